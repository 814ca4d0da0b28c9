"""The tokenizers of the encoder line, as transformers applies them (docs/bert.md).

- **WordPiece** (BERT, DistilBERT), pure Python: a folder's ``vocab.txt`` with tokenizer_config.json's
  ``do_lower_case``, ``strip_accents`` and ``tokenize_chinese_chars``, or its ``tokenizer.json`` when that holds a
  WordPiece model. The text is split on the special tokens first (``[MASK]`` in a text is the mask), then each
  part goes through BERT's basic tokenizer, the steps of the ``tokenizers`` package's BertNormalizer and
  BertPreTokenizer: control characters dropped and every whitespace a space (clean text), a space either side of
  each CJK ideograph, accents stripped (NFD, the non-spacing marks left out; by default when lower-casing),
  lower-cased one character at a time, split at whitespace and around each punctuation character; then greedy
  longest-match-first WordPiece: the longest vocabulary entry that starts the word, then the longest ``##``
  entry that continues it, and so on; a word with no such split, or longer than ``max_input_chars_per_word``
  characters, is one ``[UNK]``.
- **Byte-level BPE** (RoBERTa) through the ``tokenizers`` package (the hf extra, as minitf.llama.tokenizer):
  ``vocab.json`` + ``merges.txt`` or ``tokenizer.json``; pairs as ``<s> a </s></s> b </s>``; ``<mask>`` takes the
  space before it where the folder says so (``lstrip``, roberta-base's tokenizer.json), as transformers reads it.

Both have ``encode(text, pair=None) -> (ids, token_type_ids)``, ``encode_batch``, ``tokens``, ``decode`` (special
tokens left out), ``model_bytes``/``from_bytes`` (JSON, never pickle), ``sha256`` and ``save(folder)``.
:func:`train_wordpiece` makes a WordPiece vocabulary from training text for a masked-LM run from scratch."""
import collections
import functools
import hashlib
import heapq
import json
import pathlib
import re
import unicodedata

from minitf.atomic import write_atomic
from minitf.backend import host as np
from minitf.training.errors import DataError
from minitf.training.tokenizer import tokenizers_package

#: What a run's tokenizer.model holds for these tokenizers (its "format").
FORMAT = "minitf-bert-tokenizer"
#: WordPiece's special tokens in the order train_wordpiece gives them ids 0..4.
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
#: The roles a tokenizer names, with BERT's and RoBERTa's spelling of each.
ROLES = {"pad": ("[PAD]", "<pad>"), "unk": ("[UNK]", "<unk>"), "cls": ("[CLS]", "<s>"), "sep": ("[SEP]", "</s>"),
         "mask": ("[MASK]", "<mask>")}
MAX_INPUT_CHARS_PER_WORD = 100
#: CJK ideographs, each of which BERT reads as a word of its own (the ranges of the tokenizers package).
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
              (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


# ---------------------------------------------------------------------------------------------------------------
# BERT's basic tokenizer, one rule a function


@functools.cache
def is_whitespace(ch):
    """Tab, newline, carriage return and every Unicode white space (what BertNormalizer maps to a space)."""
    return ch in "\t\n\r" or ch.isspace()


@functools.cache
def is_control(ch):
    """A character of category C (control, format, unassigned, private use, surrogate) other than tab, newline
    and carriage return: clean text drops it."""
    return ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")


@functools.cache
def is_punctuation(ch):
    """ASCII punctuation (``$``, ``+``, ``<``, ``^``, ... included) or a Unicode punctuation category P*."""
    cp = ord(ch)
    return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or \
        unicodedata.category(ch).startswith("P")


@functools.cache
def is_cjk(ch):
    cp = ord(ch)
    return any(low <= cp <= high for low, high in CJK_RANGES)


def clean_text(text):
    """NUL, U+FFFD and control characters dropped, every whitespace character a space."""
    return "".join(" " if is_whitespace(ch) else ch for ch in text
                   if not (ch == "\0" or ch == "\ufffd" or is_control(ch)))


def space_cjk(text):
    """A space either side of each CJK ideograph, so that each is a word of its own."""
    return "".join(f" {ch} " if is_cjk(ch) else ch for ch in text)


def strip_accents(text):
    """NFD (an accented letter becomes the letter and its combining mark), the non-spacing marks (Mn) left out."""
    return "".join(ch for ch in unicodedata.normalize("NFD", text) if unicodedata.category(ch) != "Mn")


def lower(text):
    """Each character lower-cased on its own (no final-sigma rule: "ΟΔΟΣ" -> "οδοσ", as the tokenizers package)."""
    return "".join(ch.lower() for ch in text)


def split_words(text):
    """Split at whitespace (dropped) and around each punctuation character (kept as a word of its own)."""
    words, word = [], []
    for ch in text:
        if is_whitespace(ch) or is_punctuation(ch):
            if word:
                words.append("".join(word))
                word = []
            if not is_whitespace(ch):
                words.append(ch)
        else:
            word.append(ch)
    if word:
        words.append("".join(word))
    return words


#: ASCII's control characters (tab, newline and carriage return are whitespace) and its words: every printable
#: character that is no letter or digit is punctuation
ASCII_CONTROLS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
ASCII_WORDS = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")


def basic_tokenize(text, lowercase=True, accents=None, chinese=True):
    """BERT's basic tokenizer: ``text`` -> its words before WordPiece. ``accents``: strip them (None: when
    lower-casing, as BERT). ASCII text takes a short way (two regular expressions) to the same words."""
    if text.isascii():
        text = ASCII_CONTROLS.sub("", text)
        return ASCII_WORDS.findall(text.lower() if lowercase else text)
    return basic_tokenize_unicode(text, lowercase, accents, chinese)


def basic_tokenize_unicode(text, lowercase=True, accents=None, chinese=True):
    """:func:`basic_tokenize`, one rule after the other, for any text."""
    text = clean_text(text)
    if chinese:
        text = space_cjk(text)
    if lowercase if accents is None else accents:
        text = strip_accents(text)
    if lowercase:
        text = lower(text)
    return split_words(text)


def wordpiece(word, vocab, unk, max_chars=MAX_INPUT_CHARS_PER_WORD):
    """Greedy longest-match-first: ``word`` -> its pieces (``##`` before each but the first), or ``[unk]`` when a
    part of it has no piece or it is longer than ``max_chars`` characters."""
    if len(word) > max_chars:
        return [unk]
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start:
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                break
            end -= 1
        if end == start:
            return [unk]
        pieces.append(piece)
        start = end
    return pieces


def split_on(text, specials):
    """``text`` -> [(part, is_special)]: each special token found (the longest at a place first), the text between."""
    parts, start, i = [], 0, 0
    ordered = sorted(specials, key=len, reverse=True)
    while i < len(text):
        found = next((s for s in ordered if s and text.startswith(s, i)), None)
        if found is None:
            i += 1
            continue
        if i > start:
            parts.append((text[start:i], False))
        parts.append((found, True))
        i = start = i + len(found)
    if start < len(text):
        parts.append((text[start:], False))
    return parts


# ---------------------------------------------------------------------------------------------------------------
# What both tokenizers share


class EncoderTokenizer:
    """What the encoder's tokenizers share: the special ids, batching with padding, the bytes a run keeps. A
    subclass gives ``token_id``, ``tokens``, ``decode``, ``_values`` (what model_bytes holds), ``save``, and
    ``encode`` or the ``_encode_one(text) -> ids`` (no specials) and ``_join(a, b)`` it is made of."""

    def _set_specials(self, specials):
        """``specials``: {role: token}; each must have an id."""
        self.specials = dict(specials)
        for role, token in self.specials.items():
            setattr(self, f"{role}_id", self.token_id(token))
        self.mask_token = self.specials["mask"]

    def _finish(self):
        self._bytes = json.dumps({"format": FORMAT, **self._values()}, ensure_ascii=False,
                                 sort_keys=False).encode("utf-8")
        self.sha256 = hashlib.sha256(self._bytes).hexdigest()

    def model_bytes(self):
        """What a run keeps in its tokenizer.model (JSON)."""
        return self._bytes

    @staticmethod
    def from_bytes(data, origin="tokenizer.model"):
        """The tokenizer :meth:`model_bytes` wrote (of either kind): :func:`from_bytes`."""
        return from_bytes(data, origin)

    @staticmethod
    def written(data):
        """Whether a tokenizer.model's bytes are ones :meth:`model_bytes` wrote."""
        return f'"format": "{FORMAT}"'.encode() in data[:64]

    def encode(self, text, pair=None):
        """``text`` (and ``pair``) -> (ids, token_type_ids) with the special tokens as transformers adds them (an
        empty pair is none, as transformers reads it)."""
        a = self._encode_one(text)
        b = self._encode_one(pair) if pair else None
        return self._join(a, b)

    def encode_batch(self, texts, pairs=None):
        """-> ids (B, T) int64, token_type_ids (B, T) int64, key_padding_mask (B, T) bool (True = padding): each
        row as :meth:`encode`, padded on the right with ``pad_id`` to the longest."""
        texts = list(texts)
        pairs = [None] * len(texts) if pairs is None else list(pairs)
        if len(pairs) != len(texts):
            raise DataError(f"{len(texts)} texts but {len(pairs)} pairs; give one pair per text (or none)")
        rows = [self.encode(text, pair) for text, pair in zip(texts, pairs)]
        T = max((len(ids) for ids, _ in rows), default=0)
        ids = np.full((len(rows), T), self.pad_id, dtype=np.int64)
        types = np.zeros((len(rows), T), dtype=np.int64)
        padding = np.ones((len(rows), T), dtype=bool)
        for row, (i, t) in enumerate(rows):
            ids[row, :len(i)], types[row, :len(t)], padding[row, :len(i)] = i, t, False
        return ids, types, padding


def _token_text(value):
    """A special token as tokenizer_config.json / special_tokens_map.json spell it: a string or {"content": ...}."""
    return value.get("content") if isinstance(value, dict) else value


def _read_json(path):
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise DataError(f"{path} is not UTF-8 JSON ({error}); copy it again from the model's folder") from None
    if not isinstance(value, dict):
        raise DataError(f"{path} holds a {type(value).__name__}, expected a JSON object; copy it again")
    return value


def _folder_settings(folder):
    """tokenizer_config.json and special_tokens_map.json merged (the latter's tokens win), {} when neither."""
    settings = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = pathlib.Path(folder) / name
        if path.is_file():
            settings.update(_read_json(path))
    return settings


def _specials_from(settings, bpe):
    """{role: token} from a folder's settings, BERT's or RoBERTa's defaults where it names none."""
    return {role: _token_text(settings.get(f"{role}_token")) or names[bpe] for role, names in ROLES.items()}


# ---------------------------------------------------------------------------------------------------------------
# WordPiece (BERT, DistilBERT)


class WordPieceTokenizer(EncoderTokenizer):
    """BERT's tokenizer: ``vocab`` the tokens in id order (vocab.txt's lines)."""
    kind = "wordpiece"

    def __init__(self, vocab, do_lower_case=True, strip_accents=None, tokenize_chinese_chars=True,
                 specials=None, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD, clean_up_spaces=False,
                 never_decoded=(), origin="the vocabulary"):
        self.vocab = list(vocab)
        self.ids = {token: i for i, token in enumerate(self.vocab)}  # a repeated token: its last line, as transformers
        self.do_lower_case, self.strip_accents = bool(do_lower_case), strip_accents
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self.max_input_chars_per_word = int(max_input_chars_per_word)
        self.clean_up_spaces = bool(clean_up_spaces)
        specials = dict(zip(ROLES, SPECIALS)) if specials is None else specials
        missing = [token for token in specials.values() if token not in self.ids]
        if missing:
            raise DataError(f"{origin} lacks the special token{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(missing)}; a BERT vocabulary holds [PAD], [UNK], [CLS], [SEP] and [MASK]: "
                            "copy vocab.txt again from the model's folder")
        self._set_specials(specials)
        # the special tokens: found whole in a text before anything else, left out by decode
        self.never_decoded = set(specials.values()) | {token for token in never_decoded if token in self.ids}
        self._pieces = {}  # word -> its pieces, computed once
        self._finish()

    @property
    def vocab_size(self):
        return len(self.vocab)

    def token_id(self, token):
        return self.ids[token]

    def tokenize(self, text):
        """``text`` -> its tokens (special tokens in it kept whole), before the [CLS]/[SEP] are added."""
        tokens = []
        for part, special in split_on(text, self.never_decoded):
            if special:
                tokens.append(part)
                continue
            for word in basic_tokenize(part, self.do_lower_case, self.strip_accents, self.tokenize_chinese_chars):
                pieces = self._pieces.get(word)
                if pieces is None:
                    pieces = self._pieces[word] = wordpiece(word, self.ids, self.specials["unk"],
                                                            self.max_input_chars_per_word)
                tokens.extend(pieces)
        return tokens

    def _encode_one(self, text):
        return [self.ids[token] for token in self.tokenize(text)]

    def _join(self, a, b):
        """``[CLS] a [SEP]`` (type 0) and ``b [SEP]`` (type 1)."""
        ids = [self.cls_id, *a, self.sep_id]
        types = [0] * len(ids)
        if b is not None:
            ids += [*b, self.sep_id]
            types += [1] * (len(b) + 1)
        return ids, types

    def tokens(self, ids):
        """Each id as the vocabulary spells it; a one-line DataError for an id past the vocabulary."""
        ids = [int(i) for i in ids]
        bad = next((i for i in ids if not 0 <= i < len(self.vocab)), None)
        if bad is not None:
            raise DataError(f"token id {bad} is not in the vocabulary of {len(self.vocab)} tokens; expected ids "
                            f"0 to {len(self.vocab) - 1} (a model and a tokenizer of two different vocabularies?)")
        return [self.vocab[i] for i in ids]

    def decode(self, ids):
        """As transformers' ``decode(ids, skip_special_tokens=True)``: the pieces joined by spaces, ``##`` joined
        to the piece before it, the spaces before ``. ? ! ,`` left out (clean_up_tokenization_spaces: more)."""
        words = []
        for token in self.tokens(ids):
            if token in self.never_decoded:
                continue
            if words:
                token = token[2:] if token.startswith("##") else " " + token
            words.append(_cleanup_piece(token))
        text = "".join(words)
        return _cleanup_text(text) if self.clean_up_spaces else text

    def _values(self):
        return {"kind": self.kind, "vocab": self.vocab, "do_lower_case": self.do_lower_case,
                "strip_accents": self.strip_accents, "tokenize_chinese_chars": self.tokenize_chinese_chars,
                "max_input_chars_per_word": self.max_input_chars_per_word, "specials": self.specials,
                "clean_up_spaces": self.clean_up_spaces, "never_decoded": sorted(self.never_decoded)}

    @classmethod
    def _from_values(cls, values):
        return cls(values["vocab"], values["do_lower_case"], values["strip_accents"],
                   values["tokenize_chinese_chars"], values["specials"], values["max_input_chars_per_word"],
                   values["clean_up_spaces"], values["never_decoded"])

    def save(self, folder):
        """vocab.txt, tokenizer_config.json and special_tokens_map.json: what transformers' AutoTokenizer reads."""
        folder = pathlib.Path(folder)
        write_atomic(folder / "vocab.txt", "".join(f"{token}\n" for token in self.vocab))
        names = {f"{role}_token": token for role, token in self.specials.items()}
        extra = sorted(self.never_decoded - set(self.specials.values()))
        if extra:
            names["additional_special_tokens"] = extra
        write_atomic(folder / "special_tokens_map.json", json.dumps(names, indent=2, ensure_ascii=False))
        write_atomic(folder / "tokenizer_config.json", json.dumps({
            "tokenizer_class": "BertTokenizer", "do_lower_case": self.do_lower_case,
            "strip_accents": self.strip_accents, "tokenize_chinese_chars": self.tokenize_chinese_chars,
            "clean_up_tokenization_spaces": self.clean_up_spaces, **names}, indent=2, ensure_ascii=False))


#: transformers' clean_up_tokenization: the spaces a WordPiece decode leaves before punctuation and contractions
CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
           (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def _cleanup_text(text):
    """transformers' clean_up_tokenization, when the folder's tokenizer_config.json asks for it."""
    for dirty, clean in CLEANUP:
        text = text.replace(dirty, clean)
    return text


def _cleanup_piece(token):
    """The WordPiece decoder's cleanup of one piece (with its leading space): the same, and " do not"."""
    return _cleanup_text(token).replace(" do not", " don't")


def read_vocab_txt(path):
    """vocab.txt's tokens, one a line (its newline the only character taken off, as transformers reads it)."""
    try:
        text = pathlib.Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{path} is not UTF-8 (byte {error.start}: {error.reason}); a vocab.txt is UTF-8 text, "
                        "one token a line: copy it again from the model's folder") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise DataError(f"{path} is empty; a vocab.txt holds one token a line: copy it again from the model's folder")
    return lines


def _wordpiece_from_vocab_txt(folder, settings):
    path = pathlib.Path(folder) / "vocab.txt"
    accents = settings.get("strip_accents")
    return WordPieceTokenizer(read_vocab_txt(path), settings.get("do_lower_case", True),
                              accents if accents in (True, False) else None,
                              settings.get("tokenize_chinese_chars", True), _specials_from(settings, bpe=False),
                              clean_up_spaces=bool(settings.get("clean_up_tokenization_spaces", False)),
                              never_decoded=_additional(settings), origin=str(path))


def _additional(settings):
    return [_token_text(t) for t in settings.get("additional_special_tokens") or [] if _token_text(t)]


def _wordpiece_from_json(path, data, settings):
    """A tokenizer.json whose model is WordPiece: its vocabulary, its BertNormalizer's settings and its special
    tokens."""
    model, normalizer = data["model"], data.get("normalizer") or {}
    if normalizer.get("type") != "BertNormalizer":
        raise DataError(f"{path} holds a WordPiece model with the normalizer {normalizer.get('type')!r}; "
                        "BERT's tokenizer.json has a BertNormalizer: read the folder's vocab.txt instead")
    pre = (data.get("pre_tokenizer") or {}).get("type")
    if pre != "BertPreTokenizer":
        raise DataError(f"{path} holds a WordPiece model with the pre-tokenizer {pre!r}; BERT's tokenizer.json has a "
                        "BertPreTokenizer: read the folder's vocab.txt instead")
    if model.get("continuing_subword_prefix", "##") != "##":
        raise DataError(f"{path}'s WordPiece continues words with {model['continuing_subword_prefix']!r}, not '##'; "
                        "only BERT's WordPiece is read")
    vocab_ids = model["vocab"]
    vocab = [None] * (max(vocab_ids.values(), default=-1) + 1)
    for token, i in vocab_ids.items():
        vocab[i] = token
    for added in data.get("added_tokens") or []:  # added tokens past the model's vocabulary
        if added["id"] >= len(vocab):
            vocab += [None] * (added["id"] + 1 - len(vocab))
        vocab[added["id"]] = vocab[added["id"]] or added["content"]
    if None in vocab:
        raise DataError(f"{path}'s vocabulary has no token for id {vocab.index(None)}; copy it again")
    specials = _specials_from(settings, bpe=False)
    specials["unk"] = model.get("unk_token") or specials["unk"]
    special_added = [added["content"] for added in data.get("added_tokens") or [] if added.get("special")]
    return WordPieceTokenizer(vocab, normalizer.get("lowercase", True), normalizer.get("strip_accents"),
                              normalizer.get("handle_chinese_chars", True), specials,
                              model.get("max_input_chars_per_word", MAX_INPUT_CHARS_PER_WORD),
                              bool(settings.get("clean_up_tokenization_spaces", False)), special_added,
                              origin=str(path))


# ---------------------------------------------------------------------------------------------------------------
# Byte-level BPE (RoBERTa), through the tokenizers package


class ByteLevelBPETokenizer(EncoderTokenizer):
    """RoBERTa's tokenizer: a ``tokenizers.Tokenizer`` (its byte-level pre-tokenizer, BPE, RobertaProcessing)."""
    kind = "bpe"

    def __init__(self, tokenizer, specials):
        self._tokenizer = tokenizer
        self._set_specials(specials)
        self._finish()

    @property
    def vocab_size(self):
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def token_id(self, token):
        i = self._tokenizer.token_to_id(token)
        if i is None:
            raise DataError(f"the tokenizer has no token {token!r}; a RoBERTa vocabulary holds <s>, </s>, <pad>, "
                            "<unk> and <mask>: copy vocab.json again from the model's folder")
        return i

    def encode(self, text, pair=None):
        """As transformers' RoBERTa tokenizer: ``<s> a </s></s> b </s>`` (``<mask>`` in the text takes the space
        before it where the folder says so); token types all 0 (RoBERTa has one row of them)."""
        encoding = self._tokenizer.encode(text, pair or None, add_special_tokens=True)
        return list(encoding.ids), [0] * len(encoding.ids)

    def tokens(self, ids):
        return [self._tokenizer.id_to_token(int(i)) for i in ids]

    def decode(self, ids):
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def _values(self):
        return {"kind": self.kind, "specials": self.specials, "tokenizer": self._tokenizer.to_str()}

    @classmethod
    def _from_values(cls, values):
        return cls(tokenizers_package("tokenizer.model").Tokenizer.from_str(values["tokenizer"]), values["specials"])

    def save(self, folder):
        """tokenizer.json and tokenizer_config.json: what transformers' AutoTokenizer reads."""
        folder = pathlib.Path(folder)
        write_atomic(folder / "tokenizer.json", self._tokenizer.to_str())
        names = {f"{role}_token": token for role, token in self.specials.items()}
        names.update(bos_token=self.specials["cls"], eos_token=self.specials["sep"])
        write_atomic(folder / "tokenizer_config.json", json.dumps({
            "tokenizer_class": "RobertaTokenizer", "add_prefix_space": False, "trim_offsets": True, **names},
            indent=2, ensure_ascii=False))


def _bpe_from_files(folder, settings):
    """vocab.json + merges.txt built into the tokenizer transformers' RobertaTokenizer builds from them."""
    tokenizers = tokenizers_package(f"the tokenizer of {folder} (RoBERTa's byte-level BPE)")
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
    folder = pathlib.Path(folder)
    vocab = _read_json(folder / "vocab.json")
    try:
        lines = (folder / "merges.txt").read_bytes().decode("utf-8").split("\n")
    except UnicodeDecodeError as error:
        raise DataError(f"{folder / 'merges.txt'} is not UTF-8 (byte {error.start}); copy it again") from None
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    bad = next((" ".join(m) for m in merges if len(m) != 2), None)
    if bad is not None:
        raise DataError(f"{folder / 'merges.txt'} has the line {bad!r}; expected two tokens a line: copy it again")
    specials = _specials_from(settings, bpe=True)
    prefix_space = bool(settings.get("add_prefix_space", False))
    try:
        tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, continuing_subword_prefix="",
                                                    end_of_word_suffix="", fuse_unk=False))
    except Exception as error:  # the tokenizers package raises a bare Exception
        raise DataError(f"{folder}'s vocab.json and merges.txt do not make a BPE ({error}); copy them again") from None
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(token, **_strips(settings, role, token), normalized=False, special=True)
                                  for role, token in specials.items()])
    for role, token in specials.items():
        if tokenizer.token_to_id(token) is None or token not in vocab:
            raise DataError(f"{folder / 'vocab.json'} lacks the special token {token}; a RoBERTa vocabulary holds "
                            "<s>, </s>, <pad>, <unk> and <mask>: copy it again from the model's folder")
    tokenizer.post_processor = processors.RobertaProcessing((specials["sep"], vocab[specials["sep"]]),
                                                            (specials["cls"], vocab[specials["cls"]]),
                                                            trim_offsets=True, add_prefix_space=prefix_space)
    return ByteLevelBPETokenizer(tokenizer, specials)


def _strips(settings, role, token):
    """Whether a special token takes the space before (lstrip) or after (rstrip) it: tokenizer_config.json's
    ``<role>_token`` or ``added_tokens_decoder`` entry says (roberta-base's ``<mask>``: lstrip); neither, as
    transformers reads a folder of vocab.json and merges.txt alone."""
    entries = [settings.get(f"{role}_token")] + list((settings.get("added_tokens_decoder") or {}).values())
    entry = next((e for e in entries if isinstance(e, dict) and e.get("content") == token), {})
    return {"lstrip": bool(entry.get("lstrip", False)), "rstrip": bool(entry.get("rstrip", False))}


def _bpe_from_json(path, data, settings):
    """A tokenizer.json whose model is BPE (``data``, its JSON read), through the tokenizers package."""
    tokenizers = tokenizers_package(f"{path} (RoBERTa's byte-level BPE)")
    try:  # the tokenizers package raises a bare Exception
        return ByteLevelBPETokenizer(tokenizers.Tokenizer.from_str(json.dumps(data)), _specials_from(settings, bpe=True))
    except Exception as error:
        if isinstance(error, DataError):
            raise
        raise DataError(f"{path} is no tokenizer the tokenizers package reads ({str(error).strip() or 'no reason'}); "
                        "copy it again from the model's folder") from None


# ---------------------------------------------------------------------------------------------------------------
# A folder's tokenizer, a run's tokenizer.model


def read_tokenizer(folder, hf_config=None):
    """The tokenizer of a BERT, DistilBERT or RoBERTa folder: its tokenizer.json (a WordPiece or a BPE model),
    else its vocab.txt (WordPiece) or vocab.json + merges.txt (byte-level BPE). ``hf_config``: the folder's
    config.json (its ``model_type`` names what was expected in the error lines). A one-line DataError for a folder
    with none of them, or a vocabulary without the special tokens, or not UTF-8."""
    folder = pathlib.Path(folder)
    settings = _folder_settings(folder)
    model_type = (hf_config or {}).get("model_type", "bert")
    path = folder / "tokenizer.json"
    if path.is_file():
        data = _read_json(path)
        model = data.get("model") if isinstance(data.get("model"), dict) else {}
        if model.get("type") == "WordPiece":
            try:
                return _wordpiece_from_json(path, data, settings)
            except (KeyError, TypeError, AttributeError, ValueError) as error:
                if isinstance(error, DataError):
                    raise
                raise DataError(f"{path}'s WordPiece model is not as transformers writes it ({type(error).__name__}: "
                                f"{error}); copy it again from the model's folder") from None
        if model.get("type") == "BPE":
            return _bpe_from_json(path, data, settings)
        raise DataError(f"{path} holds a {model.get('type')!r} model; a {model_type} folder's tokenizer.json holds "
                        "WordPiece (BERT, DistilBERT) or BPE (RoBERTa)")
    if (folder / "vocab.txt").is_file():
        return _wordpiece_from_vocab_txt(folder, settings)
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        return _bpe_from_files(folder, settings)
    expected = "vocab.json and merges.txt" if model_type == "roberta" else "vocab.txt"
    raise DataError(f"{folder} has no tokenizer: neither tokenizer.json nor {expected}; copy the tokenizer's files "
                    "from the model's Hugging Face folder")


def from_bytes(data, origin="tokenizer.model"):
    """The tokenizer a run keeps in its tokenizer.model (:meth:`EncoderTokenizer.model_bytes`)."""
    try:
        values = json.loads(bytes(data).decode("utf-8"))
        if not isinstance(values, dict) or values.get("format") != FORMAT:
            raise ValueError("not written by minitf's BERT tokenizer")
        cls = {"wordpiece": WordPieceTokenizer, "bpe": ByteLevelBPETokenizer}[values["kind"]]
        return cls._from_values(values)
    except DataError:
        raise
    except Exception as error:  # JSON, a missing key, the tokenizers package's bare Exception
        raise DataError(f"{origin} is not a BERT tokenizer written by minitf ({str(error).strip() or type(error).__name__}); "
                        "use the run's own tokenizer.model") from None


# ---------------------------------------------------------------------------------------------------------------
# A WordPiece vocabulary from training text


def train_wordpiece(texts, vocab_size, lowercase=True):
    """A WordPiece vocabulary of at most ``vocab_size`` tokens made from ``texts`` (deterministic: the same text
    gives the same vocabulary): [PAD]=0, [UNK], [CLS], [SEP], [MASK]; then every character that starts a word and
    every ``##`` character that continues one (most frequent first, as many as fit); then the pieces that BPE's
    merges make inside words, the most frequent pair of neighbouring pieces first (ties: the first in string
    order), until the vocabulary is full or no pair is left."""
    vocab_size = int(vocab_size)
    if vocab_size <= len(SPECIALS):
        raise DataError(f"a WordPiece vocabulary needs more than its {len(SPECIALS)} special tokens, got vocab size "
                        f"{vocab_size}; raise --vocab-size")
    counts = collections.Counter()
    for text in texts:
        counts.update(basic_tokenize(text, lowercase))
    if not counts:
        raise DataError("cannot make a WordPiece vocabulary from no text; expected a non-empty training text")
    words = sorted(counts)  # one order for every run
    splits = [[w[0]] + ["##" + ch for ch in w[1:]] for w in words]
    freq = [counts[w] for w in words]
    alphabet = collections.Counter()
    for split, f in zip(splits, freq):
        for piece in split:
            alphabet[piece] += f
    room = vocab_size - len(SPECIALS)
    vocab = list(SPECIALS) + [piece for piece, _ in sorted(alphabet.items(), key=lambda kv: (-kv[1], kv[0]))][:room]
    known = set(vocab)
    pairs, where = collections.Counter(), collections.defaultdict(set)
    for i, (split, f) in enumerate(zip(splits, freq)):
        for pair in zip(split, split[1:]):
            pairs[pair] += f
            where[pair].add(i)
    heap = [(-n, pair) for pair, n in pairs.items()]  # (minus the count, the pair): the most frequent first
    heapq.heapify(heap)
    while len(vocab) < vocab_size and heap:
        minus, (a, b) = heapq.heappop(heap)
        if pairs.get((a, b), 0) != -minus or minus >= 0:
            continue  # an entry whose count has changed since (its new count has its own entry)
        merged, changed = a + b[2:], set()
        for i in sorted(where.pop((a, b))):
            split, f = splits[i], freq[i]
            for pair in zip(split, split[1:]):  # this word's pairs leave the counts ...
                pairs[pair] -= f
                changed.add(pair)
            new, j = [], 0
            while j < len(split):
                if j + 1 < len(split) and split[j] == a and split[j + 1] == b:
                    new.append(merged)
                    j += 2
                else:
                    new.append(split[j])
                    j += 1
            splits[i] = new
            for pair in zip(new, new[1:]):  # ... and its new pairs come in
                pairs[pair] += f
                where[pair].add(i)
                changed.add(pair)
        for pair in sorted(changed):
            if pairs[pair] > 0:
                heapq.heappush(heap, (-pairs[pair], pair))
            else:
                del pairs[pair]
        if merged not in known:
            vocab.append(merged)
            known.add(merged)
    return WordPieceTokenizer(vocab, do_lower_case=lowercase, origin="the trained vocabulary")
