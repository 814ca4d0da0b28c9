"""A Llama-family folder's ``tokenizer.json`` through the ``tokenizers`` package, applied as transformers applies
it (where the folder declares transformers' LlamaTokenizer over sentencepiece pieces, with that class's
pre-tokenizer and decoder: :func:`as_transformers_reads`): :meth:`LlamaTokenizer.encode` runs the normalizer, pre-tokenizer, model and post-processor (which puts
``<s>`` or ``<|begin_of_text|>`` first where the folder's has one: ``add_special_tokens=True``, transformers'
default), :meth:`LlamaTokenizer.decode` leaves the special tokens out (as its text-generation pipeline writes
text). Generation stops at any of ``eos_ids`` (config.json's or generation_config.json's ``eos_token_id``, an id
or a list)."""
import json
import pathlib

from minitf.atomic import write_atomic
from minitf.llama.hf import read_json_object
from minitf.pretrained import write_json
from minitf.training.errors import DataError
from minitf.training.tokenizer import HuggingFaceTokenizer, read_tokenizer_json, tokenizers_package

#: What a run's tokenizer.model would hold for this tokenizer (its "format").
FORMAT = "minitf-llama-tokenizer"


class LlamaTokenizer(HuggingFaceTokenizer):
    """A ``tokenizers.Tokenizer`` with the interface of :class:`minitf.training.tokenizer.Tokenizer` (``encode``,
    ``decode``, ``vocab_size``, ``eos_id``, ``sha256``, ``model_bytes``): the post-processor's special tokens on
    encoding, none on decoding, and every end-of-text id (``eos_ids``; ``eos_id`` the first, or None)."""
    ADD_SPECIAL_TOKENS = True
    SKIP_SPECIAL_TOKENS = True

    def __init__(self, tokenizer, eos_ids=()):
        self.eos_ids = tuple(eos_ids)
        self.eos_id = self.eos_ids[0] if self.eos_ids else None
        super().__init__(tokenizer, json.dumps({"format": FORMAT, "eos_ids": list(self.eos_ids),
                                                "tokenizer": tokenizer.to_str()}).encode("utf-8"))

    @classmethod
    def from_bytes(cls, data, origin="tokenizer.model"):
        """The tokenizer a fine-tuning run keeps in its tokenizer.model (:meth:`model_bytes`; a checkpoint's copy)."""
        tokenizers = tokenizers_package(origin)
        try:
            values = json.loads(data.decode("utf-8"))
            eos_ids = values["eos_ids"]
            if values.get("format") != FORMAT or not all(type(e) is int for e in eos_ids):
                raise ValueError("not a Llama-family tokenizer")
            tokenizer = tokenizers.Tokenizer.from_str(values["tokenizer"])
        except Exception as error:  # the tokenizers package raises a bare Exception
            raise DataError(f"{origin} is not a Llama-family tokenizer written by train.py --model llama --init-from "
                            f"({str(error).strip() or type(error).__name__}); use the run's own tokenizer.model") from None
        return cls(tokenizer, eos_ids)

    @staticmethod
    def written(data):
        """Whether a tokenizer.model's bytes are one :meth:`model_bytes` wrote (json.dumps writes "format" first)."""
        return f'"format": "{FORMAT}"'.encode() in data[:64]

    def save(self, folder, config=None):
        """Write tokenizer.json into ``folder`` (the folder's own file as minitf applies it: as transformers read
        it) and tokenizer_config.json: its class PreTrainedTokenizerFast (the file as it is), and from ``config``
        (the model's :class:`LlamaConfig`) its bos, eos and pad tokens (pad: the model's pad token, else its first
        end of text) and positions, so that transformers' tokenizer of the folder encodes as this one does and pads
        a batch. Each file atomically."""
        folder = pathlib.Path(folder)
        write_atomic(folder / "tokenizer.json", self._tokenizer.to_str())
        settings = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
        if config is not None:
            eos = config.eos_ids[0] if config.eos_ids else None
            pad = config.pad_token_id if config.pad_token_id is not None else eos
            for key, token in (("bos_token", config.bos_token_id), ("eos_token", eos), ("pad_token", pad)):
                if token is not None and self._tokenizer.id_to_token(token) is not None:
                    settings[key] = self._tokenizer.id_to_token(token)
            settings["model_max_length"] = config.max_position_embeddings
        write_json(folder / "tokenizer_config.json", settings)


def read_tokenizer(folder, eos_ids=()):
    """The :class:`LlamaTokenizer` of ``folder``'s tokenizer.json; a one-line DataError for a folder without one
    (Llama 2's sentencepiece tokenizer.model alone is not read) or one the package cannot read."""
    tokenizers, tokenizer = read_tokenizer_json(tokenizer_path(folder), f"the tokenizer of {folder}")
    return LlamaTokenizer(as_transformers_reads(tokenizer, folder, tokenizers), eos_ids)


def as_transformers_reads(tokenizer, folder, tokenizers):
    """``tokenizer`` (``folder``'s tokenizer.json) as transformers 5's ``AutoTokenizer`` makes it: the file as it
    is, except where a Llama's folder (config.json's model_type llama) declares transformers' LlamaTokenizer
    (tokenizer_config.json's tokenizer_class, else config.json's, "Fast" or not) over a tokenizer.json that is not
    byte-level (Llama 2's sentencepiece pieces; a byte-level one, Llama 3's, is read as it is). That class keeps the
    file's pieces and post-processor but replaces its normalizer (Prepend("▁") and Replace(" ", "▁"), which turn
    " Hello" into "▁▁Hello") by a Metaspace pre-tokenizer that puts "▁" first only where the text does not start
    with one (tokenizer_config.json's ``add_prefix_space``, default true; ``legacy`` true: before the text after
    each special token too), its decoder by one that takes that first space off again, and turns on byte fallback."""
    try:
        settings, config = (read_json_object(pathlib.Path(folder) / name) for name in ("tokenizer_config.json",
                                                                                       "config.json"))
    except ValueError as error:
        raise DataError(str(error)) from None
    declared = settings.get("tokenizer_class") or config.get("tokenizer_class")
    if (config.get("model_type") != "llama" or not isinstance(declared, str)
            or declared.removesuffix("Fast") != "LlamaTokenizer" or '"ByteLevel"' in tokenizer.to_str()):
        return tokenizer
    prefix = settings.get("add_prefix_space")
    prefix = True if prefix is None else bool(prefix)
    scheme = ("always" if settings.get("legacy", False) else "first") if prefix else "never"
    tokenizer.normalizer = None
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    decoders = tokenizers.decoders
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
                                          + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    if type(tokenizer.model).__name__ == "BPE":  # the class builds its BPE with both on
        tokenizer.model.byte_fallback = tokenizer.model.fuse_unk = True
    return tokenizer


def tokenizer_path(folder):
    """``folder``'s tokenizer.json; a one-line DataError where there is none."""
    path = pathlib.Path(folder) / "tokenizer.json"
    if not path.is_file():
        also = (" (its sentencepiece tokenizer.model is not read here: save the tokenizer with transformers, "
                "which writes tokenizer.json)") if (pathlib.Path(folder) / "tokenizer.model").is_file() else ""
        raise DataError(f"{folder} has no tokenizer.json{also}; copy it from the model's Hugging Face folder")
    return path
