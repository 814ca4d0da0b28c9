"""The language model's default text (minitf.lm.corpus): a small fake ``sword-text-web`` package, built here
with a tiny zText SWORD module, is served from 127.0.0.1 (no network, no apt), read with pysword, split by
chapter and cached; failures are one line and leave nothing. The package fetch itself is minitf.training.debian's,
tested with the Ding corpus in test_corpora.py."""
import hashlib
import importlib.util
import os
import struct
import subprocess
import sys
import tarfile
import zlib

import pytest

from minitf.lm import corpus
from minitf.training.debian import DebianPackage
from minitf.training.download import Terminated
from minitf.training.errors import DataError
from tests.loopback import Server, slowly
from tests.runs import ROOT, sigterm_once_part_grows
from tests.test_corpora import fake_apt, link, make_deb, root_entry, tree

needs_pysword = pytest.mark.skipif(importlib.util.find_spec("pysword") is None,
                                   reason="needs pysword (an install requirement: pip install -e .)")

SWORD = "./usr/share/sword/"
CONF = ("[engWEB2015eb]\nDataPath=./modules/texts/ztext/engWEB2015eb/\nModDrv=zText\nSourceType=OSIS\n"
        "Encoding=UTF-8\nCompressType=ZIP\nBlockType=BOOK\nVersification=NRSVA\n")
#: Genesis 1 to 40, two verses each, then John 3:16; in OSIS markup as the real module has it.
VERSES = [("Gen", c, v, f"<w lemma=\"strong:H1\">Genesis</w> {c}:{v} says <divineName>Yahweh</divineName>.")
          for c in range(1, 41) for v in (1, 2)]
VERSES[0] = ("Gen", 1, 1, 'God<note placement="foot">The Hebrew word is “Elohim”.</note>created &amp; saw '
                          '“ light<note n="b"/> ”, <title type="x">A heading</title>the first day .')
VERSES += [("John", 3, 16, "For God so loved the world.")]


def expected_line(book, chapter, verse):
    if (book, chapter, verse) == ("Gen", 1, 1):
        return "God created & saw “light”, the first day."
    if book == "John":
        return "For God so loved the world."
    return f"Genesis {chapter}:{verse} says Yahweh."


def ztext(testament, verses):
    """``{extension: bytes}`` of one testament of a zText module holding ``verses`` in one compressed block,
    each at the index pysword computes for it under the NRSVA versification."""
    from pysword.books import BibleStructure
    structure = BibleStructure("nrsva", [testament])
    records, block = {}, b""
    for book, chapter, verse, text in verses:
        index, = structure.ref_to_indicies(books=[book], chapters=[chapter], verses=[verse])[testament]
        data = text.encode("utf-8")
        records[index] = struct.pack("<IIH", 0, len(block), len(data))
        block += data
    bzv = b"".join(records.get(i, struct.pack("<IIH", 0, 0, 0)) for i in range(max(records) + 1))
    compressed = zlib.compress(block)
    return {"bzs": struct.pack("<III", 0, len(compressed), len(block)), "bzv": bzv, "bzz": compressed}


def sword_entries(padding=b""):
    """The data.tar entries of a fake sword-text-web: the conf and both testaments (``padding``: a doc file)."""
    entries = {"./": root_entry(), "./usr/share/doc/sword-text-web/copyright": b"public domain" + padding,
               SWORD + "mods.d/engWEB2015eb.conf": CONF.encode()}
    for testament, verses in (("ot", VERSES[:-1]), ("nt", VERSES[-1:])):
        for ext, data in ztext(testament, verses).items():
            entries[f"{SWORD}modules/texts/ztext/engWEB2015eb/{testament}.{ext}"] = data
    return entries


def pin(monkeypatch, data):
    monkeypatch.setattr(corpus, "PACKAGE", DebianPackage(corpus.PACKAGE.name, corpus.PACKAGE.pool_path, len(data),
                                                         hashlib.sha256(data).hexdigest()))


@pytest.fixture
def serve(monkeypatch):
    """serve(deb_bytes, pinned=None) -> Server at .../debian, pinning ``pinned`` (default: the served bytes)."""
    servers = []

    def start(data, pinned=None):
        pin(monkeypatch, data if pinned is None else pinned)
        servers.append(Server({"/debian/" + corpus.PACKAGE.pool_path: data}))
        servers[-1].url += "/debian"
        return servers[-1]

    monkeypatch.setenv("MINITF_NO_APT", "1")
    yield start
    for server in servers:
        server.close()


@needs_pysword
def test_the_default_text_is_fetched_read_split_by_chapter_and_cached(tmp_path, serve):
    server = serve(make_deb(sword_entries()))
    notes = []
    paths = corpus.default_text_splits(tmp_path, progress=False, log=notes.append, base_url=server.url)
    chapters = sorted({(b, c) for b, c, _, _ in VERSES}, key=[(b, c) for b, c, _, _ in VERSES].index)
    held = {"valid": {chapters[9], chapters[29]}, "test": {chapters[19], chapters[39]}}  # Gen 10, 30; 20, 40
    for name in ("train", "valid", "test"):
        chosen = held[name] if name in held else set(chapters) - held["valid"] - held["test"]
        want = "".join(expected_line(b, c, v) + "\n" for b, c, v, _ in VERSES if (b, c) in chosen)
        assert open(paths[name], encoding="utf-8").read() == want, name
        assert f"{name} {len(want):,} characters" in notes[0]
    assert tree(tmp_path) == ["web-bible-v1", "web-bible-v1/test.txt", "web-bible-v1/train.txt",
                              "web-bible-v1/valid.txt"]  # no .deb, no unpacked module, no temp file
    assert corpus.default_text_splits(tmp_path, progress=False, log=notes.append, base_url=server.url) == paths
    assert len(server.requests) == 1 and len(notes) == 1  # the second call reads the cache


@needs_pysword
def test_the_mirror_comes_from_the_environment(tmp_path, serve, monkeypatch):
    server = serve(make_deb(sword_entries()))
    monkeypatch.setenv("MINITF_DEBIAN_MIRROR", server.url)
    assert os.path.isfile(corpus.default_text_splits(tmp_path, progress=False, log=None)["test"])
    assert server.requests == [("/debian/" + corpus.PACKAGE.pool_path, None)]


@needs_pysword
def test_apt_comes_first_where_it_exists(tmp_path, serve, monkeypatch):
    deb = make_deb(sword_entries())
    server = serve(deb)
    commands = fake_apt(monkeypatch, deb, package="sword-text-web")
    paths = corpus.default_text_splits(tmp_path, progress=False, log=None, base_url=server.url)
    assert commands == [["apt-get", "download", "sword-text-web"]] and server.requests == []
    assert open(paths["valid"], encoding="utf-8").readline() == "Genesis 10:1 says Yahweh.\n"
    assert tree(tmp_path)[0] == "web-bible-v1" and len(tree(tmp_path)) == 4  # apt's temp folder is gone


@needs_pysword
def test_apt_failing_falls_back_to_the_archive(tmp_path, serve, monkeypatch):
    server = serve(make_deb(sword_entries()))
    commands = fake_apt(monkeypatch, None, package="sword-text-web")
    assert os.path.isfile(corpus.default_text_splits(tmp_path, progress=False, log=None, base_url=server.url)["test"])
    assert len(commands) == 1 and len(server.requests) == 1 and len(tree(tmp_path)) == 4


def corrupted(deb):
    bad = bytearray(deb)
    bad[len(bad) // 2] ^= 0xFF
    return bytes(bad)


@needs_pysword
@pytest.mark.parametrize("case, pattern", [
    ("corrupted", "sha256 .* differs from the pinned .*MINITF_DEBIAN_MIRROR"),
    ("not a deb", "not a Debian package"),
    ("no module", "the package has no usr/share/sword/mods.d/engWEB2015eb.conf"),
    ("a link", "modules/texts/ztext/engWEB2015eb/ot.bzz in the package is not a regular file"),
    ("unreadable module", "pysword read only 1 chapters of text from the SWORD module engWEB2015eb"),
])
def test_a_failed_fetch_is_one_line_and_leaves_nothing(tmp_path, serve, case, pattern):
    good = make_deb(sword_entries())
    if case == "corrupted":
        server = serve(corrupted(good), pinned=good)
    elif case == "not a deb":
        server = serve(b"<html>a captive portal</html>")
    elif case == "no module":
        server = serve(make_deb({"./usr/share/doc/x": b"doc"}))
    else:
        entries = sword_entries()
        name = SWORD + "modules/texts/ztext/engWEB2015eb/ot.bzz"
        if case == "a link":
            entries[name] = link(name, "/etc/passwd", tarfile.SYMTYPE)
        else:
            entries[name] = b"not zlib"
            entries[name.replace(".bzz", ".bzs")] = struct.pack("<III", 0, 8, 100)
        server = serve(make_deb(entries))
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=pattern) as error:
        corpus.default_text_splits(cache, progress=False, base_url=server.url)
    assert "\n" not in str(error.value) and "--train-text" in str(error.value)
    assert list(cache.iterdir()) == []  # nothing half-written in the cache


def test_without_pysword_the_error_is_one_line_before_any_fetch(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pysword.modules", None)  # import fails as where it is not installed
    with pytest.raises(DataError, match="pip install pysword.*--train-text") as error:
        corpus.default_text_splits(tmp_path, progress=False, base_url="http://127.0.0.1:9")
    assert "\n" not in str(error.value) and list(tmp_path.iterdir()) == []


@needs_pysword
def test_sigterm_while_reading_the_module_leaves_nothing(tmp_path, serve, monkeypatch):
    """SIGTERM raises Terminated inside the fetch; the unpacked module's temp folder and the .deb go."""
    server = serve(make_deb(sword_entries()))

    def killed(sword_path, module=corpus.MODULE):
        assert (sword_path / "mods.d/engWEB2015eb.conf").is_file()
        raise Terminated(15)

    monkeypatch.setattr(corpus, "read_chapters", killed)
    with pytest.raises(Terminated):
        corpus.default_text_splits(tmp_path, progress=False, base_url=server.url)
    assert list(tmp_path.iterdir()) == []


CHILD = ("import sys; from minitf.lm import corpus; from minitf.training.debian import DebianPackage\n"
         "name, path = corpus.PACKAGE.name, corpus.PACKAGE.pool_path\n"
         "corpus.PACKAGE = DebianPackage(name, path, int(sys.argv[3]), sys.argv[4])\n"
         "corpus.default_text_splits(sys.argv[2], progress=False, base_url=sys.argv[1])")


@needs_pysword
def test_sigterm_during_the_download_leaves_only_the_part_and_the_next_call_resumes(tmp_path, serve):
    deb = make_deb(sword_entries(padding=os.urandom(20000)))  # incompressible: ~2 s at the trickle below
    server = serve(deb)
    server.routes["/debian/" + corpus.PACKAGE.pool_path] = slowly(deb, 512, 0.05)
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "MINITF_NO_APT": "1"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, server.url, str(cache), str(len(deb)),
                              hashlib.sha256(deb).hexdigest()], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    part = cache / (corpus.PACKAGE.filename + ".part")
    err = sigterm_once_part_grows(child, part)
    assert child.returncode != 0, err
    assert tree(cache) == [part.name]  # no temp file, no unpacked module: only the resumable part
    kept = part.stat().st_size
    assert 2048 <= kept < len(deb)
    server.routes["/debian/" + corpus.PACKAGE.pool_path] = deb
    paths = corpus.default_text_splits(cache, progress=False, log=None, base_url=server.url)
    assert server.requests[-1][1] == f"bytes={kept}-" and os.path.getsize(paths["train"]) > 0
    assert tree(cache) == ["web-bible-v1", "web-bible-v1/test.txt", "web-bible-v1/train.txt",
                           "web-bible-v1/valid.txt"]


def test_the_pinned_package_is_the_archives_file():
    """Pinned from ``apt-get download sword-text-web`` on Debian 12 (the size and sha256 the layout names)."""
    package = corpus.PACKAGE
    assert package.pool_path == "pool/main/s/sword-text-web/sword-text-web_426.0-1_all.deb"
    assert package.size == 3956428
    assert package.sha256 == "930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1"


# --------------------------------------------------------------------------- training text of control characters
@pytest.mark.parametrize("data", [bytes(4096), b"\x00\x00\n\x00\r\n\x1b\x7f\x0c\t \xe2\x80\x8b\xef\xbb\xbf\n"],
                         ids=["zero-filled", "control and invisible characters"])
def test_a_text_of_control_characters_only_is_refused_as_blank_text_is(tmp_path, data):
    """A zero-filled file (what a crash can leave) has no text to learn. Before: read_text returned it, and a
    character model trained on NUL."""
    from minitf.training.text import read_lines, read_text
    path = tmp_path / "train.txt"
    path.write_bytes(data)
    with pytest.raises(DataError, match=f"has no text \\({len(data)} bytes of blanks and control characters"):
        read_text(path, "--train-text")
    path.write_bytes(data + b"a")  # one visible character: text, kept as it is
    assert read_text(path, "--train-text") == data.decode("utf-8").removeprefix("\ufeff") + "a"
    path.write_bytes(data.replace(b"\n", b"") + b"\n" + data)  # a translation's lines: refused the same way
    with pytest.raises(DataError, match="has only empty lines \\(or blanks and control characters\\)"):
        read_lines(path, "source")
