"""Downloading one pinned file (a corpus archive) over HTTP(S), with the standard library.

:func:`download` gets a file whose size and sha256 are known in advance from the
first of several mirrors that delivers it:

- the bytes go to ``DEST.part`` beside ``DEST``; a ``.part`` left by a cut or
  killed run is resumed with an HTTP ``Range`` request (a server that answers
  ``200`` instead of ``206`` is read again from byte 0);
- never more than the pinned size is written: a server that sends more is refused;
- a mirror that trickles (fewer than ``min_rate`` bytes/s averaged over the last
  ``rate_window`` seconds, as curl's ``--speed-limit``/``--speed-time``) is given
  up, and each read also has a socket timeout;
- only a file with the pinned sha256 is renamed (atomically, after fsync) to ``DEST``;
  a wrong one is deleted;
- every network failure (HTTP status, a reply that is not HTTP, a body cut short,
  too many headers, a redirect loop, a timeout, a reset, TLS) is one line in a
  :class:`~minitf.nmt.errors.DataError`;
- SIGTERM while downloading raises :class:`Terminated` (a KeyboardInterrupt), so
  ``finally`` blocks clean up; what is left is at most ``DEST.part``, which the
  next start resumes.
"""
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

from minitf.nmt.errors import DataError
from minitf.nmt.files import file_sha256, fsync_dir

_BLOCK = 1 << 16


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while a download (or an unpacking) was running.

    A KeyboardInterrupt, so that nothing on the way swallows it and the commands
    report it as an interruption. Attributes: ``signum``.
    """

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def sigterm_raises():
    """Inside the block SIGTERM raises :class:`Terminated` instead of killing the
    process on the spot, so ``finally`` blocks remove their temp files.

    Only in the main thread, and only where SIGTERM still has its default action
    (a command that handles SIGTERM itself keeps its handler)."""
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
    """The base URL from the environment variable ``env_var`` (say
    ``MINITF_DEBIAN_MIRROR``) when set and not empty, else ``default``; no trailing ``/``."""
    return (os.environ.get(env_var, "").strip() or default).rstrip("/")


class _MirrorFailed(Exception):
    """One URL failed; ``reason`` is one line. ``keep``: the ``.part`` is good to resume."""

    def __init__(self, reason, keep=True):
        super().__init__(reason)
        self.reason, self.keep = reason, keep


def download(urls, dest, *, size, sha256, what, progress=True, min_rate=1024, rate_window=60.0,
             read_timeout=60.0, log=None):
    """Download the file of pinned ``size`` and ``sha256`` to ``dest``, from the first
    of ``urls`` that delivers it; return ``dest``.

    Parameters
    ----------
    urls : str or sequence of str
        One URL, or mirrors tried in order (one that fails: the next).
    dest : path-like
        The final file. ``dest`` already there with the pinned size and sha256 is
        returned as it is. The bytes arrive in ``dest.part`` (same folder).
    size : int
        The pinned size in bytes: the most that is ever written.
    sha256 : str
        The pinned digest (hex).
    what : str
        What is fetched, for the messages (``"Debian package trans-de-en"``).
    progress : bool or "always"
        A progress bar (bytes, MB/s, ETA) on stderr: True where stderr is a
        terminal, "always" anywhere, False never.
    min_rate, rate_window : float
        A mirror that delivers fewer than ``min_rate`` bytes/s averaged over the
        last ``rate_window`` seconds is given up (the next one is tried).
    read_timeout : float
        Seconds one read (or the connection) may wait for data.
    log : callable or None
        Called with one-line notes (a resumed download, a mirror given up).

    Raises
    ------
    DataError
        One line: every URL failed (each one's reason), or ``dest``'s folder is not
        writable. It ends with what to do; callers append their own hint (a
        mirror variable, their own corpus).
    """
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
    todo = (f"run again to resume ({kept} of {size} bytes kept in {part.name})" if kept
            else "run again later")
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
            response = urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                              timeout=read_timeout)
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
            if received == size and _read(response, 1, read_timeout):
                out.flush()
                os.fsync(out.fileno())
                raise _MirrorFailed(f"the server sent more than the pinned {size} bytes (a different file)",
                                    keep=False)
            out.flush()
            os.fsync(out.fileno())
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
    """Give up when fewer than ``min_rate`` bytes/s arrived over the last ``rate_window`` s.

    ``samples``: (time, bytes so far) pairs; the oldest one kept is the last one at
    least ``rate_window`` old, so the average always spans a whole window."""
    now = time.monotonic()
    samples.append((now, received))
    while len(samples) > 2 and samples[1][0] <= now - rate_window:
        samples.popleft()
    start, start_bytes = samples[0]
    if now - start >= rate_window and (received - start_bytes) / (now - start) < min_rate:
        raise _MirrorFailed(f"slower than {_rate_text(min_rate)} for {rate_window:g} s "
                            f"({received} bytes so far)")


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
