"""The inspection page's server (``python -m minitf.inspect --serve``, minitf/study/inspection/serve.py,
docs/inspect.md#security-model) against hostile and broken requests, with real HTTP clients on 127.0.0.1 and
every wait bounded:

1. a request for another host name (DNS rebinding) is refused with a short body holding nothing of the run;
2. a connection that sends nothing blocks nobody else and is closed after the read timeout; requests are served
   concurrently while the model computes one sentence at a time;
3. a run file that cannot be read while serving gives the 500 page, not an empty reply; a failing error page
   gives a short 500 page;
4. control characters of a request reach the log escaped; raw bytes that are not UTF-8 in the request line are
   a 400, raw UTF-8 is read as UTF-8;
5. ``--text`` or ``--reference`` bytes that are not UTF-8 on the command line are one line and exit 1;
6. a metrics.jsonl that is not a regular file (a FIFO, a link to /dev/zero) is refused at once, never read, and
   the server goes on;
7. direction and invisible characters (bidi overrides and isolates, zero-width spaces and joiners, ESC, BEL)
   reach the page and the terminal as visible escapes (``[U+202E]``, ``\\x1b``);
8. requests whose client has gone are not computed; an absolute URI naming another host is refused; an HTTP/0.9
   request is answered at once.

The page's numbers and the server's ordinary errors are in tests/test_inspect.py.
"""
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import unicodedata
import urllib.error
import urllib.parse
import urllib.request

import pytest

from minitf import inspect
from minitf.study.inspection import page, serve
from minitf.training.errors import DataError
from minitf.training.kind import TRANSLATION_PAGE
from tests.runs import CPU_ENV, ROOT, copy_run, read_line

TIMEOUT = 30  # s: the longest any answer may take here (a blocked server fails the test, never hangs it)
#: The address space a served command may take here (it needs about 200 MB): a server that reads a device
#: without a limit fails with a MemoryError instead of filling the machine.
MEMORY_LIMIT = 1 << 30


def get(url, headers=None, timeout=TIMEOUT):
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8")


def raw_request(port, data, timeout=TIMEOUT):
    """Send ``data`` (bytes, as they are) and return the whole reply (the server closes after one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(data)
        reply = b""
        while chunk := connection.recv(65536):
            reply += chunk
    return reply


def status_of(reply):
    return int(reply.split(b" ", 2)[1])


@contextlib.contextmanager
def in_process(respond=None, error_page=None, **options):
    """A server of ``serve.make_server`` in a thread: (server, base url, its log lines)."""
    lines = []
    respond = respond or (lambda query: (200, "page " + json.dumps(query)))
    error_page = error_page or (lambda message, query: "error " + message)
    server = serve.make_server(respond, error_page, max_chars=50, log=lines.append, **options)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_port}/", lines
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=TIMEOUT)


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


@contextlib.contextmanager
def serving(run):
    """``python -m minitf.inspect --checkpoint RUN --serve`` on a free port (its memory capped at
    :data:`MEMORY_LIMIT`): its base url."""
    child = subprocess.Popen([sys.executable, "-m", "minitf.inspect", "--checkpoint", str(run), "--serve",
                              "--port", "0", "--beam", "1"], cwd=ROOT, env=CPU_ENV, stderr=subprocess.PIPE,
                             preexec_fn=limit_memory)
    try:
        line = read_line(child.stderr.fileno())
        yield re.fullmatch(r"serving (http://127\.0\.0\.1:\d+/) \(Ctrl-C stops\)", line).group(1)
    finally:
        child.send_signal(signal.SIGINT)
        try:
            assert child.wait(timeout=TIMEOUT) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stderr.close()


# --------------------------------------------------------------------------- 1. DNS rebinding
def test_a_foreign_host_is_refused_with_nothing_of_the_run(world):
    run = world["ref"]
    with serving(run) as base:
        status, html = get(base)
        data = page.read_data(html)
        shape = data["model"]["facts"][0][1]                       # "Transformer (encoder-decoder), ... d_model 16"
        losses = [json.dumps(loss) for loss in data["curves"]["train"]["loss"]]
        secrets = [str(run), shape, *losses, page.DATA_ID]
        assert status == 200 and all(secret in html for secret in secrets)  # what a refusal must not carry
        for host in ("rebound.example:8000", "127.0.0.1.rebound.example", ""):
            status, body = get(base + "?text=Der+hund.", headers={"Host": host})
            assert status == 400 and "127.0.0.1 or localhost only" in body, (host, body[:300])
            assert len(body) < 200 and [s for s in secrets if s in body] == [], (host, body[:300])
        assert get(base, headers={"Host": "localhost"})[0] == 200  # the names it serves still work


# --------------------------------------------------------------------------- 2. idle connections, concurrency
def test_an_idle_connection_blocks_nobody_else():
    with in_process() as (server, base, _):
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=TIMEOUT) as idle:
            idle.sendall(b"GET /?te")  # a request begun and never finished
            with socket.create_connection(("127.0.0.1", server.server_port), timeout=TIMEOUT):  # and one silent
                started = time.monotonic()
                assert get(base + "?text=hello", timeout=5) == (200, 'page {"text": "hello"}')
                assert time.monotonic() - started < 5


def test_an_idle_connection_is_closed_after_the_read_timeout():
    with in_process(timeout=1) as (server, base, _):
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=TIMEOUT) as idle:
            started = time.monotonic()
            assert idle.recv(1024) == b""  # the server closed it without an answer
            assert 0.5 < time.monotonic() - started < 10


def test_requests_are_concurrent_but_the_model_computes_one_at_a_time():
    busy, overlaps, lock = [0], [], threading.Lock()

    def respond(query):
        with lock:
            busy[0] += 1
            overlaps.append(busy[0])
        time.sleep(0.2)  # the model's work
        with lock:
            busy[0] -= 1
        return 200, "page " + json.dumps(query)

    with in_process(respond) as (server, base, _):
        answers = {}
        clients = [threading.Thread(target=lambda i=i: answers.update({i: get(base + f"?text={i}")}))
                   for i in range(4)]
        for client in clients:
            client.start()
        for client in clients:
            client.join(timeout=TIMEOUT)
    assert answers == {i: (200, f'page {{"text": "{i}"}}') for i in range(4)}
    assert overlaps == [1, 1, 1, 1]  # never two sentences in the model at once


# --------------------------------------------------------------------------- 3. broken run files, broken error pages
def test_an_unreadable_metrics_file_while_serving_gives_the_500_page(world, tmp_path):
    run = copy_run(world["ref"], tmp_path / "run")
    with serving(run) as base:
        status, html = get(base)
        assert status == 200 and page.read_data(html)["curves"] is not None
        (run / "metrics.jsonl").unlink()
        (run / "metrics.jsonl").mkdir()  # unreadable, even for root
        for query in ("", "?text=Der+hund."):
            status, html = get(base + query)
            data = page.read_data(html)
            assert status == 500 and "metrics.jsonl" in data["error"] and data["curves"] is None, (query, data)
        status, html = get(base + "?text=+")  # a bad request's page reads no run file either
        assert status == 400 and "empty" in page.read_data(html)["error"]
        shutil.rmtree(run / "metrics.jsonl")
        shutil.copy(world["ref"] / "metrics.jsonl", run / "metrics.jsonl")
        status, html = get(base + "?text=Der+hund.")  # the server went on
        assert status == 200 and page.read_data(html)["examples"][0]["text"] == "Der hund."


def test_an_error_page_that_fails_still_answers_500_with_the_message():
    def respond(query):
        raise RuntimeError("deep <trouble>")

    def error_page(message, query):
        raise OSError("the error page cannot be made either")

    with in_process(respond, error_page) as (server, base, _):
        status, body = get(base + "?text=a")
        assert status == 500 and "RuntimeError: deep &lt;trouble&gt;" in body and len(body) < 500, body
        status, body = get(base + "?other=1")  # a 400 whose page fails: still its status and message
        assert status == 400 and "unknown field" in body


# --------------------------------------------------------------------------- 4. what a request can carry
def test_control_characters_reach_the_log_escaped():
    with in_process() as (server, base, lines):
        for target in (b"/\x1b[2J\x1b]0;owned\x07", b"/?text=\x9b31m"):  # ESC..., and CSI as one raw byte
            reply = raw_request(server.server_port, b"GET " + target + b" HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            assert reply.startswith(b"HTTP/1.0 "), reply
    log = " ".join(lines)
    assert len(lines) >= 2 and not re.search(r"[\x00-\x1f\x7f-\x9f]", log), lines
    assert "\\x1b[2J\\x1b]0;owned\\x07" in log and "\\x9b31m" in log


def test_raw_bytes_that_are_not_utf8_are_a_400_and_raw_utf8_is_read_as_utf8():
    queries = []

    def respond(query):
        queries.append(query)
        return 200, "page " + json.dumps(query, ensure_ascii=False)

    with in_process(respond) as (server, base, _):
        for target in (b"/?text=\xff", b"/?text=caf\xe9", b"/?text=\xc3"):
            reply = raw_request(server.server_port, b"GET " + target + b" HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            assert status_of(reply) == 400 and b"not valid UTF-8" in reply, (target, reply)
        reply = raw_request(server.server_port, b"GET /?text=H\xc3\xbcnd HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        assert status_of(reply) == 200 and reply.endswith('page {"text": "Hünd"}'.encode())
    assert queries == [{"text": "Hünd"}]


# --------------------------------------------------------------------------- 5. the command line
@pytest.mark.parametrize("flag", ["--text", "--reference"])
def test_command_line_text_that_is_not_utf8_is_one_line(flag, world, tmp_path):
    out = tmp_path / "page.html"
    given = {"--text": b"Der \xff hund.", "--reference": b"The \xff dog."}
    argv = [sys.executable, "-m", "minitf.inspect", "--checkpoint", str(world["ref"]), "--out", str(out),
            "--beam", "1", "--text", given["--text"] if flag == "--text" else b"Der hund."]
    if flag == "--reference":
        argv += ["--reference", given["--reference"]]
    done = subprocess.run(argv, cwd=ROOT, env=CPU_ENV, capture_output=True, timeout=120)
    err = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
    assert done.returncode == 1 and len(err) == 1, err
    assert err[0].startswith("minitf.inspect: error: ") and flag in err[0] and "UTF-8" in err[0], err
    assert not out.exists()


# --------------------------------------------------------------------------- 6. run files that are not files
def test_a_fifo_or_a_device_in_place_of_the_metrics_file_is_refused_and_the_server_goes_on(world, tmp_path):
    run = copy_run(world["ref"], tmp_path / "run")
    metrics = run / "metrics.jsonl"
    with serving(run) as base:
        assert get(base)[0] == 200
        metrics.unlink()
        os.mkfifo(metrics)  # no writer: an open() that waits for one never returns
        for query in ("", "?text=Der+hund.", ""):  # each answered at once, and the server is not wedged
            status, html = get(base + query, timeout=10)
            data = page.read_data(html)
            assert status == 500 and f"{metrics} is a FIFO" in data["error"] and data["curves"] is None, data["error"]
        metrics.unlink()
        metrics.symlink_to("/dev/zero")  # endless: read whole, it fills the memory
        status, html = get(base, timeout=10)
        error = page.read_data(html)["error"]
        assert status == 500 and f"{metrics} is a character device" in error, error
        metrics.unlink()
        shutil.copy(world["ref"] / "metrics.jsonl", metrics)
        status, html = get(base)  # a file again: its curves again
        assert status == 200 and page.read_data(html)["curves"] is not None


def test_a_metrics_file_longer_than_the_cap_is_refused_unread(world, monkeypatch):
    size = (world["ref"] / "metrics.jsonl").stat().st_size
    assert inspect.read_curves(world["ref"], TRANSLATION_PAGE)["train"]["step"]  # read whole at its own size
    monkeypatch.setattr(inspect, "MAX_METRICS_BYTES", size - 1)
    with pytest.raises(DataError, match=f"metrics.jsonl holds {size:,} bytes, more than the {size - 1:,} read here"):
        inspect.read_curves(world["ref"], TRANSLATION_PAGE)


# --------------------------------------------------------------------------- 7. direction and invisible characters
#: What a hostile sentence may carry: a right-to-left override, isolates, zero-width space and joiner, word joiner,
#: BOM, and a terminal's escape sequence with a bell.
SPOOF = "Der \u202ehund\u200b und\u2066 \u200d\u2060\ufeff\u2067\u202a\x1b[31m\x07katze."
#: What each becomes where the page or the terminal shows it.
ESCAPED = ["[U+202E]", "[U+200B]", "[U+2066]", "[U+200D]", "[U+2060]", "[U+FEFF]", "[U+2067]", "[U+202A]",
           "\\x1b", "\\x07"]


def invisible(text):
    """The characters of ``text`` that a browser or a terminal would not show as themselves."""
    return [char for char in text if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs")]


def strings(value):
    """Every string in a page's JSON data."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def test_visible_escapes_the_hidden_characters_and_nothing_else():
    ordinary = "Die Ärztin ▁Haus </s> 日本語 ‐ \u00a0 ä \\x1b [U+202E]"  # shown as they are (a no-break space too)
    assert page.visible(ordinary) == ordinary
    assert page.visible(SPOOF) == ("Der [U+202E]hund[U+200B] und[U+2066] [U+200D][U+2060][U+FEFF][U+2067][U+202A]"
                                   "\\x1b[31m\\x07katze.")
    hidden = "\n\t\r\x00\x7f\x9b\u00ad\u200e\u200f\u2028\u2029\U000e0041\udcff"
    assert page.visible(hidden) == ("\\x0a\\x09\\x0d\\x00\\x7f\\x9b[U+00AD][U+200E][U+200F][U+2028][U+2029]"
                                    "[U+E0041][U+DCFF]")
    assert page.visible(page.visible(SPOOF + hidden)) == page.visible(SPOOF + hidden)  # escaping twice changes nothing


def test_direction_and_invisible_characters_are_shown_escaped_in_the_page(world):
    with serving(world["ref"]) as base:
        query = urllib.parse.urlencode({"text": SPOOF, "reference": "\u202eThe dog."})
        status, html = get(base + "?" + query)
        data = page.read_data(html)
        assert status == 200, data["error"]
        shown = {key: value for key, value in data.items() if key != "serve"}
        assert [invisible(text) for text in strings(shown) if invisible(text)] == []
        note, = data["examples"][0]["notes"]  # the page's own warning, naming each character
        assert all(escape in note for escape in ESCAPED), note
        assert data["examples"][0]["reference"] == "[U+202E]The dog."
        assert data["serve"]["text"] == SPOOF  # the text box keeps the sentence as sent: sent again, it is the same
        status, html = get(base + "?" + urllib.parse.urlencode({"\u202etext": "x"}))  # an error page too
        error = page.read_data(html)["error"]
        assert status == 400 and "unknown field" in error and not invisible(error), error


def test_direction_and_invisible_characters_reach_the_terminal_escaped(world, tmp_path):
    out = tmp_path / "page.html"
    done = subprocess.run([sys.executable, "-m", "minitf.inspect", "--checkpoint", str(world["ref"]), "--out",
                           str(out), "--beam", "1", "--text", SPOOF], cwd=ROOT, env=CPU_ENV, capture_output=True,
                          timeout=120)
    err = done.stderr.decode("utf-8")
    assert done.returncode == 0 and out.exists(), err
    warning, = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert invisible(err.replace("\n", "")) == [] and all(escape in warning for escape in ESCAPED), ascii(err)
    assert page.read_data(out.read_text(encoding="utf-8"))["examples"][0]["notes"] == [warning[len("warning: "):]]


# --------------------------------------------------------------------------- 8. abandoned, misdirected, HTTP/0.9
def test_requests_whose_client_has_gone_are_not_computed():
    computed, release = [], threading.Event()

    def respond(query):
        computed.append(query.get("text"))
        if query.get("text") == "first":
            assert release.wait(TIMEOUT)  # the model busy while the others come and go
        return 200, "page " + json.dumps(query)

    with in_process(respond) as (server, base, lines):
        first = threading.Thread(target=get, args=(base + "?text=first",))
        first.start()
        deadline = time.monotonic() + TIMEOUT
        while computed != ["first"]:
            assert time.monotonic() < deadline, computed
            time.sleep(0.01)
        for i in range(10):  # sent, and abandoned before their turn
            with socket.create_connection(("127.0.0.1", server.server_port), timeout=TIMEOUT) as client:
                client.sendall(b"GET /?text=gone%d HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" % i)
        release.set()
        first.join(timeout=TIMEOUT)
        while sum("gone" in line for line in lines) < 10:  # each one's turn came and went
            assert time.monotonic() < deadline, lines
            time.sleep(0.01)
        assert get(base + "?text=last", timeout=5) == (200, 'page {"text": "last"}')
    assert computed == ["first", "last"], computed
    assert sum("not computed" in line for line in lines) == 10, lines


def test_an_absolute_uri_naming_another_host_is_refused():
    with in_process() as (server, base, _):
        port = server.server_port
        for target in (b"http://other.host/?text=x", b"http://other.host:%d/?text=x" % port,
                       b"HTTP://OTHER.HOST/?text=x", b"http://127.0.0.1@other.host/?text=x", b"https://other.host/"):
            reply = raw_request(port, b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert status_of(reply) == 400 and reply.endswith(serve.REFUSAL.encode()), (target, reply)
        for host in (b"127.0.0.1:%d" % port, b"localhost"):  # one naming this server is served
            reply = raw_request(port, b"GET http://" + host + b"/?text=x HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            assert status_of(reply) == 200 and reply.endswith(b'page {"text": "x"}'), (host, reply)


def test_an_http_0_9_request_is_answered_at_once():
    with in_process() as (server, base, _):
        started = time.monotonic()
        reply = raw_request(server.server_port, b"GET /\r\n", timeout=5)  # HTTP/0.9: no version, no headers
        assert time.monotonic() - started < 3 and b"HTTP/0.9" in reply, reply
        assert get(base + "?text=x") == (200, 'page {"text": "x"}')
