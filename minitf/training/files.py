"""Files a run can trust. Every write goes to a temp file beside its final place, is
flushed to disk (fsync) and renamed into place in one step: a crash leaves the old file
or the new one, never a torn one.

One process per run folder: rank 0 takes an advisory lock (``fcntl.flock``) on
``RUN_DIR/train.lock`` before it writes anything there. The kernel releases it when its
holder dies (SIGKILL included), so a killed run leaves no stale lock. The holder writes
its PID into the file (for a refused process to name) and deletes it when done; a
process that locked a file deleted meanwhile (another inode than the path's) tries
again. ``minitf.translate`` only reads and takes no lock. Taking a held lock again is a
no-op; :func:`released_on_exit` releases what a command took (tests call the commands
in-process, many times).
"""
import contextlib
import hashlib
import json
import os
import pathlib

try:
    import fcntl
except ImportError:  # not POSIX: no locking (docs/reliability.md)
    fcntl = None

from minitf.atomic import atomic_writer, fsync_dir, write_atomic  # noqa: F401  (the core's, used here too)
from minitf.training.errors import RunFolderBusy, UsageError


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


def check_output_folder(out):
    """Refuse to overwrite another run, and fail early on a folder we cannot write."""
    out = pathlib.Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder; expected a run folder, choose another --out")
    if (out / "config.json").exists() and not never_trained(out):
        raise UsageError(f"--out {out} already holds a run; continue it with --resume {out} or choose another --out")
    probe = out if out.exists() else next((p for p in out.parents if p.exists()), pathlib.Path("."))
    if not probe.is_dir():
        raise UsageError(f"--out {out} lies below {probe}, which is a file, not a folder; choose another --out")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write to {probe} (for --out {out}); choose a writable --out")


def never_trained(run_dir):
    """Whether a run folder holds a config.json and nothing trained: no checkpoint, no metrics (a run stopped or
    failed right after it wrote config.json). A new run may start there again: nothing of it is lost, and its
    kept files (tokenizer.model) may be those of a folder repaired since, which --resume would read again."""
    run_dir = pathlib.Path(run_dir)
    checkpoints, metrics = run_dir / "checkpoints", run_dir / "metrics.jsonl"
    try:
        return ((not checkpoints.exists() or (checkpoints.is_dir() and not any(checkpoints.iterdir())))
                and (not metrics.exists() or (metrics.is_file() and metrics.stat().st_size == 0)))
    except OSError:  # unreadable: not known to be empty
        return False


def check_resumable(run_dir):
    """UsageError (nothing changed) for a run folder that --resume could not continue and save
    into: ``checkpoints`` not a readable, writable folder, or an unwritable folder or metrics.jsonl."""
    run_dir = pathlib.Path(run_dir)
    folder = run_dir / "checkpoints"
    if folder.exists() or folder.is_symlink():
        if not folder.is_dir():
            raise UsageError(f"--resume {run_dir}: {folder} is not a folder, so its checkpoints are gone or "
                             "hidden; restore the checkpoints folder (or move the file away to start at step 0)")
        try:
            list(folder.iterdir())
        except OSError as error:
            raise UsageError(f"--resume {run_dir}: cannot read {folder} ({error.strerror or error}); "
                             "fix its permissions") from None
    for path in (run_dir, folder, run_dir / "metrics.jsonl"):
        if path.exists() and not os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0)):
            raise UsageError(f"--resume {run_dir}: {path} is not writable; fix its permissions")


LOCK_NAME = "train.lock"
_held = {}  # realpath of a run folder -> (descriptor holding its lock, lock file path)


def lock_run_folder(run_dir):
    """Take the (existing) run folder's lock and return the lock file's path; RunFolderBusy names the holder's PID."""
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
                                "another folder") from None
        try:
            same = os.path.samestat(os.stat(path), os.fstat(fd))
        except FileNotFoundError:
            same = False
        if same:
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
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still locked: see the module doc
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
