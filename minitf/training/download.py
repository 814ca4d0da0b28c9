"""Downloading one file of pinned size and sha256 over HTTP(S) with the standard library: resumed from
``DEST.part``, never more than the pinned size, trickling mirrors given up, renamed to ``DEST`` only with the
pinned sha256, every network failure one line, SIGTERM raising :class:`Terminated` so ``finally`` cleans up."""
import collections
import contextlib
import http.client
import os
import pathlib
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

from minitf.training.errors import DataError, Interrupted
from minitf.training.files import file_sha256, fsync_dir

_BLOCK = 1 << 16
#: Where fetched corpora are kept (either model's): $XDG_CACHE_HOME/minitf, else ~/.cache/minitf (``--cache-dir``).
DEFAULT_CACHE = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "minitf"


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while a download (or an unpacking) ran: a KeyboardInterrupt, so that nothing on the way
    swallows it and the commands report an interruption."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def sigterm_raises():
    """Inside the block SIGTERM raises :class:`Terminated`, so ``finally`` blocks remove their temp files;
    only in the main thread and where SIGTERM has its default action (a command's own handler is kept)."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def stop(signum, frame):
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def mirror_base(env_var, default):
    """The base URL in ``env_var`` when set and not empty, else ``default``; no trailing ``/``."""
    return (os.environ.get(env_var, "").strip() or default).rstrip("/")


class _MirrorFailed(Exception):
    """One URL failed; ``reason`` is one line. ``keep``: the ``.part`` is good to resume."""

    def __init__(self, reason, keep=True):
        super().__init__(reason)
        self.reason, self.keep = reason, keep


def download(urls, dest, *, size, sha256, what, progress=True, min_rate=1024, rate_window=60.0,
             read_timeout=60.0, log=None):
    """Download the file of pinned ``size`` and ``sha256`` to ``dest`` from the first of ``urls`` (one or mirrors
    in order) that delivers it, and return ``dest`` (at once when it is already right). ``progress``: a bar on
    stderr (True: on a terminal, "always", False). A mirror giving under ``min_rate`` bytes/s over
    ``rate_window`` s, or nothing for ``read_timeout`` s, is given up. ``log`` takes one-line notes. A one-line
    DataError (each URL's reason, or an unwritable folder) ends with what to do."""
    urls = [urls] if isinstance(urls, str) else list(urls)
    dest = pathlib.Path(dest)
    part = dest.with_name(dest.name + ".part")
    note = log or (lambda message: None)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_file() and dest.stat().st_size == size and file_sha256(dest) == sha256:
            return dest
        if part.is_file() and (part.stat().st_size > size
                               or part.stat().st_size == size and file_sha256(part) != sha256):
            part.unlink()  # not the pinned file, nor a prefix of it
    except OSError as error:
        raise DataError(f"cannot write {what} to {dest.parent} ({error.strerror or error}); "
                        "choose another cache folder") from None
    try:
        return _download(urls, dest, part, size, sha256, what, progress, min_rate, rate_window, read_timeout, note)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (Terminated): say what is kept
        if isinstance(stop, Interrupted):
            raise
        kept = part.stat().st_size if part.is_file() else 0
        raise Interrupted(getattr(stop, "signum", signal.SIGINT), (
            f"kept {part} ({kept:,} of {size:,} bytes of {what}): the same command resumes the download"
            if kept else f"nothing of {what} was kept")) from None


def _download(urls, dest, part, size, sha256, what, progress, min_rate, rate_window, read_timeout, note):
    reasons = []
    with sigterm_raises():
        for url in urls:
            try:
                resumed = part.is_file() and part.stat().st_size > 0
                _fetch(url, part, size, what, progress, min_rate, rate_window, read_timeout, note)
                if resumed and file_sha256(part) != sha256:  # the kept bytes were not a prefix of it
                    part.unlink()
                    note(f"{what}: the resumed file is wrong; downloading it again from byte 0")
                    _fetch(url, part, size, what, progress, min_rate, rate_window, read_timeout, note)
                digest = file_sha256(part)
                if digest != sha256:
                    raise _MirrorFailed(f"sha256 {digest[:16]}... differs from the pinned {sha256[:16]}... "
                                        "(a corrupted or different file)", keep=False)
            except _MirrorFailed as failure:
                if not failure.keep:
                    part.unlink(missing_ok=True)
                reasons.append(f"{url}: {failure.reason}")
                if url != urls[-1]:
                    note(f"{what}: {url} failed ({failure.reason}); trying {urls[urls.index(url) + 1]}")
                continue
            os.replace(part, dest)
            fsync_dir(dest.parent)
            return dest
    kept = part.stat().st_size if part.is_file() else 0
    todo = (f"run again to resume ({kept} of {size} bytes kept in {part.name})" if kept else "run again later")
    raise DataError(f"could not download {what}: {'; '.join(reasons) or 'no URL to try'}; {todo}")


def _fetch(url, part, size, what, progress, min_rate, rate_window, read_timeout, note):
    """Bring ``part`` to ``size`` bytes from ``url`` (resuming it); raises _MirrorFailed."""
    for _ in range(2):  # a second time from byte 0 when the server refuses the range (416)
        have = part.stat().st_size if part.is_file() else 0
        if have == size:
            return
        headers = {"User-Agent": "minitf", "Accept-Encoding": "identity"}
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=read_timeout)
        except urllib.error.HTTPError as error:
            error.close()
            if error.code == 416 and have:
                part.unlink()
                continue
            raise _MirrorFailed(_http_error(error)) from None
        except Exception as error:  # noqa: BLE001 (every network exception becomes one line)
            raise _MirrorFailed(_network_reason(error, read_timeout)) from None
        with response:
            _receive(response, url, part, have, size, what, progress, min_rate, rate_window, read_timeout, note)
        return
    raise _MirrorFailed("the server refuses to resume and to start over (HTTP 416)", keep=False)


def _receive(response, url, part, have, size, what, progress, min_rate, rate_window, read_timeout, note):
    """Append the body of ``response`` to ``part`` (or rewrite it), at most ``size`` bytes in all."""
    if have and response.status == 206:
        first = response.headers.get("Content-Range", "").removeprefix("bytes ").split("-")[0]
        if first != str(have):
            raise _MirrorFailed(f"asked for bytes from {have}, the server sent "
                                f"{response.headers.get('Content-Range')!r}", keep=False)
        note(f"{what}: resuming at byte {have} of {size}")
    elif response.status == 200:
        if have:
            note(f"{what}: the server does not resume downloads; starting again from byte 0")
        have = 0
    else:
        raise _MirrorFailed(f"unexpected HTTP {response.status} {response.reason}")
    length = response.headers.get("Content-Length", "")
    if length.isdigit() and have + int(length) > size:
        raise _MirrorFailed(f"the server announces {have + int(length)} bytes, more than the pinned {size} "
                            "(a different file)", keep=False)
    bar = _progress_bar(progress, size, have, what)
    received, samples = have, collections.deque([(time.monotonic(), have)])
    try:
        with open(part, "ab" if have else "wb") as out:
            while received < size:
                block = _read(response, min(_BLOCK, size - received), read_timeout)
                if not block:
                    break
                out.write(block)
                received += len(block)
                bar.update(len(block))
                _check_rate(samples, received, min_rate, rate_window)
            out.flush()
            os.fsync(out.fileno())
            if received == size and _read(response, 1, read_timeout):
                raise _MirrorFailed(f"the server sent more than the pinned {size} bytes (a different file)", keep=False)
    except OSError as error:  # our own disk, not the network (network errors arrive as _MirrorFailed)
        raise DataError(f"cannot write {part} ({error.strerror or error}); free disk space or choose "
                        "another cache folder") from None
    finally:
        bar.close()
    if received < size:
        raise _MirrorFailed(f"the connection closed after {received} of {size} bytes")


def _read(response, n, read_timeout):
    """At most ``n`` bytes, as soon as any arrive (one read of the socket)."""
    try:
        return response.read1(n)
    except http.client.IncompleteRead as error:
        raise _MirrorFailed(f"the body was cut short ({len(error.partial)} bytes of a chunk arrived)") from None
    except Exception as error:  # noqa: BLE001
        raise _MirrorFailed(_network_reason(error, read_timeout)) from None


def _check_rate(samples, received, min_rate, rate_window):
    """Give up when fewer than ``min_rate`` bytes/s arrived over the last ``rate_window`` s; ``samples`` are
    (time, bytes so far), the oldest kept the last one at least a window old (the average spans a window)."""
    now = time.monotonic()
    samples.append((now, received))
    while len(samples) > 2 and samples[1][0] <= now - rate_window:
        samples.popleft()
    start, start_bytes = samples[0]
    if now - start >= rate_window and (received - start_bytes) / (now - start) < min_rate:
        raise _MirrorFailed(f"slower than {_rate_text(min_rate)} for {rate_window:g} s ({received} bytes so far)")


def _rate_text(rate):
    return f"{rate / 1024:g} KB/s" if rate >= 1024 else f"{rate:g} B/s"


def _progress_bar(progress, size, have, what):
    show = progress == "always" or (progress and sys.stderr is not None and sys.stderr.isatty())
    from tqdm import tqdm
    return tqdm(total=size, initial=have, unit="B", unit_scale=True, unit_divisor=1024, desc=what,
                file=sys.stderr, disable=not show, dynamic_ncols=True, leave=False)


def _http_error(error):
    """One line for an HTTP error status (a redirect loop included)."""
    if 300 <= error.code < 400:
        return f"HTTP {error.code}: the redirects go round in a loop (or more than 10 of them)"
    return f"HTTP {error.code} {' '.join(str(error.reason).split())}"


def _network_reason(error, read_timeout):
    """One line for any exception of a network transfer."""
    if isinstance(error, urllib.error.URLError) and not isinstance(error.reason, str):
        error = error.reason  # the socket, DNS or TLS error inside
    if isinstance(error, (socket.timeout, TimeoutError)):
        return f"no data for {read_timeout:g} s (timed out)"
    if isinstance(error, http.client.RemoteDisconnected):
        return "the server closed the connection without a reply"
    if isinstance(error, http.client.BadStatusLine):
        return f"not an HTTP reply (it starts {str(error)[:40]!r})"
    if isinstance(error, http.client.HTTPException):
        return f"a broken HTTP reply ({' '.join(str(error).split()) or type(error).__name__})"
    if isinstance(error, urllib.error.URLError):
        return " ".join(str(error.reason).split())
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
