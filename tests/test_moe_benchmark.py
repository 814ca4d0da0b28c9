"""The dry run of benchmarks/moe_step.py (issue 52's speed item) at its ``tiny`` shape: the three training steps run
as the command runs, each in its own process (minitf's sparse model, transformers' with its eager expert loop,
minitf's dense model of the same active parameters), the sparse sides' first losses agree (the same Mixtral folder
read on both sides, no dropout), the output names transformers' experts implementation that ran and both ratios
with their targets, each side's peak memory is measured, and --json writes the same numbers. No timing is checked:
that is the benchmark's job on a quiet machine. Skipped without the bench extra."""
import json
import re
import sys

from tests.helpers import BENCH_MARKS, ROOT, assert_step_report, run_benchmark

pytestmark = BENCH_MARKS


def run(*args):
    return run_benchmark("moe_step.py", *args)


def test_the_dry_run_steps_three_models_and_reports_both_ratios(tmp_path):
    out_json = tmp_path / "moe.json"
    result = run("--dry-run", "--threads", "1", "--json", str(out_json))
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "- model (tiny): random MixtralForCausalLM, 2 layers" in out and "8 experts of d_ff 32 (128 / 4)" in out
    assert_step_report(out)
    assert "transformers' experts implementation that ran: eager;" in out
    assert re.search(r"minitf sparse / transformers sparse: \*\*[\d.]+x\*\* .*target <= 0.6: (met|NOT met)", out), out
    assert re.search(r"minitf sparse / minitf dense \(d_ff 64\): \*\*[\d.]+x\*\* .*target <= 1.3", out), out
    assert re.search(r"\| minitf dense \(d_ff 64\) \| \d+ ", out), out
    numbers = json.loads(out_json.read_text())
    assert numbers["shape"] == "tiny" and numbers["rounds"] == 1
    step = numbers["step"]
    workers = step["workers"]
    assert step["losses_agree"] and set(step["peak_mib"]) == {"minitf", "PyTorch", "dense"}
    assert all(p > 0 for p in step["peak_mib"].values())
    assert {w["threads"] for w in workers.values()} == {1}                 # every process got the setting
    assert workers["PyTorch"]["experts"] == "eager" and workers["minitf"]["sparse_layers"] == 2
    assert workers["minitf"]["parameters"] == workers["PyTorch"]["parameters"]
    # the dense model's feed-forward holds the active experts' parameters: 2 layers x 3 matrices x 64 x (64 - 8 x 32)
    assert workers["dense"]["d_ff"] == 64
    assert workers["minitf"]["parameters"] - workers["dense"]["parameters"] == 2 * (3 * 64 * (8 * 32 - 64) + 64 * 8)
    for key, target in (("transformers", 0.6), ("dense", 1.3)):
        ratio = step["ratios"][key]
        assert ratio["target"] == target and ratio["met"] == (ratio["ratio"] <= target)
    assert step["ratios"]["dense"]["ratio"] == step["median"]["minitf"] / step["median"]["dense"]


def test_the_default_shape_is_smollm2_with_eight_quarter_width_experts_and_a_bad_flag_is_one_line():
    sys.path.insert(0, str(ROOT))
    from benchmarks.moe_step import SHAPES, widths
    shape = SHAPES["smollm2"]
    m = shape["model"]
    assert (m["num_layers"], m["d_model"], m["num_heads"], m["num_kv_heads"], m["vocab_size"], m["rope_theta"],
            m["tie_word_embeddings"]) == (30, 576, 9, 3, 49152, 100000.0, True)
    assert (shape["experts"], shape["per_token"], widths(shape), shape["batch"], shape["block"]) == \
        (8, 2, (384, 768), 4, 256)
    result = run("--rounds", "0")
    assert result.returncode == 2 and "--rounds must be at least 1, got 0" in result.stderr
    assert "Traceback" not in result.stderr
