"""The dry run of benchmarks/marian_opus.py (the opus-mt benchmark of issue 36) at its ``small`` shape: both parts
run as the command runs, minitf's translations equal transformers' token for token at greedy and beam 4, both
decode the same number of tokens (each batch to its longest source sentence), and with dropout 0 the first
fine-tuning step's losses agree (the same model and batch in both frameworks). No timing is checked: that is
the benchmark's job on a quiet machine. Skipped without the bench extra."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

from benchmarks.marian_opus import source_batches

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "marian_opus.py"

pytestmark = [pytest.mark.extra("torch", "bench"), pytest.mark.extra("transformers", "bench"),
              pytest.mark.extra("safetensors", "bench")]


def run(*args):
    """The command in a process of its own, NumPy's BLAS on one thread (and so PyTorch)."""
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=os.environ | {"OPENBLAS_NUM_THREADS": "1"})


def test_the_dry_run_decodes_equal_tokens_and_steps_from_equal_losses():
    result = run("--shape", "small", "--sentences", "7", "--batch-size", "3", "--rounds", "1", "--step-batch", "3",
                 "--step-len", "6", "--dropout", "0")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "- CPU: " in out and "GFLOP/s" in out and "1 threads" in out  # the machine and the threads are named
    for mode in ("greedy", "beam 4"):
        assert re.search(rf"- {mode}: minitf / transformers time \*\*[\d.]+x\*\* .*outputs equal token for token: "
                         r"7/7 sentences", out), out
    # every sentence runs to its batch's limit: the tokens generated are the same in both, and known
    expected = sum(len(src) * limit for src, limit in source_batches(7, 1000, 3))
    rows = re.findall(r"^\| (greedy|beam 4) \| (minitf|transformers) \| .* \| ([\d,]+) \|$", out, re.M)
    assert len(rows) == 4 and {int(tokens.replace(",", "")) for _, _, tokens in rows} == {expected}, out
    losses = re.search(r"first-step loss: minitf ([\d.]+), PyTorch ([\d.]+)", out)
    assert losses and abs(float(losses[1]) - float(losses[2])) <= 1e-5 * float(losses[2]), out
    assert re.search(r"minitf / PyTorch: \*\*[\d.]+x\*\*", out), out


def test_a_bad_flag_is_one_line():
    result = run("--rounds", "0")
    assert result.returncode == 2 and "--rounds must be at least 1, got 0" in result.stderr
    assert "Traceback" not in result.stderr
