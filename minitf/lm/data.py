"""A language model's data (host NumPy): the text as one stream of token ids, the training blocks of an
epoch and the evaluation blocks of a split. Tokens are sentencepiece BPE pieces (lines joined by EOS, which
stands for the line break), characters (:class:`CharTokenizer`) or a pretrained model's byte-level BPE
(:class:`PretrainedTokenizer`, GPT-2's, for fine-tuning). Bad input is a one-line DataError."""
import hashlib
import json
import pathlib

from minitf.backend import host as np
from minitf.training.errors import DataError
from minitf.training.tokenizer import EOS_ID, UNK_ID, HuggingFaceTokenizer, Tokenizer, tokenizers_package

#: The "format" of a character tokenizer's tokenizer.model (JSON; a sentencepiece model is a protobuf, never JSON).
CHAR_FORMAT = "minitf-char-1"
#: The "format" of a pretrained tokenizer's tokenizer.model (JSON holding the tokenizers package's own JSON).
PRETRAINED_FORMAT = "minitf-pretrained-1"


class CharTokenizer:
    """One id per character of the training text; id 0 stands for any character it did not have. The same
    interface as :class:`minitf.training.tokenizer.Tokenizer` (``vocab_size``, ``sha256``, ``model_bytes``,
    ``encode``, ``decode``), saved as JSON in tokenizer.model."""

    def __init__(self, chars):
        self.chars = "".join(sorted(set(chars)))
        self._ids = {ch: i + 1 for i, ch in enumerate(self.chars)}
        self._bytes = json.dumps({"format": CHAR_FORMAT, "chars": self.chars}).encode("utf-8")
        self.sha256 = hashlib.sha256(self._bytes).hexdigest()

    @classmethod
    def from_bytes(cls, data, origin="tokenizer.model"):
        try:
            values = json.loads(data.decode("utf-8"))
            if values.get("format") != CHAR_FORMAT or not isinstance(values.get("chars"), str):
                raise ValueError("not a character tokenizer")
        except (ValueError, UnicodeDecodeError, AttributeError) as error:
            raise DataError(f"{origin} is not a character tokenizer written by train.py ({error}); "
                            "use the run's own tokenizer.model") from None
        return cls(values["chars"])

    @property
    def vocab_size(self):
        return len(self.chars) + 1

    def model_bytes(self):
        return self._bytes

    def encode(self, texts):
        if isinstance(texts, str):
            raise TypeError("CharTokenizer.encode takes a list of strings; wrap one text as [text]")
        return [[self._ids.get(ch, 0) for ch in text] for text in texts]

    def decode(self, id_lists):
        return ["".join(self.chars[int(i) - 1] if 0 < int(i) <= len(self.chars) else "\ufffd" for i in ids)
                for ids in id_lists]

    def unknown_characters(self, text):
        """The characters of ``text`` not in the alphabet (each read as id 0), in order of first appearance."""
        return [ch for ch in dict.fromkeys(text) if ch not in self._ids]


class PretrainedTokenizer(HuggingFaceTokenizer):
    """A tokenizer of the ``tokenizers`` package (a Hugging Face model's, such as GPT-2's byte-level BPE) with
    the interface of :class:`minitf.training.tokenizer.Tokenizer`. No special tokens are added around a text (as
    Hugging Face's text-generation pipeline encodes a prompt); ``eos_id`` is the model's end-of-text id or
    None. A run of ``train.py --init-from`` keeps it in tokenizer.model (:meth:`model_bytes`)."""

    def __init__(self, tokenizer, eos_id=None, data=None):
        self.eos_id = eos_id
        super().__init__(tokenizer, data if data is not None else json.dumps(
            {"format": PRETRAINED_FORMAT, "eos_id": eos_id, "tokenizer": tokenizer.to_str()}).encode("utf-8"))

    @classmethod
    def from_bytes(cls, data, origin="tokenizer.model"):
        """The tokenizer of a run's tokenizer.model written by :meth:`model_bytes` (a checkpoint's copy too)."""
        tokenizers = tokenizers_package(origin)
        try:
            values = json.loads(data.decode("utf-8"))
            eos_id = values["eos_id"]
            if values.get("format") != PRETRAINED_FORMAT or not (eos_id is None or type(eos_id) is int):
                raise ValueError("not a pretrained tokenizer")
            tokenizer = tokenizers.Tokenizer.from_str(values["tokenizer"])
        except Exception as error:  # the tokenizers package raises a bare Exception
            raise DataError(f"{origin} is not a pretrained tokenizer written by train.py --init-from "
                            f"({str(error).strip() or type(error).__name__}); use the run's own tokenizer.model") from None
        return cls(tokenizer, eos_id, data)


def tokenizer_files(folder):
    """The tokenizer files of a Hugging Face folder: [tokenizer.json] if present, else
    [vocab.json, merges.txt]; a DataError when neither is there."""
    folder = pathlib.Path(folder)
    if (folder / "tokenizer.json").is_file():
        return [folder / "tokenizer.json"]
    if all((folder / name).is_file() for name in ("vocab.json", "merges.txt")):
        return [folder / "vocab.json", folder / "merges.txt"]
    raise DataError(f"{folder} has no tokenizer: expected tokenizer.json, or vocab.json and merges.txt "
                    "(GPT-2's byte-level BPE); copy them from the model's Hugging Face folder")


def read_pretrained_tokenizer(folder, eos_id=None):
    """The :class:`PretrainedTokenizer` of a Hugging Face folder: ``tokenizer.json`` if present, else
    ``vocab.json`` and ``merges.txt`` read as GPT-2's byte-level BPE (its end-of-text token, ``eos_id``, made
    special as GPT-2's tokenizer does). A DataError names a missing or unreadable file."""
    files = tokenizer_files(folder)
    tokenizers = tokenizers_package(f"the tokenizer of {folder}")
    try:
        if len(files) == 1:
            tokenizer = tokenizers.Tokenizer.from_file(str(files[0]))
        else:
            tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(*map(str, files)))
            tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's
            tokenizer.decoder = tokenizers.decoders.ByteLevel()
            eos = tokenizer.id_to_token(eos_id) if eos_id is not None else None
            if eos is not None:  # "<|endoftext|>" in a text is one token, not 7 pieces
                tokenizer.add_special_tokens([eos])
    except Exception as error:  # the tokenizers package raises a bare Exception
        raise DataError(f"{' and '.join(str(f) for f in files)} cannot be read as a tokenizer "
                        f"({str(error).strip() or type(error).__name__}); copy it again from the model's "
                        "Hugging Face folder") from None
    return PretrainedTokenizer(tokenizer, eos_id)


def pretrained_eos_id(hf_config, vocab_size):
    """The end-of-text id of a Hugging Face config.json (``eos_token_id``), or None where it is absent or not
    one id of the vocabulary (generation then runs to its length)."""
    eos_id = hf_config.get("eos_token_id")
    return eos_id if type(eos_id) is int and 0 <= eos_id < vocab_size else None


def tokenizer_kind(tokenizer):
    """The run config's ``tokenizer`` of a tokenizer: "char", "pretrained" or "bpe"."""
    return {CharTokenizer: "char", PretrainedTokenizer: "pretrained"}.get(type(tokenizer), "bpe")


def load_tokenizer(path):
    """A run's tokenizer.model: a character or pretrained tokenizer (JSON) or a sentencepiece BPE model."""
    path = pathlib.Path(path)
    data = path.read_bytes() if path.is_file() else None
    if data is not None and data.startswith(b"{"):
        return tokenizer_from_bytes(data, str(path))
    return Tokenizer(path)


def tokenizer_from_bytes(data, origin="tokenizer.model"):
    """A run's tokenizer.model from its bytes (a checkpoint's copy): characters or a pretrained model's
    tokenizer (JSON, told apart by its "format"), or sentencepiece BPE."""
    if not data.startswith(b"{"):
        return Tokenizer.from_bytes(data)
    if f'"format": "{PRETRAINED_FORMAT}"'.encode() in data[:64]:  # json.dumps writes "format" first
        return PretrainedTokenizer.from_bytes(data, origin)
    return CharTokenizer.from_bytes(data, origin)


class TextTokenizer:
    """A run's tokenizer as a sampler uses it: ``encode``/``decode`` of whole texts with their line breaks
    (sentencepiece BPE writes one as EOS, :func:`encode_text`), so a sample runs on across lines; the
    end-of-text id of a pretrained tokenizer (the others have none)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.vocab_size, self.sha256 = tokenizer, tokenizer.vocab_size, tokenizer.sha256
        self.eos_id = getattr(tokenizer, "eos_id", None)

    def encode(self, texts):
        return [encode_text(self.tokenizer, text)[:-1 if _line_breaks_as_eos(self.tokenizer) else None]
                .tolist() for text in texts]  # a prompt ends where it ends, not with a line break

    def decode(self, id_lists):
        return [decode_ids(self.tokenizer, ids) for ids in id_lists]

    def unknown_characters(self, text):
        """The characters of ``text`` the tokenizer cannot represent (the character tokenizer's id 0,
        sentencepiece's unk), in order of first appearance; a prompt with any is refused, not read as unknown."""
        if hasattr(self.tokenizer, "unknown_characters"):
            return self.tokenizer.unknown_characters(text)
        chars = [ch for ch in dict.fromkeys(text) if not ch.isspace()]  # sentencepiece's spaces are its own
        return [ch for ch, ids in zip(chars, self.tokenizer.encode(chars)) if UNK_ID in ids]


def _line_breaks_as_eos(tokenizer):
    """Whether ``tokenizer`` is sentencepiece BPE, which has no line break: lines are joined by EOS (a Hugging Face
    folder's tokenizer, GPT-2's or a Llama's, has the line break's byte)."""
    return not isinstance(tokenizer, (CharTokenizer, HuggingFaceTokenizer))


def encode_text(tokenizer, text):
    """The ids of a whole text (int64, host): characters one by one, a pretrained tokenizer's bytes as they
    come (a line break is a byte like any other), or each line's BPE pieces followed by EOS for its line break."""
    if not _line_breaks_as_eos(tokenizer):
        return np.asarray(tokenizer.encode([text])[0], dtype=np.int64)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    ids = []
    for piece in tokenizer.encode(lines):
        ids.extend(piece)
        ids.append(EOS_ID)
    return np.asarray(ids, dtype=np.int64)


def decode_ids(tokenizer, ids):
    """The text of a stream of ids (:func:`encode_text` reversed: EOS back to a line break)."""
    ids = [int(i) for i in ids]
    if not _line_breaks_as_eos(tokenizer):
        return tokenizer.decode([ids])[0]
    lines, start = [], 0
    for i, token in enumerate(ids + [EOS_ID]):
        if token == EOS_ID:
            lines.append(tokenizer.decode([ids[start:i]])[0])
            start = i + 1
    return "\n".join(lines)


class TextCorpus:
    """The splits of a text (``{"train": str, "valid": str, "test": str}``, test optional) as token streams.
    Training blocks: ``block_size`` + 1 consecutive tokens (the input and its next-token targets), cut at an
    offset drawn from (seed, epoch) and shuffled by it, so that an epoch's batches, and a resumed run's, depend
    only on (seed, epoch, batch); each batch holds ``max_tokens // block_size`` blocks."""

    def __init__(self, tokenizer, texts, block_size):
        self._setup(tokenizer, {split: encode_text(tokenizer, text) for split, text in texts.items()},
                    {split: len(text) for split, text in texts.items()}, block_size)

    @classmethod
    def from_tokens(cls, tokenizer, tokens, chars, block_size):
        """A corpus over token arrays already made (``tokens``: {split: ids}, memory-mapped ones too) and the
        characters of each split's text (``chars``, for bits per character)."""
        corpus = cls.__new__(cls)
        corpus._setup(tokenizer, tokens, chars, block_size)
        return corpus

    def _setup(self, tokenizer, tokens, chars, block_size):
        self.tokenizer, self.block_size = tokenizer, int(block_size)
        self.tokens, self.chars = dict(tokens), dict(chars)
        self.text = {}  # (translation's sentences: none here)
        for split, ids in self.tokens.items():
            least = self.block_size + 1 if split == "train" else 2
            if ids.size < least:
                raise DataError(f"the {split} text has {ids.size} tokens, fewer than the {least} it needs "
                                f"(--block-size {self.block_size} + 1 for training); give a longer text or a "
                                "smaller --block-size")
        self._starts = None

    def set_bpe_dropout(self, p):
        if p > 0:
            raise DataError(f"--bpe-dropout {p} is for translation; a language model trains with --bpe-dropout 0")

    def epoch_batches(self, seed, epoch, max_tokens):
        """(batches, lengths): index arrays of this epoch's blocks, ``max_tokens // block_size`` a batch, and
        the tokens each block predicts (twice: the trainer's (source, target) lengths)."""
        T, n_tokens = self.block_size, self.tokens["train"].size
        rng = np.random.default_rng([int(seed), int(epoch), 0x4C4D])  # "LM": not the translation batches' stream
        shift = int(rng.integers(0, min(T, n_tokens - T)))
        n_blocks = (n_tokens - 1 - shift) // T
        self._starts = shift + rng.permutation(n_blocks).astype(np.int64) * T
        rows = max(1, int(max_tokens) // T)
        order = np.arange(n_blocks, dtype=np.int64)
        batches = [order[i:i + rows] for i in range(0, n_blocks, rows)]
        lengths = np.full(n_blocks, T, dtype=np.int64)
        return batches, (lengths, lengths)

    def batch(self, split, index):
        """Host int64 inputs (B, T) and targets (B, T) of training blocks ``index`` of the current epoch."""
        starts = self._starts[np.asarray(index, dtype=np.int64)]
        rows = starts[:, None] + np.arange(self.block_size + 1)[None, :]    # (B, T + 1)
        block = np.asarray(self.tokens[split][rows], dtype=np.int64)
        return block[:, :-1], block[:, 1:]

    def eval_batches(self, split, max_tokens):
        """[(inputs, targets)] covering every token of ``split`` after the first once: consecutive blocks,
        ``max_tokens // block_size`` a batch, the last block shorter."""
        ids, T = self.tokens[split], self.block_size
        starts = np.arange(0, ids.size - 1, T)
        full = starts[starts + T + 1 <= ids.size]
        rows = max(1, int(max_tokens) // T)
        out = []
        for i in range(0, full.size, rows):
            block = np.asarray(ids[full[i:i + rows, None] + np.arange(T + 1)[None, :]], dtype=np.int64)
            out.append((block[:, :-1], block[:, 1:]))
        if full.size < starts.size:  # the tail: fewer than T targets
            tail = np.asarray(ids[starts[full.size]:], dtype=np.int64)
            out.append((tail[None, :-1], tail[None, 1:]))
        return out
