"""The corpora, each fetched, verified, unpacked and split once under ``--cache-dir``: the default Ding
German-English dictionary (Debian's ``trans-de-en``: apt, else the pinned .deb over HTTPS) as text files, and
WMT 2014 English-German (the paper's) from pinned archives as memory-mapped token arrays."""
import dataclasses
import os
import pathlib
import re
import shutil
import tarfile

from minitf.backend import host as np
from minitf.training.text import read_lines, write_lines
from minitf.training.debian import DEBIAN_ARCHIVE, MIRROR_VARIABLE, DebianPackage, extract_member, fetch_package
from minitf.training.debian import make_cache as _make_cache
from minitf.training.download import DEFAULT_CACHE, download, mirror_base, sigterm_raises  # noqa: F401 (DEFAULT_CACHE)
from minitf.training.errors import DataError
from minitf.training.files import atomic_writer
from minitf.nmt.prepare import prepare_corpus


DING_PACKAGE = "trans-de-en"
DING_MEMBER = pathlib.Path("usr/share/trans/de-en")
#: Fetched over HTTPS where apt is missing or fails; the file ``apt-get download trans-de-en`` gives on Debian 12.
DING_DEB = "trans-de-en_1.9-6_all.deb"
DING_DEB_PATH = "pool/main/d/ding/" + DING_DEB
DING_DEB_SHA256 = "45f6b4cf1c434776fba6811d7bc522efabb5425c43ba8afd0e289bf9e2e53df4"
DING_DEB_SIZE = 6276816
#: The archive's permanent copy of the same file, by its sha1 (tried when the pool no longer has it).
DING_DEB_SNAPSHOT = "https://snapshot.debian.org/file/72c711ad89bff6de764306923b6d65ed49779bc2"

_CORPUS_HINT = ("pass your own corpus with --train-src/--train-tgt --valid-src/--valid-tgt "
                "(plain UTF-8 text, one sentence per line)")


def fetch_default_corpus(cache_dir, use_apt=None, base_url=None, progress=True):
    """The Ding dictionary file ``CACHE/trans-de-en/usr/share/trans/de-en``, fetched once by
    :func:`minitf.training.debian.fetch_package` (apt, else the pinned .deb from ``base_url``, default
    ``MINITF_DEBIAN_MIRROR`` or Debian's archive, then its snapshot; a cut download resumed next time). The file
    is renamed into place whole; temp files go on success, error and SIGTERM. A one-line DataError says why not."""
    cache_dir = pathlib.Path(cache_dir)
    corpus = cache_dir / DING_PACKAGE / DING_MEMBER
    if corpus.is_file():
        return corpus
    package = DebianPackage(DING_PACKAGE, DING_DEB_PATH, DING_DEB_SIZE, DING_DEB_SHA256, DING_DEB_SNAPSHOT)
    fetch_package(package, cache_dir, lambda deb: _unpack_dictionary(deb, corpus, cache_dir), hint=_CORPUS_HINT,
                  use_apt=use_apt, base_url=base_url, progress=progress)
    return corpus


def _unpack_dictionary(deb, corpus, cache_dir):
    """Unpack :data:`DING_MEMBER` of ``deb`` into a temp file in ``cache_dir``, then rename it to ``corpus``."""
    with atomic_writer(corpus, temp_dir=cache_dir) as out:
        try:
            extract_member(deb, DING_MEMBER.as_posix(), out)
        except DataError as error:
            raise DataError(f"{deb.name}: {error}; {_CORPUS_HINT}") from None


# Annotations Ding puts around words: {f}, {m}, {vt}, [ugs.], [Br.], (explanations).
_ANNOTATION = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|\([^()]*\)")
# Placeholders mark a phrase pattern, not a sentence ("jdm. etw. geben", "to give sb. sth.").
_PLACEHOLDER = re.compile(r"(?<!\w)(?:etw|jdn|jdm|jds|sth|sb|so)\.|(?<!\w)sb['’]s(?!\w)|\.\.\.|…")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,;:!?])")
# Alternatives ("neighbours/neighbors"), an abbreviation "/CRSR/", and leftover markup (annotations split by "; ").
_ALTERNATIVES = re.compile(r"([\w'’.-]+)(?:/[\w'’.-]+)+")
_ABBREVIATION = re.compile(r"\s*/[\w.-]+/")
_MARKUP = re.compile(r"[{}\[\]()<>/|;:]")


def _clean(text):
    """Strip Ding annotations and collapse whitespace."""
    previous = None
    while previous != text:  # nested brackets, e.g. "(a (b) c)"
        previous, text = text, _ANNOTATION.sub(" ", text)
    return _SPACE_BEFORE_PUNCT.sub(r"\1", " ".join(text.split()))


def _is_sentence(text):
    """True for a whole sentence: capitalised, >= 3 words, final . ! ?, no placeholders."""
    return (len(text) > 0 and text[0].isupper() and text[-1] in ".!?"
            and len(text.split()) >= 3 and not _PLACEHOLDER.search(text))


def _is_lexicon_item(text):
    """True for a headword or phrase: 1 to 12 words, no sentence, no leftover markup."""
    return 1 <= len(text.split()) <= 12 and not _is_sentence(text) and not _MARKUP.search(text)


def _is_phrase(pair):
    """True for a lexicon pair of at least two words a side (``--phrases``)."""
    return all(len(side.split()) >= 2 for side in pair)


def _first_alternative(text):
    """``sheer/pure mockery`` -> ``sheer mockery``; ``/CRSR/``-style abbreviations dropped."""
    return " ".join(_ALTERNATIVES.sub(r"\1", _ABBREVIATION.sub("", text)).split())


def _line_items(line):
    """``(sentences, lexicon)``: the sentence pairs and the headword and phrase pairs of one Ding line
    ``de | de :: en | en``."""
    if " :: " not in line:
        return [], []
    german, english = line.split(" :: ", 1)
    de_entries, en_entries = german.split(" | "), english.split(" | ")
    if len(de_entries) != len(en_entries):
        return [], []
    sentences, lexicon = [], []
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
            if _is_lexicon_item(de) and _is_lexicon_item(en):
                lexicon.append((de, en))
    return sentences, lexicon


def split_pairs(pairs, seed=1234, n_valid=500, n_test=500):
    """Shuffle a copy of ``pairs`` with ``seed`` (same seed, same split) and cut it into lists
    ``train, valid, test`` of ``len(pairs) - n_valid - n_test``, ``n_valid`` and ``n_test`` items."""
    n_valid, n_test = int(n_valid), int(n_test)
    if n_valid < 0 or n_test < 0:
        raise DataError(f"split sizes must be >= 0, got n_valid={n_valid}, n_test={n_test}")
    if n_valid + n_test >= len(pairs):
        raise DataError(f"cannot hold out {n_valid} valid + {n_test} test pairs from only "
                        f"{len(pairs)} pairs; use a bigger corpus or smaller held-out sets")
    order = np.random.default_rng(seed).permutation(len(pairs))
    shuffled = [pairs[i] for i in order.tolist()]
    return shuffled[n_valid + n_test:], shuffled[:n_valid], shuffled[n_valid:n_valid + n_test]


def parse_ding_entries(path):
    """``[(line_number, sentences, lexicon)]`` for each line ``de1 | de2 :: en1 | en2`` of a Ding file with a pair
    (``#`` starts a comment). Sub-entries, and ``; ``-separated synonyms, pair by position (a line with unequal
    sides is skipped; a single synonym against several takes the first); annotations are stripped. Sentences:
    capitalised, >= 3 words, a final ``.!?``, no placeholder (``etw.``, ``jdm.``, ``sth.``, ``sb.``, ``...``);
    lexicon: headwords and phrases of 1 to 12 words a side, ``a/b`` reduced to ``a``, no placeholders."""
    entries = []
    for number, line in enumerate(read_lines(path, "Ding dictionary", max_chars=None), start=1):
        if not line or line.startswith("#"):
            continue
        sentences, lexicon = _line_items(line)
        if sentences or lexicon:
            entries.append((number, sentences, lexicon))
    return entries


def unique_sentences(entries):
    """The sentence pairs of ``entries`` (:func:`parse_ding_entries`), each once, in order of first occurrence."""
    return list(dict.fromkeys(pair for _, line_sentences, _ in entries for pair in line_sentences))


def split_by_entry(entries, seed=1234, n_valid=500, n_test=500):
    """Held-out sentences as :func:`split_pairs` draws them, and a training set sharing no entry with them.

    Valid and test are the sentence pairs ``split_pairs(sentences, seed, n_valid, n_test)`` holds out. Every
    line holding one of them is held out whole, and so is any pair with a German or English side equal to a
    held-out one. Returns a dict of ``train_sentences``, ``train_lexicon`` (headwords and phrases),
    ``train_phrases`` (the lexicon's pairs of 2+ words a side), ``valid``, ``test`` (lists of pairs) and
    ``stats`` (counts for the README and the log).
    """
    sentences = unique_sentences(entries)
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
    train_lexicon = [pair for pair in keep(pair for _, p in clean_lines for pair in p) if pair not in sentence_set]
    train_phrases = [pair for pair in train_lexicon if _is_phrase(pair)]
    stats = dict(lines=len(entries), held_out_lines=len(entries) - len(clean_lines),
                 sentences=len(sentences), old_train_sentences=len(old_train),
                 train_sentences=len(train_sentences), train_lexicon=len(train_lexicon),
                 train_phrases=len(train_phrases), removed_sentences=len(set(old_train) - set(train_sentences)))
    return dict(train_sentences=train_sentences, train_lexicon=train_lexicon, train_phrases=train_phrases,
                valid=valid, test=test, stats=stats)


#: The cached split's folder: a new name whenever the split changes, so an old cache is never reused.
SPLIT_FOLDER = "ding-de-en-v2"


def default_corpus_splits(cache_dir, src_lang="de", tgt_lang="en", phrases=False, lexicon=False):
    """Fetch the Ding dictionary, split it by entry (:func:`split_by_entry`, seed 1234, 500 valid and 500
    test sentences) and cache the splits as text; returns absolute paths ``{"train_src", "train_tgt",
    "valid_src", "valid_tgt", "test_src", "test_tgt"}`` (with ``lexicon``, also ``lexicon_src`` and
    ``lexicon_tgt``: ``lexicon.*``, the headwords and phrases ``--lexicon`` samples from). Training is the
    sentences plus, with ``phrases``, the phrase sub-entries (``train.*``); ``train-sentences.*`` holds the
    sentences alone."""
    folder = pathlib.Path(cache_dir) / SPLIT_FOLDER
    splits = {"train": "train" if phrases else "train-sentences", "valid": "valid", "test": "test"}
    if lexicon:
        splits["lexicon"] = "lexicon"
    names = {f"{s}_{side}": folder / f"{name}.{lang}"
             for s, name in splits.items() for side, lang in (("src", src_lang), ("tgt", tgt_lang))}
    files = [folder / f"{n}.{lang}" for n in ("train", "train-sentences", "lexicon", "valid", "test")
             for lang in ("de", "en")]
    if not all(p.is_file() for p in files):
        split = split_by_entry(parse_ding_entries(fetch_default_corpus(cache_dir)), seed=1234)
        parts = {"train": split["train_sentences"] + split["train_phrases"],
                 "train-sentences": split["train_sentences"], "lexicon": split["train_lexicon"],
                 "valid": split["valid"], "test": split["test"]}
        for name, pairs in parts.items():  # the held-out sets last: their presence marks a complete cache
            write_lines(folder / f"{name}.de", [de for de, _ in pairs])
            write_lines(folder / f"{name}.en", [en for _, en in pairs])
    return {k: os.path.abspath(v) for k, v in names.items()}


# WMT 2014 English-German as fairseq's ``prepare-wmt14en2de.sh --icml17``: 4.5 million training pairs, newstest2013
# to validate, newstest2014 to test (all 3,003 sentences, from SGM as sacreBLEU reads it). The archives are pinned
# by size and sha256 (tensorflow/datasets' values); both test sets come from WMT 2019's pinned dev.tgz (WMT 2014's
# own are unpinned, never used). Disk: archives 1.7 GB, text 1.3 GB, prepared arrays about 0.5 GB.
#: A base URL with the archives by file name under it (a local mirror, a test's server) replaces their addresses.
WMT14_MIRROR_ENV = "MINITF_WMT_MIRROR"
WMT14_FOLDER = "wmt14-en-de"
#: The paper's shared vocabulary: "about 37000 tokens".
WMT14_VOCAB_SIZE = 37000
WMT14_HINT = (f"set {WMT14_MIRROR_ENV} to a mirror that holds the archives by file name, or train on your own "
              "files with --train-src/--train-tgt")


@dataclasses.dataclass(frozen=True)
class Archive:
    """One pinned download (``size`` in bytes) and ``members``: ``{name under text/: member path}``."""
    url: str
    size: int
    sha256: str
    members: dict

    @property
    def filename(self):
        return self.url.rsplit("/", 1)[-1]


WMT14_ARCHIVES = {
    "europarl-v7": Archive(
        "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz", 657632379,
        "0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7",
        {"europarl-v7.en": "training/europarl-v7.de-en.en", "europarl-v7.de": "training/europarl-v7.de-en.de"}),
    "commoncrawl": Archive(
        "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz", 918311367,
        "c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5",
        {"commoncrawl.en": "commoncrawl.de-en.en", "commoncrawl.de": "commoncrawl.de-en.de"}),
    "news-commentary-v9": Archive(
        "https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz", 80418416,
        "cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485",
        {"news-commentary-v9.en": "training/news-commentary-v9.de-en.en",
         "news-commentary-v9.de": "training/news-commentary-v9.de-en.de"}),
    "dev": Archive(
        "https://data.statmt.org/wmt19/translation-task/dev.tgz", 38654961,
        "7a7deccf82ebb05ba508dba5eb21356492224e8f630ec4f992132b029b4b25e7",
        {"newstest2013.en": "dev/newstest2013.en", "newstest2013.de": "dev/newstest2013.de",
         "newstest2014.en": "dev/newstest2014-deen-src.en.sgm", "newstest2014.de": "dev/newstest2014-deen-ref.de.sgm"}),
}
WMT14_TRAIN = ("europarl-v7", "commoncrawl", "news-commentary-v9")


def archive_urls(archive):
    """The URL to fetch ``archive`` from: under ``MINITF_WMT_MIRROR`` when set, else its own."""
    base = mirror_base(WMT14_MIRROR_ENV, "")
    return [f"{base}/{archive.filename}"] if base else [archive.url]


def fetch_archives(folder, archives=None, progress=True, log=print):
    """Download every archive once into ``folder`` (kept: a rebuild needs no network); ``{name: path}``."""
    archives = WMT14_ARCHIVES if archives is None else archives
    folder = pathlib.Path(folder)
    _make_cache(folder)
    paths = {}
    for name, archive in archives.items():
        if not (isinstance(archive.sha256, str) and len(archive.sha256) == 64):
            raise DataError(f"{archive.filename} has no pinned sha256, so it is not fetched; {WMT14_HINT}")
        try:
            paths[name] = download(archive_urls(archive), folder / archive.filename, size=archive.size,
                                   sha256=archive.sha256, what=f"WMT 2014 archive {archive.filename}",
                                   progress=progress, log=log)
        except DataError as error:
            raise DataError(f"{error}; {WMT14_HINT}") from None
    return paths


_SEG = re.compile(r"<seg.*?>(.*)</seg>.*?")


def parse_sgm(text):
    """WMT SGM segments as sacreBLEU reads them: each ``<seg`` line's text, spaces collapsed, nothing unescaped."""
    return [re.sub(r"\s+", " ", _SEG.sub(r"\1", line).strip())
            for line in text.split("\n") if line.startswith("<seg ")]


def extract_texts(paths, text_dir, archives=None):
    """Unpack the archives' text members into ``text_dir`` (each atomically; SGM parsed to one segment per
    line), skipping files already there; ``{name: path}`` of every member."""
    archives = WMT14_ARCHIVES if archives is None else archives
    text_dir = pathlib.Path(text_dir)
    text_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, archive in archives.items():
        wanted = {member: target for target, member in archive.members.items()
                  if not (text_dir / target).is_file()}
        out.update({target: text_dir / target for target in archive.members})
        if not wanted:
            continue
        try:
            with tarfile.open(paths[name], "r|gz") as tar:  # one pass over the stream
                for info in tar:
                    if info.name in wanted and info.isfile():
                        _write_member(tar.extractfile(info), text_dir / wanted.pop(info.name),
                                      sgm=info.name.endswith(".sgm"))
                        if not wanted:
                            break
        except (tarfile.TarError, OSError, EOFError) as error:
            raise DataError(f"cannot unpack {archive.filename} ({error}); delete {paths[name]} so that it is "
                            "downloaded again") from None
        if wanted:
            raise DataError(f"{archive.filename} has no member {sorted(wanted)[0]}; the archive's layout is not "
                            f"the expected one, so {WMT14_HINT}")
    return out


def _write_member(handle, target, sgm):
    """Copy one member to ``target`` through a temp file (SGM: parsed to plain lines)."""
    with atomic_writer(target) as out:
        if sgm:
            lines = parse_sgm(handle.read().decode("utf-8"))
            out.write("".join(line + "\n" for line in lines).encode("utf-8"))
        else:
            shutil.copyfileobj(handle, out, 1 << 20)


def wmt14_prepared_folder(cache_dir, src_lang="en", tgt_lang="de", vocab_size=WMT14_VOCAB_SIZE, seed=1):
    """Where :func:`prepare_wmt14` puts (and finds) the prepared corpus of these settings."""
    return pathlib.Path(cache_dir) / WMT14_FOLDER / f"prepared-{src_lang}-{tgt_lang}-v{vocab_size}-s{seed}"


def prepare_wmt14(cache_dir, *, src_lang="en", tgt_lang="de", vocab_size=WMT14_VOCAB_SIZE, sample_sentences=1_000_000,
                  seed=1, workers=None, archives=None, progress=True, rebuild=False, log=print):
    """Fetch, unpack and prepare WMT 2014 en-de or de-en once under ``CACHE/wmt14-en-de`` and return the
    prepared folder (an :class:`minitf.nmt.data.IndexedCorpus`); other arguments as
    :func:`minitf.nmt.prepare.prepare_corpus`, ``archives`` replacing :data:`WMT14_ARCHIVES` (for tests)."""
    if {src_lang, tgt_lang} != {"en", "de"}:
        raise DataError(f"WMT 2014 English-German is en-de or de-en, got {src_lang}-{tgt_lang}")
    archives = WMT14_ARCHIVES if archives is None else archives
    folder = pathlib.Path(cache_dir) / WMT14_FOLDER
    out = wmt14_prepared_folder(cache_dir, src_lang, tgt_lang, vocab_size, seed)
    with sigterm_raises():
        paths = fetch_archives(folder / "archives", archives, progress, log)
        texts = extract_texts(paths, folder / "text", archives)

    def pair(stem):
        return (str(texts[f"{stem}.{src_lang}"]), str(texts[f"{stem}.{tgt_lang}"]))

    train_stems = [next(iter(archives[name].members)).rsplit(".", 1)[0] for name in WMT14_TRAIN]
    sources = {"train": [pair(stem) for stem in train_stems], "valid": pair("newstest2013"),
               "test": pair("newstest2014")}
    # the archives are pinned: their sha256 and the member names identify the text
    identity = {name: archives[name].sha256 for name in archives}
    digests = {"train": [[identity[name], f"{stem}.{src_lang}", f"{stem}.{tgt_lang}"]
                         for name, stem in zip(WMT14_TRAIN, train_stems)],
               "valid": [[identity["dev"], f"newstest2013.{src_lang}", f"newstest2013.{tgt_lang}"]],
               "test": [[identity["dev"], f"newstest2014.{src_lang}", f"newstest2014.{tgt_lang}"]]}
    return prepare_corpus(out, sources, vocab_size, sample_sentences=sample_sentences, seed=seed, workers=workers,
                          source_digests=digests, languages=(src_lang, tgt_lang), rebuild=rebuild, log=log)
