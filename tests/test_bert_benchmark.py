"""The dry run of benchmarks/bert_step.py (issue 50's speed items) at its ``tiny`` shape: the masked-LM step runs as
the command runs, each framework in its own process, the first step's losses agree (the same model read from the
same folder on both sides, dropout 0), each side's peak memory is measured; fill-mask and classify run through
minitf's commands' functions and transformers' pipelines with equal outputs (every mask's top-5 ids, every text's
ranked labels); --json writes the same numbers. No timing is checked: that is the benchmark's job on a quiet
machine. Skipped without the bench extra."""
import json
import re
import sys

from tests.helpers import BENCH_MARKS, ROOT, assert_step_report, run_benchmark

pytestmark = BENCH_MARKS


def run(*args):
    return run_benchmark("bert_step.py", *args)


def test_the_dry_run_steps_both_frameworks_from_equal_losses(tmp_path):
    out_json = tmp_path / "bert.json"
    result = run("--dry-run", "--threads", "1", "--json", str(out_json))
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "- model (tiny): random BertForMaskedLM, 2 layers" in out and "1 timed rounds" in out
    assert_step_report(out)
    numbers = json.loads(out_json.read_text())
    assert numbers["threads"] == 1 and numbers["shape"] == "tiny" and numbers["rounds"] == 1
    step = numbers["step"]
    assert step["losses_agree"] and all(p > 0 for p in step["peak_mib"].values())
    assert {w["threads"] for w in step["workers"].values()} == {1}                 # both processes got the setting
    assert step["workers"]["minitf"]["parameters"] == step["workers"]["PyTorch"]["parameters"]
    assert {len(t) for t in step["times"].values()} == {1}
    for part, what in (("fill-mask", "masks' top-5 ids"), ("classify", "texts' ranked labels")):
        found = numbers[part]
        assert found["all_equal"] and found["outputs_equal"] == found["outputs"] == found["texts"] == 10, part
        assert found["batch_size"] == 4 and found["score_relative_difference"] < 1e-3, part
        assert {len(t) for t in found["times"].values()} == {1}, part
        assert found["workers"]["minitf"]["parameters"] == found["workers"]["PyTorch"]["parameters"], part
        assert re.search(rf"throughput: \*\*[\d.]+x\*\* .*outputs equal: 10/10 {what}", out), out
    assert "batch size 4 on both sides" in out


def test_one_part_runs_alone():
    result = run("--dry-run", "--threads", "1", "--part", "classify")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "## Classify" in result.stdout and "## Fill-mask" not in result.stdout and "## Masked-LM" not in result.stdout


def test_the_default_shape_is_bert_base_and_a_bad_flag_is_one_line():
    sys.path.insert(0, str(ROOT))
    from benchmarks.bert_step import SHAPES
    base = SHAPES["base"]
    assert (base["model"]["num_hidden_layers"], base["model"]["hidden_size"], base["model"]["num_attention_heads"],
            base["block"], base["batch"]) == (12, 768, 12, 128, 8)
    result = run("--rounds", "0")
    assert result.returncode == 2 and "--rounds must be at least 1, got 0" in result.stderr
    assert "Traceback" not in result.stderr
