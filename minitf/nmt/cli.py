"""What the two commands share: argparse with one-line usage errors, and one
place that turns every error the application raises into one line on stderr and
an exit status (never a traceback from deep inside NumPy)."""
import argparse
import sys

from minitf.backend import DeviceError
from minitf.nmt.errors import CheckpointError, DataError, MetricsWriteError, StepOutOfMemory, UsageError


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
