"""Strategies and assertions shared by the gradient tests. They live in the public module
minitf.testing (so that a learner's own layer is tested the same way); this module keeps
the names the tests import. Also: how the benchmark scripts' tests run a script (:func:`run_benchmark`) and read
benchmarks/common.py's step table (:func:`assert_step_report`)."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

from minitf import backend
from minitf.testing import (ATOL, LN_RTOL, RTOL, arrays, assert_gradients_match, attention_masks,  # noqa: F401
                            padding_lengths, padding_masks, random_array, randomize, seeds, small,
                            upstream_gradients)

np = backend.host


def relative_difference(a, b, floor=0.0):
    """max |a - b| / max(max |a|, max |b|, floor): how the parity tests (PyTorch, GPT-2, Marian) compare arrays."""
    scale = max(float(np.abs(a).max(initial=0)), float(np.abs(b).max(initial=0)), floor, 1e-300)
    return float(np.abs(a - b).max(initial=0)) / scale


ROOT = pathlib.Path(__file__).resolve().parents[1]
#: The marks of a test that runs a comparison against transformers (skipped without the "bench" extra).
BENCH_MARKS = [pytest.mark.extra(name, "bench") for name in ("torch", "transformers", "safetensors")]


def run_benchmark(script, *args):
    """``python benchmarks/SCRIPT *args`` in a process of its own (its workers in theirs), from the checkout:
    the CompletedProcess, its output captured as text."""
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600, env=os.environ | {"PYTHONPATH": str(ROOT)})


def assert_step_report(out):
    """``out`` holds benchmarks/common.py's ``step_report``: the first step's losses equal (relative 1e-4, checked
    here from the printed numbers too) and the ratios of time and of peak memory."""
    losses = re.search(r"first-step loss: minitf ([\d.]+), PyTorch ([\d.]+) \(relative difference \S+: equal", out)
    assert losses and abs(float(losses[1]) - float(losses[2])) <= 1e-4 * float(losses[2]), out
    assert re.search(r"minitf / PyTorch: \*\*[\d.]+x\*\* .*peak memory \*\*[\d.]+x\*\*", out), out
