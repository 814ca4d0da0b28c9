"""train.py end to end on a small corpus the test makes: training, checkpoints,
exact resume, averaging, translation, and bad input. No network, no apt."""
import json
import pathlib
import subprocess
import sys

import pytest

from minitf.nmt import checkpoint as ckpt
from minitf.backend import host as np
from minitf.nmt.train import main as train_main
from minitf.nmt.translate import main as translate_main
from tests.runs import BAD_TRAIN_INPUTS, ROOT, TINY, metrics

def test_training_runs_evaluates_and_saves(tmp_path, corpus, capsys):
    run = tmp_path / "run"
    assert train_main(corpus + TINY + ["--max-steps", "6", "--eval-every", "3", "--save-every", "3",
                                       "--out", str(run)]) == 0
    err = capsys.readouterr().err
    assert "test BLEU" in err and "src:" in err and "out:" in err
    steps = [r["step"] for r in metrics(run)]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert all(np.isfinite(r["loss"]) and r["tokens_per_s"] > 0 for r in metrics(run))
    assert [r["step"] for r in metrics(run, "valid")][:2] == [3, 6]
    assert "bleu" in metrics(run, "test")[0]
    names = [p.name for p in ckpt.list_checkpoints(run)]
    assert names == ["step-00000003", "step-00000006"]
    state = ckpt.read_checkpoint(run / "checkpoints" / "step-00000006")
    assert state["meta"]["step"] == 6 and set(state["optimizer"]) == {"m", "v"}
    assert (run / "checkpoints" / "averaged" / "meta.json").is_file()


def test_resume_continues_exactly(tmp_path, corpus):
    """Losses and final parameters after resuming equal an uninterrupted run, bit for bit."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = corpus + TINY + ["--eval-every", "100", "--save-every", "4", "--average", "0", "--dropout", "0.2"]
    assert train_main(common + ["--max-steps", "10", "--out", str(straight)]) == 0
    assert train_main(common + ["--max-steps", "4", "--out", str(split)]) == 0
    assert train_main(["--resume", str(split), "--max-steps", "10", "--no-progress"]) == 0
    a = {r["step"]: r["loss"] for r in metrics(straight)}
    b = {r["step"]: r["loss"] for r in metrics(split)}
    assert a == b and len(a) == 10
    pa = ckpt.read_checkpoint(ckpt.checkpoint_path(straight, 10))["params"]
    pb = ckpt.read_checkpoint(ckpt.checkpoint_path(split, 10))["params"]
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)


def test_averaging_is_the_mean_of_checkpoints(tmp_path, corpus):
    run = tmp_path / "run"
    assert train_main(corpus + TINY + ["--max-steps", "6", "--save-every", "2", "--eval-every", "100",
                                       "--average", "3", "--out", str(run)]) == 0
    paths = ckpt.list_checkpoints(run)
    assert len(paths) == 3
    loaded = [ckpt.read_checkpoint(p)["params"] for p in paths]
    averaged = ckpt.read_checkpoint(run / "checkpoints" / "averaged")["params"]
    for name in averaged:
        assert np.allclose(averaged[name], np.mean([c[name] for c in loaded], axis=0), atol=1e-7)


def test_translate_cli_reads_stdin_and_scores_references(tmp_path, corpus):
    run = tmp_path / "run"
    assert train_main(corpus + TINY + ["--max-steps", "4", "--eval-every", "100", "--out", str(run)]) == 0
    src = pathlib.Path(corpus[corpus.index("--test-src") + 1])
    ref = pathlib.Path(corpus[corpus.index("--test-tgt") + 1])
    result = subprocess.run([sys.executable, "-m", "minitf.translate", "--checkpoint", str(run), "--beam", "2",
                             "--ref", str(ref)], input=src.read_bytes(), capture_output=True, cwd=ROOT,
                            timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode().splitlines()
    assert len(lines) == len(src.read_text().splitlines())
    assert "BLEU" in result.stderr.decode()


def test_train_cli_default_help_runs():
    result = subprocess.run([sys.executable, "train.py", "--help"], capture_output=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0 and b"--preset" in result.stdout


@pytest.mark.parametrize("case", sorted(BAD_TRAIN_INPUTS))
def test_bad_train_input_gives_one_error_line_and_nonzero_exit(tmp_path, corpus, case, capsys):
    out = tmp_path / "out"
    out.mkdir()
    keep = out / "precious.txt"
    keep.write_text("do not touch")
    argv = BAD_TRAIN_INPUTS[case](tmp_path, corpus + TINY + ["--max-steps", "2", "--out", str(out)])
    try:
        code = train_main(argv)
    except SystemExit as exit_:  # argparse
        code = exit_.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0, case
    assert len(err) == 1 and "error" in err[0], err
    assert sorted(p.name for p in out.iterdir()) == ["precious.txt"] and keep.read_text() == "do not touch"


def test_existing_run_is_not_overwritten(tmp_path, corpus, capsys):
    run = tmp_path / "run"
    assert train_main(corpus + TINY + ["--max-steps", "2", "--out", str(run)]) == 0
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert train_main(corpus + TINY + ["--max-steps", "2", "--out", str(run)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert before == {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}


def test_corrupted_latest_checkpoint_falls_back_to_the_previous(tmp_path, corpus, capsys):
    run = tmp_path / "run"
    assert train_main(corpus + TINY + ["--max-steps", "4", "--save-every", "2", "--eval-every", "100",
                                       "--average", "0", "--out", str(run)]) == 0
    latest = ckpt.checkpoint_path(run, 4) / "model.npz"
    latest.write_bytes(latest.read_bytes()[:100])      # truncated
    with pytest.raises(ckpt.CheckpointError, match="checksum"):
        ckpt.read_checkpoint(latest.parent)
    state, path, errors = ckpt.latest_valid_checkpoint(run)
    assert path.name == "step-00000002" and len(errors) == 1


def test_pickled_checkpoint_is_refused(tmp_path):
    """A crafted object array (which would need pickle, and could run code) is rejected."""
    folder = tmp_path / "step-00000001"
    params = {"w": np.array([{"evil": 1}], dtype=object)}
    folder.mkdir()
    with open(folder / "model.npz", "wb") as handle:
        np.savez(handle, **params)   # numpy pickles the object array inside
    (folder / "tokenizer.model").write_bytes(b"x")
    meta = {"config": {}, "sha256": {n: ckpt.file_sha256(folder / n) for n in ("model.npz", "tokenizer.model")}}
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ckpt.CheckpointError, match="pickle"):
        ckpt.read_checkpoint(folder)


@pytest.mark.parametrize("case", ["missing folder", "not a run", "missing file", "bad utf-8 on stdin"])
def test_bad_translate_input(tmp_path, corpus, case, capsys, monkeypatch):
    argv = ["--checkpoint", str(tmp_path / "nothing")]
    if case == "not a run":
        argv = ["--checkpoint", str(tmp_path)]
    if case in ("missing file", "bad utf-8 on stdin"):
        run = tmp_path / "run"
        assert train_main(corpus + TINY + ["--max-steps", "2", "--out", str(run)]) == 0
        capsys.readouterr()
        argv = ["--checkpoint", str(run)]
        if case == "missing file":
            argv += ["--src", str(tmp_path / "missing.txt")]
        else:
            (tmp_path / "bad").write_bytes(b"\xff\xfe bad\n")
            monkeypatch.setattr(sys, "stdin", open(tmp_path / "bad", "r"))
    assert translate_main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0], err
