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
    src = np.array([[5, 6, 7, 8, 0], [9, 10, 11, 0, 0]])
    tgt = np.array([[2, 12, 13, 14, 3], [2, 15, 16, 3, 0]])
    results, previous = {}, backend.get_device()
    for device in ("cpu", "gpu"):
        backend.set_device(device)
        try:
            with backend.default_dtype("float64"):
                model = minitf.Transformer(20, 20, d_model=16, num_heads=2, num_encoder_layers=2,
                                           num_decoder_layers=2, d_ff=32, dropout=0.0)
                loss_fn = minitf.LabelSmoothedCrossEntropy(0.1, ignore_index=0)
                optimizer = minitf.Adam(model.parameters(), lr=1e-3)
                loss = loss_fn(model(src, tgt[:, :-1]), tgt[:, 1:])
                model.backward(loss_fn.backward())
                grad = backend.to_numpy(model.flat.grad).copy()
                optimizer.step()
                results[device] = (loss, grad, backend.to_numpy(model.flat.data).copy())
        finally:
            backend.set_device(previous)
    (loss_c, grad_c, data_c), (loss_g, grad_g, data_g) = results["cpu"], results["gpu"]
    assert abs(loss_c - loss_g) <= 1e-10 * abs(loss_c)
    assert np.allclose(grad_c, grad_g, rtol=1e-8, atol=1e-12)
    assert np.allclose(data_c, data_g, rtol=0, atol=3e-3)   # Adam: near-zero gradients may flip by ~2 lr
