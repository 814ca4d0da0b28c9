"""``python -m minitf.inspect --serve``: the inspection page on http://127.0.0.1:PORT/ with a text box;
each sentence sent is computed by the one model the command loaded. Bound to 127.0.0.1 only; requests are
served in threads (an idle or slow client holds only its own, and each read waits at most READ_TIMEOUT
seconds) while the model computes one sentence at a time (a lock; the page around its numbers, which reads the
run's files, is made outside it), and a request whose client has gone by its turn is not computed; the query
capped in size. A request for another host name (in its Host header or in an absolute URI) gets a short
refusal holding nothing of the run; an HTTP/0.9 request (no version) is answered at once; a bad request is
answered with an error in the page (status 400) and the server goes on. The security model:
docs/inspect.md#security-model."""
import html
import http.server
import re
import select
import socket
import sys
import threading
import urllib.parse

from minitf.study.inspection.page import visible

HOST = "127.0.0.1"  # localhost only: never another interface
#: The longest request line accepted (the text box's own cap is the command's --max-chars).
MAX_URL = 16384
#: The names a query may carry.
FIELDS = ("text", "reference")
#: Seconds one read from (or write to) a client may wait before its connection is closed.
READ_TIMEOUT = 10
#: The host names served (any port): a request naming another is refused.
OURS = (HOST, "localhost")
#: The whole answer to a request for another host name: nothing of the run, nothing of the request.
REFUSAL = f"this server answers requests for {HOST} or localhost only\n"
#: The whole answer to an HTTP/0.9 request (a request line with no version), which has no headers to wait for.
NO_VERSION = "this server answers HTTP/1.0 and HTTP/1.1 requests only; this one names no version (HTTP/0.9)\n"
#: A request target in absolute form (``http://host/path``): the host it names is the request's.
ABSOLUTE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


class BadRequest(ValueError):
    """A request the server answers with status 400 and its message in the page."""


def parse_query(path, max_chars):
    """{field: text} of a request path ``/?text=...&reference=...``: UTF-8, each field once, at most
    ``max_chars`` characters each. BadRequest for anything else."""
    if len(path) > MAX_URL:
        raise BadRequest(f"the request is {len(path)} characters long; at most {MAX_URL} are read")
    try:  # http.server reads the request line as Latin-1: its raw bytes back, then read as UTF-8
        path = path.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise BadRequest("the request is not valid UTF-8; send the sentence as UTF-8 text") from None
    url = urllib.parse.urlsplit(path)
    if url.path != "/":
        raise BadRequest(f"there is no page {url.path!r} here; the inspection page is at /")
    try:
        pairs = urllib.parse.parse_qsl(url.query, keep_blank_values=True, errors="strict", max_num_fields=len(FIELDS))
    except UnicodeDecodeError:
        raise BadRequest("the query is not valid UTF-8; send the sentence as UTF-8 text") from None
    except ValueError as error:  # too many fields, or malformed
        raise BadRequest(f"the query does not fit: {error}; send text= and, for translation, reference=") from None
    query = {}
    for name, value in pairs:
        if name not in FIELDS:
            raise BadRequest(f"unknown field {name!r}; the page sends {' and '.join(FIELDS)}")
        if name in query:
            raise BadRequest(f"the field {name!r} comes twice; send it once")
        if len(value) > max_chars:
            raise BadRequest(f"the {name} has {len(value)} characters; at most {max_chars} are inspected here "
                             "(--max-chars): shorten it")
        query[name] = value
    return query


def make_server(compute, error_page, max_chars, port=0, log=None, timeout=READ_TIMEOUT, present=None):
    """A threading HTTP server on 127.0.0.1:``port`` (0: any free port; ``server.server_port`` says which).
    ``compute(query)`` does the model's work for a parsed query ({} for the empty form), one call at a time;
    ``present(query, computed)`` -> (status, html) makes the answer from what it returned, outside that lock,
    so that a slow run file holds up no other request (without ``present``, ``compute`` returns (status,
    html) itself); ``error_page(message, query)`` -> html answers a BadRequest (400) and anything else either
    raises (500, the server goes on); if it fails too, a short page of the message answers. A request whose
    client has closed its connection by the time the lock is its own is not computed (a line in the log). A
    request for another host (its Host header, or the host of an absolute URI) is refused (400) with
    :data:`REFUSAL` alone, an HTTP/0.9 request (400) with :data:`NO_VERSION` at once. Each read from a client waits at most
    ``timeout`` seconds. ``log(line)`` gets one line per request, every hidden character escaped
    (:func:`~minitf.study.inspection.page.visible`) (default: none)."""
    one_at_a_time = threading.Lock()  # one model: its work is never concurrent

    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "minitf-inspect"

        def setup(self):
            self.timeout = timeout  # StreamRequestHandler sets it on the socket: an idle client is dropped
            super().setup()

        def do_GET(self):
            if not self._host_is_ours():
                return self._send(400, REFUSAL, "text/plain")
            query = {}
            try:
                query = parse_query(self.path, max_chars)
                with one_at_a_time:
                    if self._client_gone():  # queued, then abandoned: no one would read the page
                        self.log_message('"%s" not computed: the client had closed the connection', self.requestline)
                        return
                    computed = compute(query)
                status, page = computed if present is None else present(query, computed)
            except BadRequest as error:
                status, page = 400, self._error_page(str(error), query)
            except Exception as error:  # noqa: BLE001 -- one bad request must not stop the server
                status, page = 500, self._error_page(
                    f"the page could not be computed ({type(error).__name__}: {error})", query)
            self._send(status, page)

        def _error_page(self, message, query):
            try:
                return error_page(message, query)
            except Exception as error:  # noqa: BLE001 -- every request gets an answer, this one a short page
                return (f"<!DOCTYPE html>\n<title>minitf inspect: error</title>\n<p>{html.escape(message)}</p>\n"
                        f"<p>(the error page failed too: {html.escape(type(error).__name__)})</p>\n")

        def _send(self, status, text, kind="text/html"):
            body = text.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(body)

        def parse_request(self):
            if len(str(self.raw_requestline, "iso-8859-1").split()) == 2:  # HTTP/0.9: answered now, not after
                self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")  # waiting for headers
                self.command, self.request_version, self.close_connection = None, "HTTP/1.0", True
                self._send(400, NO_VERSION, "text/plain")
                return False
            return super().parse_request()

        def _host_is_ours(self):
            # a page elsewhere cannot reach this server through a name that resolves to 127.0.0.1 (DNS rebinding):
            # its Host header names it; nor through a request line naming another host (an absolute URI, whose host
            # a server obeys over the Host header)
            hosts = [(self.headers.get("Host") or "").rsplit(":", 1)[0]]
            if ABSOLUTE.match(self.path):
                try:
                    hosts.append(urllib.parse.urlsplit(self.path).hostname or "")
                except ValueError:  # a malformed authority (a port that is not a number, a bracket left open)
                    return False
            return all(host.lower() in OURS for host in hosts)

        def _client_gone(self):
            """Whether the client has closed (or reset) its connection: at its end, nothing left to read."""
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)
            except OSError:  # reset by the client
                return True

        def log_message(self, format, *args):  # noqa: A002 (the base class's name)
            if log is not None:  # a request's escape sequences and direction controls never reach a terminal raw
                log(visible(f"{self.address_string()} {format % args}"))

    server = http.server.ThreadingHTTPServer((HOST, port), Handler)
    server.daemon_threads = True  # a client still connected does not hold up Ctrl-C
    return server


def serve_forever(server, out=None):
    """Serve until Ctrl-C (then close the socket and return 0)."""
    out = out or sys.stderr
    print(f"serving http://{HOST}:{server.server_port}/ (Ctrl-C stops)", file=out, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
