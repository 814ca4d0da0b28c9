"""Files that are never half-written: every write goes to a temp file beside its
final place, is flushed to disk (fsync), and is renamed into place in one step.
A crash leaves the old file or the new one, never a torn one."""
import hashlib
import json
import os
import pathlib
import tempfile


def fsync_dir(path):
    """Flush a folder's entries (a rename inside it) to disk, where the OS allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path, data):
    """Write ``data`` (bytes, or str as UTF-8) to ``path`` atomically.

    The temp file ``.<name>.<random>.tmp`` is removed again if anything fails,
    a KeyboardInterrupt included."""
    path = pathlib.Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path, value):
    """``write_atomic`` of ``value`` as indented, key-sorted JSON."""
    write_atomic(path, json.dumps(value, indent=1, sort_keys=True))


def file_sha256(path):
    """The sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
