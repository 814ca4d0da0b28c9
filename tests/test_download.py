"""minitf.training.download: one pinned file over HTTP, resumed, capped, verified, and
every failure one line. Every test serves its own bytes from 127.0.0.1."""
import hashlib
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from minitf.training import download as dl
from minitf.training.errors import DataError
from tests.loopback import Server, raw, slowly
from tests.runs import ROOT, sigterm_once_part_grows

DATA = bytes(range(256)) * 160  # 40 KiB
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def serve():
    servers = []

    def start(routes, ranges=True):
        servers.append(Server(routes, ranges=ranges))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def fetch(urls, dest, **kwargs):
    kwargs = {"size": len(DATA), "sha256": SHA, "what": "the test file", "progress": False,
              "read_timeout": 5.0, **kwargs}
    return dl.download(urls, dest, **kwargs)


def listing(folder):
    return sorted(p.name for p in folder.iterdir())


def test_download_then_the_cached_file(tmp_path, serve):
    server = serve({"/f": DATA})
    dest = tmp_path / "f"
    assert fetch(server.url + "/f", dest) == dest and dest.read_bytes() == DATA
    assert listing(tmp_path) == ["f"]
    assert fetch(server.url + "/f", dest) == dest and len(server.requests) == 1  # verified, not fetched again


def test_a_cached_file_of_the_pinned_size_but_other_bytes_is_downloaded_again(tmp_path, serve):
    server = serve({"/f": DATA})
    dest = tmp_path / "f"
    wrong = bytearray(DATA)
    wrong[-1] ^= 1
    dest.write_bytes(bytes(wrong))  # the pinned size: only the sha256 tells it apart
    assert fetch(server.url + "/f", dest) == dest and dest.read_bytes() == DATA
    assert len(server.requests) == 1 and listing(tmp_path) == ["f"]


@pytest.mark.parametrize("ranges", [True, False], ids=["server-resumes", "server-ignores-range"])
def test_a_cut_download_is_resumed_on_the_next_start(tmp_path, serve, ranges):
    cut = 10_000
    server = serve({"/f": raw(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(DATA) + DATA[:cut])},
                   ranges=ranges)
    with pytest.raises(DataError, match=f"closed after {cut} of {len(DATA)} bytes.*run again to resume"):
        fetch(server.url + "/f", tmp_path / "f")
    assert listing(tmp_path) == ["f.part"] and (tmp_path / "f.part").read_bytes() == DATA[:cut]
    server.routes["/f"] = DATA
    notes = []
    assert fetch(server.url + "/f", tmp_path / "f", log=notes.append).read_bytes() == DATA
    assert server.requests[-1] == ("/f", f"bytes={cut}-")
    assert ("resuming at byte 10000" if ranges else "starting again from byte 0") in notes[-1]
    assert listing(tmp_path) == ["f"]


def test_a_trickling_mirror_is_given_up_and_the_next_resumes(tmp_path, serve):
    server = serve({"/slow": slowly(DATA, 10, 0.05), "/f": DATA})  # 200 B/s
    notes, start = [], time.monotonic()
    fetch([server.url + "/slow", server.url + "/f"], tmp_path / "f", min_rate=1000, rate_window=0.5,
          log=notes.append)
    assert time.monotonic() - start < 60  # the trickle alone takes 200 s; a loaded machine may take seconds
    assert "slower than 1000 B/s for 0.5 s" in notes[0] and (tmp_path / "f").read_bytes() == DATA
    assert server.requests[-1][1].startswith("bytes=")  # the trickled bytes were kept


def test_a_trickling_only_mirror_is_one_line(tmp_path, serve):
    server = serve({"/slow": slowly(DATA, 10, 0.05)})
    with pytest.raises(DataError, match=r"^could not download the test file: http://127.0.0.1:\d+/slow: "
                                        r"slower than 1 KB/s for 0.5 s") as error:
        fetch(server.url + "/slow", tmp_path / "f", min_rate=1024, rate_window=0.5)
    assert "\n" not in str(error.value)


def test_a_slow_but_steady_mirror_finishes(tmp_path, serve):
    server = serve({"/f": slowly(DATA, 2048, 0.03)})  # about 60 KB/s, ~0.6 s in all
    # a short window, but a limit 300 times below the rate: only a stall of 10 s (2048 B at 200 B/s) gives up
    assert fetch(server.url + "/f", tmp_path / "f", min_rate=200, rate_window=0.2).read_bytes() == DATA


@pytest.mark.parametrize("announced", [False, True], ids=["no-length", "announced"])
def test_more_than_the_pinned_size_is_refused(tmp_path, serve, announced):
    body = DATA + b"x" * 100_000
    server = serve({"/f": slowly(body, 4096, 0, length=len(body) if announced else False)})
    pattern = "announces 140960 bytes, more than the pinned 40960" if announced else \
        "sent more than the pinned 40960 bytes"
    with pytest.raises(DataError, match=pattern):
        fetch(server.url + "/f", tmp_path / "f")
    assert listing(tmp_path) == []


def test_a_wrong_file_leaves_nothing(tmp_path, serve):
    wrong = bytearray(DATA)
    wrong[5] ^= 1
    server = serve({"/f": bytes(wrong)})
    with pytest.raises(DataError, match=r"sha256 [0-9a-f]{16}\.\.\. differs from the pinned"):
        fetch(server.url + "/f", tmp_path / "f")
    assert listing(tmp_path) == []


def test_a_wrong_partial_file_is_downloaded_again(tmp_path, serve):
    server = serve({"/f": DATA})
    (tmp_path / "f.part").write_bytes(b"not the start of it")
    assert fetch(server.url + "/f", tmp_path / "f").read_bytes() == DATA
    assert [r for _, r in server.requests] == ["bytes=19-", None] and listing(tmp_path) == ["f"]


REPLIES = {
    "not HTTP": (raw(b"SSH-2.0-OpenSSH_9.2\r\n\r\n"), "not an HTTP reply"),
    "chunked body cut short": (raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1000\r\n" + DATA[:100]),
                               "the body was cut short"),
    "150 headers": (raw(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(150)) + b"\r\n"),
                    "a broken HTTP reply .got more than 100 headers"),
    "over-long header": (raw(b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000 + b"\r\n\r\n"),
                         "a broken HTTP reply .got more than 65536 bytes"),
    "no reply": (raw(b""), "closed the connection without a reply"),
    "silent": (lambda handler: time.sleep(1.5), r"no data for 0.5 s \(timed out\)"),
    "404": (None, "HTTP 404 Not Found"),
    "redirect loop": (raw(b"HTTP/1.1 302 Found\r\nLocation: /f\r\nContent-Length: 0\r\n\r\n"),
                      "HTTP 302: the redirects go round in a loop"),
}


@pytest.mark.parametrize("case", list(REPLIES) + ["closed port"])
def test_every_network_failure_is_one_line(tmp_path, serve, case):
    route, pattern = REPLIES.get(case, (None, "Connection refused"))
    server = serve({"/f": route} if route else {})
    url = f"http://127.0.0.1:{closed_port()}/f" if case == "closed port" else server.url + "/f"
    with pytest.raises(DataError) as error:
        fetch(url, tmp_path / "f", read_timeout=0.5)
    message = str(error.value)
    assert "\n" not in message, message
    assert message.startswith(f"could not download the test file: {url}: "), message
    assert re.search(pattern, message), message
    assert not (tmp_path / "f").exists()


def closed_port():
    """A loopback port nothing listens on: bound, then closed (port 9 may have a listener)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_mirror_base_from_the_environment(monkeypatch):
    monkeypatch.setenv("MINITF_TEST_MIRROR", "http://mirror.example/debian/")
    assert dl.mirror_base("MINITF_TEST_MIRROR", "https://deb.debian.org/debian") == "http://mirror.example/debian"
    monkeypatch.setenv("MINITF_TEST_MIRROR", "")
    assert dl.mirror_base("MINITF_TEST_MIRROR", "https://deb.debian.org/debian") == "https://deb.debian.org/debian"


CHILD = ("import sys; from minitf.training.download import download\n"
         "download(sys.argv[1], sys.argv[2], size=int(sys.argv[3]), sha256=sys.argv[4], what='x', progress=False)")


def test_sigterm_leaves_only_the_part_file_and_the_next_start_resumes_it(tmp_path, serve):
    server = serve({"/f": slowly(DATA, 512, 0.05)})  # ~10 KB/s: 4 s for the whole file, time to land a SIGTERM
    dest = tmp_path / "f"
    child = subprocess.Popen([sys.executable, "-c", CHILD, server.url + "/f", str(dest), str(len(DATA)), SHA],
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    part = tmp_path / "f.part"
    err = sigterm_once_part_grows(child, part)
    assert child.returncode != 0, err
    assert listing(tmp_path) == ["f.part"]  # no temp file, no half-written dest: only the resumable part
    kept = part.stat().st_size
    assert 2048 <= kept < len(DATA)
    server.routes["/f"] = DATA
    assert fetch(server.url + "/f", dest).read_bytes() == DATA
    assert server.requests[-1] == ("/f", f"bytes={kept}-") and listing(tmp_path) == ["f"]


def test_progress_bar_only_where_asked(tmp_path, serve, capsys):
    server = serve({"/f": DATA})
    fetch(server.url + "/f", tmp_path / "a", progress=True)  # stderr is not a terminal here: quiet
    assert capsys.readouterr().err == ""
    fetch(server.url + "/f", tmp_path / "b", progress="always")
    err = capsys.readouterr().err
    assert "the test file" in err and "/40.0k" in err and "B/s" in err  # bytes of the total, rate, ETA
