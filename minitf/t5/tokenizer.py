"""A T5 folder's tokenizer: ``tokenizer.json`` through the ``tokenizers`` package where the folder has one (as
transformers 5 reads it: its post-processor puts ``</s>`` last), else the sentencepiece ``spiece.model`` with T5's
sentinels: ``extra_ids`` of them (tokenizer_config.json's, default 100) after the model's pieces, ``<extra_id_N>``
the id ``vocab_size - 1 - N`` (``<extra_id_0>`` the last), each written in a text read as its one id. As minitf's
other tokenizers (Marian's), ``encode`` gives the ids without the final ``</s>`` (the decoders and batches put it
after each source); decoding cuts at the first eos and leaves pad and the sentinels out (transformers'
``skip_special_tokens``).

A tokenizer whose ids do not fit the model (pieces + sentinels beyond config.json's vocab_size) is refused in one
line naming both files."""
import base64
import hashlib
import json
import pathlib
import re

from minitf.atomic import write_atomic
from minitf.training.errors import DataError
from minitf.training.tokenizer import HuggingFaceTokenizer, _spm, read_tokenizer_json, tokenizers_package

SENTINEL = re.compile(r"<extra_id_(\d+)>")
#: transformers' T5Tokenizer's default number of sentinels
EXTRA_IDS = 100


class T5Tokenizer:
    """``spiece.model`` with ``extra_ids`` sentinels (module doc): ``encode(texts)`` -> id lists (no final eos),
    ``decode(id_lists)`` -> texts; ``vocab_size`` = pieces + extra_ids; ``pad_id``, ``eos_id``, ``unk_id`` the
    model's own (T5's 0, 1, 2); ``sentinel(n)`` the id of ``<extra_id_n>``."""

    def __init__(self, data, extra_ids=EXTRA_IDS, origin="spiece.model"):
        spm = _spm()
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(data)
        except Exception as error:  # sentencepiece raises RuntimeError or OSError, by version
            raise DataError(f"{origin} is not a sentencepiece model ({str(error).strip() or type(error).__name__}); "
                            "copy it again from the model's Hugging Face folder") from None
        self._bytes, self.extra_ids, self.pieces = bytes(data), int(extra_ids), self._sp.get_piece_size()
        self.vocab_size = self.pieces + self.extra_ids
        self.pad_id, self.eos_id, self.unk_id = self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id()
        self.bos_id = None  # T5's decoder starts from the model's decoder_start_token_id (pad)

    def sentinel(self, n):
        """The id of ``<extra_id_n>``."""
        if not 0 <= n < self.extra_ids:
            raise ValueError(f"<extra_id_{n}>: this tokenizer has sentinels 0 to {self.extra_ids - 1}")
        return self.vocab_size - 1 - n

    def model_bytes(self):
        return self._bytes

    def tokens(self, ids):
        """Each id as the model sees it (the inspection page's tokens): its sentencepiece piece ("▁house", "</s>"),
        a sentinel's ``<extra_id_N>``, ``<ID>`` for an id past the tokenizer's (a model's spare rows)."""
        return [self._sp.id_to_piece(i) if i < self.pieces else f"<extra_id_{self.vocab_size - 1 - i}>"
                if i < self.vocab_size else f"<{i}>" for i in map(int, ids)]

    def save(self, folder):
        """Write spiece.model (as read) and tokenizer_config.json with its ``extra_ids`` into ``folder``, atomically:
        what :func:`read_tokenizer` and transformers' T5Tokenizer read."""
        folder = pathlib.Path(folder)
        write_atomic(folder / "spiece.model", self._bytes)
        write_atomic(folder / "tokenizer_config.json", json.dumps(
            {"tokenizer_class": "T5Tokenizer", "extra_ids": self.extra_ids,
             **{f"{role}_token": self._sp.id_to_piece(i) for role, i in (("eos", self.eos_id), ("unk", self.unk_id),
                                                                         ("pad", self.pad_id)) if i >= 0}},
            indent=2, ensure_ascii=False))

    def encode_one(self, text):
        """The ids of one text: its pieces, each ``<extra_id_N>`` as its sentinel (no final eos)."""
        ids, at = [], 0
        for match in SENTINEL.finditer(text):
            n = int(match.group(1))
            if n >= self.extra_ids:
                continue  # not a sentinel of this tokenizer: spelled out as text
            ids += self._sp.encode(text[at:match.start()]) + [self.sentinel(n)]
            at = match.end()
        return ids + self._sp.encode(text[at:])

    def encode(self, texts):
        return [self.encode_one(text) for text in texts]

    def decode(self, id_lists):
        """Texts of id lists: each cut at its first eos, pad and the sentinels left out."""
        texts = []
        for ids in id_lists:
            ids = [int(i) for i in ids]
            ids = ids[:ids.index(self.eos_id)] if self.eos_id in ids else ids
            texts.append(self._sp.decode([i for i in ids if i != self.pad_id and 0 <= i < self.pieces]))
        return texts


class T5JsonTokenizer(HuggingFaceTokenizer):
    """A T5 folder's tokenizer.json (the ``tokenizers`` package): its post-processor's ``</s>`` not added on encoding
    (as :class:`T5Tokenizer`), special tokens left out on decoding, as transformers applies it."""
    ADD_SPECIAL_TOKENS = False
    SKIP_SPECIAL_TOKENS = True

    def __init__(self, tokenizer, data, pad_id=0, eos_id=1):
        super().__init__(tokenizer, data)
        self.pad_id, self.eos_id, self.bos_id = pad_id, eos_id, None


def extra_ids(folder):
    """tokenizer_config.json's ``extra_ids`` (an int >= 0; absent: 100, transformers' default), checked naming it."""
    path = pathlib.Path(folder) / "tokenizer_config.json"
    if not path.is_file():
        return EXTRA_IDS
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise DataError(f"{path} is not readable JSON ({error}); copy it again or remove it") from None
    count = values.get("extra_ids", EXTRA_IDS) if isinstance(values, dict) else None
    if not (isinstance(count, int) and not isinstance(count, bool) and count >= 0):
        raise DataError(f"{path}: extra_ids is {count!r}; it must be a count of sentinels (an int >= 0)")
    return count


def read_tokenizer(folder, config):
    """The tokenizer of a T5 folder whose model is ``config`` (a :class:`minitf.t5.config.T5Config`): tokenizer.json
    where there is one, else spiece.model with tokenizer_config.json's extra_ids. A one-line DataError for a folder
    with neither, an unreadable file, or more ids than the model's vocabulary (the sentinels would be ids the model
    has no row for)."""
    folder = pathlib.Path(folder)
    tokenizer_present(folder)
    if (folder / "tokenizer.json").is_file():
        path = folder / "tokenizer.json"
        _, tokenizer = read_tokenizer_json(path, f"the tokenizer of {folder}")
        found = T5JsonTokenizer(tokenizer, path.read_bytes(), config.pad_token_id, config.eos_token_id)
        what = str(path)
    else:
        path, count = folder / "spiece.model", extra_ids(folder)
        try:
            data = path.read_bytes()
        except OSError as error:
            raise DataError(f"{path} cannot be read ({error.strerror or error})") from None
        found = T5Tokenizer(data, count, str(path))
        what = f"{path} has {found.pieces} pieces and tokenizer_config.json {count} sentinels (extra_ids)"
    if found.vocab_size > config.vocab_size:
        raise DataError(f"{what}: {found.vocab_size} ids, more than config.json's vocab_size {config.vocab_size}; "
                        "the tokenizer does not belong to this model (or extra_ids is wrong)")
    return found


def tokenizer_present(folder):
    """A one-line DataError where ``folder`` has neither tokenizer.json nor spiece.model (before the weights are
    read)."""
    folder = pathlib.Path(folder)
    if not ((folder / "tokenizer.json").is_file() or (folder / "spiece.model").is_file()):
        raise DataError(f"{folder} has no spiece.model (nor tokenizer.json); copy the tokenizer from the model's "
                        "Hugging Face folder")


def run_bytes(tokenizer):
    """A T5 run's tokenizer.model: JSON naming the folder's tokenizer file (spiece.model or tokenizer.json), its
    sentinels and ids, and the file's bytes (base64), so that a run needs the folder no more
    (:func:`from_run_bytes` reads it; a protobuf's first byte is never "{")."""
    spiece = isinstance(tokenizer, T5Tokenizer)
    return json.dumps({"t5_tokenizer": "spiece.model" if spiece else "tokenizer.json",
                       "extra_ids": tokenizer.extra_ids if spiece else None, "pad_id": tokenizer.pad_id,
                       "eos_id": tokenizer.eos_id, "data": base64.b64encode(tokenizer.model_bytes()).decode("ascii")},
                      sort_keys=True).encode("utf-8")


def from_run_bytes(data, origin="tokenizer.model"):
    """The tokenizer of a T5 run's tokenizer.model (:func:`run_bytes`); a one-line DataError for anything else."""
    try:
        values = json.loads(bytes(data).decode("utf-8"))
        kept = base64.b64decode(values["data"], validate=True)
        which, pad_id, eos_id = values["t5_tokenizer"], int(values["pad_id"]), int(values["eos_id"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise DataError(f"{origin} is not a T5 run's tokenizer (JSON naming spiece.model or tokenizer.json with "
                        "its bytes); restore it from a checkpoint's tokenizer.model") from None
    if which == "spiece.model":
        return T5Tokenizer(kept, values.get("extra_ids", EXTRA_IDS), origin)
    tokenizers = tokenizers_package(f"the tokenizer of {origin}")
    try:
        tokenizer = tokenizers.Tokenizer.from_str(kept.decode("utf-8"))
    except Exception as error:  # the tokenizers package raises a bare Exception
        raise DataError(f"{origin} holds a tokenizer.json that cannot be read ({error}); restore it from a "
                        "checkpoint's tokenizer.model") from None
    return T5JsonTokenizer(tokenizer, kept, pad_id, eos_id)


class PrefixedTokenizer:
    """A T5 tokenizer that puts ``prefix`` before every source it encodes (a translation's task prefix: "translate
    English to German: "); a target (``encode_target``) is encoded as it is. ``model_bytes`` and ``sha256`` are a
    run's tokenizer.model (:func:`run_bytes`); ``bos_id``: the decoder's start (a run's batches: the model's
    decoder_start_token_id); all else is the wrapped tokenizer's."""

    def __init__(self, tokenizer, prefix, bos_id=None):
        self.tokenizer, self.prefix, self.bos_id = tokenizer, prefix, bos_id
        self.sha256 = hashlib.sha256(self.model_bytes()).hexdigest()

    def encode(self, texts):
        return self.tokenizer.encode([self.prefix + text for text in texts])

    def encode_target(self, texts):
        return self.tokenizer.encode(texts)

    def model_bytes(self):
        return run_bytes(self.tokenizer)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)
