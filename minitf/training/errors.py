"""How the commands fail: typed errors raised at the boundary, argparse with one-line
usage errors, and :func:`report_errors`, which turns every expected error into one line
on stderr and an exit status (never a traceback from deep inside NumPy)."""
import argparse
import os
import sys
import time

from minitf.backend import DeviceError


class UsageError(ValueError):
    """An impossible flag combination or value (exit status 2)."""


class DataError(ValueError):
    """Bad input at the data boundary (missing file, bad encoding, misaligned corpus...)."""


class CommandFailed(DataError):
    """An external command (apt-get, dpkg-deb) failed; ``detail`` is its most relevant output line."""

    def __init__(self, what, detail, hint):
        super().__init__(f"{what} failed: {detail}; {hint}")
        self.detail = detail


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupted or does not fit."""


class StepOutOfMemory(MemoryError):
    """A training step ran out of memory; the message already says what to do."""


class RunFolderBusy(ValueError):
    """Another process holds the lock of a run folder (``minitf.training.files.lock_run_folder``)."""


class MetricsWriteError(OSError):
    """Appending to metrics.jsonl (``path``) failed for ``reason`` (a full disk, say); the record is kept."""

    def __init__(self, path, reason, advice=""):
        super().__init__(f"could not append to {path}: {reason}" + (f"; {advice}" if advice else ""))
        self.path, self.reason = path, reason


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (``signum`` 2) or SIGTERM (15) stopped a step whose leftovers are known: ``kept`` says what
    stays on disk (a download's ``.part`` to resume, nothing) and how to go on, for the one line reporting it."""

    def __init__(self, signum, kept):
        super().__init__(signum, kept)
        self.signum, self.kept = int(signum), kept


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit status 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class _OldSpelling(argparse.Action):
    """A renamed flag's old spelling, kept one release: its value goes to the new flag's, with a one-line note."""

    def __init__(self, option_strings, dest, new=None, **keywords):
        self.new = new
        super().__init__(option_strings, dest, **keywords)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"note: {option_string} is now {self.new} (the old spelling goes in the next release)", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_renamed(parser, new, old, **keywords):
    """Add the flag ``new`` (argparse's ``keywords``) and its old spelling ``old``, kept one release: it sets the
    same value and says once, on stderr, that it is now ``new`` (hidden from --help). One meaning per flag in every
    command (docs/training.md, "Flags")."""
    action = parser.add_argument(new, **keywords)
    parser.add_argument(old, dest=action.dest, action=_OldSpelling, new=new, help=argparse.SUPPRESS,
                        default=argparse.SUPPRESS, **{k: v for k, v in keywords.items() if k in ("type", "metavar")})
    return action


def _number(convert, accept, expected):
    """An argparse type: ``convert(text)`` if ``accept`` takes it, else 'expected ..., got ...'."""
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


def positive(kind):
    """An argparse type: a positive ``kind`` (int or float), finite."""
    return _number(kind, lambda value: 0 < value < float("inf"), f"a positive {kind.__name__}")


def number_in(low, high):
    """An argparse type: a float in [low, high] (nan refused)."""
    return _number(float, lambda value: low <= value <= high, f"a finite number >= {low:g} and at most {high:g}")


#: An argparse type: a finite float >= 0 (nan and inf are refused).
non_negative = _number(float, lambda value: 0 <= value < float("inf"), "a finite number >= 0")


def report_errors(prog, run, argv, memory_hint, interrupt_message="interrupted"):
    """Run ``run(argv)`` and return its exit status; every expected failure
    becomes ``prog: error: ...`` on stderr with a non-zero status. ``memory_hint``: what to do after running out
    of memory, or a function of the MemoryError giving it (the setting that drove that allocation)."""
    def fail(message, status=1):
        print(f"{prog}: error: {message}", file=sys.stderr)
        return status

    try:
        return run(argv)
    except UsageError as error:
        return fail(error, 2)
    # StepOutOfMemory and MetricsWriteError before MemoryError and OSError: their messages say what to do
    except (DataError, CheckpointError, DeviceError, FloatingPointError, ValueError, StepOutOfMemory,
            MetricsWriteError) as error:
        return fail(error)
    except MemoryError as error:
        hint = memory_hint(error) if callable(memory_hint) else memory_hint
        return fail(f"out of memory ({error or 'MemoryError'}); {hint}")
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM (download.Terminated, Interrupted)
        signum = getattr(error, "signum", 2)
        if isinstance(error, Interrupted):
            return fail(f"interrupted ({'Ctrl-C' if signum == 2 else 'SIGTERM'}); {error.kept}", 128 + signum)
        return fail(interrupt_message, 128 + signum)
    except OSError as error:
        return fail(f"{error.strerror or error}: {error.filename or ''}")


def pause_for_tests(phase):
    """For tests only: with ``MINITF_TEST_PAUSE=PHASE:SECONDS`` the process says ``test pause: PHASE`` on
    stderr and sleeps there (as a long download, preparation or decode would), so that a test can signal it
    in that phase. Phases: ``tokenize``, ``prepare``, ``end`` (rank 0 only, where the others wait for it)."""
    wanted, _, seconds = os.environ.get("MINITF_TEST_PAUSE", "").partition(":")
    if wanted == phase:
        print(f"test pause: {phase}", file=sys.stderr, flush=True)
        time.sleep(float(seconds or 60))
