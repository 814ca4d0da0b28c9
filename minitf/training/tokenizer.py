"""The joint source/target BPE tokenizer (sentencepiece, fixed special ids), and BPE-dropout. The model is
stored in checkpoints (:meth:`Tokenizer.model_bytes`), so a checkpoint always decodes with the vocabulary it
was trained with (:attr:`Tokenizer.sha256` identifies it)."""
import hashlib
import io
import pathlib
import random
import re

from minitf.backend import host as np
from minitf.training.errors import DataError
from minitf.training.files import write_atomic

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
_SPECIALS = {"pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}


def _spm():
    """Import sentencepiece lazily, with an actionable error if it is missing."""
    try:
        import sentencepiece
    except ImportError:
        raise DataError("the tokenizer needs sentencepiece, which is not installed; "
                        "run: pip install sentencepiece") from None
    return sentencepiece


def train_tokenizer(texts, model_path, vocab_size, seed=None):
    """Train a joint BPE :class:`Tokenizer` of ``vocab_size`` ids (specials included) on ``texts`` (sources
    and targets together) and write it atomically to ``model_path``. ``seed`` pins sentencepiece's random
    generator. A DataError for no text, or a vocabulary too small for the specials or too large for the text."""
    spm = _spm()
    texts = [text for text in texts if text and text.strip()]
    if not texts:
        raise DataError("cannot train a tokenizer on no text; expected a non-empty training corpus")
    vocab_size = int(vocab_size)
    if vocab_size <= len(_SPECIALS):
        raise DataError(f"vocab size must exceed the {len(_SPECIALS)} special tokens, got "
                        f"{vocab_size}; raise --vocab-size")
    if seed is not None:
        spm.set_random_generator_seed(int(seed))
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=model, model_type="bpe",
            vocab_size=vocab_size, character_coverage=1.0, num_threads=2,
            max_sentence_length=1 << 16,  # bytes; default 4192 would silently skip long lines
            minloglevel=2, **_SPECIALS)
    except RuntimeError as error:
        raise _vocab_error(error, vocab_size) from None
    write_atomic(model_path, model.getvalue())
    return Tokenizer.from_bytes(model.getvalue())


def _vocab_error(error, vocab_size):
    """Turn sentencepiece's "Vocabulary size too high" into a DataError."""
    message = str(error)
    match = re.search(r"value\s*<=\s*(\d+)", message)
    if "Vocabulary size" in message and match:
        return DataError(f"vocab size {vocab_size} is too large for this training text, "
                         f"which supports at most {match.group(1)}; lower --vocab-size")
    if "Vocabulary size" in message:
        return DataError(f"vocab size {vocab_size} does not fit this training text "
                         f"({message.strip().splitlines()[-1]}); lower --vocab-size")
    return DataError(f"sentencepiece failed to train the tokenizer: "
                     f"{message.strip().splitlines()[-1] if message.strip() else error!r}")


class Tokenizer:
    """A ``.model`` file of :func:`train_tokenizer`: pad, unk, bos, eos are always 0, 1, 2, 3; ``sha256``
    (of the serialized model) is equal exactly for equal vocabularies."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, model_path):
        path = pathlib.Path(model_path)
        if not path.is_file():
            kind = "is a directory" if path.is_dir() else "does not exist"
            raise DataError(f"tokenizer model {str(path)!r} {kind}; expected a .model file "
                            "written by train_tokenizer, train one or fix the path")
        try:
            data = path.read_bytes()
        except OSError as error:
            raise DataError(f"cannot read tokenizer model {str(path)!r} "
                            f"({error.strerror or error}); check its permissions") from None
        self._load(data, str(path))

    @classmethod
    def from_bytes(cls, model_bytes):
        """Rebuild a tokenizer from :meth:`model_bytes` (e.g. stored in a checkpoint)."""
        tokenizer = cls.__new__(cls)
        tokenizer._load(bytes(model_bytes), "from bytes")
        return tokenizer

    def _load(self, data, origin):
        spm = _spm()
        hint = "expected a sentencepiece model written by train_tokenizer; retrain it"
        if not data:
            raise DataError(f"tokenizer model ({origin}) is empty; {hint}")
        try:
            processor = spm.SentencePieceProcessor(model_proto=data)
        except (RuntimeError, OSError, TypeError) as error:
            raise DataError(f"tokenizer model ({origin}) is corrupt or not a sentencepiece "
                            f"model ({str(error).strip() or type(error).__name__}); {hint}") from None
        ids = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise DataError(f"tokenizer model ({origin}) has special ids pad/unk/bos/eos = "
                            f"{ids}, minitf needs {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; {hint}")
        self._processor, self._bytes = processor, data
        self.sha256 = hashlib.sha256(data).hexdigest()

    @property
    def vocab_size(self):
        """Number of ids, special tokens included."""
        return self._processor.get_piece_size()

    def model_bytes(self):
        """The serialized model, to save alongside the weights."""
        return self._bytes

    def encode(self, texts):
        """Token ids of each text of a list (no BOS/EOS: :func:`minitf.nmt.data.pad_batch` adds them)."""
        if isinstance(texts, str):
            raise TypeError("Tokenizer.encode takes a list of strings; wrap one text as [text]")
        return self._processor.encode(list(texts), out_type=int)

    def decode(self, id_lists):
        """Text of each id list or 1-D array (a padded batch's rows): cut at the first EOS, PAD and BOS ignored."""
        texts = []
        for ids in id_lists:
            ids = [int(i) for i in ids]
            if EOS_ID in ids:
                ids = ids[:ids.index(EOS_ID)]
            texts.append(self._processor.decode([i for i in ids if i not in (PAD_ID, BOS_ID)]))
        return texts

    def __reduce__(self):
        # Pickle as the model bytes: the sentencepiece processor itself is not picklable.
        return (Tokenizer.from_bytes, (self._bytes,))

    def __repr__(self):
        return f"Tokenizer(vocab_size={self.vocab_size}, sha256={self.sha256[:12]}...)"


#: At most this many different segmentations of one word type per epoch.
SAMPLES_PER_TYPE = 4
_WORD_START = "\u2581"  # sentencepiece's "▁": a piece starting with it starts a word


class BpeDropout:
    """BPE-dropout (Provilkov et al., 2020) of fixed texts: each epoch every word is rebuilt from its characters
    with the tokenizer's merges, best first, each dropped with probability ``p`` (0: the tokenizer's own
    segmentation). Not sentencepiece's sampling: it differs between processes for one seed, and a resumed run
    must repeat an uninterrupted one. A word type gets at most SAMPLES_PER_TYPE samples an epoch (about 1 s)."""

    def __init__(self, tokenizer, texts, p):
        processor = tokenizer._processor
        self.p = float(p)
        merged = [i for i in range(processor.get_piece_size())
                  if not (processor.is_control(i) or processor.is_unknown(i) or processor.is_unused(i))]
        self._id = {processor.id_to_piece(i): i for i in merged}
        self._rank = {processor.id_to_piece(i): -processor.get_score(i) for i in merged}  # lower: merged first
        self._unk = tokenizer.unk_id
        index, sentences = {}, []  # word type -> its number, in order of first occurrence
        for pieces in processor.encode(list(texts), out_type=str):
            words = []
            for piece in pieces:
                if piece.startswith(_WORD_START) or not words:
                    words.append(piece)
                else:
                    words[-1] += piece
            sentences.append([index.setdefault(word, len(index)) for word in words])
        self.types = list(index)
        self.sentences = sentences
        flat = [t for row in sentences for t in row]
        self._flat = np.asarray(flat, dtype=np.int64)
        self._counts = np.bincount(self._flat, minlength=len(index)) if flat else np.zeros(0, np.int64)

    def segment(self, word, rnd=None):
        """Ids of one word (with its leading ``▁``); with ``rnd``, each step takes the best-ranked merge that
        survives dropping each with ``p`` (the same as dropping all independently and taking the best survivor)."""
        symbols = list(word)
        rank, p = self._rank, self.p
        ranks = [rank.get(a + b) for a, b in zip(symbols, symbols[1:])]
        while True:
            at = None
            for _, i in sorted((r, i) for i, r in enumerate(ranks) if r is not None):
                if rnd is None or rnd() >= p:   # ties: the leftmost first, as sentencepiece
                    at = i
                    break
            if at is None:
                break
            symbols[at:at + 2] = [symbols[at] + symbols[at + 1]]
            del ranks[at]
            if at > 0:
                ranks[at - 1] = rank.get(symbols[at - 1] + symbols[at])
            if at < len(ranks):
                ranks[at] = rank.get(symbols[at] + symbols[at + 1])
        return [self._id.get(s, self._unk) for s in symbols]

    def sample(self, seed, epoch):
        """Token ids of every text for one epoch; the same ``(seed, epoch)`` gives the same ids."""
        rnd = random.Random(int(seed) * 1_000_003 + int(epoch)).random
        k = np.minimum(self._counts, SAMPLES_PER_TYPE)
        pools = [[self.segment(word, rnd) for _ in range(int(k[t]))] for t, word in enumerate(self.types)]
        rng = np.random.default_rng([int(seed), int(epoch), 7])
        pick = (rng.random(self._flat.size) * k[self._flat]).astype(np.int64).tolist()
        picks = iter(pick)  # one per running word, in order
        return [[i for t in row for i in pools[t][next(picks)]] for row in self.sentences]


def tokenizers_package(needed_by):
    """The ``tokenizers`` package (Hugging Face's), or a one-line DataError saying how to install it."""
    try:
        import tokenizers
    except ImportError:
        raise DataError(f"{needed_by} needs the tokenizers package, not installed here: pip install -e '.[hf]'") from None
    return tokenizers


def read_tokenizer_json(path, needed_by=None):
    """(the ``tokenizers`` package, the ``tokenizers.Tokenizer`` of the tokenizer.json at ``path``): a one-line
    DataError for a file the package cannot read, or without the package (``needed_by`` names who needs it)."""
    tokenizers = tokenizers_package(needed_by or f"the tokenizer of {pathlib.Path(path).parent}")
    try:
        return tokenizers, tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:  # the tokenizers package raises a bare Exception
        raise DataError(f"{path} cannot be read as a tokenizer ({str(error).strip() or type(error).__name__}); "
                        "copy it again from the model's Hugging Face folder") from None


class HuggingFaceTokenizer:
    """A tokenizer of the ``tokenizers`` package (a Hugging Face model's tokenizer.json) with the interface of
    :class:`Tokenizer` (``encode``, ``decode``, ``vocab_size``, ``model_bytes``, ``sha256``), what every kind that
    reads such a folder shares; a subclass says whether the post-processor's special tokens are added on encoding
    and left out on decoding (:attr:`ADD_SPECIAL_TOKENS`, :attr:`SKIP_SPECIAL_TOKENS`) and what its tokenizer.model
    holds (``data``: the bytes :meth:`model_bytes` returns)."""
    ADD_SPECIAL_TOKENS = False
    SKIP_SPECIAL_TOKENS = False

    def __init__(self, tokenizer, data):
        self._tokenizer, self._bytes = tokenizer, data
        self.sha256 = hashlib.sha256(self._bytes).hexdigest()

    @property
    def vocab_size(self):
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def model_bytes(self):
        return self._bytes

    def save(self, folder):
        """Write tokenizer.json into ``folder`` (the tokenizer as read), atomically."""
        from minitf.atomic import write_atomic
        write_atomic(pathlib.Path(folder) / "tokenizer.json", self._tokenizer.to_str().encode("utf-8"))

    def encode(self, texts):
        return [encoding.ids for encoding in
                self._tokenizer.encode_batch(list(texts), add_special_tokens=self.ADD_SPECIAL_TOKENS)]

    def decode(self, id_lists):
        return self._tokenizer.decode_batch([[int(i) for i in ids] for ids in id_lists],
                                            skip_special_tokens=self.SKIP_SPECIAL_TOKENS)

    def unknown_characters(self, text):
        """The characters of ``text`` the tokenizer drops or reads as its unknown token (none for a byte-level BPE,
        which has every byte; a BPE trained without the byte alphabet lacks some), in order of first appearance."""
        unk = getattr(self._tokenizer.model, "unk_token", None)
        unk_id = self._tokenizer.token_to_id(unk) if unk else None
        chars = list(dict.fromkeys(text))
        pieces = [e.ids for e in self._tokenizer.encode_batch(chars, add_special_tokens=False)]
        return [ch for ch, ids in zip(chars, pieces) if not ids or unk_id in ids]

