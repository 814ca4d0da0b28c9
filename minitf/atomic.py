"""Atomic file writes for the core: every write goes to a temp file beside its final place, is
flushed to disk (fsync) and renamed into place in one step, so a crash leaves the old file or
the new one, never a torn one. (The application's ``minitf.training.files`` uses these too.)"""
import contextlib
import os
import pathlib
import tempfile


def fsync_dir(path):
    """Flush a folder's entries (a rename inside it) to disk, where the OS allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_writer(path, temp_dir=None):
    """A binary handle whose bytes become ``path`` in one step when the block ends (temp file
    ``.<name>.<random>.tmp`` beside it, or in ``temp_dir`` on the same file system; fsync;
    rename). If the block raises (KeyboardInterrupt included) the temp file is removed; with
    ``temp_dir``, ``path``'s folders are made only once the file is complete."""
    path = pathlib.Path(path)
    if temp_dir is None:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=temp_dir or path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_atomic(path, data):
    """Write ``data`` (bytes, or str as UTF-8) to ``path`` atomically (:func:`atomic_writer`)."""
    with atomic_writer(path) as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)
