"""--resume: a resumed run stays a run. Resuming again and again, with flags changed in
between, on one process or two, never writes a value the run's own config would refuse,
and ``minitf.translate`` then uses the newest checkpoint."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from minitf.nmt import checkpoint as ckpt
from minitf.nmt.translate import load_model
from tests.runs import QUIET, ROOT, TINY, make_corpus, train, translate

MPIEXEC = shutil.which("mpiexec")
try:
    import mpi4py  # noqa: F401
    HAVE_MPI = MPIEXEC is not None
except ImportError:
    HAVE_MPI = False
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MINITF_DEVICE="cpu")


def _saved_configs(run):
    """config.json and every checkpoint's meta.json config of a run folder."""
    configs = [json.loads((run / "config.json").read_text())]
    configs += [json.loads((p / "meta.json").read_text())["config"] for p in ckpt.list_checkpoints(run)]
    return configs


def test_resuming_three_times_with_changed_flags_keeps_the_run_whole(tmp_path, capsys):
    run = tmp_path / "run"
    corpus = make_corpus(tmp_path)
    assert train(corpus + TINY + QUIET + ["--max-steps", "4", "--save-every", "2", "--out", run]) == 0
    for steps, extra in ((6, []), (8, ["--zero", "1", "--clip-norm", "1"]), (10, ["--max-tokens", "100"])):
        code, err = train(["--resume", run, "--max-steps", str(steps), "--no-progress"] + extra, capsys)
        assert code == 0, err
        assert not any(line.startswith("warning: skipping") for line in err), err
        assert all(c["zero"] in (0, 1) for c in _saved_configs(run))  # never null: every one reads back
    assert [p.name for p in ckpt.list_checkpoints(run)][-1] == "step-00000010"
    warnings = []
    _, _, meta = load_model(run, warn=warnings.append)
    assert meta["step"] == 10 and not warnings, warnings  # translate's choice: the newest, nothing skipped
    code, err, out = translate(["--checkpoint", run, "--beam", "1"], capsys, b"Der hund.\n",
                               pytest.MonkeyPatch(), tmp_path)
    assert code == 0 and out.strip() and not err, err


def test_a_run_written_with_zero_null_is_read_as_zero_0_with_one_note(tmp_path, capsys):
    run = tmp_path / "run"
    corpus = make_corpus(tmp_path)
    assert train(corpus + TINY + QUIET + ["--max-steps", "4", "--save-every", "2", "--out", run]) == 0
    for path in [run / "config.json"] + [p / "meta.json" for p in ckpt.list_checkpoints(run)]:
        meta = json.loads(path.read_text())
        (meta if path.name == "config.json" else meta["config"])["zero"] = None  # what the old --resume wrote
        path.write_text(json.dumps(meta))
    capsys.readouterr()
    code, err = train(["--resume", run, "--max-steps", "6", "--no-progress"], capsys)
    assert code == 0, err
    assert any('"zero": null' in line and "--zero 0" in line for line in err), err
    assert ckpt.list_checkpoints(run)[-1].name == "step-00000006"


@pytest.mark.skipif(not HAVE_MPI, reason="needs mpi4py and mpiexec (pip install '.[mpi]')")
def test_resuming_on_two_ranks_then_one_with_and_without_zero(tmp_path):
    run = tmp_path / "run"
    corpus = make_corpus(tmp_path)
    common = TINY + QUIET

    def train_py(args, ranks):
        launcher = [MPIEXEC, "-n", str(ranks)] if ranks > 1 else []
        done = subprocess.run(launcher + [sys.executable, str(ROOT / "train.py"), *map(str, args)], env=ENV,
                              cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        assert "warning: skipping" not in done.stderr, done.stderr
        return done

    train_py(corpus + common + ["--max-steps", "4", "--save-every", "2", "--out", run], 2)
    train_py(["--resume", run, "--max-steps", "6", "--zero", "1"], 2)
    train_py(["--resume", run, "--max-steps", "8"], 1)
    train_py(["--resume", run, "--max-steps", "10", "--zero", "1", "--accumulate", "2"], 2)
    assert all(c["zero"] in (0, 1) for c in _saved_configs(run))
    warnings = []
    _, _, meta = load_model(run, warn=warnings.append)
    assert meta["step"] == 10 and not warnings, warnings
