"""scripts/make_figures.py regenerates every picture of docs/ from a run folder
(skipped where matplotlib, the optional ``plot`` extra, is not installed)."""
import importlib.util
import pathlib

import pytest

from tests.runs import TINY, make_corpus

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.extra("matplotlib", "plot")
ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_make_figures_from_a_small_run(tmp_path):
    from minitf.train import main as train_main
    run = tmp_path / "run"
    assert train_main(make_corpus(tmp_path) + TINY + ["--max-steps", "4", "--eval-every", "2", "--out", str(run)]) == 0
    spec = importlib.util.spec_from_file_location("make_figures", ROOT / "scripts" / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--run", str(run), "--out", str(tmp_path / "figures")])
    names = sorted(p.name for p in (tmp_path / "figures").glob("*.png"))
    assert names == ["attention_0.png", "attention_1.png", "lr_schedule.png", "training_curves.png"]
    assert all((tmp_path / "figures" / n).stat().st_size > 5000 for n in names)


def test_moe_vs_dense_trains_both_for_equal_minutes_and_draws_them(tmp_path):
    """scripts/moe_vs_dense.sh on a tiny text and shape, 0.4 minutes a run (about a minute in all): both runs end
    by their budget with the same seed, the sparse one with 8 experts of 16, 2 per token, the dense one with d_ff 32;
    the figure is drawn from their logs, its validation minutes rise, its expert shares sum to 1 per layer."""
    import json
    import os
    import subprocess
    import sys
    from tests.test_lm_train import make_text
    flags = make_text(tmp_path) + ["--tokenizer", "char", "--d-model", "24", "--num-heads", "4", "--num-kv-heads", "2",
                                   "--num-layers", "2", "--block-size", "24", "--max-tokens", "192", "--warmup", "10"]
    out = tmp_path / "out"
    env = os.environ | {"MINUTES": "0.4", "OUT": str(out), "EXPERT_D_FF": "16", "EVAL_EVERY": "3", "SEED": "7",
                        "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "moe_vs_dense.sh"), *flags], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.count("trained ") == 2 and "wrote moe_vs_dense.png" in result.stdout
    configs = {arm: json.loads((out / arm / "config.json").read_text()) for arm in ("sparse", "dense")}
    assert (configs["sparse"]["num_experts"], configs["sparse"]["experts_per_token"], configs["sparse"]["moe_d_ff"]) \
        == (8, 2, 16)
    assert configs["dense"]["num_experts"] == 0 and configs["dense"]["d_ff"] == 32
    assert {c["max_minutes"] for c in configs.values()} == {0.4} and {c["seed"] for c in configs.values()} == {7}
    figure = out / "moe_vs_dense.png"
    assert figure.stat().st_size > 5000
    spec = importlib.util.spec_from_file_location("make_figures", ROOT / "scripts" / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for arm in ("sparse", "dense"):
        minutes, losses = module.validation_minutes(module.read_records(out / arm))
        assert len(minutes) >= 2 and minutes == sorted(minutes) and 0 < minutes[-1] <= 0.4, (arm, minutes)
    steps, shares = module.expert_shares(module.read_records(out / "sparse"))
    assert shares.shape == (len(steps), 2, 8) and abs(shares.sum(axis=-1) - 1).max() < 1e-12
    dense_only = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_figures.py"), "--moe-runs",
                                 str(out / "dense"), str(out / "dense"), "--out", str(tmp_path / "f")],
                                capture_output=True, text=True, cwd=ROOT, env=env)
    assert dense_only.returncode == 1 and "has no expert_load" in dense_only.stderr
    assert "Traceback" not in dense_only.stderr
