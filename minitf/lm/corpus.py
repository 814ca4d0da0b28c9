"""The default text of the language model: the World English Bible (public domain), Debian's ``sword-text-web``
package fetched once as the Ding corpus is (:func:`minitf.training.debian.fetch_package`: apt, else the pinned .deb
over HTTPS), its SWORD module read with PyPI's ``pysword`` and cached under ``--cache-dir`` as plain UTF-8 text,
one verse a line, in book order, split by whole chapters into train, valid and test (docs/data.md)."""
import functools
import html
import os
import pathlib
import re
import shutil
import struct
import tempfile
import zlib

from minitf.atomic import write_atomic
from minitf.training.debian import DebianPackage, extract_members, fetch_package
from minitf.training.download import sigterm_raises
from minitf.training.errors import DataError

#: Fetched over HTTPS where apt is missing or fails; the file ``apt-get download sword-text-web`` gives on Debian 12.
PACKAGE = DebianPackage(
    "sword-text-web", "pool/main/s/sword-text-web/sword-text-web_426.0-1_all.deb", 3956428,
    "930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1",
    "https://snapshot.debian.org/file/d9910dc8fe429d82aa7169560dbf436c71491dc5")
#: The SWORD module inside it: its configuration and the compressed text of both testaments (zText).
MODULE = "engWEB2015eb"
SWORD_ROOT = "usr/share/sword"
MODULE_FILES = [f"mods.d/{MODULE}.conf"] + [
    f"modules/texts/ztext/{MODULE}/{testament}.bz{kind}" for testament in ("ot", "nt") for kind in "svz"]
#: The cached split's folder: a new name whenever the text or the split changes, so an old cache is never reused.
SPLIT_FOLDER = "web-bible-v1"
SPLITS = ("train", "valid", "test")
#: Chapters (those with text, counted over the whole Bible in book order) held out: of every ``HELD_OUT_EVERY``,
#: the one at ``VALID_AT`` is validation and the one at ``TEST_AT`` test, so each is about 5% of the text.
HELD_OUT_EVERY, VALID_AT, TEST_AT = 20, 9, 19

_TEXT_HINT = "pass your own text with --train-text (and --valid-text, --test-text; plain UTF-8)"
_NOTE = re.compile(r"<note\b.*?</note>|<note\b[^<]*/>", re.DOTALL)
_SPACE_BEFORE = re.compile(r"\s+([.,;:!?”’)\]])")
_SPACE_AFTER = re.compile(r"([“‘(\[])\s+")
_cleaner = None  # pysword's OSIS cleaner, made on first use (it compiles its patterns)


def default_text_splits(cache_dir, progress=True, log=print, use_apt=None, base_url=None):
    """``{"train": path, "valid": path, "test": path}`` (absolute) of the World English Bible's splits, made
    once under ``CACHE/web-bible-v1`` and read from there after. The package is fetched as
    :func:`minitf.training.debian.fetch_package` does (``use_apt``, ``base_url``, ``MINITF_DEBIAN_MIRROR``,
    ``MINITF_NO_APT``); its files unpack into a temp folder that goes with the .deb on success, error and
    SIGTERM (which raises inside); each split is written atomically, and a cache missing one is made again.
    ``log`` takes one line on what was made. A one-line DataError says why not, and what to do."""
    cache_dir = pathlib.Path(cache_dir)
    folder = cache_dir / SPLIT_FOLDER
    paths = {name: folder / f"{name}.txt" for name in SPLITS}
    if not all(path.is_file() for path in paths.values()):
        _require_pysword()
        with sigterm_raises():  # the atomic writes remove their temp files too
            splits = fetch_package(PACKAGE, cache_dir, lambda deb: _read_package(deb, cache_dir), hint=_TEXT_HINT,
                                   use_apt=use_apt, base_url=base_url, progress=progress)
            for name in SPLITS:
                write_atomic(paths[name], "".join(line + "\n" for line in splits[name]))
        if log:
            sizes = ", ".join(f"{name} {sum(len(line) + 1 for line in splits[name]):,} characters"
                              for name in SPLITS)
            log(f"default text: the World English Bible in {folder} ({sizes})")
    return {name: os.path.abspath(path) for name, path in paths.items()}


def _require_pysword():
    try:
        import pysword.modules  # noqa: F401
    except ImportError:
        raise DataError("the default text (the World English Bible) is read with the pysword package, which is "
                        "not installed; run `pip install pysword`, or " + _TEXT_HINT) from None


def _read_package(deb, cache_dir):
    """Unpack the SWORD module of ``deb`` into a temp folder in ``cache_dir``, read and split it, remove it."""
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{PACKAGE.name}-", dir=cache_dir))
    try:
        handles = {}
        try:
            for name in MODULE_FILES:
                (work / name).parent.mkdir(parents=True, exist_ok=True)
                handles[f"{SWORD_ROOT}/{name}"] = open(work / name, "wb")
            extract_members(deb, handles)
        except DataError as error:
            raise DataError(f"{deb.name}: {error}; {_TEXT_HINT}") from None
        finally:
            for handle in handles.values():
                handle.close()
        return split_chapters(read_chapters(work))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def read_chapters(sword_path, module=MODULE):
    """``[(book, chapter, [verse, ...])]`` of the SWORD module ``module`` under ``sword_path`` (a folder with
    ``mods.d`` and ``modules``), in book order, each verse one line of clean text (:func:`clean_verse`);
    empty verses and chapters left out. A module pysword cannot read is a one-line DataError."""
    from pysword.modules import SwordModules
    try:
        modules = SwordModules(str(sword_path))
        found = modules.parse_modules()
        if module not in found:
            raise DataError(f"the package holds no SWORD module {module} (it has {sorted(found)}); its layout "
                            f"changed, so {_TEXT_HINT}")
        bible = modules.get_bible_from_module(module)
        if hasattr(bible, "_decompressed_text"):  # pysword unpacks a verse's whole block (a book) per verse: keep one
            bible._decompressed_text = functools.lru_cache(maxsize=1)(bible._decompressed_text)
        chapters = []
        for books in bible.get_structure().get_books().values():
            for book in books:
                for chapter in range(1, book.num_chapters + 1):
                    verses = [clean_verse(raw) for raw in bible.get_iter(books=[book.osis_name],
                                                                         chapters=[chapter], clean=False)]
                    verses = [verse for verse in verses if verse]
                    if verses:
                        chapters.append((book.osis_name, chapter, verses))
    except DataError:
        raise
    except (OSError, ValueError, KeyError, IndexError, struct.error, zlib.error) as error:
        raise DataError(f"pysword cannot read the SWORD module {module} ({type(error).__name__}: "
                        f"{' '.join(str(error).split())}); {_TEXT_HINT}") from None
    if len(chapters) < HELD_OUT_EVERY:  # pysword reads a block it cannot decompress as empty verses
        raise DataError(f"pysword read only {len(chapters)} chapters of text from the SWORD module {module}, "
                        f"too few to hold out valid and test chapters (a damaged module, or one pysword cannot "
                        f"read); {_TEXT_HINT}")
    return chapters


def clean_verse(raw):
    """One verse's OSIS markup as plain prose on one line: footnotes dropped (they stand between words, so they
    leave a space), the other tags removed by pysword's cleaner (titles dropped, words kept), entities decoded,
    spaces collapsed and none left before closing punctuation or after opening quotes."""
    global _cleaner
    if _cleaner is None:
        from pysword.cleaner import OSISCleaner
        _cleaner = OSISCleaner()
    text = _cleaner.clean(_NOTE.sub(" ", raw))
    text = " ".join(html.unescape(text).split())
    return _SPACE_AFTER.sub(r"\1", _SPACE_BEFORE.sub(r"\1", text))


def split_chapters(chapters):
    """``{"train", "valid", "test"}``: lists of verses, whole chapters each, in book order. Counting the chapters
    from 0, chapter ``i`` goes to valid where ``i % 20 == 9``, to test where ``i % 20 == 19``, else to train:
    about 5% each, spread over the whole Bible; the same text gives the same split."""
    splits = {name: [] for name in SPLITS}
    for index, (_, _, verses) in enumerate(chapters):
        held = index % HELD_OUT_EVERY
        splits["valid" if held == VALID_AT else "test" if held == TEST_AT else "train"].extend(verses)
    return splits
