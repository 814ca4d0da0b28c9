"""The dry run of benchmarks/gpt_step.py at its ``tiny`` shape, both methods: each framework in processes of its
own (the default: the repeats taking turns) and both in one process (``--in-process``). With dropout 0 the first
step's losses agree, which checks that the PyTorch process rebuilt the same model from the same seed as the
minitf process; the ratio's line names the method's spread. No timing is checked: that is the benchmark's job
on a quiet machine. Skipped without the bench extra."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpt_step.py"

pytestmark = [pytest.mark.extra("torch", "bench"), pytest.mark.extra("transformers", "bench")]


def run(*args):
    """The command in a process of its own, NumPy's BLAS on one thread (and so PyTorch)."""
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=os.environ | {"OPENBLAS_NUM_THREADS": "1"})


@pytest.mark.parametrize("method, spread", [([], "ratios of each repeat's medians"),
                                            (["--in-process"], "per-round ratios")])
def test_the_dry_run_starts_from_equal_losses_in_either_method(method, spread):
    result = run("--shape", "tiny", "--rounds", "2", "--repeats", "2", "--dropout", "0", *method)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert ("a process per framework, 2 each" in out) == (not method), out
    losses = re.search(r"first-step loss: minitf ([\d.]+), PyTorch ([\d.]+)", out)
    assert losses and abs(float(losses[1]) - float(losses[2])) <= 1e-5 * float(losses[2]), out
    assert re.search(rf"minitf / PyTorch: \*\*[\d.]+x\*\* \(medians; {spread} [\d.]+-[\d.]+\)", out), out


def test_a_bad_flag_is_one_line():
    result = run("--repeats", "0")
    assert result.returncode == 2 and "must be at least 1" in result.stderr and "Traceback" not in result.stderr
