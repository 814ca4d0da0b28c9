"""The dry run of benchmarks/marian_opus.py (the opus-mt benchmark of issue 36) at its ``small`` shape, both methods:
each framework in a process of its own (the default: two processes per part taking turns) and both in one process
(``--in-process``). Both parts run as the command runs: minitf's translations equal transformers' token for token
at greedy and beam 4, both decode the same number of tokens (each batch to its longest source sentence), and with
dropout 0 the first fine-tuning step's losses agree (the same model and batch in both frameworks). In the default
method these outputs come from two processes (their ids are printed and checked to differ), so the checks compare
across processes. No timing is checked: that is the benchmark's job on a quiet machine. Skipped without the bench
extra."""
import os
import pathlib
import re
import subprocess
import sys

import pytest

from benchmarks.common import Worker
from benchmarks.marian_opus import source_batches

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "marian_opus.py"

pytestmark = [pytest.mark.extra("torch", "bench"), pytest.mark.extra("transformers", "bench"),
              pytest.mark.extra("safetensors", "bench")]


def run(*args):
    """The command in a process of its own, NumPy's BLAS on one thread (and so PyTorch)."""
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=os.environ | {"OPENBLAS_NUM_THREADS": "1"})


@pytest.mark.parametrize("method", [[], ["--in-process"]])
def test_the_dry_run_decodes_equal_tokens_and_steps_from_equal_losses(method):
    result = run("--shape", "small", "--sentences", "7", "--batch-size", "3", "--rounds", "2", "--step-batch", "3",
                 "--step-len", "6", "--dropout", "0", *method)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "- CPU: " in out and "GFLOP/s" in out and "1 threads" in out  # the machine and the threads are named
    assert ("a process per framework and part, taking turns" in out) == (not method), out
    # where each framework ran, per part: both parts' processes on one thread with the same malloc settings
    processes = re.findall(r"^processes: minitf in process (\d+) \((\d+) threads, malloc keeps freed memory: (\w+)\), "
                           r"PyTorch in process (\d+) \((\d+) threads, malloc keeps freed memory: (\w+)\)$", out, re.M)
    assert len(processes) == 2, out
    for ours, our_threads, our_malloc, theirs, their_threads, their_malloc in processes:
        assert (ours != theirs) == (not method), out
        assert our_threads == their_threads == "1" and our_malloc == their_malloc, out
    pids = {pid for p in processes for pid in (p[0], p[3])}
    assert len(pids) == (4 if not method else 1), out                       # fresh processes for each part
    for mode in ("greedy", "beam 4"):
        assert re.search(rf"- {mode}: minitf / transformers time \*\*[\d.]+x\*\* \(medians; per-round ratios "
                         r"[\d.]+-[\d.]+\); outputs equal token for token: 7/7 sentences", out), out
    # every sentence runs to its batch's limit: the tokens generated are the same in both, and known
    expected = sum(len(src) * limit for src, limit in source_batches(7, 1000, 3))
    rows = re.findall(r"^\| (greedy|beam 4) \| (minitf|transformers) \| .* \| ([\d,]+) \|$", out, re.M)
    assert len(rows) == 4 and {int(tokens.replace(",", "")) for _, _, tokens in rows} == {expected}, out
    losses = re.search(r"first-step loss: minitf ([\d.]+), PyTorch ([\d.]+)", out)
    assert losses and abs(float(losses[1]) - float(losses[2])) <= 1e-5 * float(losses[2]), out
    assert re.search(r"minitf / PyTorch: \*\*[\d.]+x\*\* \(medians; per-round ratios [\d.]+-[\d.]+\)", out), out


def test_a_failing_worker_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as failed:
        Worker(SCRIPT, "minitf", ["--part", "step", "--folder", str(tmp_path / "absent"), "--shape", "small"])
    message = str(failed.value)
    assert message.startswith("marian_opus.py: the minitf process failed: ") and "\n" not in message, message
    assert "absent" in message, message


def test_a_bad_flag_is_one_line():
    result = run("--rounds", "0")
    assert result.returncode == 2 and "--rounds must be at least 1, got 0" in result.stderr
    assert "Traceback" not in result.stderr
