"""The default corpus without apt: a .deb downloaded over HTTP(S) with a pinned
sha256 and unpacked with the standard library. Every test serves a small .deb
it builds from a server on 127.0.0.1 (no network, no apt)."""
import hashlib
import http.server
import io
import subprocess
import tarfile
import threading

import pytest

from minitf.nmt import corpus, deb, fetch
from minitf.nmt.errors import DataError
from minitf.nmt.train import main as train_main

DING_TEXT = ("# Version :: test\n"
             "Hund {m} | Der Hund bellt laut. :: dog | The dog barks loudly.\n"
             "blank {adj} | aus reiner Bosheit :: sheer | from sheer malice\n")


def _tar_xz(files):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def make_deb(files, data_member="data.tar.xz", data=None):
    """An ar archive laid out as dpkg-deb builds it (``data``: the data member's bytes as given)."""
    members = [("debian-binary", b"2.0\n"), ("control.tar.xz", _tar_xz({"./control": b"Package: x\n"})),
               (data_member, _tar_xz(files) if data is None else data)]
    out = [b"!<arch>\n"]
    for name, data in members:
        header = f"{name + '/':<16}{'0':<12}{'0':<6}{'0':<6}{'100644':<8}{len(data):<10}`\n".encode()
        out += [header, data, b"\n" if len(data) % 2 else b""]
    return b"".join(out)


GOOD_DEB = make_deb({"./usr/share/trans/de-en": DING_TEXT.encode("utf-8"), "./usr/share/doc/x": b"doc"})


class Server:
    """A loopback HTTP server: ``files`` maps a path to bytes; ``cut`` stops a
    response after that many bytes (announcing the full length)."""

    def __init__(self, files, cut=None):
        self.files, self.cut, self.requests = files, cut, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append(self.path)
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data if server.cut is None else data[:server.cut])
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/debian"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve(monkeypatch):
    """serve(deb_bytes, pinned=None, cut=None) -> Server; pins the sha256 and size of ``pinned``
    (default: the served bytes), skips apt."""
    servers = []

    def start(data, pinned=None, cut=None):
        pinned = data if pinned is None else pinned
        monkeypatch.setattr(fetch, "DING_DEB_SHA256", hashlib.sha256(pinned).hexdigest())
        monkeypatch.setattr(fetch, "DING_DEB_SIZE", len(pinned))
        server = Server({"/debian/" + fetch.DING_DEB_PATH: data}, cut=cut)
        servers.append(server)
        return server

    monkeypatch.setenv("MINITF_NO_APT", "1")
    yield start
    for server in servers:
        server.close()


def test_https_fetch_unpacks_the_corpus_and_leaves_only_it(tmp_path, serve):
    server = serve(GOOD_DEB)
    path = corpus.fetch_default_corpus(tmp_path, base_url=server.url)
    assert path.read_text(encoding="utf-8") == DING_TEXT
    assert path == tmp_path / "trans-de-en" / "usr/share/trans/de-en"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "trans-de-en", "trans-de-en/usr", "trans-de-en/usr/share", "trans-de-en/usr/share/trans",
        "trans-de-en/usr/share/trans/de-en"]  # only the corpus: no temp folder, no .part, no .deb
    assert corpus.fetch_default_corpus(tmp_path, base_url=server.url) == path
    assert len(server.requests) == 1  # the second call reads the cache


def test_mirror_from_the_environment(tmp_path, serve, monkeypatch):
    server = serve(GOOD_DEB)
    monkeypatch.setenv("MINITF_DEBIAN_MIRROR", server.url)
    assert corpus.fetch_default_corpus(tmp_path).is_file()
    assert server.requests == ["/debian/" + fetch.DING_DEB_PATH]


@pytest.mark.parametrize("case, pattern", [
    ("corrupted", "sha256 .* differs from the pinned"),
    ("stops mid-file", "stopped early"),
    ("missing", "404"),
    ("damaged package with the pinned digest", "damaged Debian package"),
    ("not a deb", "not a Debian package"),
])
def test_failed_download_is_one_line_and_leaves_nothing(tmp_path, serve, case, pattern):
    if case == "corrupted":
        bad = bytearray(GOOD_DEB)
        bad[len(bad) // 2] ^= 0xFF
        server = serve(bytes(bad), pinned=GOOD_DEB)
    elif case == "stops mid-file":
        server = serve(GOOD_DEB, cut=len(GOOD_DEB) // 3)
    elif case == "missing":
        server = serve(GOOD_DEB)
        server.files.clear()
    elif case == "damaged package with the pinned digest":
        server = serve(GOOD_DEB[:len(GOOD_DEB) - 40])  # the data.tar.xz member is cut short
    else:
        server = serve(b"<html>a captive portal</html>")
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=pattern) as error:
        corpus.fetch_default_corpus(cache, base_url=server.url)
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


def test_apt_comes_first_where_it_exists(tmp_path, serve, monkeypatch):
    server = serve(GOOD_DEB)
    monkeypatch.delenv("MINITF_NO_APT")
    monkeypatch.setattr(fetch.shutil, "which", lambda name: "/usr/bin/" + name)
    commands = []

    def fake_apt(command, cwd, **kwargs):
        commands.append(command)
        (cwd / "trans-de-en_1.9-6_all.deb").write_bytes(GOOD_DEB)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_apt)
    assert corpus.fetch_default_corpus(tmp_path, base_url=server.url).read_text(encoding="utf-8") == DING_TEXT
    assert commands == [["apt-get", "download", "trans-de-en"]] and server.requests == []


def test_apt_failing_falls_back_to_the_archive(tmp_path, serve, monkeypatch):
    server = serve(GOOD_DEB)
    monkeypatch.delenv("MINITF_NO_APT")
    monkeypatch.setattr(fetch.shutil, "which", lambda name: "/usr/bin/" + name)
    failed = subprocess.CompletedProcess([], 100, "", "E: Unable to locate package trans-de-en\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: failed)
    assert corpus.fetch_default_corpus(tmp_path, base_url=server.url).is_file()
    assert len(server.requests) == 1


def test_extract_refuses_paths_outside_the_folder(tmp_path):
    path = tmp_path / "evil.deb"
    path.write_bytes(make_deb({"../../escape": b"x"}))
    with pytest.raises(DataError, match="outside"):
        deb.extract_deb(path, tmp_path / "out")
    assert not (tmp_path.parent / "escape").exists()


def test_ar_members_round_trip():
    members = deb.ar_members(GOOD_DEB)
    assert list(members) == ["debian-binary", "control.tar.xz", "data.tar.xz"]
    assert members["debian-binary"] == b"2.0\n"


def test_pinned_package_matches_the_archive_name():
    """The pinned file is the bookworm package (checked against apt-get download and
    apt-cache show when it was pinned); URL and name stay consistent."""
    assert fetch.DING_DEB_PATH.endswith("/" + fetch.DING_DEB) and fetch.DING_DEB.startswith("trans-de-en_")
    assert len(fetch.DING_DEB_SHA256) == 64 and fetch.DING_DEB_SIZE > 1_000_000
    assert fetch.DEBIAN_ARCHIVE.startswith("https://")


def test_extract_whole_package_with_its_root_entry(tmp_path):
    """dpkg-deb's data.tar starts with a "./" directory entry: the folder itself, not outside it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as archive:
        root = tarfile.TarInfo("./")
        root.type = tarfile.DIRTYPE
        archive.addfile(root)
        data = DING_TEXT.encode("utf-8")
        info = tarfile.TarInfo("./usr/share/trans/de-en")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    path = tmp_path / "real.deb"
    path.write_bytes(make_deb({}, data=buffer.getvalue()))
    deb.extract_deb(path, tmp_path / "out")
    assert (tmp_path / "out" / "usr/share/trans/de-en").read_text(encoding="utf-8") == DING_TEXT
