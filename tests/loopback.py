"""A loopback HTTP server (127.0.0.1, a free port) for the download tests: no network.

``Server(routes)``: ``routes`` maps a path to the bytes served there (honouring
``Range: bytes=N-`` with a 206 unless ``ranges=False``) or to a function
``f(handler)`` that writes a whole reply itself (a trickle, a broken reply...).
``server.requests`` lists ``(path, Range header or None)`` in order of arrival.
"""
import http.server
import threading
import time


class Server:
    def __init__(self, routes, ranges=True):
        self.routes, self.ranges, self.requests = routes, ranges, []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Range")))
                route = server.routes.get(self.path)
                self.close_connection = True
                if route is None:
                    self.send_error(404)
                elif callable(route):
                    route(self)
                else:
                    server.send_bytes(self, route)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def send_bytes(self, handler, data):
        start = 0
        wanted = handler.headers.get("Range")
        if self.ranges and wanted and wanted.startswith("bytes=") and wanted.endswith("-"):
            start = int(wanted[len("bytes="):-1])
            if start >= len(data):
                handler.send_response(416)
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            handler.send_response(206)
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            handler.send_response(200)
        handler.send_header("Content-Length", str(len(data) - start))
        handler.end_headers()
        try:
            handler.wfile.write(data[start:])
        except OSError:  # the client gave up
            pass

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def slowly(data, chunk, delay, length=None):
    """A route that sends ``data`` in ``chunk``-byte pieces, ``delay`` s apart
    (announcing ``length`` bytes, default ``len(data)``; False: no Content-Length)."""
    def route(handler):
        handler.send_response(200)
        if length is not False:
            handler.send_header("Content-Length", str(len(data) if length is None else length))
        handler.end_headers()
        try:
            for i in range(0, len(data), chunk):
                handler.wfile.write(data[i:i + chunk])
                handler.wfile.flush()
                time.sleep(delay)
        except OSError:
            pass
    return route


def raw(reply):
    """A route that writes ``reply`` (bytes) as it is, headers and all, then closes."""
    def route(handler):
        try:
            handler.wfile.write(reply)
            handler.wfile.flush()
        except OSError:
            pass
    return route

