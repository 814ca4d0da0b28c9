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
