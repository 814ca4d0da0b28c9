"""Feed-forward, residual blocks, encoder/decoder layers and stacks, and the whole
Transformer: gradients against float64 central differences, plus causality,
padding and determinism properties.

Tolerances: rtol 1e-6, atol 1e-7 per entry for the feed-forward network; rtol 1e-5
(LN_RTOL) wherever a LayerNorm is inside. With d_model as small as 2, a LayerNorm row
whose two entries are nearly equal is very steep (its third derivative grows like
eps^-1.5 = 3e7 for eps 1e-5), and the O(h^2) truncation error of the central
difference reaches a few 1e-7: seen once in CI at d_model 2. A wrong backward is
off by O(1), far above either tolerance."""

import pytest
from hypothesis import given, strategies as st

import minitf
from minitf import backend
from minitf.backend import xp
from minitf.layers import ACTIVATIONS, POSITION_LAYOUTS, LayerNorm
from minitf.module import FlatBuffers
from minitf.transformer import Decoder, DecoderLayer, Encoder, EncoderLayer, FeedForward
from tests.helpers import assert_gradients_match, randomize, np, padding_masks, random_array, seeds, small

pytestmark = pytest.mark.usefixtures("float64")
heads_and_dk = st.tuples(st.integers(1, 2), st.integers(1, 3))
# Layers with a LayerNorm: d_model >= 3. At d_model 2 LayerNorm maps a row to +-1 (times gamma,
# plus beta) through (x0 - x1) / sqrt((x0 - x1)^2 / 4 + eps), whose third derivative grows like
# |x0 - x1|^-3: a row with x0 ~ x1 (hypothesis found one) makes central differences with h = 1e-6
# wrong by ~1e-4 relative, a limit of the check, not of the backward.
ln_heads_and_dk = heads_and_dk.filter(lambda hd: hd[0] * hd[1] >= 3)
LN_RTOL = 1e-5


@given(B=small, L=small, D=small, F=small, seed=seeds)
def test_feed_forward_gradients(B, L, D, F, seed):
    ff = randomize(FeedForward(D, F), seed)
    assert_gradients_match(ff.forward, ff.backward, {"x": random_array(seed, (B, L, D))},
                           dict(ff.named_parameters()), seed=seed)


@given(data=st.data(), B=small, S=small, hd=ln_heads_and_dk, F=small, seed=seeds, pre_norm=st.booleans(),
       p=st.sampled_from([0.0, 0.3]))
def test_encoder_layer_gradients(data, B, S, hd, F, seed, pre_norm, p):
    H, dk = hd
    layer = randomize(EncoderLayer(H * dk, H, F, dropout=p, pre_norm=pre_norm), seed)
    pad = data.draw(padding_masks(B, S))
    assert_gradients_match(lambda x: layer.forward(x, pad), layer.backward,
                           {"x": random_array(seed, (B, S, H * dk))}, dict(layer.named_parameters()),
                           seed=seed, reseed=seed, tol=LN_RTOL)


@given(data=st.data(), B=small, S=small, T=small, hd=ln_heads_and_dk, F=small, seed=seeds,
       pre_norm=st.booleans(), p=st.sampled_from([0.0, 0.3]))
def test_decoder_layer_gradients(data, B, S, T, hd, F, seed, pre_norm, p):
    H, dk = hd
    layer = randomize(DecoderLayer(H * dk, H, F, dropout=p, pre_norm=pre_norm), seed)
    src_pad, tgt_pad = data.draw(padding_masks(B, S)), data.draw(padding_masks(B, T))
    assert_gradients_match(lambda x, m: layer.forward(x, m, src_pad, tgt_pad), layer.backward,
                           {"x": random_array(seed, (B, T, H * dk)), "memory": random_array(seed + 1, (B, S, H * dk))},
                           dict(layer.named_parameters()), seed=seed, reseed=seed, tol=LN_RTOL)


@given(data=st.data(), B=st.integers(1, 2), S=small, T=small, N=st.integers(1, 2), seed=seeds,
       pre_norm=st.booleans())
def test_encoder_and_decoder_stack_gradients(data, B, S, T, N, seed, pre_norm):
    D, H, F = 4, 2, 3
    encoder = randomize(Encoder(N, D, H, F, 0.0, pre_norm), seed)
    decoder = randomize(Decoder(N, D, H, F, 0.0, pre_norm), seed + 1)
    src_pad, tgt_pad = data.draw(padding_masks(B, S)), data.draw(padding_masks(B, T))
    assert_gradients_match(lambda x: encoder.forward(x, src_pad), encoder.backward,
                           {"x": random_array(seed, (B, S, D))}, dict(encoder.named_parameters()), seed=seed,
                           tol=LN_RTOL)
    # the decoder stack sums the memory gradient of every layer
    assert_gradients_match(lambda y, m: decoder.forward(y, m, src_pad, tgt_pad), decoder.backward,
                           {"y": random_array(seed, (B, T, D)), "memory": random_array(seed + 1, (B, S, D))},
                           dict(decoder.named_parameters()), seed=seed, tol=LN_RTOL)


@st.composite
def model_and_batch(draw):
    """A randomly configured Transformer and a padded batch for it."""
    H = draw(st.integers(1, 3))
    D = H * draw(st.integers(1, 3))
    V = draw(st.integers(4, 12))
    share = draw(st.booleans())
    config = dict(src_vocab_size=V, tgt_vocab_size=V if share else draw(st.integers(4, 12)), d_model=D,
                  num_heads=H, num_encoder_layers=draw(st.integers(1, 2)), num_decoder_layers=draw(st.integers(1, 2)),
                  d_ff=draw(st.integers(1, 6)), dropout=draw(st.sampled_from([0.0, 0.1])), share_embeddings=share,
                  pad_id=0, pre_norm=draw(st.booleans()))
    if draw(st.booleans()):  # the options of pretrained (Marian) models, each drawn on its own
        config |= dict(activation=draw(st.sampled_from(sorted(ACTIVATIONS))),
                       positions=draw(st.sampled_from(POSITION_LAYOUTS)), scale_embedding=draw(st.booleans()),
                       output_bias=draw(st.booleans()), layer_norm_eps=draw(st.sampled_from([1e-5, 1e-6])),
                       mask_target_padding=draw(st.booleans()), freeze_pad_embedding=draw(st.booleans()),
                       tie_target_output=not share and draw(st.booleans()))
    B, S, T = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 5))
    seed = draw(seeds)
    rng = np.random.default_rng(seed)
    src = rng.integers(1, config["src_vocab_size"], (B, S))
    tgt = rng.integers(1, config["tgt_vocab_size"], (B, T + 1))
    for row in range(B):  # real tokens then padding, at least one real token
        src[row, draw(st.integers(1, S)):] = 0
        tgt[row, draw(st.integers(2, T + 1)):] = 0
    return config, src, tgt[:, :-1], tgt[:, 1:], seed


@given(case=model_and_batch(), smoothing=st.sampled_from([0.0, 0.1]))
def test_whole_model_gradient_along_random_directions(case, smoothing):
    """d loss / d theta . u  ==  (L(theta + h u) - L(theta - h u)) / 2h  for random u over ALL parameters."""
    config, src, tgt_in, tgt_out, seed = case
    backend.manual_seed(seed)
    # random biases and gains too: at the zero-initialised biases a row zeroed by
    # dropout meets the ReLU exactly at its kink, where no derivative exists
    model = randomize(minitf.Transformer(**config), seed)
    loss_fn = minitf.LabelSmoothedCrossEntropy(smoothing=smoothing, ignore_index=0)

    def loss_value():
        backend.manual_seed(seed)  # the same dropout masks every time
        with minitf.no_grad():
            return loss_fn(model(src, tgt_in), tgt_out)

    flat = FlatBuffers.flatten(model.parameters())  # theta: every parameter as one vector
    backend.manual_seed(seed)
    model.zero_grad()
    loss_fn(model(src, tgt_in), tgt_out)
    model.backward(loss_fn.backward())
    theta, grad = flat.data, flat.grad.copy()
    rng, h = np.random.default_rng(seed), 1e-6
    for _ in range(3):
        u = rng.standard_normal(theta.shape)
        u = backend.asarray(u / np.linalg.norm(u))  # unit length: the step is h in parameter space
        original = theta.copy()
        theta += h * u
        plus = loss_value()
        theta[...] = original - h * u
        minus = loss_value()
        theta[...] = original
        numeric, analytic = (plus - minus) / (2 * h), float((grad * u).sum())
        assert abs(numeric - analytic) <= LN_RTOL * max(abs(numeric), abs(analytic)) + 1e-8, (numeric, analytic)


@given(case=model_and_batch())
def test_causality_changing_target_t_changes_no_earlier_logit(case):
    config, src, tgt_in, _, seed = case
    backend.manual_seed(seed)
    model = minitf.Transformer(**config).eval()
    T = tgt_in.shape[1]
    t = np.random.default_rng(seed).integers(0, T)
    changed = tgt_in.copy()
    changed[:, t] = (changed[:, t] % (config["tgt_vocab_size"] - 1)) + 1  # another real token
    with minitf.no_grad():
        a, b = backend.to_numpy(model(src, tgt_in)), backend.to_numpy(model(src, changed))
    assert np.allclose(a[:, :t], b[:, :t], atol=1e-12)


@given(case=model_and_batch(), extra=st.integers(1, 4))
def test_padding_the_source_changes_no_output(case, extra):
    config, src, tgt_in, _, seed = case
    backend.manual_seed(seed)
    model = minitf.Transformer(**config).eval()
    padded = np.concatenate([src, np.zeros((src.shape[0], extra), dtype=src.dtype)], axis=1)
    with minitf.no_grad():
        a, b = backend.to_numpy(model(src, tgt_in)), backend.to_numpy(model(padded, tgt_in))
    assert np.allclose(a, b, atol=1e-10)


@given(case=model_and_batch())
def test_eval_mode_is_deterministic_and_backward_does_not_mutate_inputs(case):
    config, src, tgt_in, tgt_out, seed = case
    config = config | {"dropout": 0.5}
    backend.manual_seed(seed)
    model = minitf.Transformer(**config)
    model.eval()
    with minitf.no_grad():
        a = backend.to_numpy(model(src, tgt_in))
        b = backend.to_numpy(model(src, tgt_in))
    assert np.array_equal(a, b)
    model.train()
    copies = src.copy(), tgt_in.copy(), tgt_out.copy()
    logits = model(src, tgt_in)
    loss_fn = minitf.LabelSmoothedCrossEntropy()
    loss_fn(logits, tgt_out)
    dlogits = loss_fn.backward()
    before = backend.to_numpy(dlogits).copy()
    model.backward(dlogits)
    assert np.array_equal(before, backend.to_numpy(dlogits))
    for original, array in zip(copies, (src, tgt_in, tgt_out)):
        assert np.array_equal(original, array)


def test_shared_embedding_is_one_parameter():
    model = minitf.Transformer(11, 11, d_model=4, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=8)
    names = [n for n, _ in model.named_parameters()]
    assert names.count("src_embed.weight") == 1 and not any("tgt_embed" in n or "generator" in n for n in names)
    assert model.src_embed.weight is model.tgt_embed.weight is model.generator.weight
    untied = minitf.Transformer(11, 13, d_model=4, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                                d_ff=8, share_embeddings=False)
    assert {"src_embed.weight", "tgt_embed.weight", "generator.weight"} <= set(n for n, _ in untied.named_parameters())


def test_the_papers_model_is_the_default_and_each_marian_option_changes_its_one_part():
    paper = minitf.Transformer(11, 11, d_model=4, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=8)
    assert paper.config == minitf.TransformerConfig(11, 11, d_model=4, num_heads=2, num_encoder_layers=1,
                                                    num_decoder_layers=1, d_ff=8)
    assert (paper.config.activation, paper.config.positions, paper.generator.bias) == ("relu", "interleaved", None)
    assert paper.src_embed.scale == 2.0 and paper.src_embed.padding_idx is None
    marian = minitf.Transformer(11, 11, d_model=4, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=8,
                                pad_id=10, activation="silu", positions="halves", output_bias=True,
                                layer_norm_eps=1e-6, scale_embedding=False, mask_target_padding=False,
                                freeze_pad_embedding=True, decoder_start_id=10, eos_id=0)
    # the same parameters in the same order (checkpoints, flat buffers), and the output bias last
    assert [n for n, _ in marian.named_parameters()] == [n for n, _ in paper.named_parameters()] + ["generator.bias"]
    assert {type(layer.feed_forward.activation).__name__
            for layer in list(marian.encoder.layers) + list(marian.decoder.layers)} == {"SiLU"}
    assert {m.eps for m in marian.modules() if isinstance(m, LayerNorm)} == {1e-6}
    assert marian.positional.layout == "halves" and marian.src_embed.scale == 1.0 and marian.src_embed.padding_idx == 10
    assert marian.config.decoder_start_id == 10 and marian.config.eos_id == 0


def test_a_decoder_that_starts_from_pad_sees_it_only_without_target_padding_masks():
    """Marian's decoder starts from the pad token. With the paper's mask (pad keys masked) the first
    position sees no key at all and its attention output is 0; with ``mask_target_padding=False`` (the
    causal mask only) it sees itself, and every position's logits depend on the start embedding."""
    src, tgt = np.array([[4, 5, 6, 0]]), np.array([[0, 7, 8]])  # pad (0) starts the target

    def logits(mask, start_row):
        backend.manual_seed(3)
        model = randomize(minitf.Transformer(12, 12, d_model=8, num_heads=2, num_encoder_layers=1,
                                             num_decoder_layers=1, d_ff=16, dropout=0.0,
                                             mask_target_padding=mask), 3).eval()
        model.src_embed.weight.data[0] = start_row
        with minitf.no_grad():
            return backend.to_numpy(model(src, tgt))

    # (the pad's own logit, column 0, reads the tied row as an output weight: left out)
    a, b = logits(False, 0.0)[..., 1:], logits(False, 1.0)[..., 1:]
    assert np.abs(a - b).min(axis=-1).min() > 0       # every position sees the start token
    masked_a, masked_b = logits(True, 0.0)[..., 1:], logits(True, 1.0)[..., 1:]
    assert np.abs(masked_a[:, 1:] - masked_b[:, 1:]).max() == 0  # a masked key for the later positions
    assert np.abs(a - masked_a).max() > 1e-3


def test_parameters_live_in_flat_buffers_and_state_dict_round_trips():
    model = minitf.Transformer(9, 9, d_model=4, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=8)
    total = sum(p.size for p in model.parameters())
    assert FlatBuffers.of(model.parameters()) is None  # the model alone is not flattened ...
    flat = minitf.Adam(model.parameters()).flat         # ... its optimizer flattens it
    assert flat.data.size == total and FlatBuffers.of(model.parameters()) is flat
    # every p.data is a view of the flat buffer, in order: write the buffer, read the parameters
    # (checked on the device: to_numpy copies on a GPU, so host copies cannot show sharing)
    state = model.state_dict()
    flat.data[...] = xp.arange(total, dtype=flat.data.dtype)
    seen = xp.concatenate([p.data.ravel() for p in model.parameters()])
    assert np.array_equal(backend.to_numpy(seen), np.arange(total))
    model.load_state_dict(state)
    state = model.state_dict()
    other = minitf.Transformer(9, 9, d_model=4, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=8)
    other.load_state_dict(state)
    assert np.array_equal(backend.to_numpy(minitf.Adam(other.parameters()).flat.data), backend.to_numpy(flat.data))
    bad = dict(state)
    bad["src_embed.weight"] = np.zeros((10, 4))
    with pytest.raises(ValueError, match="src_embed.weight: expected \\(9, 4\\), got \\(10, 4\\)"):
        other.load_state_dict(bad)
    del bad["src_embed.weight"]
    with pytest.raises(ValueError, match="missing"):
        other.load_state_dict(bad)


@pytest.mark.parametrize("src, tgt, message", [
    (np.array([1, 2, 3]), np.array([[1, 2]]), "rank 2"),
    (np.array([[1.0, 2.0]]), np.array([[1, 2]]), "integer"),
    (np.array([[1, 2, 99]]), np.array([[1, 2]]), r"ids in \[0, 9\)"),
    (np.array([[1, -1]]), np.array([[1, 2]]), r"ids in \[0, 9\)"),
    (np.array([[1, 2], [3, 4]]), np.array([[1, 2]]), "same batch size"),
    ([[1, 2]], np.array([[1, 2]]), "integer array"),
])
def test_bad_input_gives_clear_value_errors(src, tgt, message):
    model = minitf.Transformer(9, 9, d_model=4, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=8)
    with pytest.raises(ValueError, match=message):
        model(src, tgt)


@pytest.mark.parametrize("kwargs, message", [
    (dict(d_model=10, num_heads=3), "divisible"),
    (dict(src_vocab_size=9, tgt_vocab_size=10), "share_embeddings"),
    (dict(d_model=0), "positive integer"),
    (dict(pad_id=20), "pad_id"),
    (dict(num_decoder_layers=0), "positive integer"),
    (dict(activation="swish"), "activation must be one of relu, gelu, gelu_tanh, silu, got 'swish'"),
    (dict(positions="learned"), "positions must be one of interleaved, halves"),
    (dict(layer_norm_eps=0.0), "layer_norm_eps"),
    (dict(decoder_start_id=9), "decoder_start_id must be None or a token id below tgt_vocab_size 9"),
    (dict(eos_id=True), "eos_id"),
])
def test_bad_config_gives_clear_value_errors(kwargs, message):
    config = dict(src_vocab_size=9, tgt_vocab_size=9, d_model=4, num_heads=2, num_encoder_layers=1,
                  num_decoder_layers=1, d_ff=8) | kwargs
    with pytest.raises(ValueError, match=message):
        minitf.Transformer(**config)


def _tiny_model_and_batch():
    model = minitf.Transformer(12, 12, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=16)
    src, tgt = np.array([[4, 5, 6, 0]]), np.array([[2, 7, 8]])
    return model, src, tgt


def _grads(model):
    return {name: backend.to_numpy(p.grad).copy() for name, p in model.named_parameters()}


def test_zero_grad_between_forward_and_backward_is_pytorchs_order():
    """``out = model(x); opt.zero_grad(); model.backward(d); opt.step()``: zero_grad only zeroes."""
    model, src, tgt = _tiny_model_and_batch()
    model.eval()                                             # no dropout: every forward the same
    optimizer = minitf.Adam(model.parameters())
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.1)
    loss_fn(model(src, tgt), tgt)
    model.backward(loss_fn.backward())
    expected = _grads(model)                                 # the gradients of one step, zeroed first
    for zero_grad in (model.zero_grad, optimizer.zero_grad):
        loss_fn(model(src, tgt), tgt)                        # forward and loss first ...
        zero_grad()                                          # ... then zero_grad, before backward
        model.backward(loss_fn.backward())
        assert all(np.array_equal(g, expected[name]) for name, g in _grads(model).items())
    optimizer.step()                                         # every cache consumed: the step runs
    assert optimizer.step_count == 1


def test_a_forgotten_backward_is_caught_at_the_next_forward_and_at_the_step():
    model, src, tgt = _tiny_model_and_batch()
    optimizer = minitf.Adam(model.parameters())
    def caches():
        return [len(m.__dict__.get("_saved", ())) for m in model.modules()]

    model(src, tgt)                                          # gradients on, and no backward
    model.zero_grad()                                        # zeroing is no harm
    before = caches()
    with pytest.raises(RuntimeError, match=r"Transformer\.forward ran with gradients on over the cache of an "
                                           r"earlier forward that no backward consumed: "
                                           r"src_embed \(Embedding\), src_dropout \(Dropout\), "
                                           r"tgt_dropout \(Dropout\) and 20 more modules\. Call backward"):
        model(src, tgt)                                      # a second one would grow every stack
    assert caches() == before                                # and it added nothing
    with pytest.raises(RuntimeError, match="MultiHeadAttention x3.*model.check_saved_consumed"):
        optimizer.step()                                     # a step over stale gradients
    assert optimizer.step_count == 0
    with minitf.no_grad():                                   # evaluation saves nothing: no harm
        model(src, tgt)
    model.clear_saved()                                      # after an aborted step: legal again
    model(src, tgt)
    with pytest.raises(RuntimeError, match=r"model\.clear_saved\(\)"):
        model(src, tgt)


def test_a_forward_that_raises_leaves_no_cache_behind():
    model, src, tgt = _tiny_model_and_batch()

    def out_of_memory(*args, **kwargs):
        raise MemoryError("the output projection")

    model.generator.forward = out_of_memory                  # after the encoder and decoder have pushed theirs
    with pytest.raises(MemoryError):
        model(src, tgt)
    del model.generator.forward
    model.check_saved_consumed()                             # the aborted forward's caches are gone
    model(src, tgt)                                          # not reported as a forgotten backward


def test_layer_checks_may_stack_two_forwards_before_their_backwards():
    """The gradient check's cache rule calls a layer twice before its two backwards (as a
    shared layer is called twice in one forward): inside stacked_forwards() that is allowed."""
    from minitf.module import stacked_forwards
    model, src, tgt = _tiny_model_and_batch()
    layer = model.encoder.layers[0]
    x = random_array(np.random.default_rng(0), (1, 4, 8))
    with stacked_forwards():
        layer(x, None)
        layer(x * 2, None)
    layer.backward(np.ones((1, 4, 8)))
    layer.backward(np.ones((1, 4, 8)))
    model.check_saved_consumed()


def test_consumed_or_unsaved_caches_pass_zero_grad():
    model, src, tgt = _tiny_model_and_batch()
    optimizer = minitf.Adam(model.parameters())
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.1)

    def caches():
        return sum(len(m.__dict__.get("_saved", ())) for m in model.modules())

    def grad_sum():
        return sum(float(np.abs(backend.to_numpy(p.grad)).sum()) for p in model.parameters())

    with minitf.no_grad():                                   # evaluation saves nothing
        model(src, tgt)
    assert caches() == 0
    model.zero_grad()
    loss_fn(model(src, tgt), tgt)
    assert caches() > 0
    model.backward(loss_fn.backward())                       # every cache consumed
    assert caches() == 0 and grad_sum() > 0
    optimizer.zero_grad()
    assert grad_sum() == 0
    model.zero_grad()
    loss_fn(model(src, tgt), tgt)                            # an aborted step: the loss's cache stays,
    model.clear_saved()                                      # but it is no part of the model
    assert caches() == 0
    model.zero_grad()
    optimizer.zero_grad()
    loss_fn.clear_saved()
    loss_fn(model(src, tgt), tgt)
    model.backward(loss_fn.backward())                       # the next step is whole again
    assert caches() == 0 and grad_sum() > 0
    model.zero_grad()
    assert grad_sum() == 0
