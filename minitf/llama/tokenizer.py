"""A Llama-family folder's ``tokenizer.json`` through the ``tokenizers`` package, applied as transformers applies
it: :meth:`LlamaTokenizer.encode` runs the normalizer, pre-tokenizer, model and post-processor (which puts
``<s>`` or ``<|begin_of_text|>`` first where the folder's has one: ``add_special_tokens=True``, transformers'
default), :meth:`LlamaTokenizer.decode` leaves the special tokens out (as its text-generation pipeline writes
text). Generation stops at any of ``eos_ids`` (config.json's or generation_config.json's ``eos_token_id``, an id
or a list)."""
import json
import pathlib

from minitf.training.errors import DataError
from minitf.training.tokenizer import HuggingFaceTokenizer, tokenizers_package

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


def read_tokenizer(folder, eos_ids=()):
    """The :class:`LlamaTokenizer` of ``folder``'s tokenizer.json; a one-line DataError for a folder without one
    (Llama 2's sentencepiece tokenizer.model alone is not read) or one the package cannot read."""
    path = tokenizer_path(folder)
    tokenizers = tokenizers_package(f"the tokenizer of {folder}")
    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:  # the tokenizers package raises a bare Exception
        raise DataError(f"{path} cannot be read as a tokenizer ({str(error).strip() or type(error).__name__}); "
                        "copy it again from the model's Hugging Face folder") from None
    return LlamaTokenizer(tokenizer, eos_ids)


def tokenizer_path(folder):
    """``folder``'s tokenizer.json; a one-line DataError where there is none."""
    path = pathlib.Path(folder) / "tokenizer.json"
    if not path.is_file():
        also = (" (its sentencepiece tokenizer.model is not read here: save the tokenizer with transformers, "
                "which writes tokenizer.json)") if (pathlib.Path(folder) / "tokenizer.model").is_file() else ""
        raise DataError(f"{folder} has no tokenizer.json{also}; copy it from the model's Hugging Face folder")
    return path
