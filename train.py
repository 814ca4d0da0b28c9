#!/usr/bin/env python3
"""Train a Transformer translation model, or (``--model gpt``) a decoder-only language model:
``python train.py --help``.

With no arguments: fetches the Ding German-English dictionary (via apt, or over
HTTPS from Debian's archive, once), trains the tiny preset on the CPU within 14
minutes for the whole command, reports
validation and test BLEU, and leaves a checkpoint for ``python -m minitf.translate``.
"""
import _signal  # the C module, at once: signal.py imports enum, os takes milliseconds (a rank runs with -S)

HELD = []  # a Ctrl-C that comes before StartUp decides (the launcher says one line, a rank holds it)
if __name__ == "__main__":
    _signal.signal(_signal.SIGINT, lambda signum, frame: HELD.append(signum))

import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

STARTED = time.time()  # the whole command's wall time and --max-minutes count from here, before the imports

#: Set in every rank by the MPI launchers (as minitf.training.distributed.LAUNCHER_ENV; read here before any import).
RANK_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


class StartUp:
    """Ctrl-C from train.py's first line until the run takes it (``minitf.train.after_start_up``): the imports,
    the launcher's checks, ``mpiexec`` starting the ranks, MPI's start. The launcher (nothing written yet) says
    one line and exits 130 at once; a rank holds the signal until MPI has started (a rank that left before
    MPI_Init would leave the others waiting in it forever) and ``end`` hands it to the run, which ends every rank
    with one line and 130."""
    #: What a Ctrl-C before training leaves, for its one line (the launcher's, or rank 0's through report_errors).
    kept = "training had not started: nothing was written, the same command starts again"

    def __init__(self, held):
        ranks = [os.environ[name] for name in RANK_ENV if name in os.environ]
        self.rank = (int(ranks[0]) if ranks[0].strip().isdigit() else 0) if ranks else None  # None: not a rank
        self.held = held
        signal.signal(signal.SIGINT, self._on_signal)
        ready = os.environ.get("MINITF_READY_DIR")  # the launcher passes a Ctrl-C on once every rank is here
        if ready and self.rank is not None:
            try:
                os.close(os.open(os.path.join(ready, str(self.rank)), os.O_WRONLY | os.O_CREAT, 0o600))
            except OSError:
                pass
        if held and self.rank is None:
            self._on_signal(held[0], None)

    def _on_signal(self, signum, frame):
        if self.rank is not None:
            self.held.append(signum)
            return
        os.write(2, f"train.py: error: interrupted (Ctrl-C); {self.kept}\n".encode())
        os._exit(128 + signum)  # no KeyboardInterrupt: it would surface from whichever import it lands in

    def end(self):
        """Hand Ctrl-C to Python's default (KeyboardInterrupt, which the run reports); the signal a rank held, or
        None. The handler first, then the look: a signal in between raises rather than being lost."""
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return self.held[0] if self.held else None

    def pause(self, phase):
        """For tests only, as ``minitf.training.errors.pause_for_tests``: with ``MINITF_TEST_PAUSE=PHASE:SECONDS``
        say ``test pause: PHASE`` and wait there (a slow import would) until a signal comes or SECONDS pass.
        Phases: ``start`` (the command, before its imports), ``launch`` (the launcher, its checks done, before
        ``mpiexec``), ``rank0-start``, ``rank1-start`` (that rank, before its imports)."""
        wanted, _, seconds = os.environ.get("MINITF_TEST_PAUSE", "").partition(":")
        if wanted != phase:
            return
        print(f"test pause: {phase}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + float(seconds or 60)
        while not self.held and time.monotonic() < deadline:
            time.sleep(0.01)


if __name__ == "__main__":
    START_UP = StartUp(HELD)  # before the imports, which take seconds on a busy machine
    if os.environ.pop("MINITF_SITE_AFTER_HANDLER", None) and sys.flags.no_site:
        import site  # a rank the launcher started with -S: site's imports (.pth files, sitecustomize) after the handler

        site.main()
    START_UP.pause("start" if START_UP.rank is None else f"rank{START_UP.rank}-start")
    from minitf.train import main

    sys.exit(main(started=STARTED, start_up=START_UP))
