"""Interrupting and resuming a run: a kill, a signal or a bad checkpoint costs at most
the steps since the last good checkpoint, and ``--resume`` then ends where an
uninterrupted run ends, bit for bit on the CPU (parameters, Adam's moments, metrics),
with BPE-dropout, after changed flags, and across world sizes. (fp16 resume:
tests/test_precision.py.)"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc

import pytest

from minitf.nmt import task as translation_task
from minitf.training import checkpoint as ckpt, trainer as trainer_module
from minitf.training.checkpoint import load_model
from minitf.backend import host as np
from tests.runs import (BAD_CHECKPOINTS, CPU_ENV, MPI_ENV, QUIET, ROOT, TINY, copy_run, final_params, make_corpus,
                        metrics, needs_mpi, one_error_line, params_of, same_params, snapshot, train, train_py,
                        translate, truncate_model)


def _spawn(argv, env=CPU_ENV):
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


def _losses(run):
    return [(r["step"], r["loss"]) for r in metrics(run)]


def _records(run):
    """Every record of metrics.jsonl, without its wall-clock fields."""
    return [{k: v for k, v in json.loads(line).items() if k not in ("elapsed", "tokens_per_s", "train_minutes")}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def _same_checkpoints(a, b):
    """Parameters and Adam's moments equal, bit for bit."""
    a, b = ckpt.read_checkpoint(a), ckpt.read_checkpoint(b)
    return same_params(a["params"], b["params"]) and same_params(a["optimizer"], b["optimizer"])


# --------------------------------------------------------------------------- kills and signals
def test_sigkill_at_random_moments_then_resume_equals_an_uninterrupted_run(tmp_path):
    """SIGKILL train.py at seeded-random moments (before config.json exists, during
    training, while a checkpoint is being written), resume each time; the final
    parameters, Adam's moments and the metrics equal those of a run never killed."""
    corpus = make_corpus(tmp_path)
    steps = 14
    argv = corpus + TINY + ["--max-steps", steps, "--save-every", 1, "--keep", 3, "--eval-every", 5,
                            "--bleu-sentences", 2, "--average", 0]
    ref = tmp_path / "ref"
    done = subprocess.run([sys.executable, "train.py", *map(str, argv), "--out", str(ref)], cwd=ROOT, env=CPU_ENV,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]

    run = tmp_path / "killed"
    slow = dict(CPU_ENV, MINITF_TEST_SLOW_CHECKPOINT="0.08")  # ~0.25 s per checkpoint: most kills land mid-write
    rng = random.Random(20240611)
    seen = {"before config.json": 0, "mid-checkpoint": 0, "resumed, then killed while training": 0}
    for attempt in range(30):  # 5 to 7 on an idle machine; the rest is a loaded machine's margin
        if attempt >= 5 and all(seen.values()):
            break
        missed = [kind for kind, count in seen.items() if not count] if attempt >= 6 else []
        resume = (run / "config.json").is_file()
        trained = _steps_logged(run) if resume else 0
        proc = _spawn(["--resume", run, "--no-progress"] if resume else argv + ["--out", run], slow)
        if attempt == 0:
            time.sleep(rng.uniform(0.0, 0.05))  # before config.json: Python is still starting
        elif "mid-checkpoint" in missed:  # the random moments missed every save (a loaded machine): aim at one
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline and not any(
                    ".tmp-" in name for name in _leftovers(run)):
                time.sleep(0.005)
        elif attempt % 2 and "resumed, then killed while training" not in missed:
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

    final = subprocess.run([sys.executable, "train.py", "--resume", str(run), "--no-progress"], cwd=ROOT,
                           env=CPU_ENV, capture_output=True, timeout=120)
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
                                   "--average", 0, "--out", run])
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
    monkeypatch.setattr(translation_task, "Corpus", interrupted)
    code, err = train(make_corpus(tmp_path) + TINY + ["--out", tmp_path / "run"], capsys)
    assert code == 130 and "interrupted" in one_error_line(err, lines=2)


def test_sigterm_during_the_end_of_run_evaluation_stops_cleanly(world, tmp_path, capsys, monkeypatch):
    """SIGTERM arrives while the last checkpoints are averaged and evaluated: the
    process says so in one line and exits 143; best.json names the last checkpoint;
    nothing half-written remains; --resume redoes the evaluation."""
    real = trainer_module.ckpt.average_checkpoints

    def average_then_sigterm(*args, **kwargs):
        result = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return result
    monkeypatch.setattr(trainer_module.ckpt, "average_checkpoints", average_then_sigterm)
    run = tmp_path / "run"
    argv = world["corpus"] + TINY + ["--max-steps", 4, "--save-every", 2, "--eval-every", 1000, "--average", 2,
                                     "--out", run]
    code, err = train(argv, capsys)
    assert code == 143 and any("SIGTERM during the end-of-run evaluation: stopped it" in line for line in err), err
    assert not any("error" in line.lower() for line in err), err
    assert json.loads((run / "best.json").read_text())["checkpoint"] == "checkpoints/step-00000004"
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    monkeypatch.undo()
    code, err = train(["--resume", run, "--no-progress"], capsys)
    assert code == 0 and any("test BLEU" in line for line in err), err


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


# --------------------------------------------------------------------------- which checkpoint --resume uses
@pytest.mark.parametrize("case", ["none"] + sorted(BAD_CHECKPOINTS))
def test_resume_uses_the_newest_good_checkpoint_and_ends_like_an_uninterrupted_run(world, tmp_path, case, capsys):
    """A run killed after saving step 4 resumes from it and ends where an uninterrupted
    run ends, bit for bit: parameters, Adam's moments and every metrics record (wall-clock
    fields apart: train records, the end-of-run report). If that checkpoint is
    damaged, does not fit, or was crafted (checksums recomputed) to declare a huge
    array, hold another dtype or NaN/inf/negative moments, --resume warns in one line,
    sets it aside as step-4.bad, continues from step 2 and ends the same; the whole
    resumed run allocates under 64 MiB (tracemalloc), never what a header declares."""
    run = copy_run(world["ref"], tmp_path / "run")
    shutil.rmtree(ckpt.checkpoint_path(run, 6))  # killed after saving step 4
    if case != "none":
        damage, reason = BAD_CHECKPOINTS[case]
        damage(ckpt.checkpoint_path(run, 4), world)
    tracemalloc.start()
    try:
        code, err = train(["--resume", run, "--no-progress", "--bleu-sentences", 2], capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 0, err
    warnings = [line for line in err if line.startswith("warning: skipping a bad checkpoint")]
    if case == "none":
        assert not warnings and any("resumed from" in line and "step-00000004" in line for line in err), err
    else:
        assert len(warnings) == 1 and reason in warnings[0] and "step-00000004" in warnings[0], err
        assert any("resumed from" in line and "step-00000002" in line for line in err), err
        assert (run / "checkpoints" / "step-00000004.bad").is_dir()
    assert _same_checkpoints(ckpt.checkpoint_path(run, 6), ckpt.checkpoint_path(world["ref"], 6))
    assert _records(run) == _records(world["ref"])
    assert peak < 64 * 2 ** 20, f"peak {peak / 2 ** 20:.0f} MiB"
    assert not (world["base"] / "PWNED").exists()  # the pickled payload never ran


def test_resume_with_no_usable_checkpoint_refuses_and_changes_nothing(world, tmp_path, capsys):
    run = copy_run(world["ref"], tmp_path / "run")
    for step in (2, 4, 6):
        truncate_model(ckpt.checkpoint_path(run, step))
    before = snapshot(run)
    code, err = train(["--resume", run, "--max-steps", 9, "--lr-scale", 0.5], capsys)
    line = one_error_line(err)
    assert code == 1 and "none of its 3 checkpoints is usable" in line and "checksum" in line
    assert snapshot(run) == before


def test_resume_refuses_when_checkpoints_is_a_file_and_changes_nothing(world, tmp_path, capsys):
    run = copy_run(world["ref"], tmp_path / "run")
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").write_text("not a folder")
    before = snapshot(run)
    code, err = train(["--resume", run, "--max-steps", 9], capsys)
    line = one_error_line(err)
    assert code == 2 and "checkpoints is not a folder" in line
    assert snapshot(run) == before and len(metrics(run)) == 6


def test_resume_without_checkpoint_starts_at_step_zero_and_resets_metrics(world, tmp_path, capsys):
    run = copy_run(world["ref"], tmp_path / "run")
    shutil.rmtree(run / "checkpoints")
    with open(run / "metrics.jsonl", "a") as handle:
        handle.write('{"kind": "train", "step": 7, "lo')  # a line torn by a kill
    code, err = train(["--resume", run, "--no-progress", "--bleu-sentences", 2], capsys)
    assert code == 0 and any("starting from step 0" in line for line in err)
    assert _losses(run) == _losses(world["ref"])
    assert same_params(params_of(ckpt.checkpoint_path(run, 6)), params_of(ckpt.checkpoint_path(world["ref"], 6)))


# --------------------------------------------------------------------------- flags on --resume
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


def _saved_configs(run):
    """config.json and every checkpoint's meta.json config of a run folder."""
    configs = [json.loads((run / "config.json").read_text())]
    configs += [json.loads((p / "meta.json").read_text())["config"] for p in ckpt.list_checkpoints(run)]
    return configs


def test_resuming_three_times_with_changed_flags_keeps_the_run_whole(world, tmp_path, capsys):
    """Resumed again and again, with flags changed in between, a run never writes a
    value its own config would refuse, and minitf.translate then uses the newest checkpoint."""
    run = copy_run(world["ref"], tmp_path / "run")
    for steps, extra in ((8, []), (10, ["--zero", "1", "--clip-norm", "1"]), (12, ["--max-tokens", "100"])):
        code, err = train(["--resume", run, "--max-steps", str(steps), "--no-progress"] + extra, capsys)
        assert code == 0, err
        assert not any(line.startswith("warning: skipping") for line in err), err
        assert all(c["zero"] in (0, 1) for c in _saved_configs(run))  # never null: every one reads back
    assert [p.name for p in ckpt.list_checkpoints(run)][-1] == "step-00000012"
    warnings = []
    _, _, meta = load_model(run, warn=warnings.append)
    assert meta["step"] == 12 and not warnings, warnings  # translate's choice: the newest, nothing skipped
    code, err, out = translate(["--checkpoint", run, "--beam", "1"], capsys, b"Der hund.\n",
                               pytest.MonkeyPatch(), tmp_path)
    assert code == 0 and out.strip() and not err, err


def test_a_run_written_with_zero_null_is_read_as_zero_0_with_one_note(world, tmp_path, capsys):
    run = copy_run(world["ref"], tmp_path / "run")
    for path in [run / "config.json"] + [p / "meta.json" for p in ckpt.list_checkpoints(run)]:
        meta = json.loads(path.read_text())
        (meta if path.name == "config.json" else meta["config"])["zero"] = None  # what an older --resume wrote
        path.write_text(json.dumps(meta))
    code, err = train(["--resume", run, "--max-steps", "8", "--no-progress"], capsys)
    assert code == 0, err
    assert any('"zero": null' in line and "--zero 0" in line for line in err), err
    assert ckpt.list_checkpoints(run)[-1].name == "step-00000008"


def test_resume_with_bpe_dropout_is_exact(tmp_path, corpus):
    """BPE-dropout re-segments the training split every epoch from (seed, epoch): a run
    resumed before an epoch boundary logs the losses of an uninterrupted one."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = corpus + TINY + ["--eval-every", "100", "--save-every", "7", "--average", "0", "--bpe-dropout", "0.2",
                              "--max-tokens", "400"]
    assert train(common + ["--max-steps", "28", "--out", straight]) == 0
    assert train(common + ["--max-steps", "14", "--out", split]) == 0
    assert train(["--resume", split, "--max-steps", "28", "--no-progress"]) == 0
    a = {r["step"]: r["loss"] for r in metrics(straight)}
    assert a == {r["step"]: r["loss"] for r in metrics(split)} and len(a) == 28
    assert max(r["epoch"] for r in metrics(straight)) >= 2  # an epoch boundary was crossed after the resume


# --------------------------------------------------------------------------- across world sizes
@needs_mpi
def test_resume_across_world_sizes_equals_one_process(tmp_path):
    """float32 through train.py, dropout 0, 8 updates: one process uninterrupted; 2 ranks
    for 4 then 1 process to 8; 1 process for 4 then 2 ranks (--zero 1) to 8. Parameters
    (key biases apart) agree within relative 1e-5: float32 sums in another order."""
    data = make_corpus(tmp_path)
    common = data + TINY + ["--dropout", "0", "--save-every", "4", "--eval-every", "100", "--average", "0",
                            "--bleu-sentences", "0"]
    one = train_py(*common, "--max-steps", "8", "--out", tmp_path / "one")
    assert one.returncode == 0, one.stderr[-2000:]
    a = train_py(*common, "--max-steps", "4", "--out", tmp_path / "a", ranks=2)
    assert a.returncode == 0, a.stderr[-2000:]
    assert "data parallel: 2 ranks" in a.stderr and "rank 1" not in a.stderr.replace("pids", "")
    a2 = train_py("--resume", tmp_path / "a", "--max-steps", "8", "--no-progress")
    assert a2.returncode == 0, a2.stderr[-2000:]
    b = train_py(*common, "--max-steps", "4", "--out", tmp_path / "b")
    b2 = train_py("--resume", tmp_path / "b", "--max-steps", "8", "--zero", "1", "--no-progress", ranks=2)
    assert b.returncode == 0 and b2.returncode == 0, b2.stderr[-2000:]
    step, reference = final_params(tmp_path / "one")
    assert step == 8
    for run in ("a", "b"):
        step, got = final_params(tmp_path / run)
        assert step == 8
        assert np.abs(got - reference).max() <= 1e-5 * np.abs(reference).max(), run
    assert [r["step"] for r in metrics(tmp_path / "a")] == list(range(1, 9))  # rank 0 alone wrote


@needs_mpi
def test_resuming_on_two_ranks_then_one_with_and_without_zero(tmp_path):
    """2 ranks, 2 ranks with --zero 1, 1 process, 2 ranks with --zero 1 --accumulate 2:
    no checkpoint is skipped, every saved config reads back, translate uses the newest."""
    run = tmp_path / "run"
    corpus = make_corpus(tmp_path)
    env = dict(MPI_ENV, MINITF_DEVICE="cpu")

    def resumed(args, ranks):
        done = train_py(*args, ranks=ranks, env=env, timeout=180)
        assert done.returncode == 0, done.stderr
        assert "warning: skipping" not in done.stderr, done.stderr

    resumed(corpus + TINY + QUIET + ["--max-steps", "4", "--save-every", "2", "--out", run], 2)
    resumed(["--resume", run, "--max-steps", "6", "--zero", "1"], 2)
    resumed(["--resume", run, "--max-steps", "8"], 1)
    resumed(["--resume", run, "--max-steps", "10", "--zero", "1", "--accumulate", "2"], 2)
    assert all(c["zero"] in (0, 1) for c in _saved_configs(run))
    warnings = []
    _, _, meta = load_model(run, warn=warnings.append)
    assert meta["step"] == 10 and not warnings, warnings
