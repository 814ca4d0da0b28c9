"""The Llama-family kind (the registry's "llama"): Hugging Face Llama, Qwen2 and Mistral folders read whole by
``minitf.load(FOLDER)`` (:meth:`LlamaKind.load_folder`) and sampled by ``python -m minitf.generate --checkpoint
FOLDER``; ``train.py --model llama`` trains the Llama block on the language model's data (:mod:`minitf.llama.task`),
and its runs load, resume and sample as the GPT's do."""
import importlib.util
import pathlib

from minitf.llama import hf, moe_hf
from minitf.llama.config import RUN_PRESETS, LlamaRunConfig, run_model_config, validate_run
from minitf.llama.model import Llama
from minitf.training.errors import DataError, UsageError
from minitf.training.kind import NEXT_TOKEN_PAGE, Kind, Loaded


class LlamaKind(Kind):
    name = "llama"
    extends = ("gpt",)  # its task and trainer are the language model's (minitf.lm)
    title = "language model"
    hf_model_types = moe_hf.FAMILY
    hf_what = hf.LLAMA_FOLDER
    generates = True
    presets = RUN_PRESETS
    run_config = LlamaRunConfig
    page = NEXT_TOKEN_PAGE  # one text, each next token (as a GPT's); its numbers: page_parts
    use_a_run = "sample from it with python -m minitf.generate --checkpoint RUN"

    def task(self):
        from minitf.llama.task import LlamaTask
        return LlamaTask()

    def validate(self, config):
        validate_run(config)

    def read_tokenizer(self, data, origin="tokenizer.model"):
        from minitf.llama.tokenizer import LlamaTokenizer
        if LlamaTokenizer.written(data):  # a fine-tuning run's: its folder's tokenizer.json
            return LlamaTokenizer.from_bytes(data, origin)
        from minitf.lm.data import tokenizer_from_bytes  # the language model's tokenizers (BPE, characters)
        return tokenizer_from_bytes(data, origin)

    def build_model(self, config, vocab_size):
        return Llama(run_model_config(config, vocab_size))

    def min_parameters(self, config, vocab_size):
        d, f = config.d_model, config.d_ff  # embeddings, each block's q and o (D x D each) and SwiGLU (3 D x F)
        return vocab_size * d + config.num_decoder_layers * (2 * d * d + 3 * d * f)

    def loaded_run(self, model, tokenizer, config, source, checkpoint, meta, run_dir):
        from minitf.lm.data import TextTokenizer
        from minitf.llama.tokenizer import LlamaTokenizer
        if isinstance(tokenizer, LlamaTokenizer):  # fine-tuned from a folder: its tokenizer and positions, as there
            return Loaded(model, tokenizer, self, pathlib.Path(source), None, run_dir, checkpoint, meta,
                          *model.config.positions)
        return Loaded(model, TextTokenizer(tokenizer), self, pathlib.Path(source), None, run_dir, checkpoint, meta,
                      config.block_size, "its training blocks")

    def walk(self, tracer, model):
        from minitf.llama.study import llama_walk
        return llama_walk(tracer, model)

    def page_parts(self, model):
        from minitf.llama.study import page_parts
        return page_parts(model)

    def describe_model(self, model):
        from minitf.llama.study import describe
        return describe(model)

    def trace_loaded(self, loaded, text):
        """The text as the prompt, each position scored on its next token."""
        from minitf.study.tracer import next_token_example
        return next_token_example(loaded, text)

    def trace_example(self):
        from minitf.llama.study import trace_example
        return trace_example()

    def write_folder(self, loaded, folder):
        """A run fine-tuned from a folder written as one (``python -m minitf.export RUN FOLDER``): config.json,
        generation_config.json, model.safetensors (:meth:`Llama.save_pretrained`), its tokenizer.json and a
        tokenizer_config.json naming its bos, eos and pad tokens (:meth:`LlamaTokenizer.save`)."""
        from minitf.llama.tokenizer import LlamaTokenizer
        if not isinstance(loaded.tokenizer, LlamaTokenizer):
            raise UsageError(f"{loaded.source}: a --model llama run of minitf's own tokenizer "
                             f"({loaded.model.config.vocab_size} ids) has no tokenizer.json to write; export runs "
                             "fine-tuned with --init-from, or sample from it with python -m minitf.generate "
                             "--checkpoint RUN")
        loaded.model.save_pretrained(folder)
        loaded.tokenizer.save(folder, loaded.model.config)

    def generation_settings(self, folder, warn):
        """The sampling settings of a folder's generation_config.json (:func:`minitf.llama.hf.generation_settings`):
        the generate command's defaults where no flag is given, as transformers' generate takes them."""
        return hf.generation_settings(folder, warn)

    def writes(self, model):
        return isinstance(model, Llama)

    def write_model(self, model, folder, hf_config=None):
        model.save_pretrained(folder, hf_config)  # any type of the family (minitf.llama.moe_hf)

    def load_folder(self, folder, warn=None):
        """A Llama, Qwen2 or Mistral folder: config.json (and generation_config.json), the weights, tokenizer.json;
        a missing tokenizer is named before the weights are read."""
        from minitf.llama.tokenizer import read_tokenizer, tokenizer_path
        if importlib.util.find_spec("tokenizers") is None:
            raise DataError(f"reading a {hf.LLAMA_FOLDER} needs the tokenizers package, not installed here: "
                            "pip install -e '.[hf]'")
        folder = pathlib.Path(folder)
        config, hf_config = moe_hf.pretrained_config(folder)  # every config value checked first
        tokenizer_path(folder)                    # then the tokenizer's presence, before the weights are read
        model = Llama.from_pretrained(folder, warn=warn).eval()
        tokenizer = read_tokenizer(folder, config.eos_ids)
        positions, why = config.positions
        return Loaded(model, tokenizer, self, folder, None, context=positions, context_why=why, hf_config=hf_config)


KIND = LlamaKind()
