"""Gradient and property tests of the small layers (float64 central differences).

Tolerances: relative error below 1e-6 unless a test says otherwise; central
differences with h = 1e-6 in float64 give errors around 1e-9 on smooth functions.
"""
import math
import warnings

import pytest
from hypothesis import assume, given, strategies as st

import minitf
from minitf import backend
from minitf.backend import xp
from minitf.layers import (ACTIVATIONS, Dropout, Embedding, LayerNorm, Linear, OutputProjection, PositionalEncoding,
                           ReLU, SiLU, Softmax, Tanh, make_activation, sigmoid, sinusoidal_table,
                           softmax)
from minitf.module import Parameter, stacked_forwards
from tests.helpers import assert_gradients_match, np, random_array, seeds, small

pytestmark = pytest.mark.usefixtures("float64")


@given(B=small, L=small, d_in=small, d_out=small, bias=st.booleans(), seed=seeds,
       scale=st.floats(0.1, 10))
def test_linear_gradients(B, L, d_in, d_out, bias, seed, scale):
    layer = Linear(d_in, d_out, bias=bias)
    x = random_array(seed, (B, L, d_in), scale)
    params = {"weight": layer.weight} | ({"bias": layer.bias} if bias else {})
    assert_gradients_match(layer.forward, layer.backward, {"x": x}, params, seed=seed)


@given(B=small, L=small, V=st.integers(1, 6), D=small, seed=seeds)
def test_embedding_gradients_with_repeated_ids(B, L, V, D, seed):
    layer = Embedding(V, D)
    # few distinct ids so repeats are common: add.at must sum them
    ids = backend.asarray(np.random.default_rng(seed).integers(0, V, (B, L)))
    assert_gradients_match(lambda: layer.forward(ids), lambda dy: layer.backward(dy), {},
                           {"weight": layer.weight}, seed=seed)


def test_embedding_is_scaled_by_sqrt_d_model():
    layer = Embedding(5, 16)
    ids = backend.asarray(np.array([[3, 1]]))
    expected = backend.to_numpy(layer.weight.data)[[3, 1]] * 4.0
    assert np.allclose(backend.to_numpy(layer.forward(ids))[0], expected)


@given(B=small, T=small, V=small, D=small, seed=seeds)
def test_tied_projection_gradients(B, T, V, D, seed):
    weight = Parameter(random_array(seed + 1, (V, D)))
    layer = OutputProjection(weight)
    h = random_array(seed, (B, T, D))
    assert_gradients_match(layer.forward, layer.backward, {"h": h}, {"weight": weight}, seed=seed)


@given(B=small, L=small, V=st.integers(2, 6), D=small, seed=seeds)
def test_embedding_padding_row_gets_no_gradient_from_its_lookups(B, L, V, D, seed):
    """``padding_idx`` (Marian's, PyTorch's nn.Embedding option): the gradient of the function in which the
    padding row is a constant, the other rows as before."""
    rng = np.random.default_rng(seed)
    ids = backend.asarray(rng.integers(0, V, (B, L)))
    pad = int(rng.integers(0, V))
    layer = Embedding(V, D, padding_idx=pad)
    layer.weight.data[...] = random_array(seed, (V, D))
    G = random_array(seed + 1, (B, L, D))
    layer.forward(ids)
    layer.backward(G)
    plain = Embedding(V, D)
    plain.weight.data[...] = layer.weight.data
    plain.forward(ids)
    plain.backward(G)
    frozen, full = backend.to_numpy(layer.weight.grad), backend.to_numpy(plain.weight.grad)
    assert np.array_equal(frozen[pad], np.zeros(D))
    others = np.arange(V) != pad
    assert np.allclose(frozen[others], full[others], rtol=1e-14, atol=0)
    assert np.array_equal(backend.to_numpy(G), backend.to_numpy(random_array(seed + 1, (B, L, D))))  # dy kept


@given(B=small, T=small, V=small, D=small, seed=seeds, tied=st.booleans())
def test_output_projection_with_a_bias_gradients(B, T, V, D, seed, tied):
    """Marian's logits: h W^T + b (final_logits_bias); the bias starts at 0, and is randomised here."""
    embedding = Embedding(V, D)
    layer = OutputProjection(embedding.weight if tied else Parameter(random_array(seed + 1, (V, D))), bias=True)
    assert np.array_equal(backend.to_numpy(layer.bias.data), np.zeros(V))
    layer.bias.data[...] = random_array(seed + 2, (V,))
    assert_gradients_match(layer.forward, layer.backward, {"h": random_array(seed, (B, T, D))},
                           {"weight": layer.weight, "bias": layer.bias}, seed=seed)


def test_tied_weight_accumulates_both_uses():
    """One Parameter used by an Embedding and the projection gets the sum of both gradients."""
    embedding = Embedding(7, 4)
    projection = OutputProjection(embedding.weight)
    ids = backend.asarray(np.array([[1, 2, 2]]))
    G = random_array(1, (1, 3, 7))
    projection.forward(embedding.forward(ids))
    embedding.backward(projection.backward(G))
    both = backend.to_numpy(embedding.weight.grad).copy()
    # the two uses separately, written out: dW = G^T h (projection) + scatter of dh * sqrt(D) (embedding)
    W = backend.to_numpy(embedding.weight.data)
    h = W[[1, 2, 2]] * 2.0
    g = backend.to_numpy(G)[0]
    expected = g.T @ h
    dh = g @ W
    for row, token in enumerate([1, 2, 2]):
        expected[token] += dh[row] * 2.0
    assert np.allclose(both, expected, atol=1e-12)


@given(L=st.integers(1, 12), D=st.integers(1, 9), start=st.integers(0, 50))
def test_positional_encoding_matches_formula(L, D, start):
    table = backend.to_numpy(sinusoidal_table(L, D, start=start))
    for pos in range(L):
        for i in range(D):
            angle = (start + pos) / 10000 ** ((i - i % 2) / D)
            expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
            assert abs(table[pos, i] - expected) < 1e-9


@given(L=st.integers(1, 12), D=st.integers(1, 9), start=st.integers(0, 50))
def test_positional_encoding_in_halves_matches_marians_formula(L, D, start):
    """Marian (transformers' MarianSinusoidalPositionalEmbedding): the sines of every frequency, then the
    cosines: PE(pos, j) = sin(pos / 10000^(2j/D)) for j < ceil(D/2), PE(pos, ceil(D/2) + j) = cos(...)."""
    table = backend.to_numpy(sinusoidal_table(L, D, start=start, layout="halves"))
    half = (D + 1) // 2
    for pos in range(L):
        for i in range(D):
            j = i if i < half else i - half
            angle = (start + pos) / 10000 ** (2 * j / D)
            expected = math.sin(angle) if i < half else math.cos(angle)
            assert abs(table[pos, i] - expected) < 1e-9
    # the same numbers as the paper's table, its columns renamed: sines (even columns) first
    interleaved = backend.to_numpy(sinusoidal_table(L, D, start=start))
    assert np.array_equal(table, interleaved[:, np.r_[0:D:2, 1:D:2]])
    pe = PositionalEncoding(D, layout="halves")
    assert np.array_equal(backend.to_numpy(pe.forward(xp.zeros((1, L, D)), start=start))[0], table)
    with pytest.raises(ValueError, match="interleaved, halves"):
        PositionalEncoding(D, layout="blocks")


def test_positional_encoding_beyond_training_lengths_and_offsets():
    pe = PositionalEncoding(8)
    x = xp.zeros((1, 3, 8))
    pe.forward(x)                                  # table built for a short length
    long = backend.to_numpy(pe.forward(xp.zeros((1, 5000, 8))))
    assert long.shape == (1, 5000, 8) and np.isfinite(long).all()
    # position 4321 alone (as in incremental decoding) equals row 4321 of the full table
    one = backend.to_numpy(pe.forward(xp.zeros((1, 1, 8)), start=4321))
    assert np.allclose(one[0, 0], long[0, 4321])


@given(B=small, L=small, D=small, seed=seeds)
def test_positional_encoding_gradient(B, L, D, seed):
    pe = PositionalEncoding(D)
    assert_gradients_match(pe.forward, pe.backward, {"x": random_array(seed, (B, L, D))}, seed=seed)


@given(B=small, L=small, D=small, p=st.floats(0.05, 0.9), seed=seeds)
def test_dropout_gradients_with_a_fixed_mask(B, L, D, p, seed):
    layer = Dropout(p)
    x = random_array(seed, (B, L, D))
    assert_gradients_match(layer.forward, layer.backward, {"x": x}, seed=seed, reseed=seed)


def test_dropout_keeps_expected_value_and_is_identity_in_eval():
    layer = Dropout(0.3)
    x = xp.ones((200, 500))
    with minitf.no_grad():                                  # outputs only: no cache for a backward
        y = backend.to_numpy(layer.forward(x))
    assert abs(y.mean() - 1.0) < 0.01                    # E[y] = x, 100k samples: std ~0.002
    assert abs((y == 0).mean() - 0.3) < 0.01
    assert set(np.unique(y)) <= {0.0, 1 / 0.7}
    layer.eval()
    assert layer.forward(x) is x


def test_dropout_is_seeded():
    layer = Dropout(0.5)
    with minitf.no_grad():                                  # outputs only: no cache for a backward
        backend.manual_seed(5)
        a = backend.to_numpy(layer.forward(xp.ones((4, 9))))
        backend.manual_seed(5)
        b = backend.to_numpy(layer.forward(xp.ones((4, 9))))
    assert np.array_equal(a, b)


@given(B=small, L=small, D=st.integers(2, 6), seed=seeds, scale=st.floats(0.01, 100), shift=st.floats(-50, 50))
def test_layernorm_gradients(B, L, D, seed, scale, shift):
    layer = LayerNorm(D)
    layer.gamma.data[...] = random_array(seed + 1, (D,))
    layer.beta.data[...] = random_array(seed + 2, (D,))
    x = random_array(seed, (B, L, D), scale) + shift
    # tolerance 1e-5: rows of tiny variance make the function steep at scale 0.01
    assert_gradients_match(layer.forward, layer.backward, {"x": x},
                           {"gamma": layer.gamma, "beta": layer.beta}, seed=seed, tol=1e-5)


@given(D=st.integers(2, 64), seed=seeds, scale=st.floats(0.01, 100))
def test_layernorm_output_has_zero_mean_unit_variance(D, seed, scale):
    y = backend.to_numpy(LayerNorm(D, eps=0.0).forward(random_array(seed, (3, D), scale)))
    assert np.allclose(y.mean(-1), 0, atol=1e-9)
    assert np.allclose(y.var(-1), 1, atol=1e-6)


@given(B=small, L=small, D=small, seed=seeds)
def test_relu_gradients(B, L, D, seed):
    x = random_array(seed, (B, L, D))
    assume(float(abs(x).min()) > 1e-3)  # keep away from the kink at 0
    layer = ReLU()
    assert_gradients_match(layer.forward, layer.backward, {"x": x}, seed=seed)


@given(B=small, L=small, D=small, seed=seeds, scale=st.floats(0.1, 20))
def test_silu_gradients(B, L, D, seed, scale):
    """SiLU (Marian's swish): smooth everywhere, so no input needs to keep away from a kink."""
    assert_gradients_match(SiLU(), random_array(seed, (B, L, D), scale), seed=seed)


@given(B=small, L=small, D=small, seed=seeds, scale=st.floats(0.1, 5))
def test_tanh_gradients(B, L, D, seed, scale):
    """Tanh (BERT's pooler): smooth everywhere; its backward reads only the output, 1 - y^2."""
    assert_gradients_match(Tanh(), random_array(seed, (B, L, D), scale), seed=seed)


def test_tanh_saturates_without_nan_and_keeps_the_dtype():
    x = np.array([-1000.0, -20.0, 0.0, 0.5, 20.0, 1000.0])
    layer = Tanh()
    y = backend.to_numpy(layer.forward(backend.asarray(x)))
    dx = backend.to_numpy(layer.backward(backend.asarray(np.ones_like(x))))
    assert np.array_equal(y, np.tanh(x)) and y[0] == -1.0 and y[-1] == 1.0
    assert dx[2] == 1.0 and dx[0] == 0.0 and abs(dx[3] - (1 - math.tanh(0.5) ** 2)) < 1e-15
    assert Tanh().forward(backend.asarray(x.astype(np.float32))).dtype == np.float32


def test_silu_is_x_times_the_sigmoid_without_overflow():
    x = np.concatenate([np.linspace(-30, 30, 601), [0.0, -745.0, -1000.0, 1000.0, 710.0]])
    layer = SiLU()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exp(-x) overflows on the far left, as meant: no warning comes out
        y = backend.to_numpy(layer.forward(backend.asarray(x)))
        s = backend.to_numpy(sigmoid(backend.asarray(x)))
        dx = backend.to_numpy(layer.backward(backend.asarray(np.ones_like(x))))
        for dtype in (np.float32, np.float16):  # the input's dtype is kept, in float16 too
            low = SiLU().forward(backend.asarray(x.astype(dtype)))
            assert low.dtype == dtype and np.isfinite(backend.to_numpy(low)).all()
        # float16 works in float32: sigmoid(-12) = 6.1e-6 is no 0 (float16's own exp(12) overflows)
        assert sigmoid(backend.asarray(np.array([-12.0], np.float16)))[0] == np.float16(1 / (1 + math.exp(12)))
    exact = [v / (1 + math.exp(-v)) if v > -700 else 0.0 for v in x]
    assert np.allclose(y, exact, rtol=1e-14, atol=1e-300)
    assert s[-3] == 0.0 and s[-2] == 1.0 and y[-2] == 1000.0 and y[-3] == 0.0
    assert 0.0 <= s[-4] < 1e-300  # exp(-745): the smallest subnormal on the CPU; CUDA's exp flushes it to 0
    # dy/dx = s + x s (1 - s): 1/2 at 0, 1 far right, 0 far left, finite everywhere
    assert dx[601] == 0.5 and dx[-2] == 1.0 and dx[-3] == 0.0 and np.isfinite(dx).all()
    assert isinstance(make_activation("silu"), SiLU) and "silu" in ACTIVATIONS


@given(B=small, L=small, D=small, seed=seeds, scale=st.floats(0.1, 30))
def test_softmax_gradients_and_rows_sum_to_one(B, L, D, seed, scale):
    layer = Softmax()
    x = random_array(seed, (B, L, D), scale)
    y = backend.to_numpy(layer.forward(x))
    # the rows sum to 1, so a gradient equal on every entry of a row changes nothing: dx = 0
    # (exactly y * (1 - sum(y)), which is zero up to the rounding of that sum)
    dx = backend.to_numpy(layer.backward(xp.ones_like(x)))
    assert (np.abs(dx) <= 2 * D * np.finfo(dx.dtype).eps * y).all(), np.abs(dx).max()
    assert np.allclose(y.sum(-1), 1.0) and (y >= 0).all()
    assert_gradients_match(layer.forward, layer.backward, {"x": x}, seed=seed)


def test_softmax_is_stable_for_huge_logits():
    y = backend.to_numpy(softmax(xp.asarray([[1e4, 1e4 - 1, -1e4]])))
    assert np.isfinite(y).all() and np.allclose(y.sum(), 1)


def test_module_called_twice_keeps_both_caches():
    """The second forward must not overwrite the first one's cache: backward pops in reverse."""
    layer = Linear(3, 2)
    x1, x2 = random_array(1, (2, 3)), random_array(2, (2, 3))
    g1, g2 = random_array(3, (2, 2)), random_array(4, (2, 2))
    with stacked_forwards():                                # as a layer called twice within one forward
        layer.forward(x1)
        layer.forward(x2)
    dx2 = layer.backward(g2)
    dx1 = layer.backward(g1)
    expected_dw = backend.to_numpy(x1.T @ g1 + x2.T @ g2)
    assert np.allclose(backend.to_numpy(layer.weight.grad), expected_dw)
    assert np.allclose(backend.to_numpy(dx1), backend.to_numpy(g1 @ layer.weight.data.T))
    assert np.allclose(backend.to_numpy(dx2), backend.to_numpy(g2 @ layer.weight.data.T))
    with pytest.raises(RuntimeError, match="without a matching forward"):
        layer.backward(g1)


def test_no_grad_saves_nothing():
    layer = Linear(3, 2)
    with minitf.no_grad():
        layer.forward(random_array(1, (2, 3)))
    with pytest.raises(RuntimeError):
        layer.backward(random_array(1, (2, 2)))
