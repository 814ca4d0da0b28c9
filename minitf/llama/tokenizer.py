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
