"""The application's errors. Each carries what its callers need as attributes,
so no caller ever matches on message text. Every one of them is reported by the
command-line tools as one line (``minitf.nmt.cli.report_errors``)."""


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
    """Another process holds the lock of a run folder (``minitf.nmt.runlock``).

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
