"""One process per run folder: an advisory lock (``fcntl.flock``) on
``RUN_DIR/train.lock``, taken before a run writes anything into the folder.

The kernel releases a ``flock`` when its holder dies, SIGKILL included, so a
killed run never leaves a stale lock (only a stale file, which means nothing). The
holder writes its PID into it, so that a refused process can name it, and deletes
it when it is done; a process that locked a file that was deleted meanwhile
notices (another inode than the path's) and tries again, so two processes never
hold two files of the same name. ``minitf.translate`` only
reads and takes no lock. With several ranks, rank 0 holds it.

A process holds at most one lock per folder: taking it again is a no-op, and
:func:`released_on_exit` lets a command release what it took when it returns
(tests call the commands in-process, many times).
"""
import contextlib
import os
import pathlib

try:
    import fcntl
except ImportError:  # not POSIX: no locking (documented in the README)
    fcntl = None

from minitf.nmt.errors import RunFolderBusy, UsageError

LOCK_NAME = "train.lock"
_held = {}  # realpath of a run folder -> open file descriptor holding its lock


def lock_run_folder(run_dir):
    """Take the run folder's lock (the folder must exist) or raise RunFolderBusy
    naming the holder's PID. Returns the lock file's path."""
    run_dir = pathlib.Path(run_dir)
    key = os.path.realpath(run_dir)
    path = run_dir / LOCK_NAME
    if key in _held or fcntl is None:
        return path
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as error:
            raise UsageError(f"cannot create the lock file {path} ({error.strerror or error}); "
                             "the run folder must be writable") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pid = holder_pid(path)
            os.close(fd)
            raise RunFolderBusy(f"{run_dir} is in use by another train.py (process {pid or 'unknown'}, lock "
                                f"{path}); wait for it to end or stop it (kill -TERM {pid or 'PID'}), or choose "
                                "another folder", run_dir, pid) from None
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        mine = os.fstat(fd)
        if current is not None and (current.st_ino, current.st_dev) == (mine.st_ino, mine.st_dev):
            break
        os.close(fd)  # the holder deleted the file between our open and flock: lock the new one
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _held[key] = (fd, path)
    return path


def holder_pid(path):
    """The PID written into a lock file, or None."""
    try:
        text = pathlib.Path(path).read_text(encoding="ascii").strip()
        return int(text) if text.isdigit() else None
    except (OSError, UnicodeDecodeError):
        return None


def release(run_dir):
    """Release this process's lock of ``run_dir`` (if it holds it)."""
    held = _held.pop(os.path.realpath(run_dir), None)
    if held is not None:
        fd, path = held
        try:
            os.unlink(path)  # while still locked: see the module doc
        except OSError:
            pass
        os.close(fd)  # closing the only descriptor releases the flock


@contextlib.contextmanager
def released_on_exit():
    """Release, on leaving, every run-folder lock taken inside."""
    before = set(_held)
    try:
        yield
    finally:
        for key in set(_held) - before:
            release(key)
