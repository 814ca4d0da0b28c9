"""Reliability of a long training run: a kill, a crash, a full disk or a bad file
costs at most the steps since the last checkpoint, and never leaves a corrupt model
or a wrong number printed as a right one.

- kill (SIGKILL at seeded-random moments, mid-checkpoint too) and --resume give the
  parameters and the metrics of an uninterrupted run, bit for bit on the CPU;
  Ctrl-C / SIGTERM save a checkpoint and exit 130 / 143
- damaged or mismatched checkpoints are refused with one clear line; --resume falls
  back to the previous good one; loading never unpickles (a payload's side effect
  provably does not happen)
- no NaN/inf from padding, masking, huge logits, length-1 or batch-of-one inputs;
  a non-finite step stops the run (naming step and checkpoint) or is skipped and
  counted, with Adam's moments untouched
- bad input to train.py and minitf.translate: one error line, non-zero exit, nothing
  changed on disk
- same seed, same losses; a full disk or an out-of-memory batch says what to do

Everything runs on a tiny corpus and model (tests/test_train.py's ``make_corpus``,
``TINY``); the whole file takes well under a minute on 2 cores.
"""
import errno
import hashlib
import json
import os
import pathlib
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from minitf import backend
from minitf.nmt import checkpoint as ckpt, train as train_module, trainer as trainer_module
from minitf.attention import MultiHeadAttention
from minitf.backend import host as np
from minitf.loss import LabelSmoothedCrossEntropy
from minitf.nmt.trainer import MetricsLog
from minitf.module import FlatBuffers
from minitf.transformer import Transformer

from tests.runs import (QUIET, TINY, assert_resumed_past_bad_step_4, copy_run, make_corpus, metrics, one_error_line,
                        params_of, same_params, snapshot, train, translate)

ROOT = pathlib.Path(__file__).resolve().parent.parent
# --------------------------------------------------------------------------- 1. kill and resume
def _spawn(argv, run_dir, env):
    return subprocess.Popen([sys.executable, "train.py", *map(str, argv)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _steps_logged(run_dir):
    """Train records in metrics.jsonl, tolerating a line being written or torn by a kill."""
    count = 0
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            count += json.loads(line)["kind"] == "train"
        except ValueError:
            pass
    return count


def _leftovers(run_dir):
    folder = run_dir / "checkpoints"
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".")) if folder.is_dir() else []


def test_sigkill_at_random_moments_then_resume_equals_an_uninterrupted_run(tmp_path):
    """SIGKILL train.py at seeded-random moments (before config.json exists, during
    training, while a checkpoint is being written), resume each time; the final
    parameters, Adam's moments and the metrics equal those of a run never killed."""
    corpus = make_corpus(tmp_path)
    steps = 14
    argv = corpus + TINY + ["--max-steps", steps, "--save-every", 1, "--keep", 3, "--eval-every", 5,
                            "--bleu-sentences", 2, "--average", 0]
    env = dict(os.environ, MINITF_DEVICE="cpu")
    env.pop("MINITF_TEST_SLOW_CHECKPOINT", None)
    ref = tmp_path / "ref"
    done = subprocess.run([sys.executable, "train.py", *map(str, argv), "--out", str(ref)], cwd=ROOT, env=env,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]

    run = tmp_path / "killed"
    slow = dict(env, MINITF_TEST_SLOW_CHECKPOINT="0.08")  # ~0.25 s per checkpoint: most kills land mid-write
    rng = random.Random(20240611)
    seen = {"before config.json": 0, "mid-checkpoint": 0, "resumed, then killed while training": 0}
    for attempt in range(12):
        if attempt >= 5 and all(seen.values()):
            break
        resume = (run / "config.json").is_file()
        trained = _steps_logged(run) if resume else 0
        proc = _spawn(["--resume", run, "--no-progress"] if resume else argv + ["--out", run], run, slow)
        if attempt == 0:
            time.sleep(rng.uniform(0.0, 0.05))  # before config.json: Python is still starting
        elif attempt % 2:
            time.sleep(rng.uniform(0.2, 1.2))   # counted from the start: startup, loading or training
        else:  # counted from the first new step, whatever the machine's load: training or saving
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline and _steps_logged(run) <= trained:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode in (-signal.SIGKILL, 0), err.decode()[-2000:]
        if not (run / "config.json").is_file():
            seen["before config.json"] += 1
        if any(".tmp-" in name for name in _leftovers(run)):
            seen["mid-checkpoint"] += 1
        if resume and _steps_logged(run) > trained:
            seen["resumed, then killed while training"] += 1
    print("kills:", seen)
    assert all(seen.values()), seen

    final = subprocess.run([sys.executable, "train.py", "--resume", str(run), "--no-progress"], cwd=ROOT, env=env,
                           capture_output=True, timeout=120)
    assert final.returncode == 0, final.stderr.decode()[-2000:]
    assert _leftovers(run) == []
    a = ckpt.read_checkpoint(ckpt.checkpoint_path(ref, steps))
    b = ckpt.read_checkpoint(ckpt.checkpoint_path(run, steps))
    assert same_params(a["params"], b["params"])
    assert same_params(a["optimizer"], b["optimizer"])
    keys = ("kind", "step", "epoch", "loss", "ppl", "lr", "tokens", "bleu")

    def log(run_dir):  # everything before the end-of-run report, minus wall-clock fields
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        end = next(i for i, r in enumerate(records) if r["kind"] == "done")
        return [{k: r.get(k) for k in keys} for r in records[:end]]

    assert log(run) == log(ref)
    assert [r["step"] for r in metrics(run)] == list(range(1, steps + 1))


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_and_sigterm_save_a_checkpoint_and_exit_cleanly(tmp_path, sig, status, capsys):
    corpus = make_corpus(tmp_path)
    run = tmp_path / "run"
    proc = _spawn(corpus + TINY + ["--max-steps", 100000, "--save-every", 100000, "--eval-every", 100000,
                                   "--average", 0, "--out", run], run, dict(os.environ, MINITF_DEVICE="cpu"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
            (run / "metrics.jsonl").is_file() and len((run / "metrics.jsonl").read_text().splitlines()) >= 3):
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    err = err.decode()
    assert proc.returncode == status, err[-2000:]
    assert "Traceback" not in err and "stopped at step" in err
    step = int(err.split("stopped at step ")[1].split(";")[0])
    assert step >= 3
    state = ckpt.read_checkpoint(ckpt.checkpoint_path(run, step))
    assert state["meta"]["step"] == step and state["optimizer"] is not None
    assert [r["step"] for r in metrics(run)] == list(range(1, step + 1))
    assert train(["--resume", run, "--max-steps", step + 2, "--no-progress", "--bleu-sentences", 2]) == 0
    assert [r["step"] for r in metrics(run)] == list(range(1, step + 3))


def test_interrupt_before_training_is_one_line_and_status_130(tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(train_module, "Corpus", interrupted)
    code, err = train(make_corpus(tmp_path) + TINY + ["--out", tmp_path / "run"], capsys)
    assert code == 130 and "interrupted" in one_error_line(err)


def test_kill_before_config_json_is_restarted_with_the_same_command(tmp_path, capsys):
    """A run killed before config.json exists has nothing to resume: --resume says so
    in one line; the original command then starts it afresh in the same folder,
    replacing the leftover tokenizer (which may come from other flags)."""
    corpus = make_corpus(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "tokenizer.model").write_bytes(b"left by a killed run with other flags")
    code, err = train(["--resume", run], capsys)
    assert code == 2 and "start it again with the original command" in one_error_line(err)
    assert train(corpus + TINY + QUIET + ["--max-steps", 2, "--out", run]) == 0
    assert (run / "config.json").is_file() and ckpt.checkpoint_path(run, 2).is_dir()


def test_resume_without_checkpoint_starts_at_step_zero_and_resets_metrics(tmp_path, capsys):
    corpus = make_corpus(tmp_path)
    run, ref = tmp_path / "run", tmp_path / "ref"
    argv = corpus + TINY + QUIET + ["--max-steps", 3, "--save-every", 100]
    assert train(argv + ["--out", ref]) == 0
    assert train(argv + ["--out", run]) == 0
    shutil.rmtree(run / "checkpoints")
    (run / "best.json").unlink()
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"kind": "train", "step": 4, "lo')  # a line torn by a kill
    code, err = train(["--resume", run, "--no-progress"], capsys)
    assert code == 0 and any("starting from step 0" in line for line in err)
    assert [(r["step"], r["loss"]) for r in metrics(run)] == [(r["step"], r["loss"]) for r in metrics(ref)]
    assert same_params(params_of(ckpt.checkpoint_path(run, 3)), params_of(ckpt.checkpoint_path(ref, 3)))


def test_metrics_are_cut_back_to_the_checkpoint_step(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (1, 2, 3):
        log.write(kind="train", step=step, loss=1.0)
    log.write(kind="valid", step=3, loss=2.0)
    log.write(kind="done", step=3)
    log.write(kind="valid", step=3, loss=2.5)  # end-of-run report
    assert log.truncate(3) == 2 and [json.loads(x)["kind"] for x in log.path.read_text().splitlines()] == \
        ["train", "train", "train", "valid"]
    assert log.truncate(2) == 2 and len(log.path.read_text().splitlines()) == 2
    with open(log.path, "a") as handle:
        handle.write('{"kind": "train", "step": 2, "loss": 1.0}')  # complete but unterminated: a kill before "\n"
    assert log.truncate(2) == 0 and log.path.read_text().endswith("}\n")
    log.write(kind="train", step=3, loss=1.0)
    assert [json.loads(x)["step"] for x in log.path.read_text().splitlines()] == [1, 2, 2, 3]


def test_interrupted_checkpoint_rewrite_and_temp_folders_are_recovered(tmp_path):
    """A kill between 'move the old step-N aside' and 'rename the new one in' leaves
    .step-N.old: recovery puts it back; temp and half-deleted folders are removed."""
    folder = tmp_path / "checkpoints"
    params = {"w": np.arange(4, dtype=np.float32)}
    ckpt.write_checkpoint(folder / "step-00000004", params, {"config": {}, "step": 4}, b"tok")
    os.rename(folder / "step-00000004", folder / ".step-00000004.old")
    (folder / ".step-00000005.tmp-abc").mkdir()
    (folder / ".step-00000001.deleting").mkdir()
    removed = ckpt.recover_checkpoints(tmp_path)
    assert sorted(p.name for p in removed) == [".step-00000001.deleting", ".step-00000005.tmp-abc"]
    assert [p.name for p in folder.iterdir()] == ["step-00000004"]
    assert np.array_equal(ckpt.read_checkpoint(folder / "step-00000004")["params"]["w"], params["w"])


def test_resume_refuses_fixed_flags_and_keeps_changed_lengths(world, tmp_path, capsys):
    run = copy_run(world["ref"], tmp_path / "run")
    code, err = train(["--resume", run, "--d-model", 32, "--seed", 9], capsys)
    assert code == 2 and "--d-model, --seed cannot be given" in one_error_line(err)
    code, err = train(["--resume", run, "--max-steps", 8, "--lr-scale", 1.5, "--no-progress", "--bleu-sentences", 2],
                      capsys)
    assert code == 0 and any("warning: changed --lr-scale to 1.5" in line for line in err)
    config = json.loads((run / "config.json").read_text())
    assert config["max_steps"] == 8 and config["lr_scale"] == 1.5
    assert [r["step"] for r in metrics(run)] == list(range(1, 9))


# --------------------------------------------------------------------------- 2. checkpoint integrity
class Payload:
    """Unpickling this creates ``marker``: proof that code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def _truncate(path):
    data = (path / "model.npz").read_bytes()
    (path / "model.npz").write_bytes(data[:len(data) // 2])


def _flip_byte(path):
    data = bytearray((path / "optimizer.npz").read_bytes())
    data[len(data) // 2] ^= 0x01
    (path / "optimizer.npz").write_bytes(bytes(data))


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


DAMAGE = {
    "truncated file": (lambda path, world: _truncate(path), "checksum"),
    "corrupted byte": (lambda path, world: _flip_byte(path), "checksum"),
    "missing file": (lambda path, world: (path / "optimizer.npz").unlink(), "missing optimizer.npz"),
    "missing meta.json": (lambda path, world: (path / "meta.json").unlink(), "no meta.json"),
    "other vocabulary size": (_transplant("vocab48"), "another tokenizer"),
    "other d_model": (_transplant("dmodel32"), "d_model 32 (run: 16)"),
    "other tokenizer": (_transplant("othertok"), "another tokenizer"),
    "pickled array": (_pickle, "pickle"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_resume_skips_a_bad_latest_checkpoint_and_continues_exactly(world, tmp_path, case, capsys):
    """The newest checkpoint is damaged or does not fit: --resume warns in one line,
    moves it aside, continues from the one before, and ends where an uninterrupted
    run ends, bit for bit."""
    damage, reason = DAMAGE[case]
    run = copy_run(world["ref"], tmp_path / "run")
    shutil.rmtree(ckpt.checkpoint_path(run, 6))  # killed after saving step 4
    damage(ckpt.checkpoint_path(run, 4), world)
    marker = world["base"] / "PWNED"
    code, err = train(["--resume", run, "--no-progress", "--bleu-sentences", 2], capsys)
    assert_resumed_past_bad_step_4(run, world["ref"], code, err, reason)
    assert not marker.exists()


def test_resume_with_no_usable_checkpoint_refuses_and_changes_nothing(world, tmp_path, capsys):
    run = copy_run(world["ref"], tmp_path / "run")
    for step in (2, 4, 6):
        _truncate(ckpt.checkpoint_path(run, step))
    before = snapshot(run)
    code, err = train(["--resume", run, "--max-steps", 9, "--lr-scale", 0.5], capsys)
    line = one_error_line(err)
    assert code == 1 and "none of its 3 checkpoints is usable" in line and "checksum" in line
    assert snapshot(run) == before


def test_loading_never_runs_code(world, tmp_path, capsys):
    """A crafted pickle inside a checkpoint (model.npz or optimizer.npz) is refused by
    read_checkpoint and by translate, and its __reduce__ side effect never happens,
    although the same payload does run when unpickled directly (the control)."""
    marker = tmp_path / "PWNED"
    pickle.loads(pickle.dumps(Payload(marker)))  # control: the payload works
    assert marker.exists()
    marker.unlink()
    for target in ("model.npz", "optimizer.npz"):
        folder = tmp_path / target / "step-00000004"
        shutil.copytree(ckpt.checkpoint_path(world["ref"], 4), folder)
        state = ckpt.read_checkpoint(folder)
        params, optimizer = dict(state["params"]), dict(state["optimizer"])
        (params if target == "model.npz" else optimizer)["m" if target == "optimizer.npz" else sorted(params)[0]] = \
            np.array([Payload(marker)], dtype=object)
        meta = {k: v for k, v in state["meta"].items() if k not in ("sha256", "format_version")}
        shutil.rmtree(folder)
        ckpt.write_checkpoint(folder, params, meta, state["tokenizer_bytes"], optimizer)
        assert not marker.exists()  # writing pickles, it does not unpickle
        with pytest.raises(ckpt.CheckpointError, match="pickle"):
            ckpt.read_checkpoint(folder)
        if target == "model.npz":
            code, err, _ = translate(["--checkpoint", folder, "--src", world["corpus"][1]], capsys)
            assert code == 1 and "pickle" in one_error_line(err, "minitf.translate")
        assert not marker.exists()


def test_translate_with_a_run_folder_skips_a_damaged_checkpoint_with_a_warning(world, tmp_path, capsys):
    run = copy_run(world["ref"], tmp_path / "run")
    _truncate(ckpt.checkpoint_path(run, 6))
    src = world["corpus"][world["corpus"].index("--test-src") + 1]
    code, err, out = translate(["--checkpoint", run, "--beam", 1, "--src", src], capsys)
    assert code == 0, err
    assert len(err) == 1 and err[0].startswith("warning: skipping a bad checkpoint") and "step-00000004" in err[0]
    assert len(out.splitlines()) == len(pathlib.Path(src).read_text().splitlines())


def test_best_json_is_relative_so_a_run_folder_can_move(world, tmp_path, capsys, monkeypatch):
    moved = tmp_path / "moved"
    shutil.copytree(world["ref"], moved)
    assert json.loads((moved / "best.json").read_text())["checkpoint"] == "checkpoints/step-00000006"
    code, err, out = translate(["--checkpoint", moved, "--beam", 1], capsys, b"Der hund.\n", monkeypatch, tmp_path)
    assert code == 0 and err == [] and len(out.splitlines()) == 1


# --------------------------------------------------------------------------- 3. numerical safety
def _model(dropout=0.1):
    backend.manual_seed(0)
    return Transformer(20, 20, d_model=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=2, d_ff=32,
                       dropout=dropout, pad_id=0)


EDGE_BATCHES = {  # (src, tgt_in, tgt_out)
    "target row all pad": ([[5, 6, 7], [8, 9, 0]], [[2, 4, 5], [0, 0, 0]], [[4, 5, 3], [0, 0, 0]]),
    "source row all pad": ([[5, 6, 7], [0, 0, 0]], [[2, 4, 5], [2, 6, 0]], [[4, 5, 3], [6, 3, 0]]),
    "both rows of a pair all pad": ([[5, 6], [0, 0]], [[2, 4], [0, 0]], [[4, 3], [0, 0]]),
    "whole batch pad": ([[0, 0]], [[0, 0]], [[0, 0]]),
    "length 1": ([[5]], [[2]], [[3]]),
    "batch of one": ([[5, 6, 7, 8, 9, 10]], [[2, 4, 5, 6]], [[4, 5, 6, 3]]),
}


@pytest.mark.parametrize("case", sorted(EDGE_BATCHES))
def test_no_nan_or_inf_through_the_whole_model(case):
    model = _model()
    loss_fn = LabelSmoothedCrossEntropy(0.1, ignore_index=0)
    src, tgt_in, tgt_out = (np.array(a, dtype=np.int64) for a in EDGE_BATCHES[case])
    model.zero_grad()
    logits = model(src, tgt_in)
    loss = loss_fn(logits, tgt_out)
    model.backward(loss_fn.backward())
    assert np.isfinite(backend.to_numpy(logits)).all() and np.isfinite(loss)
    grad = backend.to_numpy(FlatBuffers.flatten(model.parameters()).grad)
    assert np.isfinite(grad).all()
    if (tgt_out == 0).all():
        assert loss == 0.0 and not grad.any()  # nothing to learn from: no update
    else:
        assert loss > 0 and grad.any()


def test_all_masked_attention_rows_stay_finite():
    backend.manual_seed(0)
    attention = MultiHeadAttention(16, 2)
    x = backend.asarray(np.random.default_rng(0).normal(size=(2, 3, 16)), dtype=np.float32)
    mask = backend.asarray(np.array([[True, True, True], [False, True, True]]))  # row 0: every key masked
    for causal in (False, True):
        attention.zero_grad()
        y = attention(x, key_padding_mask=mask, causal=causal)
        dx, _ = attention.backward(backend.asarray(np.ones((2, 3, 16), dtype=np.float32)))
        assert np.isfinite(backend.to_numpy(y)).all() and np.isfinite(backend.to_numpy(dx)).all()
        assert all(np.isfinite(backend.to_numpy(p.grad)).all() for p in attention.parameters())


@pytest.mark.parametrize("scale", [1e4, 1e15, 1e30])
def test_loss_of_very_large_logits_is_finite_and_right(scale):
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(2, 3, 11)) * scale).astype(np.float32)
    target = np.array([[3, 4, 0], [5, 0, 0]])
    loss_fn = LabelSmoothedCrossEntropy(0.1, ignore_index=0)
    loss = loss_fn(backend.asarray(logits), backend.asarray(target))
    grad = backend.to_numpy(loss_fn.backward())
    assert np.isfinite(loss) and np.isfinite(grad).all()
    z = logits.astype(np.float64)  # float64 reference
    log_p = z - z.max(-1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
    keep = target != 0
    per = 0.9 * -np.take_along_axis(log_p, target[..., None], -1)[..., 0] + 0.1 * -log_p.mean(-1)
    assert loss == pytest.approx((per * keep).sum() / keep.sum(), rel=1e-5)


def _inject(monkeypatch, at_step, what):
    """Make step ``at_step`` non-finite (a NaN parameter, or an inf gradient), and
    record Adam's moments and the parameters around that step."""
    original = trainer_module.Trainer.update
    seen = {}

    def update(self, *batch):
        if self.step + 1 != at_step or seen:
            return original(self, *batch)
        before = [backend.to_numpy(a).copy() for a in (self.optimizer.m, self.optimizer.v, self.optimizer.flat.data)]
        count = self.optimizer.step_count
        if what == "nan parameter":
            saved = backend.to_numpy(self.optimizer.flat.data[:5]).copy()
            self.optimizer.flat.data[:5] = np.nan
        else:
            backward = self.model.backward

            def poisoned(dlogits):
                backward(dlogits)
                self.optimizer.flat.grad[3] = np.inf
            self.model.backward = poisoned
        result = original(self, *batch)
        if what == "nan parameter":
            after_data = backend.to_numpy(self.optimizer.flat.data).copy()
            self.optimizer.flat.data[:5] = backend.asarray(saved)
            before[2][:5] = np.nan
        else:
            del self.model.backward
            after_data = backend.to_numpy(self.optimizer.flat.data).copy()
        after = [backend.to_numpy(self.optimizer.m), backend.to_numpy(self.optimizer.v), after_data]
        seen.update(unchanged=all(np.array_equal(a, b, equal_nan=True) for a, b in zip(before, after))
                    and self.optimizer.step_count == count, kind=result.nonfinite)
        return result
    monkeypatch.setattr(trainer_module.Trainer, "update", update)
    return seen


@pytest.mark.parametrize("what, clip", [("nan parameter", 0), ("inf gradient", 0), ("inf gradient", 1)])
def test_nonfinite_step_stops_naming_step_and_last_checkpoint(tmp_path, what, clip, capsys, monkeypatch):
    seen = _inject(monkeypatch, 4, what)
    run = tmp_path / "run"
    code, err = train(make_corpus(tmp_path) + TINY + QUIET + ["--max-steps", 6, "--save-every", 2, "--out", run,
                                                                "--clip-norm", clip], capsys)
    line = one_error_line(err)
    assert code == 1 and "at step 4" in line and "last good checkpoint" in line and "step-00000002" in line
    assert ("loss became nan" if what == "nan parameter" else "gradients became non-finite") in line
    assert seen == {"unchanged": True, "kind": "loss" if what == "nan parameter" else "gradients"}
    assert [r["step"] for r in metrics(run)] == [1, 2, 3]
    state = ckpt.read_checkpoint(ckpt.checkpoint_path(run, 2))
    assert all(np.isfinite(a).all() for a in state["params"].values())


@pytest.mark.parametrize("what", ["nan parameter", "inf gradient"])
def test_skip_nonfinite_skips_and_counts_without_touching_adam(tmp_path, what, capsys, monkeypatch):
    seen = _inject(monkeypatch, 3, what)
    run = tmp_path / "run"
    code, err = train(make_corpus(tmp_path) + TINY + QUIET + ["--max-steps", 5, "--save-every", 5,
                                                                "--skip-nonfinite", "--out", run], capsys)
    assert code == 0, err
    assert seen["unchanged"], "a skipped step changed Adam's moments or the parameters"
    assert sum("skipped this batch (1 skipped so far)" in line for line in err) == 1
    state = ckpt.read_checkpoint(ckpt.checkpoint_path(run, 5))
    assert state["meta"]["skipped_nonfinite"] == 1
    assert all(np.isfinite(a).all() for a in state["params"].values())
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5]


def test_diverging_run_cli_exits_1_with_one_line(tmp_path):
    """A real divergence (--lr-scale 1e30) through the real CLI."""
    corpus = make_corpus(tmp_path)
    run = tmp_path / "run"
    result = subprocess.run([sys.executable, "train.py", *corpus, *TINY, *QUIET, "--max-steps", "50",
                             "--save-every", "1", "--lr-scale", "1e30", "--out", str(run)],
                            cwd=ROOT, capture_output=True, timeout=120)
    err = result.stderr.decode().strip().splitlines()
    line = one_error_line(err)
    assert result.returncode == 1 and line == err[-1]
    assert not any("Warning" in other for other in err), err  # no numpy overflow warnings on top
    assert re.search(r"loss became (nan|inf|-inf) at step|gradients became non-finite|parameters are not finite",
                     line), line
    assert "last good checkpoint" in line and "at step" in line
    good = line.split("last good checkpoint: ")[1].split(";")[0]
    if good != "none yet":
        assert all(np.isfinite(a).all() for a in ckpt.read_checkpoint(good)["params"].values())


# --------------------------------------------------------------------------- 4. bad input
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


# name: (argv from (world, tmp_path, checkpoint copy), stdin bytes or None, expected words in the error line)
BAD_TRANSLATE_INPUTS = {
    "checkpoint with a missing file": (lambda w, d, c: (c / "model.npz").unlink() or ["--checkpoint", c], None,
                                       "missing model.npz"),
    "checkpoint with a truncated file": (lambda w, d, c: _truncate(c) or ["--checkpoint", c], None, "checksum"),
    "checkpoint with a corrupted byte": (lambda w, d, c: _flip_byte(c) or ["--checkpoint", c], None, "checksum"),
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
    "100000-character line on stdin": (lambda w, d, c: ["--checkpoint", c], b"a" * 100_000 + b"\n",
                                       "100000 characters"),
    "100000-character line in --src": (lambda w, d, c: ["--checkpoint", c, "--src", _file(d, "a" * 100_000)], None,
                                       "100000 characters"),
    "--src is a directory": (lambda w, d, c: ["--checkpoint", c, "--src", d], None, "is a directory"),
    "--src empty": (lambda w, d, c: ["--checkpoint", c, "--src", _file(d, "")], None, "is empty"),
    "--src only empty lines": (lambda w, d, c: ["--checkpoint", c, "--src", _file(d, "\n \n\n")], None,
                               "only empty lines"),
    "--ref line-count mismatch": (lambda w, d, c: ["--checkpoint", c, "--src", _file(d, "Der hund.\nEin haus.\n"),
                                                   "--ref", _file(d, "The dog.\n", "ref")], None, "must match"),
    "zero beam size": (lambda w, d, c: ["--checkpoint", c, "--beam", "0"], b"Der hund.\n", "positive int"),
    "negative batch size": (lambda w, d, c: ["--checkpoint", c, "--batch-size", "-3"], b"Der hund.\n",
                            "positive int"),
}


def _file(folder, text, name="src", suffix=".txt"):
    path = folder / f"{name}{suffix}"
    path.write_text(text + ("\n" if text else ""), encoding="utf-8")
    return path


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


def test_unwritable_output_folder(world, tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("running as root: chmod 0o500 does not stop root from writing; the 'below a regular file' "
                    "case of BAD_TRAIN_INPUTS covers an --out that cannot be created")
    parent = tmp_path / "ro"
    parent.mkdir()
    (parent / "keep.txt").write_text("keep")
    parent.chmod(0o500)
    try:
        code, err = train(world["corpus"] + TINY + ["--out", parent / "run"], capsys)
    finally:
        parent.chmod(0o700)
    assert code == 2 and "cannot write" in one_error_line(err)
    assert sorted(p.name for p in parent.iterdir()) == ["keep.txt"]


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


# --------------------------------------------------------------------------- 5. determinism
def test_same_seed_same_losses_and_parameters_on_the_cpu(tmp_path):
    corpus = make_corpus(tmp_path)
    argv = corpus + TINY + QUIET + ["--max-steps", 5, "--save-every", 5, "--dropout", "0.3"]
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        assert train(argv + ["--seed", seed, "--out", tmp_path / name]) == 0
    losses = {name: [r["loss"] for r in metrics(tmp_path / name)] for name in "abc"}
    assert losses["a"] == losses["b"] and losses["a"] != losses["c"]
    params = {name: params_of(ckpt.checkpoint_path(tmp_path / name, 5)) for name in "abc"}
    assert same_params(params["a"], params["b"]) and not same_params(params["a"], params["c"])


# --------------------------------------------------------------------------- 6. disk full, out of memory
def _fail_on_second_file(monkeypatch, step):
    """open() inside minitf.nmt.checkpoint fails with ENOSPC on the second file written
    into the temporary folder of the checkpoint of ``step``."""
    import builtins
    calls = []

    def fake_open(path, mode="r", *args, **kwargs):
        if "w" in mode and f".step-{step:08d}.tmp-" in str(path):
            calls.append(path)
            if len(calls) == 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return builtins.open(path, mode, *args, **kwargs)
    monkeypatch.setattr(ckpt, "open", fake_open, raising=False)
    return calls


def _fail_on_rename(monkeypatch, step):
    real = os.rename

    def fake_rename(src, dst, *args, **kwargs):
        if f".step-{step:08d}.tmp-" in str(src):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(src))
        return real(src, dst, *args, **kwargs)
    monkeypatch.setattr(ckpt.os, "rename", fake_rename)


@pytest.mark.parametrize("failure", ["ENOSPC on the second file", "EIO on the final rename"])
def test_failed_checkpoint_write_keeps_the_previous_one(world, tmp_path, failure, capsys, monkeypatch):
    (_fail_on_second_file if failure.startswith("ENOSPC") else _fail_on_rename)(monkeypatch, 4)
    run = tmp_path / "run"
    argv = world["corpus"] + world["common"] + ["--out", run]
    code, err = train(argv, capsys)
    line = one_error_line(err)
    assert code == 1 and "could not write checkpoint" in line and "step-00000004" in line
    assert ("No space left on device" if failure.startswith("ENOSPC") else "Input/output error") in line
    assert "last good checkpoint" in line and "step-00000002" in line
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-00000002"]  # no temp folder left
    ckpt.read_checkpoint(ckpt.checkpoint_path(run, 2))
    monkeypatch.undo()  # disk freed: the run resumes and ends where an uninterrupted one does
    assert train(["--resume", run, "--no-progress", "--bleu-sentences", 2]) == 0
    assert same_params(params_of(ckpt.checkpoint_path(run, 6)), params_of(ckpt.checkpoint_path(world["ref"], 6)))


def test_out_of_memory_batch_suggests_a_smaller_max_tokens(world, tmp_path, capsys, monkeypatch):
    original = trainer_module.Trainer.update

    def update(self, *batch):
        if self.step + 1 == 3:
            raise MemoryError("Out of memory allocating 1,000,000,000 bytes")
        return original(self, *batch)
    monkeypatch.setattr(trainer_module.Trainer, "update", update)
    run = tmp_path / "run"
    code, err = train(world["corpus"] + world["common"] + ["--out", run], capsys)
    line = one_error_line(err)
    assert code == 1 and "out of memory at step 3" in line and "smaller --max-tokens (this run: 120)" in line
    assert f"--resume {run} --max-tokens 60" in line and "step-00000002" in line
    monkeypatch.undo()
    code, err = train(["--resume", run, "--max-tokens", 60, "--no-progress", "--bleu-sentences", 2], capsys)
    assert code == 0 and any("changed --max-tokens to 60" in line for line in err)
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]
