"""Atomic file writes for the core: every write goes to a temp file beside its final place, is
flushed to disk (fsync) and renamed into place in one step, so a crash leaves the old file or
the new one, never a torn one. (The application's ``minitf.training.files`` uses these too.)

Only a regular file is ever replaced: a device, FIFO or socket at the path is refused
(:class:`NotARegularFile`), never swapped for a file (as root, ``--out /dev/null`` would replace
the device node). A symbolic link is followed: its target is written atomically and the link is kept.
"""
import contextlib
import os
import pathlib
import stat
import tempfile

#: What ``stat``'s file type bits name, for the messages.
KINDS = {stat.S_IFREG: "a regular file", stat.S_IFDIR: "a folder", stat.S_IFCHR: "a character device",
         stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFSOCK: "a socket",
         stat.S_IFLNK: "a symbolic link"}


def kind_of(mode):
    """``KINDS``' name of the file type in ``mode`` (an ``st_mode``)."""
    return KINDS.get(stat.S_IFMT(mode), "a special file")


class NotARegularFile(OSError, ValueError):
    """A write aimed at a device, FIFO or socket (``kind``), refused before anything is written. An OSError (a
    write that cannot happen, ``strerror`` saying why) and a ValueError (a bad path: the commands' one line)."""

    def __init__(self, path, kind):
        super().__init__(None, f"{kind}, not a regular file", str(path))
        self.path, self.kind = path, kind

    def __str__(self):
        return f"{self.path} is {self.kind}, not a regular file; give a file path"


def writable_target(path):
    """The path to replace for a write to ``path``: ``path`` itself, or the file a symbolic link at it names
    (followed to the end; a link to nothing gives the path it names). NotARegularFile for a device, FIFO or
    socket; a folder is left to the rename's IsADirectoryError."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:  # nothing there (or a file for a folder on the way): the write says what is wrong
        return path
    if stat.S_ISLNK(mode):
        path = pathlib.Path(os.path.realpath(path))
        try:
            mode = os.stat(path).st_mode  # a loop of links raises here (ELOOP): nothing is replaced
        except (FileNotFoundError, NotADirectoryError):
            return path
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise NotARegularFile(path, kind_of(mode))
    return path


def umask():
    """This process's umask: from /proc (Linux), else set and put back (with 077 meanwhile, the safe side)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def new_file_mode(path):
    """The permission bits a rewrite of ``path`` gets: those of the file it replaces, else what ``open()``
    would make (0666 less the umask), not ``mkstemp``'s 0600."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~umask()


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
    ``temp_dir``, ``path``'s folders are made only once the file is complete. The file keeps the permission
    bits of the one it replaces (:func:`new_file_mode`). What ``path`` may be:
    :func:`writable_target` (checked before anything is written, and again before the rename)."""
    path = pathlib.Path(path)
    target = writable_target(path)
    if target != path:  # a link: its target's folder exists (or is the link's to make), and holds the temp file
        path, temp_dir = target, None
    if temp_dir is None:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=temp_dir or path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            if hasattr(os, "fchmod"):  # not on Windows before Python 3.13
                os.fchmod(handle.fileno(), new_file_mode(path))
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        path.parent.mkdir(parents=True, exist_ok=True)
        writable_target(path)  # again: a FIFO made meanwhile is not replaced either
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_atomic(path, data):
    """Write ``data`` (bytes, or str as UTF-8) to ``path`` atomically (:func:`atomic_writer`)."""
    with atomic_writer(path) as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)
