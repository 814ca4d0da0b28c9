"""Training with train.py on a small corpus the test makes: a run trains, evaluates,
saves and ends with the translate command and examples; the same seed gives the same
run; --max-minutes bounds the whole command; no NaN or inf from edge-case batches, and
a non-finite step stops the run (or is skipped and counted) without touching Adam; an
out-of-memory batch says what to do. No network, no apt."""
import json
import re
import subprocess
import sys
import time

import pytest

from minitf import backend
from minitf.attention import MultiHeadAttention
from minitf.backend import host as np
from minitf.loss import LabelSmoothedCrossEntropy
from minitf.module import FlatBuffers
from minitf.training import checkpoint as ckpt, trainer as trainer_module
from minitf.nmt.translation_trainer import EVERYDAY_GERMAN, TranslationTrainer
from minitf.training.trainer import WallBudget
from minitf.transformer import Transformer
from tests.runs import QUIET, ROOT, TINY, make_corpus, metrics, one_error_line, params_of, same_params, train


def test_training_runs_evaluates_saves_and_ends_with_the_translate_command(tmp_path, corpus, capsys):
    run = tmp_path / "run"
    assert train(corpus + TINY + ["--max-steps", "6", "--eval-every", "3", "--save-every", "3", "--out", run]) == 0
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
    # the end of the run: the command to translate with, and everyday sentences translated
    assert f"python -m minitf.translate --checkpoint {run}" in err
    assert all(f"  {sentence}" in err for sentence in EVERYDAY_GERMAN)
    assert err.count("  ->  ") == len(EVERYDAY_GERMAN)


def test_same_seed_same_losses_and_parameters_on_the_cpu(tmp_path):
    corpus = make_corpus(tmp_path)
    argv = corpus + TINY + QUIET + ["--max-steps", 5, "--save-every", 5, "--dropout", "0.3"]
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        assert train(argv + ["--seed", seed, "--out", tmp_path / name]) == 0
    losses = {name: [r["loss"] for r in metrics(tmp_path / name)] for name in "abc"}
    assert losses["a"] == losses["b"] and losses["a"] != losses["c"]
    params = {name: params_of(ckpt.checkpoint_path(tmp_path / name, 5)) for name in "abc"}
    assert same_params(params["a"], params["b"]) and not same_params(params["a"], params["c"])


def test_pairs_longer_than_max_len_are_skipped_with_a_message(tmp_path, corpus, capsys):
    assert train(corpus + TINY + ["--max-steps", "3", "--max-len", "25", "--eval-every", "100",
                                  "--out", tmp_path / "run"]) == 0
    assert "sentence pairs longer than --max-len 25" in capsys.readouterr().err
    code, err = train(corpus + TINY + ["--max-steps", "3", "--max-len", "1", "--out", tmp_path / "none"], capsys)
    assert code == 1
    assert err[-1] == "train.py: error: every training pair is longer than --max-len 1 tokens; raise --max-len"


# --------------------------------------------------------------------------- --max-minutes: the wall-time budget
STEP, VALIDATION, PER_SENTENCE = 1.0, 2.0, 0.1  # fake seconds


class FakeClock:
    def __init__(self):
        self.t = 5000.0

    def __call__(self):
        return self.t


@pytest.fixture
def fake(monkeypatch):
    """A fake clock that makes every step, validation and decode cost known seconds."""
    clock = FakeClock()
    monkeypatch.setattr(trainer_module, "clock", clock)
    monkeypatch.setattr(trainer_module, "_command_start", None)  # train.py marks the start: not left to later tests
    update = TranslationTrainer.update
    evaluate_loss, translate_shared = TranslationTrainer.evaluate_loss, TranslationTrainer.translate_shared
    steps = []

    def slow_step(self, *args):
        steps.append(self.step)
        assert len(steps) < 1000, "the time budget never ended training"
        clock.t += STEP
        return update(self, *args)

    def slow_loss(*args, **kwargs):
        clock.t += VALIDATION
        return evaluate_loss(*args, **kwargs)

    def slow_decode(self, sources, beam):
        clock.t += PER_SENTENCE * len(sources) * (1 if beam == 1 else 2)
        return translate_shared(self, sources, beam)

    monkeypatch.setattr(TranslationTrainer, "update", slow_step)
    monkeypatch.setattr(TranslationTrainer, "evaluate_loss", slow_loss)
    monkeypatch.setattr(TranslationTrainer, "translate_shared", slow_decode)
    return clock


@pytest.mark.parametrize("minutes", [2.0, 4.0])
def test_the_whole_command_ends_within_max_minutes(tmp_path, corpus, fake, minutes, capsys):
    """Validation, checkpoints and the end-of-run evaluation count, and training stops
    early enough for the end to fit."""
    start = fake.t
    run = tmp_path / "run"
    assert train(corpus + TINY + ["--max-minutes", str(minutes), "--eval-every", "10", "--save-every", "10",
                                  "--bleu-sentences", "4", "--out", run]) == 0
    spent = fake.t - start
    assert spent <= 60 * minutes, f"the command took {spent} fake s of a {60 * minutes} s budget"
    assert spent >= 0.6 * 60 * minutes, f"training stopped too early: {spent} fake s of {60 * minutes}"
    records = metrics(run)
    # the logged elapsed time is wall time since the command started: validations included
    validations = len([r for r in metrics(run, "valid") if "model" not in r and r["step"] < records[-1]["step"]])
    assert records[-1]["elapsed"] == pytest.approx(records[-1]["step"] * STEP
                                                   + validations * (VALIDATION + 4 * PER_SENTENCE))
    err = capsys.readouterr().err
    assert f"wall time (--max-minutes {minutes:g})" in err


def test_eta_is_the_time_left_to_the_end_of_the_command(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(trainer_module, "clock", clock)
    monkeypatch.setattr(trainer_module, "_command_start", None)
    wall = WallBudget(10)
    clock.t += 125
    assert wall.eta() == " ETA 7:55"
    wall.before = 60  # a resumed run: a minute spent by its earlier invocation
    assert wall.eta() == " ETA 6:55" and wall.elapsed() == 185
    assert WallBudget(None).eta() == "" and not WallBudget(None).over(1e9)


def test_the_end_reserve_follows_measured_validations(monkeypatch):
    monkeypatch.setattr(trainer_module, "clock", FakeClock())
    monkeypatch.setattr(trainer_module, "_command_start", None)
    wall = WallBudget(10)
    assert wall.end_reserve(500, 500, test_cost=2.0) == pytest.approx(0.08 * 600 + WallBudget.MARGIN_SECONDS)
    wall.note_validation(20.0, 200)   # 0.1 s per sentence
    expected = 20.0 + 2 * 0.1 * 500 + 0.1 * 500 * 2.0 + WallBudget.MARGIN_SECONDS
    assert wall.end_reserve(500, 500, test_cost=2.0) == pytest.approx(expected)
    assert not wall.over(expected)
    trainer_module.clock.t += 600 - expected
    assert wall.over(expected)


# --------------------------------------------------------------------------- no NaN or inf from edge cases
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


# --------------------------------------------------------------------------- a non-finite step
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
def test_nonfinite_step_stops_naming_step_and_last_checkpoint(world, tmp_path, what, clip, capsys, monkeypatch):
    seen = _inject(monkeypatch, 4, what)
    run = tmp_path / "run"
    code, err = train(world["corpus"] + TINY + QUIET + ["--max-steps", 6, "--save-every", 2, "--out", run,
                                                        "--clip-norm", clip], capsys)
    line = one_error_line(err, lines=3)
    assert code == 1 and "at step 4" in line and "last good checkpoint" in line and "step-00000002" in line
    assert ("loss became nan" if what == "nan parameter" else "gradients became non-finite") in line
    assert seen == {"unchanged": True, "kind": "loss" if what == "nan parameter" else "gradients"}
    assert [r["step"] for r in metrics(run)] == [1, 2, 3]
    state = ckpt.read_checkpoint(ckpt.checkpoint_path(run, 2))
    assert all(np.isfinite(a).all() for a in state["params"].values())


@pytest.mark.parametrize("what", ["nan parameter", "inf gradient"])
def test_skip_nonfinite_skips_and_counts_without_touching_adam(world, tmp_path, what, capsys, monkeypatch):
    seen = _inject(monkeypatch, 3, what)
    run = tmp_path / "run"
    code, err = train(world["corpus"] + TINY + QUIET + ["--max-steps", 5, "--save-every", 5,
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
    line = one_error_line(err, lines=3)
    assert result.returncode == 1 and line == err[-1]
    assert not any("Warning" in other for other in err), err  # no numpy overflow warnings on top
    assert re.search(r"loss became (nan|inf|-inf) at step|gradients became non-finite|parameters are not finite",
                     line), line
    assert "last good checkpoint" in line and "at step" in line
    good = line.split("last good checkpoint: ")[1].split(";")[0]
    if good != "none yet":
        assert all(np.isfinite(a).all() for a in ckpt.read_checkpoint(good)["params"].values())


def test_out_of_memory_batch_suggests_a_smaller_max_tokens(world, tmp_path, capsys, monkeypatch):
    original = trainer_module.Trainer.update

    def update(self, *batch):
        if self.step + 1 == 3:
            raise MemoryError("Out of memory allocating 1,000,000,000 bytes")
        return original(self, *batch)
    monkeypatch.setattr(trainer_module.Trainer, "update", update)
    run = tmp_path / "run"
    code, err = train(world["corpus"] + world["common"] + ["--out", run], capsys)
    line = one_error_line(err, lines=3)
    assert code == 1 and "out of memory at step 3" in line and "smaller --max-tokens (this run: 120)" in line
    assert f"--resume {run} --max-tokens 60" in line and "step-00000002" in line
    monkeypatch.undo()
    code, err = train(["--resume", run, "--max-tokens", 60, "--no-progress", "--bleu-sentences", 2], capsys)
    assert code == 0 and any("changed --max-tokens to 60" in line for line in err)
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]


def test_when_validation_perplexity_turns_up_its_best_checkpoint_is_kept_and_a_candidate(tmp_path, corpus,
                                                                                         monkeypatch):
    """A run whose periodic validation perplexity rises after step 2 (scripted: 10, 20, 30, 40): the step-2
    checkpoint survives --keep 2, and the end of the run weighs it as a third candidate beside the last
    checkpoint and the average; best.json names whichever had the best validation BLEU."""
    scripted = {2: 10.0, 4: 20.0, 6: 30.0, 8: 40.0}
    real = TranslationTrainer.evaluate_loss

    def evaluate_loss(self, split):
        loss, ppl = real(self, split)
        return (loss, scripted[self.step]) if split == "valid" and self.step in scripted and not self._stopping_now \
            else (loss, ppl)
    monkeypatch.setattr(TranslationTrainer, "evaluate_loss", evaluate_loss)
    run = tmp_path / "run"
    assert train(corpus + TINY + ["--max-steps", "8", "--eval-every", "2", "--save-every", "2", "--keep", "2",
                                  "--average", "2", "--bleu-sentences", "4", "--out", run]) == 0
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-00000002", "step-00000006", "step-00000008"]
    candidates = [r["model"] for r in metrics(run, "valid") if "model" in r]
    assert candidates == ["last", "average of last 2", "best validation perplexity"]
    chosen = json.loads((run / "best.json").read_text())
    assert chosen["model"] in candidates and (run / chosen["checkpoint"] / "meta.json").is_file()


@pytest.mark.parametrize("flags, why", [
    (["--keep", "1", "--save-every", "2"], "--keep 1 keeps only the last checkpoint"),
    (["--keep", "5", "--save-every", "100"], "1 of the kept checkpoints is from the run's second half (steps 2 to 4)"),
])
def test_the_end_of_a_run_says_why_it_kept_no_average(tmp_path, corpus, capsys, flags, why):
    run = tmp_path / "run"
    assert train(corpus + TINY + ["--max-steps", "4", "--eval-every", "100", "--average", "5", "--out", run]
                 + flags) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "no average" in line]
    assert len(lines) == 1 and lines[0].startswith("no average of the last 5 checkpoints: ") and why in lines[0], lines
    assert not (run / "checkpoints" / "averaged").exists()


def test_progress_in_a_log_file_is_plain_lines_without_carriage_returns(tmp_path):
    """``python train.py > log 2>&1``: stderr is a file, not a terminal, so no progress bar (tqdm redraws it with
    a carriage return per step: 886 KB of log for the default run) but one plain line at the first step and then
    one every 30 s of training; the run's own lines stay."""
    corpus = make_corpus(tmp_path)
    log = tmp_path / "log"
    flags = [flag for flag in TINY if flag != "--no-progress"]
    started = time.monotonic()
    with open(log, "wb") as out:
        result = subprocess.run([sys.executable, "train.py", *corpus, *flags, "--max-steps", "40", "--eval-every", "20",
                                 "--bleu-sentences", "2", "--average", "0", "--out", str(tmp_path / "run")],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=300)
    wall = time.monotonic() - started
    text = log.read_bytes()
    assert result.returncode == 0, text[-3000:]
    assert b"\r" not in text, text[:500]
    lines = text.decode().splitlines()
    progress = [line for line in lines if line.startswith("progress: step ")]
    assert 1 <= len(progress) <= 1 + wall / trainer_module.PROGRESS_EVERY, progress
    assert progress[0].startswith("progress: step 1/40 ") and "loss" in progress[0], progress
    assert any(line.startswith("step 20 valid:") for line in lines), lines


def test_progress_lines_come_at_the_first_step_and_then_every_interval():
    """The plain lines' cadence: the first step, then not before ``every`` seconds have passed."""
    import io
    out = io.StringIO()
    lines = trainer_module.ProgressLines(total=None, initial=10, file=out, every=3600)
    for _ in range(50):
        lines.update(1)
        lines.set_postfix_str("loss 1.0")
    lines.write("step 60 valid: loss 1.0")
    assert out.getvalue().splitlines() == ["progress: step 11, loss 1.0, 0 s", "step 60 valid: loss 1.0"]
    out = io.StringIO()
    lines = trainer_module.ProgressLines(total=20, initial=0, file=out, every=0)
    for _ in range(20):
        lines.update(1)
        lines.set_postfix_str("loss 1.0")
    assert len(out.getvalue().splitlines()) == 20 and out.getvalue().splitlines()[-1].startswith(
        "progress: step 20/20 (100%), loss 1.0")
