"""The default corpus's fetch: apt first, else a .deb over HTTP(S) with a pinned
size and sha256 (minitf.training.download, tested in test_download.py), then one file
unpacked with the standard library. Every test serves a small .deb it builds from
a server on 127.0.0.1 (no network, no apt run)."""
import hashlib
import io
import subprocess
import tarfile

import pytest

from minitf.nmt import corpora
from minitf.training import debian
from minitf.training.download import Terminated
from minitf.training.errors import DataError
from minitf.train import main as train_main
from tests.loopback import Server

DING_TEXT = ("# Version :: test\n"
             "Hund {m} | Der Hund bellt laut. :: dog | The dog barks loudly.\n"
             "blank {adj} | aus reiner Bosheit :: sheer | from sheer malice\n")
MEMBER = "./usr/share/trans/de-en"


def tar_xz(entries):
    """A data.tar.xz of ``entries``: name -> bytes (a file) or a TarInfo (a link, a folder)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz", preset=0) as archive:
        for name, data in entries.items():
            if isinstance(data, tarfile.TarInfo):
                archive.addfile(data)
                continue
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def make_deb(entries, data_member="data.tar.xz", data=None):
    """An ar archive laid out as dpkg-deb builds it (``data``: the data member's bytes as given)."""
    members = [("debian-binary", b"2.0\n"), ("control.tar.xz", tar_xz({"./control": b"Package: x\n"})),
               (data_member, tar_xz(entries) if data is None else data)]
    out = [b"!<arch>\n"]
    for name, data in members:
        header = f"{name + '/':<16}{'0':<12}{'0':<6}{'0':<6}{'100644':<8}{len(data):<10}`\n".encode()
        out += [header, data, b"\n" if len(data) % 2 else b""]
    return b"".join(out)


def root_entry():
    info = tarfile.TarInfo("./")  # dpkg-deb's data.tar starts with the folder itself
    info.type = tarfile.DIRTYPE
    return info


GOOD_DEB = make_deb({"./": root_entry(), "./usr/share/doc/x": b"doc", MEMBER: DING_TEXT.encode("utf-8")})


@pytest.fixture
def serve(monkeypatch):
    """serve(deb_bytes, pinned=None) -> Server at .../debian; pins the sha256 and size of
    ``pinned`` (default: the served bytes), skips apt."""
    servers = []

    def start(data, pinned=None):
        pinned = data if pinned is None else pinned
        monkeypatch.setattr(corpora, "DING_DEB_SHA256", hashlib.sha256(pinned).hexdigest())
        monkeypatch.setattr(corpora, "DING_DEB_SIZE", len(pinned))
        servers.append(Server({"/debian/" + corpora.DING_DEB_PATH: data}))
        servers[-1].url += "/debian"
        return servers[-1]

    monkeypatch.setenv("MINITF_NO_APT", "1")
    yield start
    for server in servers:
        server.close()


def tree(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def test_https_fetch_unpacks_the_corpus_and_leaves_only_it(tmp_path, serve):
    server = serve(GOOD_DEB)
    path = corpora.fetch_default_corpus(tmp_path, base_url=server.url)
    assert path.read_text(encoding="utf-8") == DING_TEXT
    assert path == tmp_path / "trans-de-en" / "usr/share/trans/de-en"
    assert tree(tmp_path) == ["trans-de-en", "trans-de-en/usr", "trans-de-en/usr/share", "trans-de-en/usr/share/trans",
                              "trans-de-en/usr/share/trans/de-en"]  # only the corpus: no temp file, no .deb
    assert corpora.fetch_default_corpus(tmp_path, base_url=server.url) == path
    assert len(server.requests) == 1  # the second call reads the cache


def test_mirror_from_the_environment(tmp_path, serve, monkeypatch):
    server = serve(GOOD_DEB)
    monkeypatch.setenv("MINITF_DEBIAN_MIRROR", server.url + "/")
    assert corpora.fetch_default_corpus(tmp_path).is_file()
    assert server.requests == [("/debian/" + corpora.DING_DEB_PATH, None)]


@pytest.mark.parametrize("case, pattern", [
    ("corrupted", "sha256 .* differs from the pinned .*MINITF_DEBIAN_MIRROR"),
    ("damaged package with the pinned digest", "damaged Debian package"),
    ("not a deb", "not a Debian package"),
    ("zstd", "data.tar.zst is compressed in a way"),
    ("no dictionary", "the package has no usr/share/trans/de-en"),
])
def test_failed_fetch_is_one_line_and_leaves_nothing(tmp_path, serve, case, pattern):
    if case == "corrupted":
        bad = bytearray(GOOD_DEB)
        bad[len(bad) // 2] ^= 0xFF
        server = serve(bytes(bad), pinned=GOOD_DEB)
    elif case == "damaged package with the pinned digest":
        server = serve(GOOD_DEB[:len(GOOD_DEB) - 40])  # the data.tar.xz member is cut short
    elif case == "not a deb":
        server = serve(b"<html>a captive portal</html>")
    elif case == "zstd":
        server = serve(make_deb({}, data_member="data.tar.zst", data=b"(zstd)"))
    else:
        server = serve(make_deb({"./usr/share/doc/x": b"doc"}))
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=pattern) as error:
        corpora.fetch_default_corpus(cache, base_url=server.url)
    assert "\n" not in str(error.value) and "--train-src" in str(error.value)
    assert list(cache.iterdir()) == []  # nothing half-written in the cache


def test_train_py_reports_a_corrupted_download_in_one_line(tmp_path, serve, monkeypatch, capsys):
    bad = bytearray(GOOD_DEB)
    bad[100] ^= 0xFF
    server = serve(bytes(bad), pinned=GOOD_DEB)
    monkeypatch.setenv("MINITF_DEBIAN_MIRROR", server.url)
    assert train_main(["--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train.py: error:") and "sha256" in err[0]
    assert list((tmp_path / "cache").iterdir()) == [] and not (tmp_path / "run").exists()


def test_the_cache_is_read_without_apt_or_network(tmp_path, monkeypatch):
    corpus = tmp_path / "trans-de-en" / "usr/share/trans/de-en"
    corpus.parent.mkdir(parents=True)
    corpus.write_text("x :: y\n", encoding="utf-8")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("ran a command"))
    assert corpora.fetch_default_corpus(tmp_path, base_url="http://127.0.0.1:9") == corpus


def fake_apt(monkeypatch, deb=None, package="trans-de-en"):
    """apt-get exists; ``apt-get download`` writes ``deb`` (as a newer version of ``package``), or fails as apt
    does without the package."""
    monkeypatch.delenv("MINITF_NO_APT", raising=False)
    monkeypatch.setattr(corpora.shutil, "which", lambda name: "/usr/bin/" + name)
    commands = []

    def run(command, cwd, **kwargs):
        commands.append(command)
        if deb is None:
            return subprocess.CompletedProcess(command, 100, "", f"E: Unable to locate package {package}\n")
        (cwd / f"{package}_99.0-1_all.deb").write_bytes(deb)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    return commands


def test_apt_comes_first_where_it_exists(tmp_path, serve, monkeypatch):
    server = serve(GOOD_DEB)
    commands = fake_apt(monkeypatch, GOOD_DEB)
    assert corpora.fetch_default_corpus(tmp_path, base_url=server.url).read_text(encoding="utf-8") == DING_TEXT
    assert commands == [["apt-get", "download", "trans-de-en"]] and server.requests == []
    assert tree(tmp_path)[-1] == "trans-de-en/usr/share/trans/de-en" and len(tree(tmp_path)) == 5


@pytest.mark.parametrize("apt_deb", [None, make_deb({}, data_member="data.tar.zst", data=b"(zstd)")],
                         ids=["apt-cannot-get-it", "apt-package-unreadable"])
def test_apt_failing_falls_back_to_the_archive(tmp_path, serve, monkeypatch, apt_deb):
    server = serve(GOOD_DEB)
    fake_apt(monkeypatch, apt_deb)
    assert corpora.fetch_default_corpus(tmp_path, base_url=server.url).read_text(encoding="utf-8") == DING_TEXT
    assert len(server.requests) == 1 and len(tree(tmp_path)) == 5


def test_apt_and_the_archive_failing_is_one_line_naming_both(tmp_path, monkeypatch):
    fake_apt(monkeypatch)
    with pytest.raises(DataError, match="apt-get update.*could not download.*--train-src") as error:
        corpora.fetch_default_corpus(tmp_path, base_url="http://127.0.0.1:9")
    assert "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []  # apt's temp folder is removed


def link(name, target, kind):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize("entries, pattern", [
    ({"../../escape": b"x", "/tmp/absolute-escape": b"x"}, "has no usr/share/trans/de-en"),
    ({MEMBER: link(MEMBER, "/etc/passwd", tarfile.SYMTYPE)}, "not a regular file"),
    ({"./usr/share/doc/x": b"x", MEMBER: link(MEMBER, "./usr/share/doc/x", tarfile.LNKTYPE)}, "not a regular file"),
], ids=["dot-dot-and-absolute", "symlink", "hardlink"])
def test_hostile_packages_write_nothing(tmp_path, serve, entries, pattern):
    server = serve(make_deb(entries))
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=pattern):
        corpora.fetch_default_corpus(cache, base_url=server.url)
    assert list(cache.iterdir()) == [] and tree(tmp_path) == ["cache"]  # nothing inside or outside


@pytest.mark.parametrize("where, pattern", [("the dictionary", "has 3145728 bytes, more than the 1 MiB expected"),
                                            ("before it", "data.tar.xz unpacks to more than 2 MiB")])
def test_a_decompression_bomb_is_refused_and_leaves_nothing(tmp_path, serve, monkeypatch, where, pattern):
    """The real limits are 64 MiB (the dictionary) and 256 MiB (the tar stream up to it);
    here 1 and 2 MiB, against 3 MiB of zeros (a few KB compressed)."""
    monkeypatch.setattr(debian, "MAX_MEMBER_BYTES", 1 << 20)
    monkeypatch.setattr(debian, "MAX_DATA_TAR_BYTES", 2 << 20)
    zeros = bytes(3 << 20)
    entries = {MEMBER: zeros} if where == "the dictionary" else {"./usr/share/doc/big": zeros, MEMBER: b"x"}
    server = serve(make_deb(entries))
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=pattern) as error:
        corpora.fetch_default_corpus(cache, base_url=server.url)
    assert "--train-src" in str(error.value) and "\n" not in str(error.value)
    assert list(cache.iterdir()) == []


def test_sigterm_while_unpacking_leaves_nothing(tmp_path, serve, monkeypatch):
    """SIGTERM raises Terminated inside the fetch (download.sigterm_raises); the temp file,
    the .deb and apt's folder are removed on the way out."""
    server = serve(GOOD_DEB)

    def killed(deb, member, out):
        out.write(b"half")
        raise Terminated(15)

    monkeypatch.setattr(corpora, "extract_member", killed)
    with pytest.raises(Terminated):
        corpora.fetch_default_corpus(tmp_path, base_url=server.url)
    assert list(tmp_path.iterdir()) == []


def test_pinned_package_matches_the_archive_name():
    """The pinned file is the bookworm package (checked against apt-get download and
    apt-cache show when it was pinned); URL and name stay consistent."""
    assert corpora.DING_DEB_PATH.endswith("/" + corpora.DING_DEB) and corpora.DING_DEB.startswith("trans-de-en_")
    assert len(corpora.DING_DEB_SHA256) == 64 and corpora.DING_DEB_SIZE > 1_000_000
    assert corpora.DEBIAN_ARCHIVE.startswith("https://")
