"""GPU-only checks (CuPy): skipped, with the reason, where CuPy or a CUDA device is missing.

Run on a GPU machine by scripts/gpu_check.sh. They compare the CuPy-only code
(the fused Adam kernel) with the NumPy-path reference, and one training step on
the GPU with the same step on the CPU.
"""
import pytest

import minitf
from minitf import backend
from tests.helpers import np

pytestmark = pytest.mark.skipif(not backend.gpu_available(),
                                reason="needs CuPy and a CUDA device (pip install -e .[gpu]); none here")


@pytest.fixture
def gpu():
    previous = backend.get_device()
    backend.set_device("gpu")
    yield
    backend.set_device(previous)


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 1e-6)])
def test_fused_adam_kernel_matches_the_reference_update(gpu, dtype, tol):
    rng = np.random.default_rng(0)
    with backend.default_dtype(dtype):
        start = rng.normal(size=1000)
        a, b = (minitf.Parameter(backend.asarray(start, dtype=dtype)) for _ in range(2))
    fused = minitf.Adam([a], lr=minitf.WarmupSchedule(64, warmup=10), fused=True)
    reference = minitf.Adam([b], lr=minitf.WarmupSchedule(64, warmup=10), fused=False)
    for step in range(5):
        g = backend.asarray(rng.normal(size=1000) * 10.0 ** -step, dtype=dtype)   # tiny gradients too
        a.grad[...] = g
        b.grad[...] = g
        fused.step()
        reference.step()
    for x, y in ((a.data, b.data), (fused.m, reference.m), (fused.v, reference.v)):
        x, y = backend.to_numpy(x), backend.to_numpy(y)
        assert np.allclose(x, y, rtol=tol, atol=tol * float(np.abs(y).max())), float(np.abs(x - y).max())


def test_one_training_step_matches_the_cpu_in_float64():
    """Logits, loss and gradients agree to float64 rounding, and so does the Adam update
    wherever the gradient is well above rounding (tolerances far below each one's scale)."""
    src = np.array([[5, 6, 7, 8, 0], [9, 10, 11, 0, 0]])
    tgt = np.array([[2, 12, 13, 14, 3], [2, 15, 16, 3, 0]])
    lr = 1e-3
    results, previous = {}, backend.get_device()
    for device in ("cpu", "gpu"):
        backend.set_device(device)
        try:
            with backend.default_dtype("float64"):
                model = minitf.Transformer(20, 20, d_model=16, num_heads=2, num_encoder_layers=2,
                                           num_decoder_layers=2, d_ff=32, dropout=0.0)
                loss_fn = minitf.LabelSmoothedCrossEntropy(0.1, ignore_index=0)
                optimizer = minitf.Adam(model.parameters(), lr=lr)
                logits = model(src, tgt[:, :-1])
                loss = loss_fn(logits, tgt[:, 1:])
                model.backward(loss_fn.backward())
                before = backend.to_numpy(optimizer.flat.data).copy()
                grad = backend.to_numpy(optimizer.flat.grad).copy()
                optimizer.step()
                update = backend.to_numpy(optimizer.flat.data) - before
                results[device] = (backend.to_numpy(logits).copy(), loss, grad, update)
        finally:
            backend.set_device(previous)
    (logits_c, loss_c, grad_c, update_c), (logits_g, loss_g, grad_g, update_g) = results["cpu"], results["gpu"]
    assert np.abs(logits_c - logits_g).max() <= 1e-10 * np.abs(logits_c).max()
    assert abs(loss_c - loss_g) <= 1e-10 * abs(loss_c)
    assert np.abs(grad_c - grad_g).max() <= 1e-9 * np.abs(grad_c).max()
    # Adam's first step moves each parameter by about lr * sign(g); where |g| is near rounding
    # level the sign itself is noise, so the update is compared where g is clearly non-zero
    clear = np.abs(grad_c) > 1e-6 * np.abs(grad_c).max()
    assert clear.sum() > 0.5 * clear.size
    assert np.abs(update_c).max() <= 1.01 * lr and np.abs(update_c[clear]).min() > 0.5 * lr
    assert np.abs(update_c - update_g)[clear].max() <= 1e-6 * lr
