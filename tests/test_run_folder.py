"""The run folder: one train.py per folder (an flock held until exit), a new run never
overwrites an old one, an --out that cannot be written is refused, and a full disk
while writing a checkpoint or metrics.jsonl leaves the folder resumable."""
import builtins
import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from minitf.training import checkpoint as ckpt, files, trainer as trainer_module
from minitf.training.trainer import MetricsLog
from tests.runs import (CPU_ENV, QUIET, ROOT, TINY, copy_run, make_corpus, metrics, one_error_line, params_of,
                        same_params, snapshot, train)


def holder(folder):
    """A separate process that takes ``folder``'s run lock and waits."""
    code = ("import sys, time; from minitf.training import files; files.lock_run_folder(sys.argv[1]); "
            "print('locked', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], cwd=ROOT, env=CPU_ENV, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"locked"
    return proc


def _logged(run, n):
    try:
        return len(metrics(run)) >= n
    except (OSError, ValueError):  # not there yet, or a line being written
        return False


# --------------------------------------------------------------------------- one process per run folder
def test_a_locked_run_folder_refuses_resume_and_a_second_new_run(world, tmp_path, capsys):
    """While another process holds the folder, --resume and a new run on the same
    --out are refused with one line naming its PID and change nothing; after the
    holder is SIGKILLed the kernel has released the lock (no stale lock)."""
    run = copy_run(world["ref"], tmp_path / "run")
    proc = holder(run)
    try:
        before = snapshot(run)
        code, err = train(["--resume", run, "--max-steps", 8, "--no-progress"], capsys)
        line = one_error_line(err)
        assert code == 1 and f"process {proc.pid}" in line and "in use by another train.py" in line
        assert snapshot(run) == before
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        other = holder(fresh)  # the race of two new runs: the second one never writes
        try:
            code, err = train(world["corpus"] + TINY + QUIET + ["--max-steps", 2, "--out", fresh], capsys)
            assert code == 1 and f"process {other.pid}" in one_error_line(err)
            assert sorted(p.name for p in fresh.iterdir()) == [files.LOCK_NAME]
        finally:
            other.kill()
            other.wait()
    finally:
        proc.kill()
        proc.wait()
    code, err = train(["--resume", run, "--max-steps", 8, "--no-progress", "--bleu-sentences", 2], capsys)
    assert code == 0, err
    assert [r["step"] for r in metrics(run)] == list(range(1, 9))
    assert not (run / files.LOCK_NAME).exists()  # released and removed at the end


def test_the_lock_is_held_while_train_py_runs(tmp_path):
    """Through the real CLI: a training train.py holds the lock (a second --resume is
    refused naming it) and a SIGTERMed one leaves a folder the next --resume takes."""
    corpus = make_corpus(tmp_path)
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "train.py", *corpus, *TINY, "--max-steps", "100000", "--save-every",
                             "100000", "--eval-every", "100000", "--average", "0", "--out", str(run)],
                            cwd=ROOT, env=CPU_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _logged(run, 2):
        time.sleep(0.05)
    second = subprocess.run([sys.executable, "train.py", "--resume", str(run), "--no-progress"], cwd=ROOT,
                            env=CPU_ENV, capture_output=True, timeout=60)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    lines = second.stderr.decode().strip().splitlines()
    assert second.returncode == 1 and len(lines) == 1 and f"process {proc.pid}" in lines[0], lines
    assert proc.returncode == 143, err.decode()[-2000:]
    steps = [r["step"] for r in metrics(run)]
    assert steps == list(range(1, len(steps) + 1))  # one writer: no steps going backwards


# --------------------------------------------------------------------------- --out
def test_existing_run_is_not_overwritten(world, tmp_path, capsys):
    run = copy_run(world["ref"], tmp_path / "run")
    before = snapshot(run)
    code, err = train(world["corpus"] + TINY + ["--max-steps", "2", "--out", run], capsys)
    assert code == 2 and "already holds a run" in one_error_line(err)
    assert snapshot(run) == before


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


# --------------------------------------------------------------------------- disk full
def _fail_on_second_file(monkeypatch, step):
    """open() inside minitf.training.checkpoint fails with ENOSPC on the second file written
    into the temporary folder of the checkpoint of ``step``."""
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
    line = one_error_line(err, lines=3)
    assert code == 1 and "could not write checkpoint" in line and "step-00000004" in line
    assert ("No space left on device" if failure.startswith("ENOSPC") else "Input/output error") in line
    assert "last good checkpoint" in line and "step-00000002" in line
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-00000002"]  # no temp folder left
    ckpt.read_checkpoint(ckpt.checkpoint_path(run, 2))
    monkeypatch.undo()  # disk freed: the run resumes and ends where an uninterrupted one does
    assert train(["--resume", run, "--no-progress", "--bleu-sentences", 2]) == 0
    assert same_params(params_of(ckpt.checkpoint_path(run, 6)), params_of(ckpt.checkpoint_path(world["ref"], 6)))


def test_disk_full_while_appending_metrics_saves_names_and_resumes_exactly(world, tmp_path, capsys, monkeypatch):
    """metrics.jsonl refuses the record of step 5 (ENOSPC): one line naming the file
    and the checkpoint saved at step 5 (which carries the unwritten record), no torn
    line, no temp file; after the disk is freed, --resume ends exactly where an
    uninterrupted run ends, metrics included."""
    run = tmp_path / "run"

    def full_disk(path, mode="r", *args, **kwargs):
        handle = builtins.open(path, mode, *args, **kwargs)
        if "a" in mode and len(metrics(run)) == 4:
            handle.close()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return handle
    monkeypatch.setattr(trainer_module, "open", full_disk, raising=False)
    code, err = train(world["corpus"] + world["common"] + ["--out", run], capsys)
    line = one_error_line(err, lines=3)
    assert code == 1 and f"could not append to {run / 'metrics.jsonl'}: No space left on device" in line
    assert "saved checkpoint" in line and "step-00000005" in line and "--resume" in line
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]
    assert not [p for p in run.rglob("*") if p.name.startswith(".")]  # no temp file or folder
    monkeypatch.undo()
    assert train(["--resume", run, "--no-progress", "--bleu-sentences", 2]) == 0
    assert same_params(params_of(ckpt.checkpoint_path(run, 6)), params_of(ckpt.checkpoint_path(world["ref"], 6)))
    assert [(r["step"], r["loss"]) for r in metrics(run)] == [(r["step"], r["loss"]) for r in metrics(world["ref"])]


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


def test_a_metrics_path_that_is_not_a_file_is_refused_before_any_step(world, tmp_path, capsys):
    """metrics.jsonl replaced by a folder: --resume refuses in one line naming what it is, trains
    no step and writes no checkpoint (it used to train a step, save, and advise freeing disk space)."""
    run = copy_run(world["ref"], tmp_path / "run")
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").mkdir()
    before = snapshot(run / "checkpoints")
    code, err = train(["--resume", run, "--max-steps", 8, "--no-progress"], capsys)
    line = one_error_line(err, lines=2)
    assert code == 1 and "metrics.jsonl is a folder" in line and "move it away" in line, err
    assert "disk space" not in line
    assert snapshot(run / "checkpoints") == before


def test_the_lock_refuses_a_held_folder_in_process_and_release_frees_it(tmp_path):
    """The run-folder lock without a second process (mutation testing found it checked only through children):
    a folder whose train.lock another open file holds (flock, as another train.py would) is refused with the
    holder's PID; a free one is locked once (locking it again is a no-op) and written with our PID; release
    deletes train.lock and frees the flock, so that another holder can take it."""
    import fcntl
    from minitf.training.errors import RunFolderBusy
    run = tmp_path / "run"
    run.mkdir()
    other = os.open(run / files.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(other, b"4242\n")
        with pytest.raises(RunFolderBusy, match=r"in use by another train.py \(process 4242, lock .*kill -TERM 4242"):
            files.lock_run_folder(run)
    finally:
        os.close(other)  # the other holder ends
    path = files.lock_run_folder(run)
    probe = os.open(path, os.O_RDWR)  # the same lock file, as a waiting train.py would hold it
    try:
        assert path == run / files.LOCK_NAME and files.holder_pid(path) == os.getpid()
        assert files.lock_run_folder(run) == path  # this process holds it already
        with pytest.raises(OSError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        files.release(run)
        assert not path.exists()
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released: the flock is free again
    finally:
        os.close(probe)
        files.release(run)
