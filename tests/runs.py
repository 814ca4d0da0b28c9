"""What the application's tests share: a tiny learnable corpus, tiny model flags,
the metrics of a run, and the catalogue of bad train.py inputs."""
import hashlib
import json
import pathlib
import shutil
import sys

from minitf.backend import host as np
from minitf.nmt import checkpoint as ckpt
from minitf.nmt.train import main as train_main
from minitf.nmt.translate import main as translate_main

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORDS = {"der": "the", "hund": "dog", "katze": "cat", "sieht": "sees", "mag": "likes", "ein": "a",
         "haus": "house", "rote": "red", "kleine": "small", "vogel": "bird", "baum": "tree", "und": "and"}
TINY = ["--d-model", "16", "--num-heads", "2", "--num-layers", "1", "--d-ff", "32", "--vocab-size", "40",
        "--max-tokens", "120", "--warmup", "20", "--bleu-sentences", "4", "--beam", "2", "--no-progress",
        "--seed", "3"]


def make_corpus(folder, n_train=120, n_valid=12, seed=0):
    """Word-by-word 'German' -> 'English' sentences: learnable, tiny, deterministic."""
    rng = np.random.default_rng(seed)
    german = list(WORDS)
    files = {}
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_valid)):
        src, tgt = [], []
        for _ in range(n):
            words = [german[i] for i in rng.integers(0, len(german), rng.integers(3, 7))]
            src.append(" ".join(words).capitalize() + ".")
            tgt.append(" ".join(WORDS[w] for w in words).capitalize() + ".")
        for side, lines in (("src", src), ("tgt", tgt)):
            path = folder / f"{split}.{side}"
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            files[f"--{split}-{side}"] = str(path)
    return [part for item in files.items() for part in item]


def metrics(run_dir, kind="train"):
    lines = (pathlib.Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


BAD_TRAIN_INPUTS = {
    "missing file": lambda d, c: c + ["--train-src", str(d / "nope.txt")],
    "empty file": lambda d, c: c + ["--train-src", str(_write(d / "empty.txt", b""))],
    "line-count mismatch": lambda d, c: c + ["--train-tgt", str(_write(d / "short.txt", b"One two three.\n"))],
    "invalid utf-8": lambda d, c: c + ["--train-src", str(_write(d / "latin1.txt", "Straße\n".encode("latin-1") * 120))],
    "directory": lambda d, c: c + ["--train-src", str(d)],
    "unknown preset": lambda d, c: c + ["--preset", "huge"],
    "zero size": lambda d, c: c + ["--d-model", "0"],
    "negative tokens": lambda d, c: c + ["--max-tokens", "-5"],
    "heads do not divide": lambda d, c: c + ["--d-model", "10", "--num-heads", "3"],
    "only train given": lambda d, c: ["--train-src", c[1], "--train-tgt", c[3]],
    "resume nothing": lambda d, c: ["--resume", str(d / "nothing")],
    "line of 100000 characters": lambda d, c: c + ["--train-src", str(_write(d / "long.txt", b"a" * 100_000 + b"\n"))],
    "only empty lines": lambda d, c: c + ["--valid-tgt", str(_write(d / "blank.txt", b"\n  \n\n"))],
    "out below a regular file": lambda d, c: c + ["--out", str(d / "out" / "precious.txt" / "run")],
    "resume a folder that is not a run": lambda d, c: ["--resume", str(d / "out")],
    "resume a file": lambda d, c: ["--resume", str(d / "out" / "precious.txt")],
    "resume with a model flag": lambda d, c: ["--resume", str(d / "out"), "--d-model", "32"],
    "dropout out of range": lambda d, c: c + ["--dropout", "1.5"],
    "vocabulary too small": lambda d, c: c + ["--vocab-size", "4"],
    "vocabulary too large for the text": lambda d, c: c + ["--vocab-size", "100000"],
}


def _write(path, data):
    path.write_bytes(data)
    return path


# --------------------------------------------------------------------------- running the CLIs in-process
QUIET = ["--eval-every", "1000", "--average", "0", "--bleu-sentences", "2"]


def train(argv, capsys=None):
    """train.py in-process; returns (exit status, stderr lines) when capsys is given."""
    try:
        code = train_main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse
        code = exit_.code
    if capsys is None:
        return code
    return code, capsys.readouterr().err.strip().splitlines()


def translate(argv, capsys, stdin_bytes=None, monkeypatch=None, tmp_path=None):
    if stdin_bytes is not None:
        (tmp_path / "stdin").write_bytes(stdin_bytes)
        monkeypatch.setattr(sys, "stdin", open(tmp_path / "stdin", "r"))
    try:
        code = translate_main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines(), captured.out


def snapshot(folder):
    """{relative path: sha256} of every file below ``folder``."""
    folder = pathlib.Path(folder)
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def params_of(path):
    return ckpt.read_checkpoint(path)["params"]


def same_params(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def one_error_line(err, prog="train.py"):
    errors = [line for line in err if "error" in line.lower()]
    assert len(errors) == 1 and f"{prog}: error: " in errors[0], err
    assert not any("Traceback" in line for line in err), err
    return errors[0]


def copy_run(src, dst):
    shutil.copytree(src, dst)
    (dst / "best.json").unlink(missing_ok=True)
    return dst


def assert_resumed_past_bad_step_4(run, ref, code, err, reason):
    """``--resume`` of a copy of ``ref`` whose step-4 checkpoint was damaged: one warning
    naming ``reason``, step 4 set aside, resumed from step 2, and step 6 equal to ``ref``'s."""
    assert code == 0, err
    warnings = [line for line in err if line.startswith("warning: skipping a bad checkpoint")]
    assert len(warnings) == 1 and reason in warnings[0] and "step-00000004" in warnings[0], err
    assert any("resumed from" in line and "step-00000002" in line for line in err)
    assert (run / "checkpoints" / "step-00000004.bad").is_dir()
    assert same_params(params_of(ckpt.checkpoint_path(run, 6)), params_of(ckpt.checkpoint_path(ref, 6)))
