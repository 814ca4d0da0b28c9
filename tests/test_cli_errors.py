"""Bad input to the two commands, train.py and minitf.translate: one error line on
stderr, a non-zero exit (2 for usage errors), nothing written or changed on disk,
in-process and through the real command (no traceback from deep inside NumPy)."""
import hashlib
import json
import shutil
import subprocess
import sys

import pytest

from minitf import backend
from minitf.training import checkpoint as ckpt
from tests.runs import (BAD_TRAIN_INPUTS, CPU_ENV, ROOT, TINY, flip_byte, one_error_line, snapshot, train,
                        translate, truncate_model)


def test_train_help_runs():
    result = subprocess.run([sys.executable, "train.py", "--help"], capture_output=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0 and b"--preset" in result.stdout


@pytest.mark.parametrize("case", sorted(BAD_TRAIN_INPUTS))
def test_bad_train_input_gives_one_error_line_and_nonzero_exit(tmp_path, corpus, case, capsys):
    out = tmp_path / "out"
    out.mkdir()
    keep = out / "precious.txt"
    keep.write_text("do not touch")
    make_argv, status, expected = BAD_TRAIN_INPUTS[case]
    code, err = train(make_argv(tmp_path, corpus + TINY + ["--max-steps", "2", "--out", str(out)]), capsys)
    assert code == status and expected in one_error_line(err) and len(err) == 1, (case, err)
    assert sorted(p.name for p in out.iterdir()) == ["precious.txt"] and keep.read_text() == "do not touch"


# --------------------------------------------------------------------------- minitf.translate
def _ckpt_copy(world, tmp_path, step=4):
    folder = tmp_path / "ckpt" / f"step-{step:08d}"
    shutil.copytree(ckpt.checkpoint_path(world["ref"], step), folder)
    return folder


def _resign(folder, **meta_changes):
    """Rewrite a checkpoint's meta.json with changes and fresh checksums (a crafted,
    internally consistent but mismatched checkpoint)."""
    meta = json.loads((folder / "meta.json").read_text())
    for key, value in meta_changes.items():
        if key == "d_model":
            meta["config"]["d_model"] = value
        else:
            meta[key] = value
    meta["sha256"] = {name: ckpt.file_sha256(folder / name) for name in meta["sha256"]}
    (folder / "meta.json").write_text(json.dumps(meta))


def _swap_tokenizer(world, folder):
    shutil.copy(world["othertok"] / "tokenizer.model", folder / "tokenizer.model")


def _tokenizer_resigned(world, folder):
    _swap_tokenizer(world, folder)
    _resign(folder)


def _vocab_mismatch(world, folder):
    shutil.copy(world["vocab48"] / "tokenizer.model", folder / "tokenizer.model")
    meta = json.loads((folder / "meta.json").read_text())
    _resign(folder, tokenizer_sha256=hashlib.sha256((folder / "tokenizer.model").read_bytes()).hexdigest(),
            vocab_size=meta["vocab_size"])


def _file(folder, text, name="src", suffix=".txt"):
    path = folder / f"{name}{suffix}"
    path.write_text(text + ("\n" if text else ""), encoding="utf-8")
    return path


def _folder(folder, name):
    (folder / name).mkdir()
    return folder / name


# name: (argv from (world, tmp_path, checkpoint copy), stdin bytes or None, expected words in the error line)
BAD_TRANSLATE_INPUTS = {
    "checkpoint folder does not exist": (lambda w, d, c: ["--checkpoint", d / "nothing"], None, "does not exist"),
    "checkpoint folder is not a run": (lambda w, d, c: ["--checkpoint", _folder(d, "notarun")], None,
                                       "neither a checkpoint folder"),
    "checkpoint with a missing file": (lambda w, d, c: (c / "model.npz").unlink() or ["--checkpoint", c], None,
                                       "missing model.npz"),
    "checkpoint with a truncated file": (lambda w, d, c: truncate_model(c) or ["--checkpoint", c], None,
                                         "checksum"),
    "checkpoint with a corrupted byte": (lambda w, d, c: flip_byte(c) or ["--checkpoint", c], None, "checksum"),
    "checkpoint with a swapped tokenizer file": (lambda w, d, c: _swap_tokenizer(w, c) or ["--checkpoint", c], None,
                                                 "tokenizer.model does not match its checksum"),
    "swapped tokenizer, checksums re-signed": (lambda w, d, c: _tokenizer_resigned(w, c) or ["--checkpoint", c],
                                               None, "not the one the model was trained with"),
    "checkpoint of another vocabulary size": (lambda w, d, c: _vocab_mismatch(w, c) or ["--checkpoint", c], None,
                                              "vocabulary of"),
    "checkpoint of another d_model": (lambda w, d, c: _resign(c, d_model=32) or ["--checkpoint", c], None,
                                      "do not fit"),
    "checkpoint meta.json not JSON": (lambda w, d, c: _file(c, "{", "meta", ".json") and ["--checkpoint", c], None,
                                      "not valid JSON"),
    "invalid UTF-8 on stdin": (lambda w, d, c: ["--checkpoint", c], b"\xff\xfe bad\n", "not valid UTF-8"),
    "100000-character line on stdin": (lambda w, d, c: ["--checkpoint", c], b"a" * 100_000 + b"\n",
                                       "100000 characters"),
    "100000-character line in --src": (lambda w, d, c: ["--checkpoint", c, "--src", _file(d, "a" * 100_000)], None,
                                       "100000 characters"),
    "--src does not exist": (lambda w, d, c: ["--checkpoint", c, "--src", d / "missing.txt"], None,
                             "does not exist"),
    "--src is a directory": (lambda w, d, c: ["--checkpoint", c, "--src", d], None, "is a directory"),
    "--src empty": (lambda w, d, c: ["--checkpoint", c, "--src", _file(d, "")], None, "is empty"),
    "--src only empty lines": (lambda w, d, c: ["--checkpoint", c, "--src", _file(d, "\n \n\n")], None,
                               "only empty lines"),
    "--reference line-count mismatch": (lambda w, d, c: ["--checkpoint", c, "--src", _file(d, "Der hund.\nEin haus.\n"),
                                                         "--reference", _file(d, "The dog.\n", "ref")], None,
                                        "must match"),
    "zero beam size": (lambda w, d, c: ["--checkpoint", c, "--beam", "0"], b"Der hund.\n", "positive int"),
    "negative batch size": (lambda w, d, c: ["--checkpoint", c, "--batch-size", "-3"], b"Der hund.\n",
                            "positive int"),
}


@pytest.mark.parametrize("case", sorted(BAD_TRANSLATE_INPUTS))
def test_bad_translate_input_gives_one_error_line(world, tmp_path, case, capsys, monkeypatch):
    make_argv, stdin, expected = BAD_TRANSLATE_INPUTS[case]
    folder = _ckpt_copy(world, tmp_path)
    argv = make_argv(world, tmp_path, folder)
    before = snapshot(tmp_path)
    code, err, out = translate(argv, capsys, stdin if stdin is not None else b"Der hund.\n", monkeypatch, tmp_path)
    line = one_error_line(err, "minitf.translate")
    assert code not in (0, None) and expected in line and len(err) == 1, err
    assert out == ""
    after = snapshot(tmp_path)
    after.pop("stdin", None), before.pop("stdin", None)
    assert after == before


# --------------------------------------------------------------------------- through the real commands
CLI_CASES = [  # (program, argv builder, stdin, expected exit status, expected words)
    ("train.py", lambda w, d, c: w["corpus"] + ["--train-src", d / "missing.txt", "--out", d / "o"], None, 1,
     "does not exist"),
    ("train.py", lambda w, d, c: w["corpus"] + ["--preset", "huge", "--out", d / "o"], None, 2, "invalid choice"),
    ("train.py", lambda w, d, c: ["--resume", d], None, 2, "not a run folder"),
    ("minitf.translate", lambda w, d, c: (c / "model.npz").unlink() or ["--checkpoint", c], b"Der hund.\n", 1,
     "missing model.npz"),
    ("minitf.translate", lambda w, d, c: ["--checkpoint", c], b"\xff\xfe\n", 1, "not valid UTF-8"),
]


@pytest.mark.parametrize("index", range(len(CLI_CASES)))
def test_bad_input_through_the_real_cli(world, tmp_path, index):
    program, make_argv, stdin, status, expected = CLI_CASES[index]
    folder = _ckpt_copy(world, tmp_path)
    argv = [str(a) for a in make_argv(world, tmp_path, folder)]
    command = [sys.executable, "train.py"] if program == "train.py" else [sys.executable, "-m", program]
    result = subprocess.run(command + argv, cwd=ROOT, input=stdin or b"", capture_output=True, timeout=60)
    err = result.stderr.decode().strip().splitlines()
    assert result.returncode == status and len(err) == 1 and expected in err[0], err
    assert result.stdout == b""


@pytest.mark.parametrize("program", ["train.py", "minitf.translate"])
@pytest.mark.parametrize("device", ["bogus", "gpu"])
def test_a_bad_minitf_device_is_one_line(world, tmp_path, program, device):
    if device == "gpu" and backend.gpu_available():
        pytest.skip("a GPU is usable here, so MINITF_DEVICE=gpu is not an error")
    argv = ["train.py", "--resume", str(world["ref"])] if program == "train.py" else \
        ["-m", "minitf.translate", "--checkpoint", str(world["ref"])]
    result = subprocess.run([sys.executable, *argv], cwd=ROOT, env=dict(CPU_ENV, MINITF_DEVICE=device),
                            input=b"Der hund.\n", capture_output=True, timeout=60)
    err = result.stderr.decode().strip().splitlines()
    assert result.returncode == 1 and len(err) == 1 and "Traceback" not in result.stderr.decode(), err
    assert ("MINITF_DEVICE must be 'cpu' or 'gpu'" if device == "bogus" else "device 'gpu'") in err[0]


@pytest.mark.parametrize("value", ["nan", "-0.5", "inf", "x", "1e308", "10.5"])
@pytest.mark.parametrize("program", ["train.py", "minitf.translate"])
def test_alpha_must_be_a_finite_number_at_least_zero(world, tmp_path, program, value, capsys, monkeypatch):
    """Refused before anything runs; 1e308 overflowed the length penalty after all the training."""
    if program == "train.py":
        code, err = train(world["corpus"] + TINY + ["--max-steps", "2", "--alpha", value, "--out", tmp_path / "run"],
                          capsys)
    else:
        code, err, _ = translate(["--checkpoint", world["ref"], "--alpha", value], capsys, b"Der hund.\n",
                                 monkeypatch, tmp_path)
    line = one_error_line(err, program)
    assert code == 2 and "--alpha" in line and "finite number >= 0" in line
    assert not (tmp_path / "run").exists()
