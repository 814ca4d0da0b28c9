"""The dry run of benchmarks/llama_step.py (issue 43's speed item) at its ``tiny`` shape: both parts run as the
command runs, each framework in its own process, the first training step's losses agree (the same model read from
the same folder on both sides, no dropout), greedy generation gives the same tokens for every prompt, each side's
peak memory is measured, and --json writes the same numbers. No timing is checked: that is the benchmark's job on
a quiet machine. Skipped without the bench extra."""
import json
import re

from tests.helpers import BENCH_MARKS, assert_step_report, run_benchmark

pytestmark = BENCH_MARKS


def run(*args):
    return run_benchmark("llama_step.py", *args)


def test_the_dry_run_steps_from_equal_losses_and_generates_equal_tokens(tmp_path):
    out_json = tmp_path / "llama.json"
    result = run("--shape", "tiny", "--rounds", "1", "--threads", "1", "--json", str(out_json))
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "- CPU: " in out and "1 threads in each framework's process" in out
    assert_step_report(out)
    assert re.search(r"new tokens equal token for token: 3/3 prompts", out), out
    numbers = json.loads(out_json.read_text())
    assert numbers["threads"] == 1 and numbers["shape"] == "tiny"
    step, generation = numbers["step"], numbers["generate"]
    assert step["losses_agree"] and all(p > 0 for p in step["peak_mib"].values())
    assert {w["threads"] for w in step["workers"].values()} == {1}                 # both processes got the setting
    assert step["workers"]["minitf"]["parameters"] == step["workers"]["PyTorch"]["parameters"]
    assert generation["tokens"]["minitf"] == generation["tokens"]["transformers"]
    assert len(generation["tokens"]["minitf"]) == 3 and {len(t) for t in generation["tokens"]["minitf"]} == {16}
    assert len(set(sum(generation["tokens"]["minitf"], []))) > 2                  # not one token over and over


def test_a_bad_flag_is_one_line():
    result = run("--rounds", "0")
    assert result.returncode == 2 and "--rounds must be at least 1, got 0" in result.stderr
    assert "Traceback" not in result.stderr
