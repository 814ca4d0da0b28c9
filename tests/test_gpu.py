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


# --------------------------------------------------------------------------- #
# the kernels of minitf/cuda_kernels.py that the layers do not use yet, each against
# its NumPy reference (the layer code, run on CuPy)
# --------------------------------------------------------------------------- #
def _launch_rows(source, entry, dtype, rows, args):
    from minitf import cuda_kernels
    kernel = cuda_kernels.function(source, entry + cuda_kernels.suffix(dtype))
    kernel((rows,), (cuda_kernels.BLOCK,), args)


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 1e-5)])
def test_masked_softmax_kernels_match_the_reference(gpu, dtype, tol):
    from minitf.attention import scaled_dot_product_attention
    from minitf.layers import softmax_backward
    xp, rng = backend.xp, np.random.default_rng(0)
    Q, K, V = (backend.asarray(rng.normal(size=(2, 3, 5, 4)), dtype=dtype) for _ in range(3))
    keep = backend.asarray(rng.random((2, 1, 5, 5)) > 0.3)
    keep[0, 0, 1] = False                                          # one fully masked row
    _, P_ref = scaled_dot_product_attention(Q, K, V, keep)
    scores = (Q @ K.swapaxes(-1, -2)) * 0.5                         # / sqrt(dk), dk = 4
    keep_full = xp.ascontiguousarray(xp.broadcast_to(keep, scores.shape)).astype(xp.uint8)
    P = xp.empty_like(scores)
    rows, cols = scores.size // 5, 5
    _launch_rows("masked_softmax", "masked_softmax_forward", scores.dtype, rows,
                 (xp.ascontiguousarray(scores), keep_full, P, np.int64(cols)))
    assert float(xp.abs(P - P_ref).max()) <= tol
    dP = backend.asarray(rng.normal(size=P.shape), dtype=dtype)
    dS = xp.empty_like(P)
    _launch_rows("masked_softmax", "masked_softmax_backward", P.dtype, rows, (P_ref, dP, dS, np.int64(cols)))
    assert float(xp.abs(dS - softmax_backward(P_ref, dP)).max()) <= tol * float(xp.abs(dP).max())


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 1e-5)])
def test_layer_norm_kernels_match_the_reference(gpu, dtype, tol):
    from minitf.layers import LayerNorm
    xp, rng = backend.xp, np.random.default_rng(0)
    with backend.default_dtype(dtype):
        norm = LayerNorm(300)                                      # wider than one block
    norm.gamma.data[...] = backend.asarray(rng.normal(size=300), dtype=dtype)
    x = backend.asarray(rng.normal(size=(4, 7, 300)), dtype=dtype)
    dy = backend.asarray(rng.normal(size=x.shape), dtype=dtype)
    y_ref = norm(x)
    dx_ref = norm.backward(dy)
    y, xhat, rstd, dx = xp.empty_like(x), xp.empty_like(x), xp.empty(28, dtype=dtype), xp.empty_like(x)
    _launch_rows("layer_norm", "layer_norm_forward", x.dtype, 28,
                 (x, norm.gamma.data, norm.beta.data, y, xhat, rstd, x.dtype.type(norm.eps), np.int64(300)))
    assert float(xp.abs(y - y_ref).max()) <= tol * 10
    _launch_rows("layer_norm", "layer_norm_backward", x.dtype, 28, (dy, xhat, rstd, norm.gamma.data, dx, np.int64(300)))
    assert float(xp.abs(dx - dx_ref).max()) <= tol * 10 * float(xp.abs(dx_ref).max())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_dropout_residual_kernel_matches_the_reference(gpu, dtype):
    from minitf import cuda_kernels
    xp, rng, p = backend.xp, np.random.default_rng(0), 0.1
    x, s = (backend.asarray(rng.normal(size=1000), dtype=dtype) for _ in range(2))
    u = backend.asarray(rng.random(1000), dtype="float32")
    reference = x + s * ((u >= p).astype(dtype) * (1.0 / (1.0 - p)))     # Dropout's mask, then the sum
    y = xp.empty_like(x)
    kernel = cuda_kernels.function("dropout_residual", "dropout_residual" + cuda_kernels.suffix(x.dtype))
    kernel((4,), (cuda_kernels.BLOCK,), (x, s, u, y, np.float32(p), np.int64(1000)))
    assert float(xp.abs(y - reference).max()) <= 1e-6 * float(xp.abs(reference).max())


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-10), ("float32", 1e-4)])
def test_loss_kernel_matches_the_reference(gpu, dtype, tol):
    xp, rng = backend.xp, np.random.default_rng(0)
    logits = backend.asarray(rng.normal(size=(3, 5, 700)), dtype=dtype)
    target = rng.integers(1, 700, (3, 5))
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.1, ignore_index=0)
    loss = loss_fn(logits, target)
    p = xp.empty_like(logits)
    per_token, nll = xp.empty(15, dtype=dtype), xp.empty(15, dtype=dtype)
    _launch_rows("label_smoothed_loss", "label_smoothed_loss", logits.dtype, 15,
                 (logits, backend.asarray(target.astype(np.int64)), p, per_token, nll, logits.dtype.type(0.1),
                  np.int64(700)))
    saved = loss_fn.saved_tensors()
    assert abs(float(per_token.mean()) - loss) <= tol * abs(loss)
    assert abs(float(nll.sum()) - loss_fn.nll_sum) <= tol * abs(loss_fn.nll_sum)
    assert float(xp.abs(p.reshape(saved.p.shape) - saved.p).max()) <= tol
