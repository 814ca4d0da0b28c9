"""Label-smoothed cross-entropy, Adam and the warmup schedule.
Gradient tolerance: rtol 1e-6, atol 1e-7 (float64 central differences)."""
import math

import pytest
from hypothesis import given, strategies as st

import minitf
from minitf import backend
from minitf.backend import xp
from minitf.module import Parameter
from tests.helpers import assert_gradients_match, np, random_array, seeds, small

V_sizes = st.integers(2, 7)


def _targets(seed, B, T, V, pad_fraction=0.3):
    rng = np.random.default_rng(seed)
    target = rng.integers(1, V, (B, T))
    target[rng.random((B, T)) < pad_fraction] = 0
    return backend.asarray(target)


@pytest.mark.usefixtures("float64")
@given(B=small, T=small, V=V_sizes, seed=seeds, smoothing=st.floats(0, 0.5), scale=st.floats(0.1, 20))
def test_loss_gradients(B, T, V, seed, smoothing, scale):
    loss_fn = minitf.LabelSmoothedCrossEntropy(smoothing=smoothing, ignore_index=0)
    target = _targets(seed, B, T, V)
    logits = random_array(seed, (B, T, V), scale)
    # the loss is a scalar: compare with upstream gradient G = 1 by scaling inside forward
    assert_gradients_match(lambda z: xp.asarray(loss_fn(z, target)), lambda g: loss_fn.backward(float(g)),
                           {"logits": logits}, seed=seed)


@pytest.mark.usefixtures("float64")
@given(B=small, T=small, V=V_sizes, seed=seeds)
def test_zero_smoothing_is_plain_cross_entropy(B, T, V, seed):
    target = _targets(seed, B, T, V)
    logits = random_array(seed, (B, T, V), 3.0)
    loss = minitf.LabelSmoothedCrossEntropy(smoothing=0.0, ignore_index=0)(logits, target)
    z, y = backend.to_numpy(logits), backend.to_numpy(target)
    terms = [-(z[b, t, y[b, t]] - math.log(sum(math.exp(v) for v in z[b, t])))
             for b in range(B) for t in range(T) if y[b, t] != 0]
    expected = sum(terms) / len(terms) if terms else 0.0
    assert abs(loss - expected) < 1e-10


@pytest.mark.usefixtures("float64")
def test_label_smoothing_matches_its_definition():
    V, eps = 5, 0.1
    logits = random_array(3, (1, 2, V))
    target = backend.asarray(np.array([[2, 4]]))
    loss = minitf.LabelSmoothedCrossEntropy(smoothing=eps, ignore_index=0)(logits, target)
    z = backend.to_numpy(logits)[0]
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
    q = np.full((2, V), eps / V)
    q[0, 2] += 1 - eps
    q[1, 4] += 1 - eps
    assert abs(loss - float(-(q * log_p).sum() / 2)) < 1e-12


def test_all_pad_batch_and_huge_logits_stay_finite():
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.1, 0)
    assert loss_fn(xp.zeros((2, 3, 4), dtype=xp.float32), xp.zeros((2, 3), dtype=xp.int64)) == 0.0
    assert not backend.to_numpy(loss_fn.backward()).any()
    logits = xp.asarray(np.array([[[1e30, -1e30, 0.0]]], dtype=np.float32))
    assert math.isfinite(loss_fn(logits, xp.asarray(np.array([[1]]))))
    assert np.isfinite(backend.to_numpy(loss_fn.backward())).all()


def test_adam_first_steps_match_the_closed_form():
    """Step 1 moves every weight by -lr * sign(g) (m_hat / sqrt(v_hat) = g / |g|);
    step 2 with the same gradient also moves by -lr * g / |g| (up to eps)."""
    with backend.default_dtype("float64"):
        p = Parameter(backend.asarray(np.array([1.0, -2.0, 3.0])))
    opt = minitf.Adam([p], lr=0.01)
    g = np.array([0.5, -3.0, 1e-3])
    for expected_step in (1, 2):
        p.grad[...] = backend.asarray(g)
        before = backend.to_numpy(p.data).copy()
        opt.step()
        # eps = 1e-9 against |g| = 1e-3 moves the step by lr * 1e-6 = 1e-8 at most
        assert np.allclose(backend.to_numpy(p.data), before - 0.01 * np.sign(g), rtol=0, atol=2e-8)
        assert opt.step_count == expected_step
    # a changing gradient: compare with the textbook formula written out
    b1, b2, eps, lr = 0.9, 0.98, 1e-9, 0.01
    m = (1 - b1) * g
    v = (1 - b2) * g * g
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    g3 = np.array([-1.0, 2.0, 0.5])
    m, v = b1 * m + (1 - b1) * g3, b2 * v + (1 - b2) * g3 * g3
    expected = backend.to_numpy(p.data) - lr * (m / (1 - b1 ** 3)) / (np.sqrt(v / (1 - b2 ** 3)) + eps)
    p.grad[...] = backend.asarray(g3)
    opt.step()
    assert np.allclose(backend.to_numpy(p.data), expected, rtol=1e-12, atol=1e-12)


def test_schedule_peaks_at_warmup_and_matches_the_paper():
    schedule = minitf.WarmupSchedule(d_model=512, warmup=4000)
    lrs = [schedule(s) for s in range(1, 20001)]
    assert int(np.argmax(lrs)) + 1 == 4000
    assert abs(schedule(4000) - 512 ** -0.5 * 4000 ** -0.5) < 1e-15
    assert abs(schedule(100) - 512 ** -0.5 * 100 * 4000 ** -1.5) < 1e-15
    assert abs(schedule(16000) - 512 ** -0.5 * 16000 ** -0.5) < 1e-15
    assert minitf.WarmupSchedule(512, 4000, scale=2.0)(4000) == 2 * schedule(4000)


def test_clip_grad_norm_scales_to_max_norm():
    a = Parameter(xp.zeros(3))
    b = Parameter(xp.zeros(4))
    a.grad[...] = 3.0
    b.grad[...] = 4.0
    norm = float(minitf.clip_grad_norm([a, b], max_norm=1.0))
    assert abs(norm - math.sqrt(9 * 3 + 16 * 4)) < 1e-5
    total = math.sqrt(float((a.grad ** 2).sum() + (b.grad ** 2).sum()))
    assert abs(total - 1.0) < 1e-4
    minitf.clip_grad_norm([a, b], max_norm=10.0)  # already small: unchanged
    assert abs(math.sqrt(float((a.grad ** 2).sum() + (b.grad ** 2).sum())) - total) < 1e-6


# --------------------------------------------------------------------------- edges mutation testing found unchecked
@pytest.mark.usefixtures("float64")
def test_loss_of_rows_far_apart_its_nll_sum_and_its_default_upstream_gradient():
    """Rows whose logits lie 1000 apart (the max is taken per row: the whole batch's would underflow the lower
    row), the logged nll_sum (the numerator of the validation perplexity) with pads present, and backward()'s
    default upstream gradient of 1: each against a computation written here."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5))
    logits[1] += 1000.0
    target = np.array([[1, 2, 0], [3, 4, 1]])            # one pad (id 0)
    loss_fn = minitf.LabelSmoothedCrossEntropy(smoothing=0.0, ignore_index=0)
    loss = loss_fn(backend.asarray(logits), backend.asarray(target))
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    nll = -np.take_along_axis(log_p, target[..., None], axis=-1)[..., 0]
    keep = target != 0
    assert loss == pytest.approx(nll[keep].mean(), rel=1e-12)
    assert loss_fn.nll_sum == pytest.approx(nll[keep].sum(), rel=1e-12) and loss_fn.num_tokens == 5
    default = backend.to_numpy(loss_fn.backward()).copy()
    loss_fn(backend.asarray(logits), backend.asarray(target))
    assert np.array_equal(default, backend.to_numpy(loss_fn.backward(1.0)))


def test_a_tiny_gradient_is_not_clipped_and_the_first_step_has_the_papers_rate():
    """clip_grad_norm leaves a gradient far below max_norm as it is (norm 1.7e-7: the 1e-6 guard must not flip
    or blow it up), and the schedule's rate at step 1 (and at 0, read as 1) is the paper's formula at step 1."""
    a = Parameter(xp.zeros(3))
    a.grad[...] = 1e-7
    minitf.clip_grad_norm([a], 1.0)
    assert np.allclose(backend.to_numpy(a.grad), 1e-7, rtol=1e-9, atol=0)
    schedule = minitf.WarmupSchedule(d_model=512, warmup=4000)
    assert schedule(1) == pytest.approx(512 ** -0.5 * min(1 ** -0.5, 1 * 4000 ** -1.5), rel=1e-12)
    assert schedule(0) == schedule(1)


# --------------------------------------------------------------------------- the optimizer interface
class MomentumSGD(minitf.optim.Optimizer):
    """A rule written as a user would add one: velocity = mu velocity + g; p -= lr velocity."""
    state_names = ("velocity",)

    def update_range(self, data, grad, lr):
        velocity = self.state["velocity"]
        velocity *= 0.9
        velocity += grad
        data -= lr * velocity


def test_another_optimizer_is_its_class_and_one_line_for_the_trainer_the_checkpoint_and_resume(tmp_path, corpus,
                                                                                                 monkeypatch):
    """A rule registered in OPTIMIZERS trains through train.py --optimizer, its state is saved by name and a resumed
    run equals an uninterrupted one; fp16 wraps it (mixed_precision) with float32 master weights and state."""
    from minitf.optim import OPTIMIZERS, mixed_precision
    from minitf.training import checkpoint as ckpt
    from minitf.train import main as train_main
    from tests.runs import TINY
    monkeypatch.setitem(OPTIMIZERS, "momentum", MomentumSGD)
    flags = corpus + TINY + ["--optimizer", "momentum", "--eval-every", "100", "--save-every", "2", "--average", "0",
                             "--bleu-sentences", "0"]
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    assert train_main(flags + ["--max-steps", "4", "--out", str(whole)]) == 0
    state = ckpt.read_checkpoint(ckpt.checkpoint_path(whole, 4))
    assert set(state["optimizer"]) == {"velocity"} and state["meta"]["config"]["optimizer"] == "momentum"
    assert float(np.abs(state["optimizer"]["velocity"]).max()) > 0
    assert train_main(flags + ["--max-steps", "2", "--out", str(halves)]) == 0
    assert train_main(["--resume", str(halves), "--max-steps", "4", "--no-progress"]) == 0
    ours, theirs = (ckpt.read_checkpoint(ckpt.checkpoint_path(run, 4)) for run in (halves, whole))
    assert all(np.array_equal(ours["params"][name], theirs["params"][name]) for name in theirs["params"])
    assert np.array_equal(ours["optimizer"]["velocity"], theirs["optimizer"]["velocity"])

    layer = minitf.Linear(3, 2)
    with backend.default_dtype("float16"):
        half = minitf.Linear(3, 2)
    opt = mixed_precision(MomentumSGD)(half.parameters(), lr=0.1, init_scale=4.0)
    assert opt.state["velocity"].dtype == np.float32 and opt.flat.data.dtype == np.float32
    half.weight.grad[...] = 4.0  # the loss was scaled by 4: the unscaled gradient is 1
    before = backend.to_numpy(opt.flat.data).copy()
    assert opt.update(bool(np.isfinite(backend.to_numpy(opt.unscale_grads())).all()))
    assert np.allclose(backend.to_numpy(opt.flat.data)[:6], before[:6] - 0.1)
    master = backend.to_numpy(opt.flat.data)[:6].reshape(3, 2)
    assert np.array_equal(backend.to_numpy(half.weight.data), master.astype(np.float16))
    with pytest.raises(ValueError, match="empty parameter list"):
        MomentumSGD([], lr=0.1)
    assert layer.weight.data.dtype != np.float16
