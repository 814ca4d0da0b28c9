"""Pytest plugin for the mutation run (scripts/mutation.sh), loaded with ``-p scripts.mutation.plugin``.

Five things keep mutmut's run targeted and its verdicts trustworthy for minitf's suite:

* A mutant of module M runs only the tests of M's own test files (``TESTS_BY_MODULE``) that call
  the mutated function (mutmut's map): not every integration test that happens to pass through
  M. A mutant none of them reaches is "no tests" (pytest's exit status 5).

* A test that starts a process (``train.py``, ``python -m minitf...``, ``mpiexec``) is skipped at
  the moment it starts it. mutmut selects the mutant by an environment variable, and
  ``tests/runs.py`` builds ``CPU_ENV``/``MPI_ENV`` when it is imported, before the worker sets that
  variable: such a child runs the unmutated code (checked: see docs/testing.md), so the test could
  only ever report "survived", and it costs seconds per mutant. mutmut's test-to-function map also
  sees only in-process calls, so a function reached only by a child has "no tests".
* Hypothesis draws the same examples every run (``derandomize``), so a mutant is killed or not
  by the code, not by the luck of the draw, and does not shrink a failing example (a killed
  mutant needs no minimal example; shrinking took minutes per mutant).
* Each mutant's pytest gets a fresh tqdm lock: a mutant whose progress bar failed while it held tqdm's
  multiprocessing lock would otherwise block every later one until its timeout.
* The fastest tests run first (durations from mutmut's stats run), so a mutant is killed by the
  first cheap test that can: ``-x`` stops there.
"""
import json
import os
import pathlib
import subprocess
import sys
import threading

import pytest

_popen_init = subprocess.Popen.__init__

# the test files that own each mutated module: a targeted, fast command per module
TESTS_BY_MODULE = {
    "minitf.training.checkpoint": ("test_checkpoint.py", "test_resume.py"),
    "minitf.training.download": ("test_download.py", "test_corpora.py"),
    "minitf.training.files": ("test_run_folder.py", "test_checkpoint.py", "test_download.py"),
    "minitf.nmt.data": ("test_data.py", "test_indexed.py", "test_wmt14.py"),
    "minitf.training.text": ("test_indexed.py", "test_data.py", "test_lm_train.py"),
    "minitf.training.distributed": ("test_data_parallel.py",),
    "minitf.loss": ("test_loss_optim.py",),
    "minitf.optim": ("test_loss_optim.py", "test_data_parallel.py"),
    "minitf.attention": ("test_attention.py",),
}


def _runs_minitf(args):
    """A child that runs Python (train.py, python -m minitf..., -c) or mpiexec; others
    (ctypes.util's ldconfig, git) are the library's or the standard library's own business."""
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    program = os.path.basename(os.fsdecode(argv[0])) if argv else ""
    return os.fsdecode(argv[0]) == sys.executable or program.startswith(("python", "mpiexec", "mpirun"))


def _refuse_minitf_processes(self, args, *rest, **kwargs):
    if _runs_minitf(args):
        pytest.skip("starts a process: excluded from the mutation run (scripts/mutation/plugin.py)")
    _popen_init(self, args, *rest, **kwargs)


def _fresh_tqdm_lock():
    """A new tqdm write lock for this process. tqdm's lock is a multiprocessing lock, shared by every process
    forked from mutmut's: a mutant whose bar raised while it held the lock (the download's bar given
    ``initial=None``: tqdm's refresh takes the lock, its display raises) left it held, and every later
    mutant that drew a bar waited on it until its timeout."""
    try:
        from tqdm import tqdm
        from tqdm.std import TqdmDefaultWriteLock
    except ImportError:
        return
    TqdmDefaultWriteLock.th_lock = threading.RLock()
    if "mp_lock" in TqdmDefaultWriteLock.__dict__:
        del TqdmDefaultWriteLock.mp_lock
    tqdm.set_lock(TqdmDefaultWriteLock())


def pytest_configure(config):
    subprocess.Popen.__init__ = _refuse_minitf_processes
    _fresh_tqdm_lock()


def pytest_unconfigure(config):
    subprocess.Popen.__init__ = _popen_init


def pytest_collection_modifyitems(config, items):
    # mutmut names the active mutant "minitf.module.x_function__mutmut_N" (or "stats", "fail", "")
    module = os.environ.get("MUTANT_UNDER_TEST", "").rpartition(".")[0]
    if module not in TESTS_BY_MODULE:
        return
    own = [item for item in items if item.path.name in TESTS_BY_MODULE[module]]
    config.hook.pytest_deselected(items=[item for item in items if item not in own])
    try:  # mutants/mutmut-stats.json; the current folder is mutants/
        duration = json.loads(pathlib.Path("mutmut-stats.json").read_text())["duration_by_test"]
    except (OSError, ValueError, KeyError):
        duration = {}
    items[:] = sorted(own, key=lambda item: duration.get(item.nodeid, 0.0))


def pytest_collection_finish(session):
    # after tests/conftest.py has loaded its profile: same examples in every run
    from hypothesis import HealthCheck, Phase, settings
    settings.register_profile("mutation", max_examples=30, deadline=None, derandomize=True, database=None,
                              phases=[Phase.explicit, Phase.generate],
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.load_profile("mutation")
