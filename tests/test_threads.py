"""backend.by_rows: NumPy's elementwise and row-wise work on blocks of rows on several threads.

Every use is checked the same way: computed with one thread (the plain NumPy lines, inline) and with four, on
inputs large enough to split at the default sizes (``backend.THREAD_MIN_ELEMENTS``), the threaded run is checked
to have split (a spy on the blocks) and its results to be the same bytes as the one-thread run's. Clipping's
norm, a whole-array sum, is the one use that is equal to rounding instead (and the same for any thread count).
"""
import math
import threading

import pytest

import minitf
from minitf import backend
from minitf.attention import MultiHeadAttention, scaled_dot_product_attention, scaled_dot_product_attention_backward
from minitf.layers import (GELU, SiLU, Dropout, Embedding, LayerNorm, ReLU, RMSNorm, SwiGLU, softmax,
                           softmax_backward)
from minitf.loss import LabelSmoothedCrossEntropy
from minitf.module import Parameter, no_grad
from minitf.optim import Adam, MixedPrecisionAdam, buffer_norm, clip_grad_norm
from tests.helpers import np

THREADS = 4


@pytest.fixture
def splits(monkeypatch):
    """Counts the blocks the threaded path ran (the calls to backend._run_blocks and their blocks), and makes
    the first two threads of each call meet before their first block: two threads then always run blocks at
    the same time, however the machine schedules them (else one thread may take every block of a call)."""
    if backend.xp.__name__ != "numpy":
        pytest.skip("the threads split NumPy's arrays only: on the strict CuPy stand-in (MINITF_STRICT=1) every "
                    "call runs inline, which test_by_rows_runs_small_arrays_nested_calls_and_other_array_modules_"
                    "inline checks")
    record = {"calls": 0, "blocks": 0, "threads": set()}
    run_blocks = backend._run_blocks

    def spy(work, count, blocks):
        record["calls"] += 1
        record["blocks"] += len(blocks)
        meet, lock, seen = threading.Barrier(2, timeout=30), threading.Lock(), set()

        def counted(lo, hi):
            me = threading.get_ident()
            record["threads"].add(me)
            with lock:
                first_two = me not in seen and len(seen) < 2
                seen.add(me)
            if first_two and count > 1 and len(blocks) > 1:
                meet.wait()
            work(lo, hi)
        run_blocks(counted, count, blocks)

    monkeypatch.setattr(backend, "_run_blocks", spy)
    return record


def same_bytes(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def one_and_many(compute, splits, *, calls=1):
    """compute() with one thread and with THREADS; the threaded run must have split (``calls`` times at least).
    compute makes its own inputs (from fixed seeds), so that both runs start from the same numbers."""
    with backend.thread_count(1):
        plain = compute()
    assert splits["calls"] == 0, "one thread must run inline"
    with backend.thread_count(THREADS):
        threaded = compute()
    assert splits["calls"] >= calls and splits["blocks"] > 1, f"the threaded run did not split: {splits}"
    return plain, threaded


def assert_all_same_bytes(plain, threaded):
    plain = plain if isinstance(plain, (tuple, list)) else (plain,)
    threaded = threaded if isinstance(threaded, (tuple, list)) else (threaded,)
    assert len(plain) == len(threaded)
    for i, (a, b) in enumerate(zip(plain, threaded)):
        assert same_bytes(a, b), f"result {i} differs: max |diff| {np.abs(a.astype(float) - b.astype(float)).max()}"


def rand(shape, seed=0, dtype=np.float32, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


# --------------------------------------------------------------------------- #
# The helper itself
# --------------------------------------------------------------------------- #
def test_default_threads_reads_minitf_threads_then_blas_then_the_cores():
    cores = len(__import__("os").sched_getaffinity(0))
    assert backend.default_threads({}) == cores
    assert backend.default_threads({"MINITF_THREADS": "3", "OMP_NUM_THREADS": "1"}) == 3
    assert backend.default_threads({"OMP_NUM_THREADS": "5"}) == 5
    assert backend.default_threads({"OPENBLAS_NUM_THREADS": "2"}) == 2
    assert backend.default_threads({"OMP_NUM_THREADS": "", "MKL_NUM_THREADS": "6"}) == 6
    # OpenMP's own forms are read as OpenMP reads them, or skipped: they are other programs' settings too
    assert backend.default_threads({"OMP_NUM_THREADS": "4,2"}) == 4
    assert backend.default_threads({"OMP_NUM_THREADS": "auto", "OPENBLAS_NUM_THREADS": "3"}) == 3
    assert backend.default_threads({"OMP_NUM_THREADS": "0"}) == cores


def test_a_rank_under_mpiexec_gets_its_share_of_the_cores():
    from minitf.training import distributed
    assert backend._MPI_LAUNCHER_ENV == distributed.LAUNCHER_ENV     # the same test of "started by mpiexec"
    for name in distributed.LAUNCHER_ENV:
        assert backend.default_threads({name: "0"}) == 1                # one rank per core: one thread
    cores = len(__import__("os").sched_getaffinity(0))
    assert backend.default_threads({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}) == cores
    assert backend.default_threads({"PMI_RANK": "0", "MPI_LOCALNRANKS": str(2 * cores)}) == 1
    assert backend.default_threads({"PMI_RANK": "0", "MINITF_THREADS": "2"}) == 2   # asked for: given


@pytest.mark.parametrize("value", ["two", "0", "-1", "1.5"])
def test_a_bad_thread_count_is_one_clear_line(value):
    with pytest.raises(ValueError, match="MINITF_THREADS must be") as error:
        backend.default_threads({"MINITF_THREADS": value})
    assert "\n" not in str(error.value) and value in str(error.value)
    with pytest.raises(ValueError, match="1 or more"):
        backend.set_threads(0)


def test_a_bad_thread_count_is_one_line_from_a_command(tmp_path):
    """The commands check the environment before anything else (as a bad MINITF_DEVICE): one line, exit 1."""
    import os
    import pathlib
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[1]
    env = dict(os.environ, MINITF_THREADS="two", PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "-m", "minitf.generate", "--checkpoint", str(tmp_path / "none"),
                           "--prompt", "hi"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "minitf.generate: error: MINITF_THREADS must be a whole number of threads, got 'two'; set it to 1 or more, "
        "or unset it"]


def test_the_suite_runs_with_threads_on():
    """CI's two cores give two threads: the tests of the layers run the threaded path where inputs are large."""
    import os
    if any(os.environ.get(name) for name in ("MINITF_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                             "MKL_NUM_THREADS")):
        pytest.skip("a thread count is set in the environment")
    assert backend.threads() == len(os.sched_getaffinity(0))


def test_by_rows_assembles_tuples_in_place_results_and_broadcast_rows(splits):
    x = rand((300, 1000))
    column = rand((1, 1000), seed=1)                                   # length 1: passed whole, broadcast
    with backend.thread_count(THREADS):
        total, row_max = backend.by_rows(lambda x, c: (x + c, x.max(axis=-1)), x, column)
        out = np.zeros_like(x)

        def write(out, x):
            out[...] = 2 * x
        assert backend.by_rows(write, out, x) is None
    assert splits["calls"] == 2 and len(splits["threads"]) > 1
    assert same_bytes(total, x + column) and same_bytes(row_max, x.max(axis=-1)) and same_bytes(out, 2 * x)


def test_by_rows_runs_small_arrays_nested_calls_and_other_array_modules_inline(splits):
    from tests import strict_xp
    with backend.thread_count(THREADS):
        small = rand((10, 10))
        assert same_bytes(backend.by_rows(np.exp, small), np.exp(small))
        big = rand((300, 1000))
        inner = backend.by_rows(lambda x: backend.by_rows(np.exp, x), big)   # the inner call inline in a block
        assert same_bytes(inner, np.exp(big)) and splits["calls"] == 1
        with strict_xp.active():                                          # CuPy's stand-in: never split
            array = backend.asarray(big)
            result = backend.by_rows(lambda a: backend.xp.exp(a), array)
            assert type(result) is type(array) and splits["calls"] == 1


def test_an_error_in_a_block_reaches_the_caller():
    def fails_on_late_rows(x):
        if x.shape[0] and x[0, 0] >= 200:
            raise ArithmeticError("row 200")
        return x
    x = np.repeat(np.arange(300, dtype=np.float32)[:, None], 1000, axis=1)
    with backend.thread_count(THREADS), pytest.raises(ArithmeticError, match="row 200"):
        backend.by_rows(fails_on_late_rows, x)


def test_rows_of_different_lengths_are_refused():
    with backend.thread_count(THREADS), pytest.raises(ValueError, match="first axis"):
        backend.by_rows(lambda a, b: a, rand((300, 1000)), rand((299, 1000)))


# --------------------------------------------------------------------------- #
# The optimizer: Adam's update, mixed precision's casts, zero_grad, clipping
# --------------------------------------------------------------------------- #
N_PARAMS = 700_000          # about 11 of Adam's 64K-element chunks


def adam_steps(cls=Adam, dtype=np.float32):
    with backend.default_dtype(dtype):
        params = [Parameter(backend.asarray(rand((N_PARAMS - 1000,), 1), dtype=dtype)),
                  Parameter(backend.asarray(rand((1000,), 2), dtype=dtype))]
    opt = cls(params, lr=1e-3)
    for step in range(3):
        opt.flat.grad[...] = rand(opt.flat.grad.shape, 10 + step, dtype, scale=1e-2)
        if cls is MixedPrecisionAdam:
            opt.model_flat.grad[...] = rand(opt.flat.grad.shape, 10 + step, dtype, scale=1e-2)
            opt.unscale_grads()
            opt.update(True)
        else:
            opt.step()
    return opt


def test_adam_step_threaded_is_bit_identical(splits):
    plain, threaded = one_and_many(adam_steps, splits, calls=3)
    assert_all_same_bytes([plain.flat.data, plain.m, plain.v], [threaded.flat.data, threaded.m, threaded.v])
    assert len(threaded._scratch) == len(splits["threads"]) > 1       # a scratch chunk per thread: no sharing


def test_mixed_precision_adam_casts_and_step_threaded_are_bit_identical(splits):
    plain, threaded = one_and_many(lambda: adam_steps(MixedPrecisionAdam, np.float16), splits, calls=9)
    assert_all_same_bytes([plain.flat.data, plain.flat.grad, plain.model_flat.data, plain.m, plain.v],
                          [threaded.flat.data, threaded.flat.grad, threaded.model_flat.data, threaded.m, threaded.v])


def test_zero_grad_threaded_zeroes_every_gradient(splits):
    def zeroed():
        opt = adam_steps()
        opt.flat.grad[...] = 1.0
        splits["calls"] = 0
        opt.zero_grad()
        assert splits["calls"] == (1 if backend.threads() > 1 else 0)
        return opt.flat.grad
    with backend.thread_count(THREADS):
        assert not zeroed().any()


def test_clipping_norm_threaded_equals_the_whole_dot_to_rounding_for_any_thread_count(splits):
    g = rand((N_PARAMS,), 3)
    with backend.thread_count(1):
        whole = float(buffer_norm(g))
    norms = []
    for count in (2, 3, THREADS):
        with backend.thread_count(count):
            norms.append(float(buffer_norm(g)))
    assert splits["calls"] == 3
    assert norms[0] == norms[1] == norms[2]                            # the blocks' sums added in one order
    assert norms[0] == pytest.approx(whole, rel=1e-6) and norms[0] == pytest.approx(
        float(np.sqrt((g.astype(np.float64) ** 2).sum())), rel=1e-6)


def test_clip_grad_norm_threaded_scales_like_one_thread(splits):
    def clipped():
        opt = adam_steps()
        splits["calls"] = 0
        norm = clip_grad_norm(opt.params, 0.5)
        return opt.flat.grad, norm
    with backend.thread_count(1):
        plain, plain_norm = clipped()
    with backend.thread_count(THREADS):
        threaded, threaded_norm = clipped()
    assert splits["calls"] == 2
    assert float(threaded_norm) == pytest.approx(float(plain_norm), rel=1e-6)
    np.testing.assert_allclose(threaded, plain, rtol=1e-6, atol=0)
    assert float(np.sqrt((threaded.astype(np.float64) ** 2).sum())) == pytest.approx(0.5, rel=1e-5)


# --------------------------------------------------------------------------- #
# The loss: log-softmax and the label-smoothed loss over (N, V) logits, and its backward
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_loss_forward_and_backward_threaded_are_bit_identical(splits, dtype):
    B, T, V = 4, 16, 4000                                              # 64 rows of 4000: 256K elements

    def run():
        logits = backend.asarray(rand((B, T, V), 4, dtype, scale=3.0))
        target = np.random.default_rng(5).integers(1, V, (B, T))
        target[:, -3:] = 0                                             # padding
        loss_fn = LabelSmoothedCrossEntropy(0.1)
        loss = loss_fn(logits, target)
        return np.float64(loss), np.float64(loss_fn.nll_sum), loss_fn.backward(128.0)
    plain, threaded = one_and_many(run, splits, calls=2)
    assert_all_same_bytes(plain, threaded)
    assert threaded[2].dtype == dtype


# --------------------------------------------------------------------------- #
# The layers: LayerNorm, RMSNorm, the activations, dropout, softmax, the embedding's gradient
# --------------------------------------------------------------------------- #
def forward_backward(make_layer, shape=(40, 16, 512), seed=6):
    def run():
        backend.manual_seed(0)
        layer = make_layer()
        x = backend.asarray(rand(shape, seed, scale=2.0))
        y = layer(x)
        dx = layer.backward(backend.asarray(rand(shape, seed + 1)))
        grads = [p.grad.copy() for p in layer.parameters()]
        return [y, dx] + grads
    return run


@pytest.mark.parametrize("make_layer", [lambda: LayerNorm(512), lambda: RMSNorm(512), ReLU, GELU,
                                        lambda: GELU("tanh"), SiLU, lambda: Dropout(0.1), lambda: SwiGLU(512, 256)],
                         ids=["layernorm", "rmsnorm", "relu", "gelu", "gelu_tanh", "silu", "dropout", "swiglu"])
def test_layer_forward_and_backward_threaded_are_bit_identical(splits, make_layer):
    plain, threaded = one_and_many(forward_backward(make_layer), splits, calls=2)
    assert_all_same_bytes(plain, threaded)


def test_layernorm_threaded_is_the_plain_formula(splits):
    """The threaded blocks compute what the formula says, not only what one thread computes."""
    x = rand((300, 512), 7)
    with backend.thread_count(THREADS):
        y = LayerNorm(512)(x)
    assert splits["calls"] == 1
    mean = x.mean(axis=-1, keepdims=True)
    assert same_bytes(y, (x - mean) * (1.0 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + 1e-5)))


def plain_gelu_tanh(x):
    """GELU's tanh form as the plain NumPy lines in the comments of GELU.rows / backward_rows: (y, cdf, t)."""
    from minitf.layers import GELU_CUBIC, SQRT_2_OVER_PI
    u = SQRT_2_OVER_PI * (x + GELU_CUBIC * (x * x * x))
    t = np.tanh(u)
    cdf = 0.5 * (1.0 + t)
    return x * cdf, cdf, t


def plain_gelu_tanh_backward(dy, x, cdf, t):
    from minitf.layers import GELU_CUBIC, SQRT_2_OVER_PI
    du_dx = SQRT_2_OVER_PI * (1.0 + (3.0 * GELU_CUBIC) * (x * x))
    return dy * (cdf + 0.5 * x * (1.0 - t * t) * du_dx)


def plain_attention(Q, K, U, keep, dO):
    """The attention core and its backward as plain NumPy lines (each step a fresh array): O, P, dQ, dK, dU."""
    scale = 1.0 / math.sqrt(Q.shape[-1])                     # a Python float: the arrays keep their dtype
    A = (Q @ K.swapaxes(-1, -2)) * scale
    if keep is not None:
        A = np.where(keep, A, np.finfo(A.dtype).min / 2)
    e = np.exp(A - A.max(axis=-1, keepdims=True))
    if keep is not None:
        e *= keep
    total = e.sum(axis=-1, keepdims=True)
    P = e / np.where(total > 0, total, 1)
    dP = dO @ U.swapaxes(-1, -2)
    dA = P * (dP - (dP * P).sum(axis=-1, keepdims=True))
    return P @ U, P, (dA @ K) * scale, (dA.swapaxes(-1, -2) @ Q) * scale, P.swapaxes(-1, -2) @ dO


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, THREADS])
def test_in_place_steps_are_the_plain_lines(dtype, threads):
    """GELU's tanh form and the attention core compute each step into an array they already have (no fresh
    array for each operation); the comments above them hold the plain NumPy lines, and these are what the
    code computes, bit for bit, on one thread and on several (the same operations in the same order)."""
    x, dy = rand((64, 16, 96), 21, dtype, scale=3.0), rand((64, 16, 96), 22, dtype)
    with backend.thread_count(threads):
        gelu = GELU("tanh")
        y = gelu(x)
        dx = gelu.backward(dy)
    y_plain, cdf, t = plain_gelu_tanh(x)
    assert same_bytes(y, y_plain)
    assert same_bytes(dx, plain_gelu_tanh_backward(dy, x, cdf, t))
    B, H, T, dk = 8, 4, 100, 24
    Q, K, U, dO = (rand((B, H, T, dk), seed, dtype) for seed in (23, 24, 25, 26))
    for keep in (None, ~np.triu(np.ones((T, T), dtype=bool), k=1)[None, None],
                 (np.arange(T)[None, :] < np.array([T, 1, 50, 0, 7, T, 3, 99])[:, None])[:, None, None, :]):
        with backend.thread_count(threads):
            O, P = scaled_dot_product_attention(Q, K, U, keep)
            grads = scaled_dot_product_attention_backward(dO, Q, K, U, P)
        assert_all_same_bytes(plain_attention(Q, K, U, keep, dO), (O, P) + tuple(grads))


def test_softmax_and_its_backward_threaded_are_bit_identical(splits):
    def run():
        x, dy = rand((8, 8, 64, 64), 8, scale=4.0), rand((8, 8, 64, 64), 9)
        y = softmax(x)
        return y, softmax_backward(y, dy)
    plain, threaded = one_and_many(run, splits, calls=2)
    assert_all_same_bytes(plain, threaded)


def test_embedding_gradient_threaded_is_bit_identical_with_repeated_ids(splits):
    def run():
        backend.manual_seed(0)
        emb = Embedding(3000, 256, padding_idx=0)
        emb.weight.grad[...] = rand(emb.weight.shape, 10)              # a tied output projection's part first
        ids = np.random.default_rng(11).integers(0, 40, (64, 32))      # 40 ids over 2048 positions: many repeats
        emb(ids)
        emb.backward(backend.asarray(rand((64, 32, 256), 12)))
        return emb.weight.grad
    plain, threaded = one_and_many(run, splits, calls=2)
    assert_all_same_bytes(plain, threaded)
    assert len(splits["threads"]) > 1


def test_add_at_rows_threaded_counts_a_negative_index_as_its_row(splits):
    """-1 and V - 1 name one row: its contributions are added in their order, by one thread, as add.at adds them."""
    def run():
        target = rand((50, 300), 21)
        index = np.random.default_rng(22).integers(-50, 50, 2000)
        backend.add_at_rows(target, index, rand((2000, 300), 23))
        return target
    plain, threaded = one_and_many(run, splits)
    assert_all_same_bytes(plain, threaded)
    reference = rand((50, 300), 21)
    np.add.at(reference, np.random.default_rng(22).integers(-50, 50, 2000), rand((2000, 300), 23))
    assert same_bytes(threaded, reference)


# --------------------------------------------------------------------------- #
# Attention: the core (scores, mask, softmax, P U) and its backward, and decoding with the cache
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("mask", ["none", "padding", "causal", "dropout"])
@pytest.mark.parametrize("B, H, T, dk", [(16, 8, 48, 64), (4, 4, 96, 64)], ids=["whole_core", "softmax_only"])
def test_attention_core_and_backward_threaded_are_bit_identical(splits, mask, B, H, T, dk):
    """Small heads run the whole core on blocks of rows; from SMALL_PRODUCT multiply-adds a head, the products
    stay on BLAS's threads and only the softmax and its backward are split. "dropout": a dropout mask on the
    weights (B, H, T, T), split with the rows, and no keep-mask."""
    from minitf import attention
    assert (T * T * dk < attention.SMALL_PRODUCT) == (T == 48)

    def run():
        Q, K, U = (rand((B, H, T, dk), seed) for seed in (13, 14, 15))
        keep = None
        if mask == "padding":
            keep = ~(np.arange(T)[None, :] >= np.random.default_rng(16).integers(1, T + 1, B)[:, None])
            keep = keep[:, None, None, :]                               # (B, 1, 1, T): split with the rows
        elif mask == "causal":
            keep = ~np.triu(np.ones((T, T), dtype=bool), k=1)[None, None]   # (1, 1, T, T): passed whole
        drop = None
        if mask == "dropout":                                           # 0 or 1 / (1 - p), as Dropout.mask_of
            drop = (np.random.default_rng(18).random((B, H, T, T)) >= 0.3).astype(np.float32) / np.float32(0.7)
        O, P = scaled_dot_product_attention(Q, K, U, keep, drop)
        return (O, P) + scaled_dot_product_attention_backward(rand((B, H, T, dk), 17), Q, K, U, P, drop)
    plain, threaded = one_and_many(run, splits, calls=2)
    assert_all_same_bytes(plain, threaded)


def test_cached_decoding_attention_threaded_is_bit_identical(splits):
    """One query a row against its key/value cache (greedy), and beams against one memory (forward_beams)."""
    B, G, S, D = 32, 4, 40, 512

    def run():
        backend.manual_seed(0)
        attention = MultiHeadAttention(D, 8)
        memory = backend.asarray(rand((B, S, D), 18))
        outputs = []
        with no_grad():
            self_cache, cross_cache = {}, {}
            for step in range(20):
                x = backend.asarray(rand((B * G, 1, D), 19 + step))
                outputs.append(attention(x, cache=self_cache))                       # self-attention, cached
                outputs.append(attention(x, memory, cache=cross_cache))             # G beams per memory row
        return outputs
    plain, threaded = one_and_many(run, splits, calls=20)
    assert_all_same_bytes(plain, threaded)


def test_greedy_and_beam_decoding_give_the_same_tokens_threaded(splits, monkeypatch):
    """A small model's arrays are under the default threshold: lowered here, so that decoding's every call splits."""
    from minitf.nmt.decode import beam_search_nbest, greedy_decode
    monkeypatch.setattr(backend, "THREAD_MIN_ELEMENTS", 64)
    monkeypatch.setattr(backend, "THREAD_BLOCK_ELEMENTS", 64)
    V = 23

    def run():
        backend.manual_seed(1)
        model = minitf.Transformer(V, V, d_model=16, num_heads=4, num_encoder_layers=2, num_decoder_layers=2,
                                   d_ff=32, dropout=0.1)
        src = np.random.default_rng(20).integers(3, V, (5, 7))
        greedy = greedy_decode(model, src, max_len=9)
        beams = beam_search_nbest(model, src, beam_size=3, alpha=0.6, max_len=9)
        return greedy, beams
    with backend.thread_count(1):
        plain = run()
    with backend.thread_count(THREADS):
        threaded = run()
    assert splits["calls"] > 20
    assert threaded[0] == plain[0]
    assert [[h for h, _ in e] for e in threaded[1]] == [[h for h, _ in e] for e in plain[1]]
    assert [[s for _, s in e] for e in threaded[1]] == [[s for _, s in e] for e in plain[1]]


# --------------------------------------------------------------------------- #
# Decoding's normalizer over the vocabulary: beam search's log-softmax, the sampler's softmax
# --------------------------------------------------------------------------- #
def test_beam_search_normalizer_threaded_is_bit_identical(splits):
    """The shift and exp of (beams x sentences, V) logits on blocks of rows (nmt/decode.py), banned ids at -inf."""
    from minitf.nmt.decode import row_sums, shifted_exp_sums

    def run():
        logits = rand((32, 5000), 24, scale=3.0)                        # 32 rows of 5000: 160K elements
        logits[:, [0, 7]] = -np.inf                                    # banned: exp gives 0
        row_max = logits.max(axis=1, keepdims=True)
        sums = shifted_exp_sums(logits, row_max)
        return logits, sums
    plain, threaded = one_and_many(run, splits)
    assert_all_same_bytes(plain, threaded)
    logits = rand((32, 5000), 24, scale=3.0)
    logits[:, [0, 7]] = -np.inf
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))      # the plain lines, out of place
    assert same_bytes(threaded[0], shifted) and same_bytes(threaded[1], row_sums(shifted))
    assert not threaded[0][:, [0, 7]].any()


@pytest.mark.parametrize("top_k, top_p", [(None, None), (40, 0.9)])
def test_sampling_softmax_threaded_is_bit_identical(splits, monkeypatch, top_k, top_p):
    """The sampler's softmax over (B, V) host logits (sampling.py's choose_tokens) on blocks of rows: the same
    probabilities, so the same tokens from the same generator."""
    from minitf.sampling import choose_tokens
    softmaxes, by_rows = [], backend.by_rows

    def recorded(fn, *arrays):
        result = by_rows(fn, *arrays)
        softmaxes.append(result)
        return result
    monkeypatch.setattr(backend, "by_rows", recorded)

    def run():
        logits = rand((8, 50257), 25, np.float64, scale=4.0)
        tokens = choose_tokens(logits, temperature=0.8, top_k=top_k, top_p=top_p, rng=np.random.default_rng(26))
        return tokens, softmaxes[-1]
    plain, threaded = one_and_many(run, splits)
    assert_all_same_bytes(plain, threaded)
    assert threaded[1].shape == (8, 50257) and np.allclose(threaded[1].sum(axis=-1), 1.0)


def test_generation_gives_the_same_tokens_threaded(splits, monkeypatch):
    """A small GPT's sampling, every call split (the threshold lowered), from the same seed: the same tokens."""
    monkeypatch.setattr(backend, "THREAD_MIN_ELEMENTS", 64)
    monkeypatch.setattr(backend, "THREAD_BLOCK_ELEMENTS", 64)

    def run():
        backend.manual_seed(2)
        model = minitf.GPT(vocab_size=97, max_len=32, d_model=16, num_heads=2, num_layers=2, d_ff=32, dropout=0.0)
        prompt = np.random.default_rng(27).integers(0, 97, (6, 5))
        return minitf.sampling.generate(model, prompt, 12, temperature=0.9, top_p=0.95, seed=28)
    plain, threaded = one_and_many(run, splits, calls=12)
    assert_all_same_bytes(plain, threaded)


def test_openblas_idle_threads_are_told_to_sleep_at_once_unless_the_user_says_otherwise():
    """Importing minitf sets OPENBLAS_THREAD_TIMEOUT (read once, when NumPy loads OpenBLAS) to 16 where it is unset,
    so that OpenBLAS's idle threads do not spin on the cores by_rows' threads need; a user's own value is kept."""
    import os
    import subprocess
    import sys
    show = "import minitf, os; print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    unset = subprocess.run([sys.executable, "-c", show], env=env, capture_output=True, text=True, check=True)
    assert unset.stdout.strip() == "16"
    own = subprocess.run([sys.executable, "-c", show], env=env | {"OPENBLAS_THREAD_TIMEOUT": "20"},
                         capture_output=True, text=True, check=True)
    assert own.stdout.strip() == "20"
