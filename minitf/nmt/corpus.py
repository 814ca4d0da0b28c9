"""The default corpus: the example sentences of the Ding German-English dictionary.

Fetched once from Debian's package ``trans-de-en`` (with apt where it exists,
else over HTTPS from Debian's archive with a pinned sha256), parsed into
sentence and phrase pairs, shuffled with a fixed seed, split into train / valid / test and
cached as plain text files that ``train.py`` then reads like any other corpus.
"""
import os
import pathlib
import re

from minitf.backend import host as np
from minitf.nmt.data import read_lines, write_lines
from minitf.nmt.errors import DataError
from minitf.nmt.fetch import DING_PACKAGE, fetch_default_corpus  # noqa: F401  (re-exported)

# --------------------------------------------------------------------------- parse Ding

# Annotations Ding puts around words: {f}, {m}, {vt}, [ugs.], [Br.], (explanations).
_ANNOTATION = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|\([^()]*\)")
# Placeholders mark a phrase pattern, not a sentence ("jdm. etw. geben", "to give sb. sth.").
_PLACEHOLDER = re.compile(r"(?<!\w)(?:etw|jdn|jdm|jds|sth|sb|so)\.|(?<!\w)sb['’]s(?!\w)|\.\.\.|…")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,;:!?])")


def _clean(text):
    """Strip Ding annotations and collapse whitespace."""
    previous = None
    while previous != text:  # nested brackets, e.g. "(a (b) c)"
        previous, text = text, _ANNOTATION.sub(" ", text)
    text = " ".join(text.split())
    return _SPACE_BEFORE_PUNCT.sub(r"\1", text)


def _is_sentence(text):
    """True for a whole sentence: capitalised, >= 3 words, final . ! ?, no placeholders."""
    return (len(text) > 0 and text[0].isupper() and text[-1] in ".!?"
            and len(text.split()) >= 3 and not _PLACEHOLDER.search(text))


def _is_phrase(text):
    """True for a multi-word phrase: 2 to 12 words, no sentence, no leftover markup."""
    return (2 <= len(text.split()) <= 12 and not _is_sentence(text)
            and not _MARKUP.search(text))


def _first_alternative(text):
    """``sheer/pure mockery`` -> ``sheer mockery``; ``/CRSR/``-style abbreviations dropped."""
    text = _ABBREVIATION.sub("", text)
    return " ".join(_ALTERNATIVES.sub(r"\1", text).split())


# Alternatives inside a phrase ("neighbours/neighbors"), an abbreviation "/CRSR/", and
# what is left of annotations split apart by "; " inside braces, or spaced alternatives.
_ALTERNATIVES = re.compile(r"([\w'’.-]+)(?:/[\w'’.-]+)+")
_ABBREVIATION = re.compile(r"\s*/[\w.-]+/")
_MARKUP = re.compile(r"[{}\[\]()<>/|;:]")


def _line_items(line):
    """The pairs of one Ding line (``de | de :: en | en``), in order, as
    ``(sentences, phrases)``: whole-sentence pairs, and multi-word phrase pairs."""
    if " :: " not in line:
        return [], []
    german, english = line.split(" :: ", 1)
    de_entries, en_entries = german.split(" | "), english.split(" | ")
    if len(de_entries) != len(en_entries):
        return [], []
    sentences, phrases = [], []
    for de_entry, en_entry in zip(de_entries, en_entries):
        de_syns, en_syns = de_entry.split("; "), en_entry.split("; ")
        if len(de_syns) != len(en_syns):
            if len(de_syns) != 1 and len(en_syns) != 1:
                continue
            # one sentence against several synonym translations: pair it with the first
            de_syns, en_syns = de_syns[:1], en_syns[:1]
        for de, en in zip(de_syns, en_syns):
            if _PLACEHOLDER.search(de) or _PLACEHOLDER.search(en):
                continue  # checked before cleaning too: "(etw.)" marks a pattern
            de, en = _clean(de), _clean(en)
            if _is_sentence(de) and _is_sentence(en):
                sentences.append((de, en))
                continue
            de, en = _first_alternative(de), _first_alternative(en)
            if _is_phrase(de) and _is_phrase(en):
                phrases.append((de, en))
    return sentences, phrases


def _line_pairs(line):
    """The sentence pairs of one Ding line, in order."""
    return _line_items(line)[0]


def parse_ding(path):
    """Extract whole-sentence German-English pairs from a Ding dictionary file.

    Lines look like ``de1 | de2 :: en1 | en2`` (``#`` starts a comment). Sub-entries
    pair up by position (a line whose sides have different counts is skipped);
    inside a sub-entry ``; `` separates synonyms, paired by position when both
    sides have as many, and a single entry against several is paired with the first. A pair is kept when both sides are whole sentences: an
    uppercase first letter, at least 3 words, a final ``.``, ``!`` or ``?``, and no
    placeholder (``etw.``, ``jdm.``, ``sth.``, ``sb.``, ``...``). Annotations
    (``{f}``, ``[ugs.]``, ``(...)``) are stripped and whitespace collapsed.

    Parameters
    ----------
    path : str or path-like
        The dictionary (UTF-8), e.g. from :func:`fetch_default_corpus`.

    Returns
    -------
    list of (str, str)
        Unique ``(german, english)`` pairs in order of first occurrence.
    """
    seen, pairs = set(), []
    for line in read_lines(path, "Ding dictionary", max_chars=None):
        if not line or line.startswith("#"):
            continue
        for pair in _line_pairs(line):
            if pair not in seen:
                seen.add(pair)
                pairs.append(pair)
    return pairs


def split_pairs(pairs, seed=1234, n_valid=500, n_test=500):
    """Shuffle a copy of ``pairs`` and cut it into train, valid and test.

    Parameters
    ----------
    pairs : sequence
        The items to split (left untouched).
    seed : int
        Seed of the shuffle; the same seed always gives the same split.
    n_valid, n_test : int
        Sizes of the validation and test sets; train gets the rest.

    Returns
    -------
    train, valid, test : list
    """
    n_valid, n_test = int(n_valid), int(n_test)
    if n_valid < 0 or n_test < 0:
        raise DataError(f"split sizes must be >= 0, got n_valid={n_valid}, n_test={n_test}")
    if n_valid + n_test >= len(pairs):
        raise DataError(f"cannot hold out {n_valid} valid + {n_test} test pairs from only "
                        f"{len(pairs)} pairs; use a bigger corpus or smaller held-out sets")
    order = np.random.default_rng(seed).permutation(len(pairs))
    shuffled = [pairs[i] for i in order.tolist()]
    valid, test = shuffled[:n_valid], shuffled[n_valid:n_valid + n_test]
    return shuffled[n_valid + n_test:], valid, test


def parse_ding_entries(path):
    """Every pair of a Ding dictionary file, with the entry (line) it came from.

    Returns
    -------
    list of (int, list of (str, str), list of (str, str))
        ``(line_number, sentences, phrases)`` for each line with at least one
        pair: the whole-sentence pairs :func:`parse_ding` keeps, and the
        multi-word phrase sub-entries (2 to 12 words a side, annotations
        stripped, ``a/b`` alternatives reduced to the first, no placeholders).
    """
    entries = []
    for number, line in enumerate(read_lines(path, "Ding dictionary", max_chars=None), start=1):
        if not line or line.startswith("#"):
            continue
        sentences, phrases = _line_items(line)
        if sentences or phrases:
            entries.append((number, sentences, phrases))
    return entries


def split_by_entry(entries, seed=1234, n_valid=500, n_test=500):
    """Held-out sentences as :func:`split_pairs` draws them, and a training set
    that shares no dictionary entry with them.

    The validation and test sets are the whole-sentence pairs that
    ``split_pairs(sentences, seed, n_valid, n_test)`` holds out (the same
    sentences as before phrases were added). Every line that holds one of them
    is held out whole: none of its sentences or phrases is trained on, and
    neither is any pair whose German or English side equals a held-out one.

    Returns
    -------
    dict
        ``train_sentences``, ``train_phrases``, ``valid``, ``test`` (lists of
        pairs) and ``stats`` (counts for the README and the log).
    """
    seen, sentences = set(), []
    for _, line_sentences, _ in entries:
        for pair in line_sentences:
            if pair not in seen:
                seen.add(pair)
                sentences.append(pair)
    old_train, valid, test = split_pairs(sentences, seed=seed, n_valid=n_valid, n_test=n_test)
    held = set(valid) | set(test)
    held_sides = {de for de, _ in held} | {en for _, en in held}
    clean_lines = [(s, p) for _, s, p in entries if not held.intersection(s)]

    def keep(pairs):
        out, kept = [], set()
        for pair in pairs:
            if pair in kept or pair in held or pair[0] in held_sides or pair[1] in held_sides:
                continue
            kept.add(pair)
            out.append(pair)
        return out

    train_sentences = keep(pair for s, _ in clean_lines for pair in s)
    sentence_set = set(train_sentences)
    train_phrases = [pair for pair in keep(pair for _, p in clean_lines for pair in p) if pair not in sentence_set]
    stats = dict(lines=len(entries), held_out_lines=len(entries) - len(clean_lines),
                 sentences=len(sentences), old_train_sentences=len(old_train),
                 train_sentences=len(train_sentences), train_phrases=len(train_phrases),
                 removed_sentences=len(set(old_train) - set(train_sentences)))
    return dict(train_sentences=train_sentences, train_phrases=train_phrases, valid=valid, test=test,
                stats=stats)


#: The cached split's folder: a new name whenever the split changes, so an old cache is never reused.
SPLIT_FOLDER = "ding-de-en-v2"


def default_corpus_splits(cache_dir, src_lang="de", tgt_lang="en", phrases=False):
    """Fetch the Ding dictionary, split it by entry (:func:`split_by_entry`, seed
    1234, 500 valid and 500 test sentences), cache the splits as text.

    The training split is the clean sentences plus, with ``phrases``, the phrase
    sub-entries (``train.*``); ``train-sentences.*`` holds the sentences alone.

    Returns
    -------
    dict
        ``{"train_src": path, "train_tgt": ..., "valid_src", "valid_tgt", "test_src", "test_tgt"}``,
        absolute paths of the cached split files.
    """
    folder = pathlib.Path(cache_dir) / SPLIT_FOLDER
    train = "train" if phrases else "train-sentences"
    names = {f"{s}_{side}": folder / f"{name}.{lang}"
             for s, name in (("train", train), ("valid", "valid"), ("test", "test"))
             for side, lang in (("src", src_lang), ("tgt", tgt_lang))}
    files = [folder / f"{n}.{lang}" for n in ("train", "train-sentences", "valid", "test") for lang in ("de", "en")]
    if not all(p.is_file() for p in files):
        split = split_by_entry(parse_ding_entries(fetch_default_corpus(cache_dir)), seed=1234)
        parts = {"train": split["train_sentences"] + split["train_phrases"],
                 "train-sentences": split["train_sentences"], "valid": split["valid"], "test": split["test"]}
        for name, pairs in parts.items():  # the held-out sets last: their presence marks a complete cache
            write_lines(folder / f"{name}.de", [de for de, _ in pairs])
            write_lines(folder / f"{name}.en", [en for _, en in pairs])
    return {k: os.path.abspath(v) for k, v in names.items()}
