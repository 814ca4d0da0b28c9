"""--precision: fp16 mixed precision (float16 model, float32 master weights and moments,
dynamic loss scaling) on the CPU through NumPy float16, and the tf32/resume refusals.
TF32 itself and fp16 on CuPy need a GPU and are not tested here."""
import functools
import json

import pytest

import minitf
from minitf import backend
from minitf.nmt.translation_trainer import TranslationTrainer
from minitf.training import checkpoint as ckpt, trainer as trainer_module
from minitf.backend import host as np
from minitf.backend import to_numpy
from minitf.optim import MixedPrecisionAdam, buffer_norm, mixed_precision
from minitf.training.config import RunConfig
from minitf.nmt.data import Corpus, read_splits
from minitf.training.tokenizer import Tokenizer
from minitf.train import main as train_main
from tests.runs import TINY, metrics


def small_fp16_model():
    minitf.manual_seed(0)
    with backend.default_dtype("float16"):
        return minitf.Linear(4, 3)


def test_fp16_run_learns_and_saves_float32_master_weights(tmp_path, corpus):
    run = tmp_path / "run"
    common = corpus + TINY + ["--max-steps", "30", "--eval-every", "100", "--save-every", "15", "--average", "0",
                              "--bleu-sentences", "0"]
    assert train_main(common + ["--precision", "fp16", "--out", str(run)]) == 0
    losses = [r["loss"] for r in metrics(run)]
    assert len(losses) == 30 and all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < losses[0] - 0.3          # it learns
    assert all(r["loss_scale"] >= 1 for r in metrics(run))
    state = ckpt.read_checkpoint(ckpt.checkpoint_path(run, 30))
    assert {a.dtype for a in state["params"].values()} == {np.dtype(np.float32)}
    assert {a.dtype for a in state["optimizer"].values()} == {np.dtype(np.float32)}
    assert state["meta"]["config"]["precision"] == "fp16"
    assert state["meta"]["loss_scale"]["scale"] == metrics(run)[-1]["loss_scale"]
    # the first steps agree with fp32 up to float16 rounding
    ref = tmp_path / "ref"
    assert train_main(common + ["--max-steps", "3", "--out", str(ref)]) == 0
    assert json.loads((ref / "config.json").read_text())["precision"] == "fp32"
    np.testing.assert_allclose(losses[:3], [r["loss"] for r in metrics(ref)], rtol=0.02)


def test_fp16_overflow_backs_off_and_the_run_goes_on(tmp_path, corpus, monkeypatch):
    """A loss scale far too large overflows float16: those batches are skipped (no step),
    the scale halves each time, and the run still reaches its steps."""
    monkeypatch.setattr(trainer_module, "mixed_precision",
                        lambda rule: functools.partial(mixed_precision(rule), init_scale=2.0 ** 40))
    run = tmp_path / "run"
    assert train_main(corpus + TINY + ["--max-steps", "4", "--eval-every", "100", "--save-every", "100",
                                       "--average", "0", "--bleu-sentences", "0", "--precision", "fp16",
                                       "--out", str(run)]) == 0
    records = metrics(run)
    assert [r["step"] for r in records] == [1, 2, 3, 4] and all(np.isfinite(r["loss"]) for r in records)
    meta = ckpt.read_checkpoint(ckpt.checkpoint_path(run, 4))["meta"]["loss_scale"]
    assert meta["overflows"] >= 1 and meta["scale"] == 2.0 ** (40 - meta["overflows"])


def test_scaler_skips_a_non_finite_step_and_halves_the_scale():
    layer = small_fp16_model()
    opt = MixedPrecisionAdam(layer.parameters(), lr=0.1)
    assert opt.flat.data.dtype == np.float32 and opt.model_flat.data.dtype == np.float16
    assert opt.m.dtype == np.float32 and opt.scale == 2.0 ** 16
    opt.model_flat.grad.fill(1.0)
    assert opt.update(np.isfinite(float(buffer_norm(opt.unscale_grads()))))   # one good step: moments non-zero
    before = [to_numpy(a).copy() for a in (opt.flat.data, opt.model_flat.data, opt.m, opt.v)]
    opt.model_flat.grad.fill(1.0)
    opt.model_flat.grad[2] = float("inf")                                    # an overflow in the float16 gradient
    assert not np.isfinite(float(buffer_norm(opt.unscale_grads())))
    assert opt.update(False) is False
    for a, b in zip(before, (opt.flat.data, opt.model_flat.data, opt.m, opt.v)):
        np.testing.assert_array_equal(a, to_numpy(b))                       # nothing updated
    assert opt.scale == 2.0 ** 15 and opt.overflows == 1 and opt.step_count == 1 and opt.good_steps == 0
    for _ in range(20):
        opt.update(False)
    assert opt.scale == 1.0                                                  # never below 1


def test_scaler_grows_after_the_interval_and_refreshes_float16_params():
    layer = small_fp16_model()
    opt = MixedPrecisionAdam(layer.parameters(), lr=1e-3, init_scale=8.0, growth_interval=3)
    assert MixedPrecisionAdam.GROWTH_INTERVAL == 2000 and MixedPrecisionAdam.INIT_SCALE == 2.0 ** 16
    opt.model_flat.grad.fill(8.0 * 0.5)                                      # scaled gradient 0.5 * scale
    np.testing.assert_array_equal(to_numpy(opt.unscale_grads()), 0.5)
    for expected in (8.0, 8.0, 16.0, 16.0):
        opt.unscale_grads()
        opt.update(True)
        assert opt.scale == expected
    assert opt.good_steps == 1 and opt.step_count == 4
    np.testing.assert_array_equal(to_numpy(opt.model_flat.data), to_numpy(opt.flat.data).astype(np.float16))
    assert layer.weight.data.dtype == np.float16 and layer.weight._flat is opt.model_flat  # still a flat view


def test_tf32_on_the_cpu_is_a_usage_error(tmp_path, corpus, capsys):
    assert train_main(corpus + TINY + ["--precision", "tf32", "--device", "cpu", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tf32 needs --device gpu" in err
    assert not (tmp_path / "r").exists()


def test_fp16_resume_restores_scale_and_master_weights_and_keeps_precision(tmp_path, corpus, capsys):
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = corpus + TINY + ["--eval-every", "100", "--save-every", "3", "--average", "0", "--bleu-sentences", "0",
                              "--precision", "fp16"]
    assert train_main(common + ["--max-steps", "6", "--out", str(straight)]) == 0
    assert train_main(common + ["--max-steps", "3", "--out", str(split)]) == 0
    capsys.readouterr()
    assert train_main(["--resume", str(split), "--precision", "fp32", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--precision cannot be given" in err
    # the resumed trainer holds the checkpoint's master weights and scaler state exactly
    config = RunConfig.read(split)
    state = ckpt.read_checkpoint(ckpt.checkpoint_path(split, 3))
    tokenizer = Tokenizer(split / "tokenizer.model")
    t = TranslationTrainer(config, split, tokenizer, Corpus(tokenizer, read_splits(config.data), print),
                               print, progress=False)
    t.optimizer.load_scaler_state({"scale": 1.0, "good_steps": 0, "overflows": 0})
    t.restore(state)
    assert t.optimizer.scaler_state() == state["meta"]["loss_scale"]
    names = [n for n, _ in t.model.named_parameters()]
    for name, view in zip(names, t.optimizer.master_params()):
        np.testing.assert_array_equal(view, state["params"][name])
    # and an fp16 run resumes exactly
    assert train_main(["--resume", str(split), "--max-steps", "6", "--no-progress"]) == 0
    assert [r["loss"] for r in metrics(straight)] == [r["loss"] for r in metrics(split)]
    a, b = (ckpt.read_checkpoint(ckpt.checkpoint_path(r, 6)) for r in (straight, split))
    assert a["meta"]["loss_scale"] == b["meta"]["loss_scale"]
    for name in a["params"]:
        np.testing.assert_array_equal(a["params"][name], b["params"][name])


def test_fp16_step_on_the_strict_device_stand_in():
    """A whole fp16 step (loss in float32, scaled backward, unscale, norm, update, refresh)
    mixes no host arrays into device arithmetic and reads only the logged scalars."""
    from tests import strict_xp
    from tests.test_strict_backend import PAD, _batch
    src, tgt_in, tgt_out = _batch()
    with strict_xp.active() as counts:
        with backend.default_dtype("float16"):
            model = minitf.Transformer(40, 40, d_model=16, num_heads=2, num_encoder_layers=1,
                                       num_decoder_layers=1, d_ff=32, dropout=0.1)
        loss_fn = minitf.LabelSmoothedCrossEntropy(0.1, ignore_index=PAD)
        opt = MixedPrecisionAdam(model.parameters(), lr=1e-3)
        for _ in range(2):
            counts.reset()
            opt.zero_grad()
            loss = loss_fn(model(src, tgt_in), tgt_out)
            dlogits = loss_fn.backward(opt.scale)
            assert dlogits.dtype == np.float16
            model.backward(dlogits)
            grads = opt.unscale_grads()
            norm = minitf.optim.clip_buffer_norm(grads, 1.0)
            assert opt.update(bool(np.isfinite(float(norm)))) and np.isfinite(loss)
        opt.load_master([backend.to_numpy(v) for v in opt.master_params()])
        assert opt.model_flat.data.dtype == np.float16 and opt.flat.data.dtype == np.float32
