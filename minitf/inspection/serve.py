"""``python -m minitf.inspect --serve``: the inspection page on http://127.0.0.1:PORT/ with a text box;
each sentence sent is computed by the one model the command loaded. Bound to 127.0.0.1 only, one
request at a time (one model, no threads), the query capped in size; a bad request is answered with
an error in the page (status 400) and the server goes on."""
import http.server
import sys
import urllib.parse

HOST = "127.0.0.1"  # localhost only: never another interface
#: The longest request line accepted (the text box's own cap is the command's --max-chars).
MAX_URL = 16384
#: The names a query may carry.
FIELDS = ("text", "reference")


class BadRequest(ValueError):
    """A request the server answers with status 400 and its message in the page."""


def parse_query(path, max_chars):
    """{field: text} of a request path ``/?text=...&reference=...``: UTF-8, each field once, at most
    ``max_chars`` characters each. BadRequest for anything else."""
    if len(path) > MAX_URL:
        raise BadRequest(f"the request is {len(path)} characters long; at most {MAX_URL} are read")
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


def make_server(respond, error_page, max_chars, port=0, log=None):
    """An HTTPServer on 127.0.0.1:``port`` (0: any free port; ``server.server_port`` says which).
    ``respond(query)`` -> (status, html) answers a parsed query ({} for the empty form);
    ``error_page(message, query)`` -> html answers a BadRequest (400) and anything ``respond`` raises
    (500, the server goes on). ``log(line)`` gets one line per request (default: none)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "minitf-inspect"

        def do_GET(self):
            query = {}
            try:
                self._check_host()
                query = parse_query(self.path, max_chars)
                status, page = respond(query)
            except BadRequest as error:
                status, page = 400, error_page(str(error), query)
            except Exception as error:  # noqa: BLE001 -- one bad request must not stop the server
                status, page = 500, error_page(f"the page could not be computed ({type(error).__name__}: {error})",
                                               query)
            body = page.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(body)

        def _check_host(self):
            # a page elsewhere cannot reach this server through a name that resolves to 127.0.0.1 (DNS rebinding)
            host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
            if host not in (HOST, "localhost"):
                raise BadRequest(f"this server answers requests for {HOST} or localhost only, not {host!r}")

        def log_message(self, format, *args):  # noqa: A002 (the base class's name)
            if log is not None:
                log(f"{self.address_string()} {format % args}")

    return http.server.HTTPServer((HOST, port), Handler)


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
