"""--max-minutes is the wall time of the whole command: validation, checkpoints
and the end-of-run evaluation count, and training stops early enough for the end
to fit. A fake clock makes every step, validation and decode cost known seconds."""
import pytest

from minitf.nmt import trainer as budget
from minitf.nmt.trainer import WallBudget
from minitf.nmt.train import main as train_main
from minitf.nmt import trainer as trainer_module
from minitf.nmt.trainer import Trainer
from tests.runs import TINY, metrics

STEP, VALIDATION, PER_SENTENCE = 1.0, 2.0, 0.1  # fake seconds


class FakeClock:
    def __init__(self):
        self.t = 5000.0

    def __call__(self):
        return self.t


@pytest.fixture
def fake(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(budget, "clock", clock)
    monkeypatch.setattr(budget, "_command_start", None)  # train.py marks the start: not left to later tests
    update = Trainer.update
    evaluate_loss, bleu_score = Trainer.evaluate_loss, trainer_module.bleu_score
    steps = []

    def slow_step(self, *args):
        steps.append(self.step)
        assert len(steps) < 1000, "the time budget never ended training"
        clock.t += STEP
        return update(self, *args)

    def slow_loss(*args, **kwargs):
        clock.t += VALIDATION
        return evaluate_loss(*args, **kwargs)

    def slow_bleu(model, tokenizer, sources, references, beam, alpha):
        clock.t += PER_SENTENCE * len(sources) * (1 if beam == 1 else 2)
        return bleu_score(model, tokenizer, sources, references, beam, alpha)

    monkeypatch.setattr(Trainer, "update", slow_step)
    monkeypatch.setattr(Trainer, "evaluate_loss", slow_loss)
    monkeypatch.setattr(trainer_module, "bleu_score", slow_bleu)
    return clock


@pytest.mark.parametrize("minutes", [2.0, 4.0])
def test_the_whole_command_ends_within_max_minutes(tmp_path, corpus, fake, minutes, capsys):
    start = fake.t
    run = tmp_path / "run"
    assert train_main(corpus + TINY + ["--max-minutes", str(minutes), "--eval-every", "10", "--save-every", "10",
                                       "--bleu-sentences", "4", "--out", str(run)]) == 0
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
    monkeypatch.setattr(budget, "clock", clock)
    monkeypatch.setattr(budget, "_command_start", None)
    wall = WallBudget(10)
    clock.t += 125
    assert wall.eta() == " ETA 7:55"
    wall.before = 60  # a resumed run: a minute spent by its earlier invocation
    assert wall.eta() == " ETA 6:55" and wall.elapsed() == 185
    assert WallBudget(None).eta() == "" and not WallBudget(None).over(1e9)


def test_the_end_reserve_follows_measured_validations(monkeypatch):
    monkeypatch.setattr(budget, "clock", FakeClock())
    monkeypatch.setattr(budget, "_command_start", None)
    wall = WallBudget(10)
    assert wall.end_reserve(500, 500, beam=4) == pytest.approx(0.08 * 600 + WallBudget.MARGIN_SECONDS)
    wall.note_validation(20.0, 200)   # 0.1 s per sentence
    expected = 20.0 + 2 * 0.1 * 500 + 0.1 * 500 * WallBudget.BEAM_FACTOR + WallBudget.MARGIN_SECONDS
    assert wall.end_reserve(500, 500, beam=4) == pytest.approx(expected)
    assert not wall.over(expected)
    budget.clock.t += 600 - expected
    assert wall.over(expected)
