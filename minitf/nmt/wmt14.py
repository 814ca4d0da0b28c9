"""The paper's English-German task: WMT 2014 English-German, fetched once and prepared
as memory-mapped token arrays.

Training data: Europarl v7, Common Crawl and News Commentary v9 (4.5 million sentence
pairs), as in fairseq's ``examples/translation/prepare-wmt14en2de.sh --icml17``;
validation: newstest2013; test: newstest2014 (the full 3,003 sentences, parsed from
SGM as sacreBLEU does). The archives are pinned by size and sha256 (the values
tensorflow/datasets pins for the same URLs) and downloaded with
:func:`minitf.nmt.download.download` (resumed, capped, verified, one line on failure).
``MINITF_WMT_MIRROR`` replaces the download addresses: a base URL under which the
archives lie by their file names (a local mirror, a test's loopback server).

newstest2013 and newstest2014 both come from WMT's development archive of 2019
(``data.statmt.org/wmt19/translation-task/dev.tgz``), which holds every earlier test
set and whose size and sha256 are pinned (tensorflow/datasets takes its wmt14 test set
from it too); the 2014 ``dev.tgz`` and ``test-full.tgz`` hold the same sets, but no
source pins their sha256, and an unpinned archive is never used.

Disk: the archives are 1.7 GB, the extracted text 1.3 GB, the prepared arrays about
0.5 GB, under ``CACHE/wmt14-en-de``.
"""
import dataclasses
import os
import pathlib
import re
import shutil
import tarfile
import tempfile

from minitf.nmt.download import download, mirror_base, sigterm_raises
from minitf.nmt.errors import DataError
from minitf.nmt.files import fsync_dir
from minitf.nmt.prepare import prepare_corpus

#: Replaces the download addresses (a base URL with the archives by file name under it).
MIRROR_ENV = "MINITF_WMT_MIRROR"
FOLDER = "wmt14-en-de"
#: The paper's shared vocabulary: "about 37000 tokens".
VOCAB_SIZE = 37000
_HINT = (f"set {MIRROR_ENV} to a mirror that holds the archives by file name, or train on your own "
         "files with --train-src/--train-tgt")


@dataclasses.dataclass(frozen=True)
class Archive:
    """One pinned download and the members it provides.

    Attributes
    ----------
    url : str
        Where it is published.
    size : int
        Bytes.
    sha256 : str
    members : dict
        ``{"train.en": member path, ...}``: the text files taken from it (by the name
        the extracted file gets under ``text/``).
    """
    url: str
    size: int
    sha256: str
    members: dict

    @property
    def filename(self):
        return self.url.rsplit("/", 1)[-1]


ARCHIVES = {
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
TRAIN = ("europarl-v7", "commoncrawl", "news-commentary-v9")


# --------------------------------------------------------------------------- fetching

def archive_urls(archive):
    """The URL to fetch ``archive`` from: under ``MINITF_WMT_MIRROR`` when set, else its own."""
    base = mirror_base(MIRROR_ENV, "")
    return [f"{base}/{archive.filename}"] if base else [archive.url]


def fetch_archives(folder, archives=None, progress=True, log=print):
    """Download every archive once into ``folder`` (kept, so a rebuild needs no network).

    Returns
    -------
    dict
        ``{name: path}``.
    """
    archives = ARCHIVES if archives is None else archives
    folder = pathlib.Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError(f"cannot create the corpus cache folder {str(folder)!r} ({error}); pass a writable "
                        "--cache-dir") from None
    paths = {}
    for name, archive in archives.items():
        if not (isinstance(archive.sha256, str) and len(archive.sha256) == 64):
            raise DataError(f"{archive.filename} has no pinned sha256, so it is not fetched; {_HINT}")
        try:
            paths[name] = download(archive_urls(archive), folder / archive.filename, size=archive.size,
                                   sha256=archive.sha256, what=f"WMT 2014 archive {archive.filename}",
                                   progress=progress, log=log)
        except DataError as error:
            raise DataError(f"{error}; {_HINT}") from None
    return paths


# --------------------------------------------------------------------------- unpacking

_SEG = re.compile(r"<seg.*?>(.*)</seg>.*?")


def parse_sgm(text):
    """The segments of a WMT SGM file, as sacreBLEU reads them: each line that starts
    with ``<seg `` gives its content, whitespace collapsed; nothing is unescaped."""
    return [re.sub(r"\s+", " ", _SEG.sub(r"\1", line).strip())
            for line in text.split("\n") if line.startswith("<seg ")]


def extract_texts(paths, text_dir, archives=None):
    """Unpack the text members of the archives into ``text_dir`` (each file atomically;
    SGM parsed to one segment per line), skipping files already there.

    Returns
    -------
    dict
        ``{name: path}`` of every extracted file (``train.en`` style names of ``members``).
    """
    archives = ARCHIVES if archives is None else archives
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
                            f"the expected one, so {_HINT}")
    return out


def _write_member(handle, target, sgm):
    """Copy one member to ``target`` through a temp file (SGM: parsed to plain lines)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            if sgm:
                lines = parse_sgm(handle.read().decode("utf-8"))
                out.write("".join(line + "\n" for line in lines).encode("utf-8"))
            else:
                shutil.copyfileobj(handle, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


# --------------------------------------------------------------------------- the whole

def prepared_folder(cache_dir, src_lang="en", tgt_lang="de", vocab_size=VOCAB_SIZE, seed=1):
    """Where :func:`prepare_wmt14` puts (and finds) the prepared corpus of these settings."""
    return pathlib.Path(cache_dir) / FOLDER / f"prepared-{src_lang}-{tgt_lang}-v{vocab_size}-s{seed}"


def prepare_wmt14(cache_dir, *, src_lang="en", tgt_lang="de", vocab_size=VOCAB_SIZE, sample_sentences=1_000_000,
                  seed=1, workers=None, archives=None, progress=True, log=print):
    """Fetch, unpack and prepare WMT 2014 English-German (once; later calls reuse it).

    Parameters
    ----------
    cache_dir : str or path-like
        Holds ``wmt14-en-de/`` (archives, text, prepared folders).
    src_lang, tgt_lang : str
        ``en``/``de`` (the paper's direction) or ``de``/``en``.
    vocab_size, sample_sentences, seed, workers
        As :func:`minitf.nmt.prepare.prepare_corpus`.
    archives : dict or None
        Replaces :data:`ARCHIVES` (tests serve small archives of the same layout).

    Returns
    -------
    pathlib.Path
        The prepared folder (``wmt14-en-de/prepared-en-de-v37000-s1``): open it with
        :class:`minitf.nmt.indexed.IndexedCorpus`.
    """
    if {src_lang, tgt_lang} != {"en", "de"}:
        raise DataError(f"WMT 2014 English-German is en-de or de-en, got {src_lang}-{tgt_lang}")
    archives = ARCHIVES if archives is None else archives
    folder = pathlib.Path(cache_dir) / FOLDER
    out = prepared_folder(cache_dir, src_lang, tgt_lang, vocab_size, seed)
    with sigterm_raises():
        paths = fetch_archives(folder / "archives", archives, progress, log)
        texts = extract_texts(paths, folder / "text", archives)

    def pair(stem):
        return (str(texts[f"{stem}.{src_lang}"]), str(texts[f"{stem}.{tgt_lang}"]))

    train_stems = [next(iter(archives[name].members)).rsplit(".", 1)[0] for name in TRAIN]
    sources = {"train": [pair(stem) for stem in train_stems], "valid": pair("newstest2013"),
               "test": pair("newstest2014")}
    # the archives are pinned: their sha256 and the member names identify the text
    identity = {name: archives[name].sha256 for name in archives}
    digests = {"train": [[identity[name], f"{stem}.{src_lang}", f"{stem}.{tgt_lang}"]
                         for name, stem in zip(TRAIN, train_stems)],
               "valid": [[identity["dev"], f"newstest2013.{src_lang}", f"newstest2013.{tgt_lang}"]],
               "test": [[identity["dev"], f"newstest2014.{src_lang}", f"newstest2014.{tgt_lang}"]]}
    return prepare_corpus(out, sources, vocab_size, sample_sentences=sample_sentences, seed=seed, workers=workers,
                          source_digests=digests, languages=(src_lang, tgt_lang), log=log)
