"""The dry run of benchmarks/t5_step.py (issue 51's speed item) at its ``tiny`` shape: every part runs as the command
runs, each framework in its own process; minitf's greedy and beam-4 translations equal transformers' ``generate``
token for token, every sentence decoded to its batch's limit (no eos: the same work on both sides), the outputs
varied (not one token over and over: the folder's larger initialisation) and beam 4's not all greedy's; the first
fine-tuning step's losses agree (the same model read from the same folder on both sides, dropout 0), each side's peak
memory is measured, and --json writes the same numbers. No timing is checked: that is the benchmark's job on a
quiet machine. Skipped without the bench extra."""
import json
import re
import sys

from tests.helpers import BENCH_MARKS, ROOT, assert_step_report, run_benchmark

pytestmark = BENCH_MARKS


def run(*args):
    return run_benchmark("t5_step.py", *args)


def test_the_dry_run_decodes_equal_tokens_and_steps_from_equal_losses(tmp_path):
    sys.path.insert(0, str(ROOT))
    from benchmarks.t5_step import SHAPES, source_batches
    out_json = tmp_path / "t5.json"
    result = run("--dry-run", "--threads", "1", "--json", str(out_json))
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "- model (tiny): random T5ForConditionalGeneration (v1.0), 2+2 blocks" in out and "1 timed rounds" in out
    assert "1 threads in each framework's process" in out
    for mode in ("greedy", "beam4"):
        assert re.search(rf"- {mode}: minitf / transformers time \*\*[\d.]+x\*\* \(medians; per-round ratios "
                         r"[\d.]+-[\d.]+\); outputs equal token for token: 7/7 sentences", out), out
    assert_step_report(out)
    numbers = json.loads(out_json.read_text())
    assert numbers["threads"] == 1 and numbers["shape"] == "tiny" and numbers["rounds"] == 1
    limits = [limit for src, limit in source_batches(SHAPES["tiny"]) for _ in src]   # each sentence's batch limit
    decode = numbers["decode"]
    for mode in ("greedy", "beam4"):
        outputs = decode[mode]["outputs"]
        assert outputs["minitf"] == outputs["transformers"] and decode[mode]["outputs_equal"] == 7
        assert [len(o) for o in outputs["minitf"]] == limits                         # no sentence ended early
        assert decode[mode]["distinct_outputs"] == 7
        assert sum(len(set(o)) for o in outputs["minitf"]) > 3 * len(limits)         # not one token over and over
        assert {w["threads"] for w in decode[mode]["workers"].values()} == {1}
    assert decode["greedy"]["outputs"]["minitf"] != decode["beam4"]["outputs"]["minitf"]
    step = numbers["step"]
    assert step["losses_agree"] and all(p > 0 for p in step["peak_mib"].values())
    assert {w["threads"] for w in step["workers"].values()} == {1}                 # both processes got the setting
    assert step["workers"]["minitf"]["parameters"] == step["workers"]["PyTorch"]["parameters"]
    assert {len(t) for t in step["times"].values()} == {1}


def test_the_default_shape_is_t5_small_and_a_bad_flag_is_one_line():
    sys.path.insert(0, str(ROOT))
    from benchmarks.t5_step import SHAPES
    small = SHAPES["t5-small"]["model"]
    assert (small["vocab_size"], small["d_model"], small["d_kv"], small["d_ff"], small["num_layers"],
            small["num_heads"]) == (32128, 512, 64, 2048, 6, 8)
    result = run("--rounds", "0")
    assert result.returncode == 2 and "--rounds must be at least 1, got 0" in result.stderr
    assert "Traceback" not in result.stderr
