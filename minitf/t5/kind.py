"""The T5 kind (the registry's "t5"): Hugging Face T5 and mT5 folders (t5 v1.0, v1.1, flan-t5, mT5) read whole by
``minitf.load(FOLDER)`` (:meth:`T5Kind.load_folder`): the model, its tokenizer and the folder's task prefixes
(config.json's ``task_specific_params``: "translate English to German: " ...). ``train.py --model t5`` is a
stand-in that refuses until the shared trainer lands (:mod:`minitf.t5.task`). What it read is written back as such a
folder by ``minitf.save_pretrained`` (:meth:`T5Kind.write_folder`; a bare model: :meth:`T5Kind.write_model`)."""
import pathlib

from minitf.t5 import hf
from minitf.training.errors import DataError
from minitf.training.kind import Kind, Loaded


def task_prefixes(hf_config):
    """``{task name: prefix}`` of a config.json's ``task_specific_params`` ({} where it names none), e.g.
    ``{"translation_en_to_de": "translate English to German: "}``; a one-line DataError for an entry that is not
    an object with a string prefix."""
    params = (hf_config or {}).get("task_specific_params") or {}
    if not isinstance(params, dict):
        raise DataError(f"config.json: task_specific_params is {params!r}; expected an object of tasks")
    prefixes = {}
    for name, values in params.items():
        if not isinstance(values, dict):
            raise DataError(f"config.json: task_specific_params.{name} is {values!r}; expected an object")
        prefix = values.get("prefix")
        if prefix is not None:
            if not isinstance(prefix, str):
                raise DataError(f"config.json: task_specific_params.{name}.prefix is {prefix!r}; expected a string")
            prefixes[name] = prefix
    return prefixes


class T5Kind(Kind):
    name = "t5"
    title = "text-to-text model"
    hf_model_types = hf.FAMILY
    hf_what = hf.T5_FOLDER
    presets = {"tiny": {}}  # a name for train.py's default; the task refuses every run for now
    page = None  # no inspection page yet: python -m minitf.inspect refuses in one line saying use_a_run
    use_a_run = ("trace one text through it with python -m minitf.trace --checkpoint RUN --text TEXT, or read it "
                 "with minitf.load(RUN)")

    def task(self):
        from minitf.t5.task import T5Task
        return T5Task()

    def load_folder(self, folder, warn=None):
        """A T5 or mT5 folder: config.json checked, then the tokenizer (its presence and its ids against the model's
        vocabulary, before the weights are read), then the weights. ``Loaded.hf_config`` carries config.json (its
        task prefixes: :func:`task_prefixes`); ``context`` its n_positions where it names one."""
        from minitf.t5.model import T5
        from minitf.t5.tokenizer import read_tokenizer
        folder = pathlib.Path(folder)
        config, hf_config = hf.pretrained_config(folder)
        task_prefixes(hf_config)
        tokenizer = read_tokenizer(folder, config)
        model = T5.from_pretrained(folder).eval()
        return Loaded(model, tokenizer, self, folder, None, context=config.n_positions,
                      context_why="its n_positions" if config.n_positions else "", hf_config=hf_config)

    def write_folder(self, loaded, folder):
        """``loaded`` written as a Hugging Face T5 folder: config.json (the entries of the one it was read from kept:
        its task prefixes), generation_config.json and model.safetensors (:func:`minitf.t5.hf.save_pretrained`), then
        its tokenizer's files (spiece.model and tokenizer_config.json's extra_ids, or tokenizer.json)."""
        hf.save_pretrained(loaded.model, folder, loaded.hf_config)
        loaded.tokenizer.save(folder)

    def writes(self, model):
        from minitf.t5.model import T5
        return isinstance(model, T5)

    def write_model(self, model, folder, hf_config=None):
        hf.save_pretrained(model, folder, hf_config)

    def describe_model(self, model):
        c = model.config
        feed_forward = f"gated {c.activation}" if c.gated else c.activation
        output = f"{'tied' if c.tie_word_embeddings else 'own'} output"
        output += " x d_model^-0.5" if c.scale_decoder_outputs else ""
        return ("T5", "pre-norm RMSNorm",
                f"T5 (encoder-decoder), {c.num_layers} + {c.num_decoder_layers} blocks, d_model {c.d_model}, "
                f"{c.num_heads} heads of {c.d_kv}, {feed_forward} d_ff {c.d_ff}, relative positions "
                f"({c.relative_attention_num_buckets} buckets to {c.relative_attention_max_distance}), {output}")

    def trace_loaded(self, loaded, text):
        """The text as source and target, the decoder starting from the model's start id and ending with its eos,
        as transformers' T5 is trained (the encoder's own eos is what the tokenizer leaves for the caller)."""
        from minitf.study.tracer import translation_example
        config = loaded.model.config
        return translation_example(loaded, text, config.decoder_start_token_id, config.eos_token_id)


KIND = T5Kind()
