"""The tokenizer of a Hugging Face Marian folder (the opus-mt models), read with the ``sentencepiece``
package, and the folder's generation settings (``generation_config.json``: :func:`read_generation_config`).

A Marian folder segments with two sentencepiece models, ``source.spm`` (the source text) and ``target.spm``
(target text), and maps the pieces to the model's ids with ``vocab.json``, one joint vocabulary (or
``vocab.json`` for the source and ``target_vocab.json`` for the target with ``separate_vocabs``). The
sentencepiece models' own ids are never used. Ids as transformers' ``MarianTokenizer`` (5.25) makes them:

- a text is first split at the special tokens written in it (``</s>``, ``<unk>``, ``<pad>``, each one id);
- a part that starts with a language code such as ``>>deu<<`` (``>>``, then up to the first ``<<``) keeps the
  code as one piece (multilingual models choose their target language so);
- the rest is segmented by sentencepiece; a piece missing from the vocabulary becomes ``<unk>``'s id;
- ``MarianTokenizer`` appends ``</s>`` to every text. :meth:`MarianTokenizer.encode` does not: minitf's batching
  adds the eos (``pad_batch(..., eos_id=tokenizer.eos_id)``), as for minitf's own tokenizer.

Decoding (``MarianTokenizer.decode(ids, skip_special_tokens=True)``): an id list is cut at its first eos (as
minitf's own tokenizer does), ``</s>``, ``<unk>`` and ``<pad>`` are dropped, ids become pieces through the
vocabulary, sentencepiece joins them, ``▁`` becomes a space and the ends are stripped. transformers 5.25
joins with the SOURCE model when the vocabulary is joint (``use_source_tokenizer`` defaults to ``not
separate_vocabs``) and with the target model otherwise; so does this (for ordinary pieces both join the same).

The interface is minitf's :class:`minitf.training.tokenizer.Tokenizer` (``encode``, ``decode``, ``vocab_size``,
``pad_id``, ``unk_id``, ``bos_id``, ``eos_id``, ``sha256``, ``model_bytes``/``from_bytes``), so translating and
the trainer use it unchanged; ``bos_id`` is the decoder's start token, Marian's ``<pad>``. :meth:`encode_target`
segments target text (fine-tuning's references). Bad files are one-line DataErrors naming the file.
"""
import base64
import dataclasses
import hashlib
import json
import pathlib
import re

from minitf import pretrained
from minitf.nmt.decode import HuggingFaceRules
from minitf.training.errors import DataError
from minitf.training.files import write_atomic

#: The "format" of a Marian tokenizer kept in a run's tokenizer.model (JSON; sentencepiece's is a protobuf).
MARIAN_FORMAT = "minitf-marian-1"
FILES = ("source.spm", "target.spm", "vocab.json")
_WORD_START = "\u2581"  # sentencepiece's "▁"


def _spm():
    try:
        import sentencepiece
    except ImportError:
        raise DataError("a Marian folder's tokenizer needs sentencepiece, which is not installed; "
                        "run: pip install sentencepiece") from None
    return sentencepiece


def _special(config, key, default):
    """A special token's text in tokenizer_config.json: a string, or a dict with "content" (re-saved copies)."""
    value = config.get(key, default)
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str) or not value:
        raise DataError(f"tokenizer_config.json: {key} is {config.get(key)!r}; expected a token such as {default!r}")
    return value


def _check_vocab(vocab, name):
    if not isinstance(vocab, dict) or not vocab:
        raise DataError(f"{name} is not a JSON object of pieces and ids; copy it again from the model's "
                        "Hugging Face folder")
    bad = next(((piece, i) for piece, i in vocab.items()
                if not (isinstance(i, int) and not isinstance(i, bool) and i >= 0)), None)
    if bad is not None:
        raise DataError(f"{name}: piece {bad[0]!r} has id {bad[1]!r}; every id must be an integer >= 0")
    return vocab


def _processor(spm, data, name, fix):
    """A loaded sentencepiece model of ``data``; a one-line DataError naming ``name`` for bytes it cannot load (an
    empty file loads nothing without a word and fails only at the first encoding: refused here)."""
    try:
        processor = spm.SentencePieceProcessor(model_proto=data) if data else None
        loaded = processor is not None and processor.get_piece_size() > 0
    except (RuntimeError, OSError, TypeError) as error:
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise DataError(f"{name} is not a sentencepiece model ({reason}); {fix}") from None
    if not loaded:
        raise DataError(f"{name} is {'empty (0 bytes)' if not data else 'a sentencepiece model of no pieces'}, "
                        f"not a sentencepiece model; {fix}")
    return processor


class MarianTokenizer:
    """The tokenizer of a Marian folder (see the module's docstring). Build it with :meth:`from_folder` (a
    Hugging Face folder) or :meth:`from_bytes` (a run's tokenizer.model)."""

    def __init__(self, source_spm, target_spm, vocab, target_vocab=None, config=None, origin="a Marian folder",
                 spm_names=None, fix="copy it again from the model's Hugging Face folder"):
        """``source_spm``, ``target_spm``: the serialized sentencepiece models (bytes); ``vocab`` (and
        ``target_vocab`` with separate vocabularies): piece -> id; ``config``: tokenizer_config.json's dict;
        ``spm_names``: how an error names the two models (default: "ORIGIN: source.spm"); ``fix``: what it says
        to do."""
        spm = _spm()
        config = dict(config or {})
        self.separate_vocabs = bool(config.get("separate_vocabs", False))
        if self.separate_vocabs and target_vocab is None:
            raise DataError(f"{origin}: tokenizer_config.json sets separate_vocabs but there is no "
                            "target_vocab.json; copy it from the model's Hugging Face folder")
        self._source_bytes, self._target_bytes = bytes(source_spm), bytes(target_spm)
        names = spm_names or (f"{origin}: source.spm", f"{origin}: target.spm")
        self._source, self._target = (_processor(spm, data, name, fix) for name, data in
                                      zip(names, (self._source_bytes, self._target_bytes)))
        self.vocab = _check_vocab(vocab, "vocab.json")
        self.target_vocab = _check_vocab(target_vocab, "target_vocab.json") if self.separate_vocabs else self.vocab
        self.config = config
        self.eos_token = _special(config, "eos_token", "</s>")
        self.unk_token = _special(config, "unk_token", "<unk>")
        self.pad_token = _special(config, "pad_token", "<pad>")
        for vocab_name, table in (("vocab.json", self.vocab), ("target_vocab.json", self.target_vocab)):
            for token in (self.eos_token, self.unk_token, self.pad_token):
                if token not in table:
                    raise DataError(f"{origin}: {vocab_name} has no {token!r}, which a Marian vocabulary needs; "
                                    "copy it again from the model's Hugging Face folder")
            if not self.separate_vocabs:
                break
        # special ids: the source vocabulary's (the target's agree in every opus-mt model; checked above to exist)
        specials = (self.eos_token, self.unk_token, self.pad_token)
        self.eos_id, self.unk_id, self.pad_id = (self.vocab[t] for t in specials)
        self.target_eos_id, self.target_unk_id, self.target_pad_id = (self.target_vocab[t] for t in specials)
        self.bos_id = self.target_pad_id  # Marian's decoder starts from <pad> (decoder_start_token_id)
        self._pieces = {i: piece for piece, i in self.target_vocab.items()}  # id -> piece (a duplicate id: the last)
        longest_first = sorted(set(specials), key=len, reverse=True)  # as transformers' trie: the longest match
        self._split = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")")
        self._skip = {self.target_eos_id, self.target_unk_id, self.target_pad_id}
        self.clean_up_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self._bytes = json.dumps({
            "format": MARIAN_FORMAT, "config": config, "vocab": self.vocab,
            "target_vocab": self.target_vocab if self.separate_vocabs else None,
            "source_spm": base64.b64encode(self._source_bytes).decode("ascii"),
            "target_spm": base64.b64encode(self._target_bytes).decode("ascii")},
            ensure_ascii=False, sort_keys=True).encode("utf-8")
        self.sha256 = hashlib.sha256(self._bytes).hexdigest()

    # -- reading and writing --------------------------------------------------------------------------
    @classmethod
    def from_folder(cls, folder):
        """The tokenizer of a Hugging Face Marian folder: source.spm, target.spm, vocab.json, optional
        tokenizer_config.json (and target_vocab.json where it sets separate_vocabs). A DataError names a
        missing or unreadable file."""
        folder = pathlib.Path(folder)
        missing = [name for name in FILES if not (folder / name).is_file()]
        if missing:
            raise DataError(f"{folder} has no {' or '.join(missing)}; a Marian folder's tokenizer is source.spm, "
                            "target.spm and vocab.json: copy them from the model's Hugging Face folder")

        def read_json(name):
            try:
                return json.loads((folder / name).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
                raise DataError(f"{folder / name} is not readable JSON ({error}); copy it again from the "
                                "model's Hugging Face folder") from None

        config = read_json("tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
        if not isinstance(config, dict):
            raise DataError(f"{folder / 'tokenizer_config.json'} is not a JSON object; copy it again from the "
                            "model's Hugging Face folder")
        target_vocab = None
        if config.get("separate_vocabs"):
            if not (folder / "target_vocab.json").is_file():
                raise DataError(f"{folder} has no target_vocab.json, which its tokenizer_config.json's "
                                "separate_vocabs needs; copy it from the model's Hugging Face folder")
            target_vocab = read_json("target_vocab.json")
        try:
            source, target = ((folder / name).read_bytes() for name in ("source.spm", "target.spm"))
        except OSError as error:
            raise DataError(f"cannot read {error.filename} ({error.strerror or error}); check its "
                            "permissions") from None
        vocab = read_json("vocab.json")
        return cls(source, target, vocab, target_vocab, config, origin=str(folder),
                   spm_names=(str(folder / "source.spm"), str(folder / "target.spm")))

    @classmethod
    def from_bytes(cls, data, origin="tokenizer.model"):
        """The tokenizer kept by :meth:`model_bytes` (a run's tokenizer.model)."""
        try:
            values = json.loads(bytes(data).decode("utf-8"))
            if not isinstance(values, dict) or values.get("format") != MARIAN_FORMAT:
                raise ValueError("not a Marian tokenizer")
            source, target = (base64.b64decode(values[key], validate=True) for key in ("source_spm", "target_spm"))
            vocab, target_vocab, config = values["vocab"], values["target_vocab"], values["config"]
        except (ValueError, UnicodeDecodeError, KeyError, TypeError) as error:
            raise DataError(f"{origin} is not a Marian tokenizer written by minitf ({error}); use the run's own "
                            "tokenizer.model") from None
        return cls(source, target, vocab, target_vocab, config, origin=origin,
                   fix="restore the run's tokenizer.model from one of its checkpoints")

    def model_bytes(self):
        """Everything the tokenizer is (both sentencepiece models, the vocabularies, the config) as JSON bytes."""
        return self._bytes

    def save(self, folder):
        """Write the tokenizer's files into ``folder`` (each atomically) as a Hugging Face Marian folder holds
        them: source.spm, target.spm, vocab.json (target_vocab.json), tokenizer_config.json."""
        folder = pathlib.Path(folder)
        write_atomic(folder / "source.spm", self._source_bytes)
        write_atomic(folder / "target.spm", self._target_bytes)
        files = {"vocab.json": self.vocab, "tokenizer_config.json": self.config}
        if self.separate_vocabs:
            files["target_vocab.json"] = self.target_vocab
        for name, values in files.items():
            write_atomic(folder / name, json.dumps(values, ensure_ascii=False, indent=2) + "\n")

    # -- ids --------------------------------------------------------------------------------------------
    @property
    def vocab_size(self):
        """Ids of the source vocabulary: its largest id + 1 (= its size in every opus-mt model)."""
        return max(self.vocab.values()) + 1

    @property
    def target_vocab_size(self):
        return max(self.target_vocab.values()) + 1

    def check_fits(self, model, folder):
        """A one-line DataError, naming the file, where the tokenizer does not fit ``model`` (the
        :class:`minitf.TransformerConfig` of the folder's config.json): an id of vocab.json (target_vocab.json) beyond the source
        (target) vocabulary; a pad or eos id (vocab.json's id of tokenizer_config.json's token) not
        config.json's pad_token_id, eos_token_id; the target vocabulary's special ids not the source's. Each is
        another model's files; the model would mask one pad and the batches pad with another."""
        folder = pathlib.Path(folder)
        for what, ids, vocab in (("vocab.json", self.vocab_size, model.src_vocab_size),
                                 ("target_vocab.json" if self.separate_vocabs else "vocab.json",
                                  self.target_vocab_size, model.tgt_vocab_size)):
            if ids > vocab:
                raise DataError(f"{folder / what} has ids up to {ids - 1} but the model's vocabulary "
                                f"has {vocab}; the tokenizer's files belong to another model: copy this model's")
        ours = {"pad_token_id": self.pad_id, "eos_token_id": self.eos_id}
        eos = model.eos_id
        theirs = {"pad_token_id": model.pad_id, "eos_token_id": self.eos_id if eos is None else eos}
        target = {"pad_token_id": self.target_pad_id, "eos_token_id": self.target_eos_id}
        wrong = [f"config.json's {key} {theirs[key]} (the tokenizer's: {ours[key]})" for key in ours
                 if ours[key] != theirs[key]]
        wrong += [f"the target vocabulary's {key[:-9]} {target[key]} (the source's: {ours[key]})" for key in ours
                  if target[key] != ours[key]]
        if wrong:
            raise DataError(f"{folder}: {', '.join(wrong)} {'do' if len(wrong) > 1 else 'does'} not fit its "
                            "tokenizer's files (vocab.json, tokenizer_config.json); they belong to different "
                            "models: copy the model's own files")

    def pieces(self, text, target=False):
        """The pieces of one text as ``MarianTokenizer.tokenize`` gives them (no ``</s>``)."""
        processor = self._target if target else self._source
        pieces = []
        for part in self._split.split(text):  # the special tokens written in the text are parts of their own
            if not part:
                continue
            if part in (self.eos_token, self.unk_token, self.pad_token):
                pieces.append(part)
                continue
            if part.startswith(">>") and (end := part.find("<<")) != -1:  # a language code: one piece
                pieces.append(part[:end + 2])
                part = part[end + 2:]
            pieces.extend(processor.encode(part, out_type=str))
        return pieces

    def _encode(self, texts, target):
        if isinstance(texts, str):
            raise TypeError("MarianTokenizer.encode takes a list of strings; wrap one text as [text]")
        table = self.target_vocab if target else self.vocab
        unk = self.target_unk_id if target else self.unk_id
        return [[table.get(piece, unk) for piece in self.pieces(text, target)] for text in texts]

    def unknown_pieces(self, text, target=False):
        """What of ``text`` became ``<unk>``'s id, read from its pieces (the ids :meth:`encode` gives, or
        :meth:`encode_target`'s): each piece the vocabulary lacks, as the text that produced it (a word piece
        without its word-start mark, a language code whole), in order. A ``<unk>`` written in the text is no
        unknown text."""
        table = self.target_vocab if target else self.vocab
        return [piece.replace(_WORD_START, "") or piece for piece in self.pieces(text, target) if piece not in table]

    def encode(self, texts):
        """Source ids of each text of a list, as ``MarianTokenizer(texts)`` without the final ``</s>``."""
        return self._encode(texts, target=False)

    def encode_target(self, texts):
        """Target ids of each text (``MarianTokenizer(text_target=texts)`` without the final ``</s>``)."""
        return self._encode(texts, target=True)

    def decode(self, id_lists):
        """Text of each id list or 1-D array: cut at the first eos, then as ``MarianTokenizer.decode(ids,
        skip_special_tokens=True)``."""
        processor = self._target if self.separate_vocabs else self._source  # as transformers 5.25 (see above)
        texts = []
        for ids in id_lists:
            ids = [int(i) for i in ids]
            if self.target_eos_id in ids:
                ids = ids[:ids.index(self.target_eos_id)]
            pieces = [self._piece(i, processor) for i in ids if i not in self._skip]
            text = processor.decode_pieces(pieces).replace(_WORD_START, " ").strip()
            texts.append(_clean_up(text) if self.clean_up_spaces else text)
        return texts

    def _piece(self, i, processor):
        if i in self._pieces:
            return self._pieces[i]
        # an id the vocabulary lacks: sentencepiece's own piece of that id, as transformers does, else <unk>
        return processor.id_to_piece(i) if 0 <= i < processor.get_piece_size() else self.unk_token

    def __reduce__(self):
        # pickle (for data-loading processes) as the model bytes: sentencepiece processors are not picklable
        return (MarianTokenizer.from_bytes, (self._bytes,))

    def __repr__(self):
        return f"MarianTokenizer(vocab_size={self.vocab_size}, sha256={self.sha256[:12]}...)"


def check_tokenizer(folder, model):
    """The Marian tokenizer of ``folder``, checked against its model (``model``: the TransformerConfig of its
    config.json; :meth:`MarianTokenizer.check_fits`). The one check of every command that reads a Marian
    folder: ``translate``, ``inspect``, ``export`` (:meth:`minitf.nmt.kind.TranslationKind.load_folder`) and
    ``train.py --init-from``. A one-line DataError names the file."""
    tokenizer = MarianTokenizer.from_folder(folder)
    tokenizer.check_fits(model, folder)
    return tokenizer


def _clean_up(text):
    """transformers' ``clean_up_tokenization`` (used where tokenizer_config.json sets
    clean_up_tokenization_spaces)."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


# --------------------------------------------------------------------------- #
# generation_config.json: how transformers' generate() decodes the folder's model
# --------------------------------------------------------------------------- #
@dataclasses.dataclass(frozen=True)
class GenerationSettings:
    """A folder's decoding settings in minitf's terms: ``num_beams`` (1: greedy); ``max_len`` (the most
    tokens of an output counting eos: generate's ``max_length`` less the start token, or ``max_new_tokens``);
    ``min_len`` (fewest tokens before eos); ``rules`` (:class:`minitf.nmt.decode.HuggingFaceRules`)."""
    num_beams: int
    max_len: int
    min_len: int
    rules: HuggingFaceRules


#: Entries of generation_config.json that change what generate() outputs and minitf does not compute, with
#: the value that changes nothing (transformers' default): any other value is refused, never ignored.
UNSUPPORTED = {"do_sample": False, "num_beam_groups": 1, "diversity_penalty": 0.0, "repetition_penalty": 1.0,
               "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0,
               "forced_bos_token_id": None, "suppress_tokens": None, "begin_suppress_tokens": None,
               "sequence_bias": None, "exponential_decay_length_penalty": None, "guidance_scale": None,
               "force_words_ids": None, "constraints": None, "remove_invalid_values": False, "penalty_alpha": None,
               "prompt_lookup_num_tokens": None, "low_memory": None}
#: transformers' default where neither file has max_length nor max_new_tokens: 20 new tokens (5.25: generation/utils.py
#: ``_prepare_generated_length``, "by default let's always generate 20 new tokens", the start token not counted)
DEFAULT_NEW_TOKENS = 20
#: |length_penalty| above this is refused (|Y| ** it overflows; opus-mt uses 1.0)
MAX_LENGTH_PENALTY = 10.0


def _one_id(value, key, where):
    """An id given as an int or a list of one int (eos_token_id may be either); a ValueError otherwise."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not (isinstance(value, int) and not isinstance(value, bool)):
        raise ValueError(f"{where}: {key} is {value!r}; minitf decodes with one id there (an integer)")
    return value


def read_generation_json(folder):
    """The folder's generation_config.json as a dict, or None where it has none. A one-line ValueError for a
    file that is not a JSON object."""
    path = pathlib.Path(folder) / "generation_config.json"
    if not path.is_file():
        return None
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not readable JSON ({error}); write it again or delete it (config.json's "
                         "entries are used then)") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path} is not a JSON object; write it again or delete it")
    return values


def read_generation_config(folder, hf_config):
    """The :class:`GenerationSettings` of a Marian folder: its generation_config.json, else the same entries of
    config.json (``hf_config``), as transformers falls back; absent entries take generate()'s defaults
    (num_beams 1, 20 new tokens, length_penalty 1.0, early_stopping False, renormalize_logits False, no forced
    eos, no banned ids). A one-line ValueError names an entry of the wrong type or range, one that disagrees
    with config.json's ids, or one minitf does not compute (:data:`UNSUPPORTED`, multi-token bad_words_ids)."""
    folder = pathlib.Path(folder)
    values, where = read_generation_json(folder), str(folder / "generation_config.json")
    if values is None:
        values, where = hf_config, str(folder / "config.json")
    values = {key: v for key, v in values.items() if v is not None}  # null: unset, as transformers reads it

    def value(key, kind, default, **checks):
        return pretrained.config_value(values, key, kind, default, where=where, **checks)

    for key, unchanged in UNSUPPORTED.items():
        if values.get(key) not in (None, [], {}, unchanged):
            raise ValueError(f"{where}: {key} is {values[key]!r}; minitf.translate decodes by greedy or beam search "
                             f"without it: set it to {json.dumps(unchanged)} (transformers' default) or remove it")
    vocab = hf_config.get("decoder_vocab_size") or hf_config.get("vocab_size")
    eos = _one_id(values.get("eos_token_id", hf_config.get("eos_token_id")), "eos_token_id", where)
    for key in ("eos_token_id", "decoder_start_token_id", "pad_token_id"):
        if key in values and values[key] is not None and key in hf_config and \
                _one_id(values[key], key, where) != hf_config[key]:
            raise ValueError(f"{where}: {key} is {values[key]!r} but config.json's is {hf_config[key]!r}; "
                             "make them agree (config.json's is the model's)")
    forced = values.get("forced_eos_token_id")
    if forced is not None and _one_id(forced, "forced_eos_token_id", where) != eos:
        raise ValueError(f"{where}: forced_eos_token_id is {forced!r}, not the eos_token_id {eos}; minitf forces "
                         "the eos only: set it to the eos_token_id or remove it")
    banned = []
    for words in values.get("bad_words_ids") or []:
        if not (isinstance(words, list) and len(words) == 1 and isinstance(words[0], int)
                and not isinstance(words[0], bool) and 0 <= words[0] < (vocab or words[0] + 1)):
            raise ValueError(f"{where}: bad_words_ids holds {words!r}; minitf bans single tokens only "
                             f"(lists of one id below the vocabulary size {vocab}), such as [[pad_token_id]]")
        if words[0] != eos:  # transformers never bans the eos through bad_words_ids
            banned.append(words[0])
    early = values.get("early_stopping", False)
    if early not in (False, True, "never"):
        raise ValueError(f"{where}: early_stopping is {early!r}; it must be true, false or \"never\"")
    max_new = value("max_new_tokens", "int", None, low=1)
    max_length = value("max_length", "int", None, low=2)
    min_length = value("min_length", "int", 0, low=0)
    min_new = value("min_new_tokens", "int", None, low=0)
    penalty = float(value("length_penalty", "float", 1.0, low=-MAX_LENGTH_PENALTY, high=MAX_LENGTH_PENALTY))
    rules = HuggingFaceRules(length_penalty=penalty, early_stopping=early,
                             renormalize=value("renormalize_logits", "bool", False), forced_eos=forced is not None,
                             banned_ids=tuple(banned))
    return GenerationSettings(num_beams=value("num_beams", "int", 1, low=1),
                              max_len=max_new if max_new is not None else  # max_length counts the start token
                              DEFAULT_NEW_TOKENS if max_length is None else max_length - 1,
                              min_len=max(min_length - 1, min_new or 0), rules=rules)
