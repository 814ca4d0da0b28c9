"""What the application's tests share: a tiny learnable corpus, tiny model flags,
the metrics of a run, the catalogues of bad train.py inputs and of bad checkpoints,
and running train.py as a command (on one process or under mpiexec)."""
import hashlib
import json
import os
import pathlib
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile

import pytest

from minitf.backend import host as np
from minitf.training import checkpoint as ckpt
from minitf.train import main as train_main
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


# name: (argv from (tmp folder, a good command line), exit status, words of the one error line: the reason, so
# that a case refused for another reason than its own does not pass)
BAD_TRAIN_INPUTS = {
    "missing file": (lambda d, c: c + ["--train-src", str(d / "nope.txt")],
                     1, "does not exist"),
    "empty file": (lambda d, c: c + ["--train-src", str(_write(d / "empty.txt", b""))],
                   1, "is empty (0 bytes)"),
    "line-count mismatch": (lambda d, c: c + ["--train-tgt", str(_write(d / "short.txt", b"One two three.\n"))],
                            1, "has 120 lines but target"),
    "invalid utf-8": (lambda d, c: c + ["--train-src",
                                        str(_write(d / "latin1.txt", "Straße\n".encode("latin-1") * 120))],
                      1, "is not valid UTF-8 at line 1"),
    "directory": (lambda d, c: c + ["--train-src", str(d)],
                  1, "is a directory"),
    "unknown preset": (lambda d, c: c + ["--preset", "huge"],
                       2, "invalid choice: 'huge'"),
    "zero size": (lambda d, c: c + ["--d-model", "0"],
                  2, "argument --d-model: expected a positive int"),
    "negative tokens": (lambda d, c: c + ["--max-tokens", "-5"],
                        2, "argument --max-tokens: expected a positive int"),
    "heads do not divide": (lambda d, c: c + ["--d-model", "10", "--num-heads", "3"],
                            2, "--d-model must be divisible by --num-heads"),
    "only train given": (lambda d, c: ["--train-src", c[1], "--train-tgt", c[3]],
                         2, "needs --valid-src and --valid-tgt"),
    "resume nothing": (lambda d, c: ["--resume", str(d / "nothing")],
                       2, "no such folder"),
    "line of 100000 characters": (lambda d, c: c + ["--train-src", str(_write(d / "long.txt", b"a" * 100_000 + b"\n"))],
                                  1, "line 1 has 100000 characters"),
    "only empty lines": (lambda d, c: c + ["--valid-tgt", str(_write(d / "blank.txt", b"\n  \n\n"))],
                         1, "has only empty lines"),
    "out below a regular file": (lambda d, c: c + ["--out", str(d / "out" / "precious.txt" / "run")],
                                 2, "which is a file, not a folder"),
    "resume a folder that is not a run": (lambda d, c: ["--resume", str(d / "out")],
                                          2, "not a run folder"),
    "resume a file": (lambda d, c: ["--resume", str(d / "out" / "precious.txt")],
                      2, "precious.txt is a file"),
    "resume with a model flag": (lambda d, c: ["--resume", str(d / "out"), "--d-model", "32"],
                                 2, "--d-model cannot be given"),
    "dropout out of range": (lambda d, c: c + ["--dropout", "1.5"],
                             2, "--dropout must be in [0, 1)"),
    "vocabulary too small": (lambda d, c: c + ["--vocab-size", "4"],
                             2, "--vocab-size must be at least 8"),
    "vocabulary too large for the text": (lambda d, c: c + ["--vocab-size", "100000"],
                                          1, "too large for this training text"),
    "lexicon without the dictionary": (lambda d, c: c + ["--lexicon", "0.5"],
                                       2, "it needs the default corpus"),
    "lexicon ratio too large": (lambda d, c: c + ["--lexicon", "11"],
                                2, "--lexicon must be a ratio in [0, 10]"),
    "negative lexicon ratio": (lambda d, c: c + ["--lexicon", "-1"],
                               2, "argument --lexicon: expected a finite number >= 0"),
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


def read_line(fd, timeout=60):
    """One line from a pipe (a command's stdout), or fail after ``timeout`` seconds."""
    data, deadline = b"", time.monotonic() + timeout
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0, f"no answer within {timeout} s (got {data!r})"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 1)
            assert chunk, f"the command closed its output after {data!r}"
            data += chunk
    return data.decode("utf-8").rstrip("\n")


def snapshot(folder):
    """{relative path: sha256} of every file below ``folder``."""
    folder = pathlib.Path(folder)
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def params_of(path):
    return ckpt.read_checkpoint(path)["params"]


def same_params(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def one_error_line(err, prog="train.py", lines=1):
    """The one ``prog: error: ...`` line of ``err`` (stderr's lines): the last of at most ``lines`` lines (more
    than one where the command logs its set-up before it fails; nothing after it, no traceback or banner)."""
    errors = [line for line in err if "error" in line.lower()]
    assert len(errors) == 1 and f"{prog}: error: " in errors[0] and len(err) <= lines and err[-1] == errors[0], err
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


# --------------------------------------------------------------------------- subprocesses and MPI
def final_params(run_dir):
    """The newest checkpoint's step and parameters, flat, without the attention key biases
    (their true gradient is zero: see tests/mpi_worker.key_bias_mask)."""
    state = ckpt.read_checkpoint(ckpt.list_checkpoints(run_dir)[-1])
    d = state["meta"]["config"]["d_model"]
    return state["meta"]["step"], np.concatenate([np.delete(np.ravel(a), np.s_[d:2 * d]) if name.endswith("attn.b_qkv")
                                                  else np.ravel(a) for name, a in sorted(state["params"].items())])


CPU_ENV = dict(os.environ, MINITF_DEVICE="cpu", PYTHONPATH=str(ROOT))  # train.py / translate as commands
CPU_ENV.pop("MINITF_TEST_SLOW_CHECKPOINT", None)
MPIEXEC = shutil.which("mpiexec")
try:
    import mpi4py  # noqa: F401
    HAVE_MPI = MPIEXEC is not None
except ImportError:
    HAVE_MPI = False
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="needs mpi4py and mpiexec (pip install '.[mpi]')")
MPI_ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")


def mpiexec(n, *args, env=MPI_ENV, timeout=120):
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *map(str, args)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def train_py(*args, ranks=1, env=MPI_ENV, timeout=120):
    """train.py as a command, on one process or under ``mpiexec -n ranks``."""
    if ranks == 1:
        return subprocess.run([sys.executable, str(ROOT / "train.py"), *map(str, args)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
    return mpiexec(ranks, ROOT / "train.py", *args, env=env, timeout=timeout)


# --------------------------------------------------------------------------- damaging a checkpoint
class Payload:
    """Unpickling this creates ``marker``: proof that code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def truncate_model(path):
    data = (path / "model.npz").read_bytes()
    (path / "model.npz").write_bytes(data[:len(data) // 2])


def flip_byte(path):
    data = bytearray((path / "optimizer.npz").read_bytes())
    data[len(data) // 2] ^= 0x01
    (path / "optimizer.npz").write_bytes(bytes(data))


def resign(folder):
    """Recompute the checksums in meta.json, so that only the content checks can catch a change."""
    meta = json.loads((folder / "meta.json").read_text())
    meta["sha256"] = {name: ckpt.file_sha256(folder / name) for name in meta["sha256"]}
    (folder / "meta.json").write_text(json.dumps(meta))


def rewrite_npz(path, change):
    """Rewrite an .npz with ``change(arrays)`` (a dict, changed in place), as np.savez does."""
    arrays = ckpt.read_npz(path)
    change(arrays)
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


def npy_bytes(shape, descr="<f4", fortran=False, data=b""):
    """An npy 1.0 member whose header says anything, followed by ``data``."""
    header = repr({"descr": descr, "fortran_order": fortran, "shape": tuple(shape)}).encode("latin1")
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data


def replace_member(path, name, payload, compress=zipfile.ZIP_STORED):
    """Replace member ``name``.npy of the archive ``path`` by raw ``payload`` bytes."""
    members = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            members[info.filename] = archive.read(info)
    members[f"{name}.npy"] = payload
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in members.items():
            archive.writestr(member, data, compress_type=compress if member == f"{name}.npy" else zipfile.ZIP_STORED)


def _transplant(source):
    def damage(path, world):
        shutil.rmtree(path)
        shutil.copytree(ckpt.checkpoint_path(world[source], 4), path)
    return damage


def _pickle(path, world):
    """A model.npz whose first array is an object array holding a Payload, with
    checksums recomputed so that only the pickle check stands in the way."""
    state = ckpt.read_checkpoint(path)
    params = dict(state["params"])
    name = sorted(params)[0]
    params[name] = np.array([Payload(world["base"] / "PWNED")], dtype=object)
    meta = {k: v for k, v in state["meta"].items() if k not in ("sha256", "format_version")}
    shutil.rmtree(path)
    ckpt.write_checkpoint(path, params, meta, state["tokenizer_bytes"], state["optimizer"])


def _resigned(change):
    """A damage made behind the checksums' back: they are recomputed afterwards."""
    def damage(path, world):
        change(path)
        resign(path)
    return damage


def _set_first(file, value, last=False):
    def change(path):
        rewrite_npz(path / file, lambda a: a[sorted(a)[-1 if last else 0]].flat.__setitem__(0, value))
    return change


def _astype(kind):
    def change(path):
        def cast(arrays):
            name = sorted(arrays)[0]
            arrays[name] = arrays[name].astype(kind)
        rewrite_npz(path / "model.npz", cast)
    return change


def _huge_header(path):
    name = sorted(ckpt.read_npz(path / "model.npz"))[0]
    replace_member(path / "model.npz", name, npy_bytes((10 ** 12,), data=b"\0" * 64))


def _deflated(path):
    """A member declaring 40 MB, deflated to ~40 KB (as a declared 3 GB would be in 3 MB)."""
    name = sorted(ckpt.read_npz(path / "model.npz"))[0]
    replace_member(path / "model.npz", name, npy_bytes((10_000_000,), data=b"\0" * 40_000_000), zipfile.ZIP_DEFLATED)


def _negative_v(path):
    rewrite_npz(path / "optimizer.npz", lambda a: a["v"].__setitem__(0, -1.0))


# name: (damage(checkpoint folder, world), words of the reason). The cases after the first eight have their
# checksums recomputed (a crafted file): sizes, dtypes and values are caught by the content checks alone.
BAD_CHECKPOINTS = {
    "truncated file": (lambda path, world: truncate_model(path), "checksum"),
    "corrupted byte": (lambda path, world: flip_byte(path), "checksum"),
    "missing file": (lambda path, world: (path / "optimizer.npz").unlink(), "missing optimizer.npz"),
    "missing meta.json": (lambda path, world: (path / "meta.json").unlink(), "no meta.json"),
    "other vocabulary size": (_transplant("vocab48"), "another tokenizer"),
    "other d_model": (_transplant("dmodel32"), "d_model 32 (run: 16)"),
    "other tokenizer": (_transplant("othertok"), "another tokenizer"),
    "pickled array": (_pickle, "pickle"),
    "header declares shape (10**12,)": (_resigned(_huge_header), "declares shape"),
    "deflated member declares 40 MB": (_resigned(_deflated), "compressed"),
    "int64 parameters": (_resigned(_astype(np.int64)), "int64"),
    "complex128 parameters": (_resigned(_astype(np.complex128)), "complex128"),
    "string parameters": (_resigned(_astype("U8")), "<U8"),
    "float64 parameters": (_resigned(_astype(np.float64)), "float64"),
    "NaN parameter": (_resigned(_set_first("model.npz", np.nan)), "NaN or inf"),
    "inf parameter": (_resigned(_set_first("model.npz", np.inf, last=True)), "NaN or inf"),
    "negative Adam second moment": (_resigned(_negative_v), "negative"),
}
# the crafted checkpoints that minitf.translate (which reads no Adam moments) must refuse too
CRAFTED_MODEL_FILES = list(BAD_CHECKPOINTS)[8:-1]


def change_manifest(change):
    """A damage for a prepared folder: ``change(manifest)`` (a dict, changed in place) written back as its
    manifest.json."""
    def damage(folder):
        manifest = json.loads((folder / "manifest.json").read_text())
        change(manifest)
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return damage


def sigterm_once_part_grows(child, part, size=2048, timeout=20):
    """SIGTERM to a downloading ``child`` once its ``part`` file holds ``size`` bytes (or after ``timeout`` s);
    its stderr once it has ended."""
    deadline = time.monotonic() + timeout
    while not (part.is_file() and part.stat().st_size >= size) and time.monotonic() < deadline:
        time.sleep(0.01)
    child.send_signal(signal.SIGTERM)
    return child.communicate(timeout=timeout)[1]
