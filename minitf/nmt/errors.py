"""How the commands fail: the typed errors every module raises at the boundary, argparse
with one-line usage errors, and one place that turns every error into one line on stderr
and an exit status (never a traceback from deep inside NumPy)."""
import argparse
import sys

from minitf.backend import DeviceError



class UsageError(ValueError):
    """An impossible flag combination or value (exit status 2)."""


class DataError(ValueError):
    """Bad input at the data boundary (missing file, bad encoding, misaligned corpus...)."""


class CommandFailed(DataError):
    """An external command (apt-get, dpkg-deb) failed.

    Attributes
    ----------
    what : str
        The command as the user would recognise it (``"apt-get download"``).
    detail : str
        The command's own most relevant output line (its last ``E:`` line, say).
    """

    def __init__(self, what, detail, hint):
        super().__init__(f"{what} failed: {detail}; {hint}")
        self.what, self.detail = what, detail


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupted or does not fit."""


class StepOutOfMemory(MemoryError):
    """A training step ran out of memory; the message already says what to do.

    Attributes
    ----------
    step : int
        The step that failed (1-based, as in the logs).
    """

    def __init__(self, message, step):
        super().__init__(message)
        self.step = step


class RunFolderBusy(ValueError):
    """Another process holds the lock of a run folder (``minitf.nmt.files.lock_run_folder``).

    Attributes
    ----------
    run_dir : pathlib.Path
        The run folder.
    pid : int or None
        The holder's process id, as it wrote it into the lock file (None if unreadable).
    """

    def __init__(self, message, run_dir, pid):
        super().__init__(message)
        self.run_dir, self.pid = run_dir, pid


class MetricsWriteError(OSError):
    """Appending to metrics.jsonl failed (a full disk, say); the record is kept in memory.

    Attributes
    ----------
    path : pathlib.Path
        The metrics file.
    reason : str
        The operating system's reason (``No space left on device``).
    """

    def __init__(self, path, reason, advice=""):
        super().__init__(f"could not append to {path}: {reason}" + (f"; {advice}" if advice else ""))
        self.path, self.reason = path, reason


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit status 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive(kind):
    """An argparse type: a positive ``kind`` (int or float), finite."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return value
    return parse


def non_negative(text):
    """An argparse type: a finite float >= 0 (nan and inf are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def report_errors(prog, run, argv, memory_hint, interrupt_message="interrupted"):
    """Run ``run(argv)`` and return its exit status; every expected failure
    becomes ``prog: error: ...`` on stderr with a non-zero status."""
    def fail(message, status=1):
        print(f"{prog}: error: {message}", file=sys.stderr)
        return status

    try:
        return run(argv)
    except UsageError as error:
        return fail(error, 2)
    except (DataError, CheckpointError, DeviceError, FloatingPointError, ValueError) as error:
        return fail(error)
    except (StepOutOfMemory, MetricsWriteError) as error:  # their messages already say what to do
        return fail(error)
    except MemoryError as error:
        return fail(f"out of memory ({error or 'MemoryError'}); {memory_hint}")
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM during a download (download.Terminated)
        return fail(interrupt_message, 128 + getattr(error, "signum", 2))
    except OSError as error:
        return fail(f"{error.strerror or error}: {error.filename or ''}")
