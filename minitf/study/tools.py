"""What the study commands share (``python -m minitf.gradcheck``, ``python -m minitf.exercise``,
``python -m minitf.trace``): running the learner's own code under guard, and a command's exit.

The learner's code (a file with a layer of their own, an exercise's backward) is loaded with
:func:`load_object` and run with :func:`guarded`: what it raises, a loop that never ends (past
``--time-limit`` seconds) and Ctrl-C become one :class:`UserCodeError` line naming the learner's
file and line; :func:`run_tool` prints that line (exit 1, 130 for Ctrl-C) and ends quietly when
``| head`` closes the pipe. :func:`one_line_parser` gives a usage error in one line (exit 2).
"""
import _thread
import argparse
import importlib.util
import os
import pathlib
import sys
import threading
import traceback

#: seconds a check of a learner's code may run (its own layer, an exercise): a loop that never ends stops
TIME_LIMIT = 60.0


class UserCodeError(Exception):
    """The learner's own code failed (or did not load, or ran past the time limit, or Ctrl-C stopped
    it); the message is one line: what failed, the exception, and where (its last frame in the
    learner's file). ``status``: the command's exit status (1, 130 for Ctrl-C)."""

    def __init__(self, message, status=1):
        super().__init__(message)
        self.status = status


def _where(tb, prefer=None):
    """"file.py:12 in backward: <the line>" of the last frame of ``tb`` in the file ``prefer``
    (the learner's), else of its last frame; "" without a traceback."""
    frames = traceback.extract_tb(tb)
    if not frames:
        return ""
    mine = [f for f in frames if prefer is not None
            and pathlib.Path(f.filename).resolve() == pathlib.Path(prefer).resolve()]
    frame = (mine or frames)[-1]
    code = f": {frame.line.strip()}" if frame.line else ""
    return f"{pathlib.Path(frame.filename).name}:{frame.lineno} in {frame.name}{code}"


def user_error(error, what, path=None):
    """A :class:`UserCodeError` for ``error`` raised by the learner's code during ``what``
    (``path``: the learner's file, whose last frame is shown)."""
    if isinstance(error, SyntaxError):
        where = f"{error.filename}:{error.lineno}" + (f": {error.text.strip()}" if error.text else "")
        return UserCodeError(f"{what}: SyntaxError: {error.msg} ({where})")
    message = " ".join(str(error).split()) or "(no message)"
    where = _where(error.__traceback__, path)
    return UserCodeError(f"{what}: {type(error).__name__}: {message}" + (f" (at {where})" if where else ""))


class _TimeLimit:
    """``with _TimeLimit(seconds) as limit:`` interrupts the main thread after ``seconds``, as Ctrl-C
    would (a loop that never ends in a learner's backward); ``limit.expired`` tells the two apart."""

    def __init__(self, seconds):
        self.seconds, self.expired, self.timer = seconds, False, None

    def _expire(self):
        self.expired = True
        _thread.interrupt_main()

    def __enter__(self):
        if self.seconds:
            self.timer = threading.Timer(self.seconds, self._expire)
            self.timer.daemon = True
            self.timer.start()
        return self

    def __exit__(self, *exc):
        if self.timer is not None:
            self.timer.cancel()
        return False


def guarded(run, path, seconds, what="the check failed", wrap=True, unwrapped=()):
    """``run()`` with the learner's failures as one line (a :class:`UserCodeError` naming the last frame
    in ``path``): ``seconds`` passed (a loop that never ends?), Ctrl-C, and with ``wrap`` any exception
    but those of the types ``unwrapped`` (raised as they are, for the caller to tell apart)."""
    limit = _TimeLimit(seconds)
    try:
        with limit:
            return run()
    except KeyboardInterrupt as error:
        where = _where(error.__traceback__, path)
        where = f" (it was at {where})" if where else ""
        if limit.expired:
            raise UserCodeError(f"the check did not finish in {seconds:g} s{where}: a loop that never ends in forward "
                                f"or backward? Give it longer with --time-limit SECONDS") from None
        raise UserCodeError(f"interrupted{where}", status=130) from None
    except Exception as error:
        if not wrap or isinstance(error, (UserCodeError, *unwrapped)):
            raise
        raise user_error(error, what, path) from None


def one_line_parser(**kwargs):
    """argparse for the study tools, with a usage error in one line (exit 2), as the application's
    ``minitf.training.errors.OneLineParser`` (the core does not import the application)."""

    class OneLineParser(argparse.ArgumentParser):
        def error(self, message):
            self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
    return OneLineParser(**kwargs)


def add_time_limit(parser, what="stop a check that runs longer"):
    """The ``--time-limit SECONDS`` option of a command that runs the learner's code (``what`` it does);
    :func:`check_time_limit` refuses a negative one."""
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT, metavar="SECONDS",
                        help=f"{what} (default {TIME_LIMIT:g}; 0: no limit)")


def check_time_limit(parser, seconds):
    """A usage error (exit 2) for a ``--time-limit`` below 0 (or NaN)."""
    if not seconds >= 0:
        parser.error(f"--time-limit takes seconds >= 0 (0: no limit), got {seconds:g}")


def run_tool(main, argv=None):
    """A study tool's ``main`` as a command: a learner's error is one line on stderr (exit 1, 130
    for Ctrl-C), and output cut short by a closed pipe (``| head``) ends quietly."""
    try:
        status = main(argv)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then caught below
        return status
    except UserCodeError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141  # 128 + SIGPIPE, as a tool killed by the closed pipe


def load_object(spec):
    """``"path/to/file.py:NAME"`` -> the object NAME defined in that file (the file runs
    as a module, as ``python file.py`` would run it). A one-line ValueError when the file
    or the name is missing."""
    path, _, name = spec.rpartition(":")
    if not path or not name:
        raise ValueError(f"expected FILE.py:NAME, got {spec!r}")
    file = pathlib.Path(path)
    if not file.is_file():
        raise ValueError(f"no such file: {path}")
    module_spec = importlib.util.spec_from_file_location(f"_gradcheck_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        raise user_error(error, f"{path} did not load", file) from None
    if not hasattr(module, name):
        raise ValueError(f"{path} defines no {name!r}")
    return getattr(module, name)
