"""The Llama-family kind (the registry's "llama"): Hugging Face Llama, Qwen2 and Mistral folders read whole by
``minitf.load(FOLDER)`` (:meth:`LlamaKind.load_folder`) and sampled by ``python -m minitf.generate --checkpoint
FOLDER``. ``train.py --model llama`` is not built yet: its task refuses in one line, and so does a checkpoint that
names this kind."""
import importlib.util
import pathlib

from minitf.llama import hf
from minitf.llama.model import Llama
from minitf.training.errors import CheckpointError, DataError, UsageError
from minitf.training.kind import Kind, Loaded
from minitf.training.task import Task

NOT_TRAINED = ("train.py does not train --model llama yet; a Llama, Qwen2 or Mistral folder is read by "
               "minitf.load(FOLDER) and sampled with python -m minitf.generate --checkpoint FOLDER")


class LlamaTask(Task):
    """``train.py --model llama``: refused in one line before anything is made (no trainer yet)."""
    name = "llama"
    title = "the Llama-family model"
    description = "(not yet: Llama-family folders are read and sampled, not trained)"
    summary = "Llama-family folders (read and sampled; training not built yet)"
    presets_help = "--model llama: none yet"

    def check_config(self, args, config):
        raise UsageError(NOT_TRAINED)


class LlamaKind(Kind):
    name = "llama"
    title = "language model"
    hf_model_types = hf.FAMILY
    hf_what = hf.LLAMA_FOLDER
    generates = True
    presets = {"tiny": {}}  # --preset's default, so that --model llama reaches the task's one-line refusal
    page = None  # the inspect page draws a GPT's blocks (model.decoder); not yet a Llama's
    use_a_run = "sample from it with python -m minitf.generate --checkpoint RUN"

    def task(self):
        return LlamaTask()

    def read_tokenizer(self, data, origin="tokenizer.model"):
        raise CheckpointError(f"{origin}: {NOT_TRAINED}")

    def build_model(self, config, vocab_size):
        raise CheckpointError(NOT_TRAINED)

    def min_parameters(self, config, vocab_size):
        raise CheckpointError(NOT_TRAINED)

    def loaded_run(self, model, tokenizer, config, source, checkpoint, meta, run_dir):
        raise CheckpointError(NOT_TRAINED)

    def load_folder(self, folder, warn=None):
        """A Llama, Qwen2 or Mistral folder: config.json (and generation_config.json), the weights, tokenizer.json;
        a missing tokenizer is named before the weights are read."""
        from minitf.llama.tokenizer import read_tokenizer, tokenizer_path
        if importlib.util.find_spec("tokenizers") is None:
            raise DataError(f"reading a {hf.LLAMA_FOLDER} needs the tokenizers package, not installed here: "
                            "pip install -e '.[hf]'")
        folder = pathlib.Path(folder)
        config, _ = hf.pretrained_config(folder)  # every config value checked first
        tokenizer_path(folder)                    # then the tokenizer's presence, before the weights are read
        model = Llama.from_pretrained(folder).eval()
        tokenizer = read_tokenizer(folder, config.eos_ids)
        return Loaded(model, tokenizer, self, folder, None, context=config.max_position_embeddings,
                      context_why="its max_position_embeddings")


KIND = LlamaKind()
