"""T5 (minitf.t5 and its layers in minitf.attention): the relative position bias layer's gradient and the whole
model's (v1.0's ReLU and tied, scaled output; v1.1's gated GELU and its own lm_head; padded batches) against float64
central differences, the bucket function against transformers' own, the key/value cache against the full forward.
Tolerance LN_RTOL (1e-5): RMSNorm's steep rows at tiny d_model, as the Llama's whole-model test."""
import pytest
from hypothesis import given, settings, strategies as st

from minitf import backend
from minitf.attention import RelativePositionBias, T5Attention, relative_position_bucket
from minitf.module import no_grad
from minitf.t5 import T5, T5Config
from tests.helpers import LN_RTOL, assert_gradients_match, np, randomize, seeds

pytestmark = pytest.mark.usefixtures("float64")


# --------------------------------------------------------------------------- #
# The relative position bias alone
# --------------------------------------------------------------------------- #
@settings(max_examples=25)
@given(heads=st.integers(1, 3), buckets=st.integers(4, 12), max_distance=st.integers(4, 20), queries=st.integers(1, 6),
       keys=st.integers(1, 9), start=st.integers(0, 3), bidirectional=st.booleans(), seed=seeds)
def test_relative_position_bias_gradient_is_the_scatter_add_over_every_pair_of_a_bucket(
        heads, buckets, max_distance, queries, keys, start, bidirectional, seed):
    """The table's gradient against central differences: every query-key pair of a bucket adds (far pairs share
    the last buckets, so a plain indexing backward would lose all but one)."""
    max_distance = max(max_distance, (buckets // 2 if bidirectional else buckets) // 2 + 1)
    layer = randomize(RelativePositionBias(heads, buckets, max_distance, bidirectional), seed)
    assert_gradients_match(lambda: layer(queries, keys, start)[0], layer.backward, {},
                           dict(layer.named_parameters()), seed=seed)


def test_relative_position_bias_backward_sums_pairs_that_share_a_bucket():
    """A hand count: 1 head, the decoder's buckets (the past only), a gradient of ones: each table entry's
    gradient is the number of pairs in its bucket."""
    layer = RelativePositionBias(1, num_buckets=8, max_distance=16, bidirectional=False)
    layer(5, 5)
    layer.backward(backend.asarray(np.ones((1, 5, 5))))
    buckets = relative_position_bucket(np.arange(5)[None, :] - np.arange(5)[:, None], False, 8, 16)
    counts = np.bincount(buckets.reshape(-1), minlength=8)
    assert counts[0] == 15 and np.array_equal(backend.to_numpy(layer.weight.grad)[:, 0], counts)


@settings(max_examples=20)
@given(batch=st.integers(1, 3), heads=st.integers(1, 3), head_dim=st.integers(1, 3), d_model=st.integers(1, 4),
       queries=st.integers(1, 4), keys=st.integers(1, 4), cross=st.booleans(), seed=seeds, p=st.sampled_from([0.0, 0.3]))
def test_t5_attention_gradient_with_a_bias_and_padding(batch, heads, head_dim, d_model, queries, keys, cross, seed, p):
    """Self-attention (a bias, causal) or cross-attention (no bias, padded keys), with or without dropout on the
    weights (the backend reseeded: one mask): x, memory, the bias and every projection against central
    differences."""
    rng = np.random.default_rng(seed)
    layer = randomize(T5Attention(d_model, heads, head_dim, p), seed)
    x = backend.asarray(rng.normal(size=(batch, queries, d_model)))
    if cross:
        memory = backend.asarray(rng.normal(size=(batch, keys, d_model)))
        pad = rng.random((batch, keys)) < 0.4
        pad[:, 0] = False
        pad = backend.asarray(pad)
        assert_gradients_match(lambda x, memory: layer(x, memory, key_padding_mask=pad),
                               lambda dy: layer.backward(dy)[:2], {"x": x, "memory": memory},
                               dict(layer.named_parameters()), seed=seed, reseed=seed)
    else:
        bias = backend.asarray(rng.normal(size=(1, heads, queries, queries)))
        assert_gradients_match(lambda x, bias: layer(x, bias=bias, causal=True),
                               lambda dy: (lambda dx, _, dbias: (dx, dbias[None]))(*layer.backward(dy)),
                               {"x": x, "bias": bias}, dict(layer.named_parameters()), seed=seed, reseed=seed)


def test_buckets_equal_transformers_for_every_distance():
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.t5.modeling_t5")
    relative = np.arange(-700, 700)[None, :]
    for num_buckets, max_distance in [(32, 128), (32, 20), (8, 16), (5, 7), (64, 300)]:
        for bidirectional in (True, False):
            theirs = modeling.T5Attention._relative_position_bucket(
                torch.from_numpy(relative), bidirectional, num_buckets, max_distance).numpy()
            ours = relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
            assert np.array_equal(ours, theirs), (num_buckets, max_distance, bidirectional)


# --------------------------------------------------------------------------- #
# The whole model
# --------------------------------------------------------------------------- #
@st.composite
def t5_and_ids(draw):
    """A small random T5Config (v1.0's or v1.1's layout and every shape drawn), token ids (B, S) and (B, T), a
    padding mask of the input (position 0 always a token) or none."""
    layout = draw(st.sampled_from(["relu", "gated-gelu"]))
    config = T5Config(vocab_size=draw(st.integers(2, 7)), d_model=draw(st.integers(1, 4)), d_kv=draw(st.integers(1, 3)),
                      d_ff=draw(st.integers(1, 4)), num_layers=draw(st.integers(1, 2)),
                      num_decoder_layers=draw(st.integers(1, 2)), num_heads=draw(st.integers(1, 2)),
                      relative_attention_num_buckets=draw(st.integers(4, 8)), relative_attention_max_distance=6,
                      dropout_rate=0.0, feed_forward_proj=layout, tie_word_embeddings=layout == "relu",
                      pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    seed = draw(seeds)
    rng = np.random.default_rng(seed)
    B = draw(st.integers(1, 3))
    ids = rng.integers(0, config.vocab_size, (B, draw(st.integers(1, 5))))
    decoder_ids = rng.integers(0, config.vocab_size, (B, draw(st.integers(1, 4))))
    mask = None
    if draw(st.booleans()):
        mask = rng.random(ids.shape) < 0.4
        mask[:, 0] = False
    return config, ids, decoder_ids, mask, seed


@settings(max_examples=15)
@given(case=t5_and_ids())
def test_whole_t5_gradient(case):
    """Every parameter's gradient (the two bias tables, the shared embedding used three times when tied) against
    central differences, through a random upstream gradient of the logits; the ids are not changed."""
    config, ids, decoder_ids, mask, seed = case
    model = randomize(T5(config), seed)
    before = ids.copy(), decoder_ids.copy()
    pad = None if mask is None else backend.asarray(mask)
    assert_gradients_match(lambda: model(ids, decoder_ids, key_padding_mask=pad), model.backward, {},
                           dict(model.named_parameters()), seed=seed, rtol=LN_RTOL)
    assert np.array_equal(ids, before[0]) and np.array_equal(decoder_ids, before[1])


@settings(max_examples=10)
@given(case=t5_and_ids(), steps=st.lists(st.integers(1, 3), min_size=1, max_size=3))
def test_decoding_through_the_cache_equals_the_full_forward(case, steps):
    config, ids, _, mask, seed = case
    model = randomize(T5(config), seed).eval()
    decoder_ids = np.random.default_rng(seed).integers(0, config.vocab_size, (ids.shape[0], sum(steps)))
    pad = None if mask is None else backend.asarray(mask)
    with no_grad():
        full = backend.to_numpy(model(ids, decoder_ids, key_padding_mask=pad))
        memory, _ = model.encode(backend.asarray(ids), pad)
        cache, rows, done = {}, [], 0
        for n in steps:
            rows.append(backend.to_numpy(model.decode(decoder_ids[:, done:done + n], memory, pad, cache=cache,
                                                      start=done)))
            done += n
        with pytest.raises(ValueError, match=f"start 0 is not the cache's length {done}"):
            model.decode(decoder_ids[:, :1], memory, pad, cache=cache, start=0)
    assert np.allclose(np.concatenate(rows, axis=1), full, rtol=1e-12, atol=1e-13)


def test_the_layouts_differ_where_t5_says():
    tied = T5(T5Config(vocab_size=11, d_model=8, d_kv=2, d_ff=6, num_layers=1, num_heads=2))
    untied = T5(T5Config(vocab_size=11, d_model=8, d_kv=2, d_ff=6, num_layers=1, num_heads=2,
                         feed_forward_proj="gated-gelu", tie_word_embeddings=False))
    assert tied.lm_head.weight is tied.shared.weight and tied.output_scale == 8 ** -0.5
    assert untied.lm_head.weight is not untied.shared.weight and untied.output_scale == 1.0
    assert untied.encoder.block[0].ff.act.approximate == "tanh" and hasattr(untied.encoder.block[0].ff, "wi_1")
    for model in (tied, untied):
        assert model.num_parameters() == model.num_parameters_of_shape()
    assert not tied.decoder.relative_attention_bias.bidirectional and tied.encoder.relative_attention_bias.bidirectional


@pytest.mark.parametrize("fields, words", [
    (dict(feed_forward_proj="gated-swish"), "feed_forward_proj must be one of"),
    (dict(relative_attention_num_buckets=2), "relative_attention_num_buckets must be at least 4"),
    (dict(relative_attention_max_distance=16), "relative_attention_max_distance 16 must be above the decoder's"),
    (dict(eos_token_id=50), r"eos_token_id must be a token id in \[0, 50\)"),
    (dict(dropout_rate=1.0), r"dropout_rate must be a number in \[0, 1\)"),
    (dict(d_kv=0), "d_kv must be a positive integer"),
])
def test_a_config_that_does_not_fit_is_refused_naming_the_field(fields, words):
    with pytest.raises(ValueError, match=words):
        T5Config(**(dict(vocab_size=50, relative_attention_num_buckets=32) | fields))


@settings(max_examples=8)
@given(case=t5_and_ids())
def test_whole_t5_gradient_with_dropout(case):
    """Dropout on (the same masks each forward: the backend reseeded): the embeddings', every sublayer's, the
    feed-forward's inner layer's, the attention weights' and the stacks' final dropout each scale the gradient
    where they kept a unit."""
    config, ids, decoder_ids, mask, seed = case
    model = randomize(T5(config.replace(dropout_rate=0.3)), seed).train()
    pad = None if mask is None else backend.asarray(mask)
    assert_gradients_match(lambda: model(ids, decoder_ids, key_padding_mask=pad), model.backward, {},
                           dict(model.named_parameters()), seed=seed, rtol=LN_RTOL, reseed=seed)


def test_dropout_is_on_while_training_and_off_in_evaluation():
    model = T5(T5Config(vocab_size=11, d_model=8, d_kv=2, d_ff=6, num_layers=1, num_heads=2, dropout_rate=0.3))
    ids = np.arange(12).reshape(2, 6) % 11
    with no_grad():
        training = [backend.to_numpy(model.train()(ids, ids[:, :4])) for _ in range(2)]
        evaluation = [backend.to_numpy(model.eval()(ids, ids[:, :4])) for _ in range(2)]
    assert not np.allclose(training[0], training[1]) and np.array_equal(evaluation[0], evaluation[1])
