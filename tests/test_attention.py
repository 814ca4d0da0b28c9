"""Scaled dot-product and multi-head attention: gradients with random padding and
causal masks (and dropout on the weights, a fixed mask), all-masked rows, and the masks' effect on outputs.
Tolerance: see tests/helpers.assert_gradients_match (rtol 1e-6, atol 1e-7)."""
import pytest
from hypothesis import given, strategies as st

from minitf import backend
from minitf.attention import (MultiHeadAttention, T5Attention, append_to_cache, attention_keep_mask,
                              biased_attention, biased_attention_backward, scaled_dot_product_attention,
                              scaled_dot_product_attention_backward)
from minitf.backend import xp
from minitf.layers import Dropout
from minitf.module import no_grad
from tests.helpers import assert_gradients_match, np, padding_masks, random_array, seeds, small

pytestmark = pytest.mark.usefixtures("float64")


@given(data=st.data(), B=small, H=st.integers(1, 3), Tq=small, Tk=small, dk=small, seed=seeds,
       causal=st.booleans())
def test_scaled_dot_product_attention_gradients(data, B, H, Tq, Tk, dk, seed, causal):
    Q, K, V = (random_array(seed + i, shape) for i, shape in enumerate([(B, H, Tq, dk), (B, H, Tk, dk), (B, H, Tk, dk)]))
    pad = data.draw(padding_masks(B, Tk, allow_all_padded=True))
    keep = attention_keep_mask(pad, causal, Tq, Tk)
    saved = {}

    def forward(Q, K, V):
        O, saved["P"] = scaled_dot_product_attention(Q, K, V, keep)
        return O

    def backward(dO):
        return scaled_dot_product_attention_backward(dO, Q, K, V, saved["P"])

    assert_gradients_match(forward, backward, {"Q": Q, "K": K, "U": V}, seed=seed)


@given(data=st.data(), B=small, H=st.integers(1, 3), Tq=small, Tk=small, dk=small, seed=seeds,
       causal=st.booleans(), p=st.floats(0.05, 0.9), biased=st.booleans())
def test_attention_gradients_with_dropout_on_the_weights(data, B, H, Tq, Tk, dk, seed, causal, p, biased):
    """O = dropout(P) U with one fixed mask (drawn once by a Dropout, as the modules draw it): Q, K, U (and T5's
    bias) against central differences, through the mask and then the softmax; the weights P returned are the
    softmax's, before dropout."""
    Q, K, V = (random_array(seed + i, shape) for i, shape in enumerate([(B, H, Tq, dk), (B, H, Tk, dk), (B, H, Tk, dk)]))
    bias = random_array(seed + 3, (1, H, Tq, Tk)) if biased else None
    keep = attention_keep_mask(data.draw(padding_masks(B, Tk, allow_all_padded=True)), causal, Tq, Tk)
    backend.manual_seed(seed)
    drop = Dropout(p).draw_mask((B, H, Tq, Tk), Q.dtype)

    def attention(Q, K, U, bias=None, drop=drop):
        return biased_attention(Q, K, U, bias, keep, drop) if biased else scaled_dot_product_attention(Q, K, U, keep,
                                                                                                      drop)
    saved = {}

    def forward(*inputs):
        O, saved["P"] = attention(*inputs)
        return O

    def backward(dO):
        if not biased:
            return scaled_dot_product_attention_backward(dO, Q, K, V, saved["P"], drop)
        dQ, dK, dU, dA = biased_attention_backward(dO, Q, K, V, saved["P"], drop)
        return dQ, dK, dU, dA.sum(axis=0, keepdims=True)         # the bias broadcast over the batch

    inputs = {"Q": Q, "K": K, "U": V} | ({"bias": bias} if biased else {})
    assert_gradients_match(forward, backward, inputs, seed=seed)
    O, P = attention(Q, K, V, bias)
    assert np.array_equal(backend.to_numpy(P), backend.to_numpy(attention(Q, K, V, bias, drop=None)[1]))
    np.testing.assert_allclose(backend.to_numpy(O), backend.to_numpy((P * drop) @ V), rtol=1e-12, atol=1e-12)


@given(B=small, Tq=small, Tk=small, seed=seeds)
def test_all_masked_rows_give_zeros_not_nan(B, Tq, Tk, seed):
    Q, K, V = random_array(seed, (B, 2, Tq, 3)), random_array(seed + 1, (B, 2, Tk, 3)), random_array(seed + 2, (B, 2, Tk, 3))
    keep = xp.zeros((B, 1, 1, Tk), dtype=bool)
    O, P = scaled_dot_product_attention(Q, K, V, keep)
    assert np.array_equal(backend.to_numpy(O), np.zeros(O.shape))
    dQ, dK, dV = scaled_dot_product_attention_backward(xp.ones_like(O), Q, K, V, P)
    for g in (dQ, dK, dV):
        assert np.isfinite(backend.to_numpy(g)).all() and not backend.to_numpy(g).any()


def test_attention_weights_sum_to_one_and_respect_the_mask():
    Q, K, V = random_array(1, (2, 1, 4, 3)), random_array(2, (2, 1, 5, 3)), random_array(3, (2, 1, 5, 3))
    pad = backend.asarray(np.array([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]], dtype=bool))
    _, P = scaled_dot_product_attention(Q, K, V, attention_keep_mask(pad, True, 4, 5))
    P = backend.to_numpy(P)
    assert np.allclose(P.sum(-1), 1)
    assert (P[0, :, :, 3:] == 0).all()                     # padding keys get no weight
    assert (np.triu(P[1, 0], k=2) == 0).all()              # query i sees keys <= i + (Tk - Tq)


@given(data=st.data(), B=small, T=small, H=st.integers(1, 3), dk=st.integers(1, 3), seed=seeds,
       causal=st.booleans(), p=st.sampled_from([0.0, 0.4]))
def test_multihead_self_attention_gradients(data, B, T, H, dk, seed, causal, p):
    """With dropout p on the weights the backend is reseeded before each forward: the same mask every time."""
    D = H * dk
    mha = MultiHeadAttention(D, H, dropout=p)
    for p in mha.parameters():  # non-zero biases so their gradients are exercised
        p.data[...] = random_array(seed + 7, p.shape, 0.5)
    x = random_array(seed, (B, T, D))
    pad = data.draw(padding_masks(B, T, allow_all_padded=True))
    assert_gradients_match(lambda x: mha.forward(x, key_padding_mask=pad, causal=causal),
                           mha.backward, {"x": x}, dict(mha.named_parameters()), seed=seed, reseed=seed)


@given(data=st.data(), B=small, T=small, S=small, H=st.integers(1, 3), dk=st.integers(1, 3), seed=seeds,
       p=st.sampled_from([0.0, 0.4]))
def test_multihead_cross_attention_gradients(data, B, T, S, H, dk, seed, p):
    D = H * dk
    mha = MultiHeadAttention(D, H, dropout=p)
    for p in mha.parameters():
        p.data[...] = random_array(seed + 7, p.shape, 0.5)
    x, memory = random_array(seed, (B, T, D)), random_array(seed + 1, (B, S, D))
    pad = data.draw(padding_masks(B, S))
    assert_gradients_match(lambda x, m: mha.forward(x, m, key_padding_mask=pad), mha.backward,
                           {"x": x, "memory": memory}, dict(mha.named_parameters()), seed=seed, reseed=seed)


@pytest.mark.parametrize("make", [lambda p: MultiHeadAttention(6, 2, dropout=p), lambda p: T5Attention(6, 2, 3, p)],
                         ids=["multi-head", "T5"])
def test_dropout_on_the_weights_draws_nothing_when_off_and_drops_while_training(make):
    """p = 0, or eval mode: no random number is drawn (the stream after the forward is the one before it: every
    run without attention dropout stays as it was) and the output is the undropped one, bit for bit; training
    with p > 0: the weights the module keeps are the softmax's, its output is another."""
    x = random_array(1, (2, 5, 6))
    plain, dropping = make(0.0), make(0.5)
    for name, parameter in dropping.named_parameters():
        parameter.data[...] = dict(plain.named_parameters())[name].data
    plain.record_weights = dropping.record_weights = True

    def forward_and_next_draw(module):
        backend.manual_seed(3)
        with no_grad():
            y = backend.to_numpy(module(x, causal=True))
        return y, backend.to_numpy(backend.rng().random(4))

    expected, next_draw = forward_and_next_draw(plain)
    for module in (plain, dropping.eval()):
        y, draw = forward_and_next_draw(module)
        assert np.array_equal(y, expected) and np.array_equal(draw, next_draw)
    y, draw = forward_and_next_draw(dropping.train())
    assert not np.allclose(y, expected) and not np.array_equal(draw, next_draw)
    assert np.array_equal(backend.to_numpy(dropping.weights), backend.to_numpy(plain.weights))


@given(data=st.data(), B=small, G=st.integers(1, 4), T=small, S=small, H=st.integers(1, 3), dk=st.integers(1, 3),
       seed=seeds, cached=st.booleans())
def test_beams_attend_to_one_memory_per_sentence_as_to_repeated_copies(data, B, G, T, S, H, dk, seed, cached):
    """Cross-attention of G beams per sentence (x (B*G, T, D), memory (B, S, D), as beam search calls it)
    equals attending to the memory repeated G times, with or without the key/value cache; with gradients
    on, a memory whose batch is not the queries' is refused."""
    from minitf.module import no_grad
    D = H * dk
    mha = MultiHeadAttention(D, H)
    for p in mha.parameters():
        p.data[...] = random_array(seed + 7, p.shape, 0.5)
    x, memory = random_array(seed, (B * G, T, D)), random_array(seed + 1, (B, S, D))
    pad = data.draw(padding_masks(B, S))
    with no_grad():
        repeated = mha.forward(x, xp.repeat(memory, G, axis=0), key_padding_mask=xp.repeat(pad, G, axis=0))
        cache = {} if cached else None
        grouped = mha.forward(x, memory, key_padding_mask=pad, cache=cache)
        if cached:  # the second step reads the memory's projections from the cache
            grouped = mha.forward(x, memory, key_padding_mask=pad, cache=cache)
    assert grouped.shape == (B * G, T, D)
    np.testing.assert_allclose(backend.to_numpy(grouped), backend.to_numpy(repeated), rtol=1e-12, atol=1e-12)
    if G > 1:
        with pytest.raises(ValueError, match="equal to the queries"):
            mha.forward(x, memory, key_padding_mask=pad)


@given(data=st.data(), B=small, D=small, seed=seeds)
def test_the_key_value_cache_holds_what_concatenating_every_step_would(data, B, D, seed):
    """append_to_cache over steps of 1 to 20 positions (through several doublings of its room) returns the
    keys and values of every position so far, as concatenating them would, and leaves its input unchanged."""
    cache, ks, vs = {}, [], []
    for step, T in enumerate(data.draw(st.lists(st.integers(1, 20), min_size=1, max_size=6), label="steps")):
        k, v = random_array(seed + 2 * step, (B, T, D)), random_array(seed + 2 * step + 1, (B, T, D))
        k_before = backend.to_numpy(k).copy()
        ks.append(k_before), vs.append(backend.to_numpy(v))
        all_k, all_v = append_to_cache(cache, k, v)
        assert np.array_equal(backend.to_numpy(all_k), np.concatenate(ks, axis=1))
        assert np.array_equal(backend.to_numpy(all_v), np.concatenate(vs, axis=1))
        assert cache["length"] == sum(x.shape[1] for x in ks) and np.array_equal(backend.to_numpy(k), k_before)


def test_d_model_must_divide_by_heads():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 3)


def _softmax_rows(A):
    """A per-row softmax written here, in float64, independent of minitf's."""
    A = np.asarray(A, dtype=np.float64)
    e = np.exp(A - A.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.usefixtures("float64")
def test_attention_without_a_mask_and_with_large_scores_is_softmax_row_by_row():
    """Edges no other attention test reached (mutation testing found them open): no mask at all (an encoder
    batch without padding), and scores of +-1000 whose rows lie far apart: each query's weights are the
    softmax of its own scores, rows sum to 1, nothing overflows."""
    rng = np.random.default_rng(0)
    Q = rng.normal(size=(1, 2, 3, 4))
    K = rng.normal(size=(1, 2, 5, 4))
    U = rng.normal(size=(1, 2, 5, 4))
    O, P = scaled_dot_product_attention(backend.asarray(Q), backend.asarray(K), backend.asarray(U), None)
    expected = _softmax_rows(Q @ K.swapaxes(-1, -2) / 2.0)
    assert np.allclose(backend.to_numpy(P), expected, rtol=1e-12, atol=0)
    assert np.allclose(backend.to_numpy(O), expected @ U, rtol=1e-12, atol=1e-15)
    Q = np.array([1.0, -1.0]).reshape(1, 1, 2, 1)        # scores 1000, 999 for query 0; -1000, -999 for query 1
    K = np.array([1000.0, 999.0]).reshape(1, 1, 2, 1)
    for keep in (None, np.ones((1, 1, 2, 2), dtype=bool)):
        _, P = scaled_dot_product_attention(backend.asarray(Q), backend.asarray(K), backend.asarray(np.ones_like(K)),
                                            None if keep is None else backend.asarray(keep))
        assert np.allclose(backend.to_numpy(P), _softmax_rows((Q @ K.swapaxes(-1, -2))[0, 0]), rtol=1e-12, atol=0)


def test_float32_attention_stays_float32():
    """A float32 model's attention weights and outputs stay float32 (a float64 fill would promote them: twice the
    memory, silently)."""
    rng = np.random.default_rng(1)
    Q, K, U = (backend.asarray(rng.normal(size=(2, 2, 3, 4)).astype(np.float32)) for _ in range(3))
    keep = backend.asarray(np.array([True, True, False])[None, None, None, :])
    O, P = scaled_dot_product_attention(Q, K, U, keep)
    assert O.dtype == np.float32 and P.dtype == np.float32
