"""The language-model kind (``train.py --model gpt``): the decoder-only GPT (:class:`minitf.gpt.GPT`) and the
Hugging Face GPT-2 folders it reads. What the shared machinery asks of a kind
(:class:`minitf.training.kind.Kind`): its presets, its own run-config fields and their checks, its model and
tokenizer from a checkpoint, a GPT-2 folder read whole, and its ``train.py`` task."""
import importlib.util
import pathlib

from minitf.lm import config as config_checks, gpt2
from minitf.lm.config import PRESETS, LanguageModelRunConfig
from minitf.training.errors import DataError
from minitf.training.kind import NEXT_TOKEN_PAGE, Kind, Loaded


class LanguageModelKind(Kind):
    name = "gpt"
    title = "language model"
    hf_model_types = ("gpt2",)
    hf_what = gpt2.GPT2_FOLDER
    presets = PRESETS
    run_config = LanguageModelRunConfig
    page = NEXT_TOKEN_PAGE
    generates = True
    use_a_run = "sample from it with python -m minitf.generate --checkpoint RUN"

    def task(self):
        from minitf.lm.task import LanguageModelTask
        return LanguageModelTask()

    def validate(self, config):
        config_checks.validate(config)

    def read_tokenizer(self, data, origin="tokenizer.model"):
        from minitf.lm.data import tokenizer_from_bytes
        return tokenizer_from_bytes(data, origin)

    def build_model(self, config, vocab_size):
        from minitf.lm.trainer import gpt_from_run_config
        return gpt_from_run_config(config.to_dict(), vocab_size)

    def min_parameters(self, config, vocab_size):
        d, f = config.d_model, config.d_ff  # embeddings, each block's attention (4 D x D) and feed-forward
        return vocab_size * d + config.num_decoder_layers * (4 * d * d + 2 * d * f)

    def loaded_run(self, model, tokenizer, config, source, checkpoint, meta, run_dir):
        from minitf.lm.data import TextTokenizer
        learned = model.config.positions == "learned"
        return Loaded(model, TextTokenizer(tokenizer), self, pathlib.Path(source), None, run_dir, checkpoint, meta,
                      model.max_len if learned else config.block_size,
                      "its learned positions" if learned else "its training blocks")

    def writes(self, model):
        from minitf.gpt import GPT
        return isinstance(model, GPT)

    def write_model(self, model, folder, hf_config=None):
        gpt2.save_pretrained(model, folder, hf_config)

    def write_folder(self, loaded, folder):
        """A GPT-2 folder: config.json (a folder's other entries kept), model.safetensors and tokenizer.json, for a
        GPT-2 folder or a run fine-tuned from one (a run of minitf's own tokenizer has none to write)."""
        from minitf.training.errors import UsageError
        from minitf.training.tokenizer import HuggingFaceTokenizer
        tokenizer = getattr(loaded.tokenizer, "tokenizer", loaded.tokenizer)  # a TextTokenizer wraps the run's
        if not isinstance(tokenizer, HuggingFaceTokenizer):
            raise UsageError(f"{loaded.source}: a --model gpt run of minitf's own tokenizer has no GPT-2 tokenizer "
                             "to write; export runs fine-tuned from a GPT-2 folder with --init-from, or sample from it "
                             f"with python -m minitf.generate --checkpoint {loaded.source} (nothing was written)")
        gpt2.save_pretrained(loaded.model, folder, loaded.hf_config)
        tokenizer.save(folder)

    def load_folder(self, folder, warn=None):
        """A GPT-2 folder: config.json, model.safetensors and a tokenizer (tokenizer.json, or vocab.json and
        merges.txt; a missing one is named before the weights are read)."""
        from minitf.lm.data import pretrained_eos_id, read_pretrained_tokenizer, tokenizer_files
        missing = [name for name in ("safetensors", "tokenizers") if importlib.util.find_spec(name) is None]
        if missing:
            raise DataError(f"reading a Hugging Face GPT-2 folder needs the {' and '.join(missing)} "
                            f"package{'s' * (len(missing) > 1)}, not installed here: pip install -e '.[hf]'")
        folder = pathlib.Path(folder)
        if all((folder / name).is_file() for name in ("config.json", "model.safetensors")):
            tokenizer_files(folder)  # a missing tokenizer is found before the weights are read
        _, hf = gpt2.pretrained_config(folder)  # config.json as read: it travels with the model for an export
        model = gpt2.from_pretrained(folder)
        tokenizer = read_pretrained_tokenizer(folder, pretrained_eos_id(hf, model.vocab_size))
        return Loaded(model, tokenizer, self, folder, None, context=model.max_len,
                      context_why="its learned positions", hf_config=hf)

    # -- what the study tools ask (minitf.study: the shared walk and page numbers of the GPT)
    def walk(self, tracer, model):
        from minitf.study.walk import language_model_walk
        return language_model_walk(tracer, model)

    def page_parts(self, model):
        from minitf.study.inspection.numbers import language_model_parts
        return language_model_parts(model)

    def describe_model(self, model):
        from minitf.study.inspection.numbers import describe_language_model
        return describe_language_model(model)

    def trace_loaded(self, loaded, text):
        """The text as the prompt, each position scored on its next token."""
        from minitf.study.tracer import next_token_example
        return next_token_example(loaded, text)

    def trace_example(self):
        from minitf.study import tracer, walk
        return tracer.Example(tracer.run_gpt, tracer.gpt_header, walk.print_gpt_walk)


KIND = LanguageModelKind()
