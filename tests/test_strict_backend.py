"""The code on a strict, CuPy-like stand-in array module (tests/strict_xp.py), on the CPU.

What it pins down, without a GPU:
* the layers, the loss, Adam and the decoders never convert a device array to NumPy
  implicitly nor mix one with a host array (either raises TypeError here, as on CuPy);
* one training step (forward, loss, backward, clipping, Adam) does exactly one
  device-to-host copy (the loss, the NLL sum and the token count, together), no
  synchronising scalar read, and three host-to-device copies (the host batch; none
  when the batch is already on the device);
* a float32 step produces no float64 array anywhere (no accidental promotion);
* results are bitwise those of plain NumPy (the stand-in runs NumPy underneath).
"""
import pytest

import minitf
from minitf import backend
from minitf.nmt.decode import beam_search, greedy_decode
from minitf.layers import Dropout, Embedding, LayerNorm, Linear
from minitf.attention import MultiHeadAttention
from tests import strict_xp
from tests.helpers import assert_gradients_match, np, randomize, random_array

PAD, BOS, EOS = 0, 2, 3


@pytest.fixture
def strict():
    with strict_xp.active() as counts:
        yield counts


# --------------------------------------------------------------------------- #
# the stand-in itself behaves like CuPy where it matters
# --------------------------------------------------------------------------- #
def test_implicit_conversion_to_numpy_is_refused(strict):
    a = backend.asarray(np.arange(3.0))
    for convert in (np.asarray, np.array, lambda x: np.asarray(x, dtype=np.float32)):
        with pytest.raises(TypeError, match="strict backend"):
            convert(a)
    assert backend.is_array(np.concatenate([a, a]))    # NumPy functions dispatch to the device, as on CuPy
    assert np.array_equal(backend.to_numpy(a), np.arange(3.0))     # explicit: fine, and counted
    assert strict.to_host == 1 and strict.to_device == 1


def test_mixing_with_host_arrays_is_refused(strict):
    a, host = backend.asarray(np.ones(3)), np.ones(3)
    for mix in (lambda: a + host, lambda: host * a, lambda: backend.xp.where(a > 0, host, a),
                lambda: backend.xp.concatenate([a, host]), lambda: a[np.array([0, 1])]):
        with pytest.raises(TypeError, match="host numpy.ndarray"):
            mix()
    with pytest.raises(TypeError, match="host numpy.ndarray"):
        a[...] = host
    assert float((a * np.float32(2) + 1.0).sum()) == 9.0           # NumPy and Python scalars are fine


def test_scalar_reads_are_counted_and_reductions_stay_on_the_device(strict):
    a = backend.asarray(np.array([1.0, 2.0]))
    total = a.sum()
    assert backend.is_array(total) and total.shape == ()            # a 0-d device array, as CuPy gives
    assert strict.scalar_reads == 0
    float(total), int(a.max()), bool(a.any()), a[0].item(), a.tolist()
    assert strict.scalar_reads == 5


# --------------------------------------------------------------------------- #
# a training step: exact transfer counts, no float64, same numbers as NumPy
# --------------------------------------------------------------------------- #
def _batch(seed=0, B=4, S=7, T=6, V=40):
    rng = np.random.default_rng(seed)
    src, tgt = rng.integers(4, V, (B, S)), rng.integers(4, V, (B, T + 1))
    src[0, 5:] = PAD
    tgt[1, 4:] = PAD
    return src, tgt[:, :-1], tgt[:, 1:]


def _train(steps, device_batch=False, clip=True, counts=None):
    """A few training steps of a tiny model; returns (losses, final flat parameters on the
    host, transfer counts of the last step)."""
    backend.manual_seed(0)
    model = minitf.Transformer(40, 40, d_model=16, num_heads=2, num_encoder_layers=2,
                               num_decoder_layers=2, d_ff=32, dropout=0.1)
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.1, ignore_index=PAD)
    optimizer = minitf.Adam(model.parameters(), lr=minitf.WarmupSchedule(16, warmup=10))
    batch = _batch()
    if device_batch:
        batch = tuple(backend.asarray(a) for a in batch)
    losses, last = [], None
    for step in range(steps):
        if counts is not None:
            counts.reset()
            counts.watch_float64 = step > 0        # step 0 builds the float64 sinusoid table once
        backend.manual_seed(100 + step)
        optimizer.zero_grad()
        losses.append(loss_fn(model(batch[0], batch[1]), batch[2]))
        model.backward(loss_fn.backward())
        if clip:
            minitf.clip_grad_norm(model.parameters(), 1.0)
        optimizer.step()
        if counts is not None:
            counts.watch_float64 = False
            last = dict(counts.as_dict(), float64_results=counts.float64_results,
                        float64_where=counts.float64_where)
    return losses, backend.to_numpy(optimizer.flat.data), last


def test_training_step_transfers_exactly_the_logged_scalars(strict):
    losses, _, last = _train(3, counts=strict)
    assert all(isinstance(loss, float) for loss in losses)
    assert last["float64_results"] == 0, "float64 arrays in a float32 step:\n" + "\n".join(last["float64_where"])
    # the loss, nll_sum and num_tokens come back in one copy; the host batch goes up in three
    assert (last["scalar_reads"], last["to_host"], last["to_device"]) == (0, 1, 3)


def test_training_step_with_a_device_batch_uploads_nothing(strict):
    _, _, last = _train(2, device_batch=True, counts=strict)
    assert (last["scalar_reads"], last["to_host"], last["to_device"]) == (0, 1, 0)


def test_strict_training_matches_numpy_bitwise():
    losses, params, _ = _train(3)
    with strict_xp.active():
        strict_losses, strict_params, _ = _train(3)
    assert losses == strict_losses
    assert np.array_equal(params, strict_params)


def test_evaluation_forward_reads_nothing_but_the_loss(strict):
    backend.manual_seed(0)
    model = minitf.Transformer(40, 40, d_model=16, num_heads=2, num_encoder_layers=1,
                               num_decoder_layers=1, d_ff=32).eval()
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.1, ignore_index=PAD)
    src, tgt_in, tgt_out = (backend.asarray(a) for a in _batch())
    strict.reset()
    with minitf.no_grad():
        loss_fn(model(src, tgt_in), tgt_out)
    assert strict.as_dict() == dict(scalar_reads=0, to_host=1, to_device=0)


# --------------------------------------------------------------------------- #
# decoding: same hypotheses as NumPy, a bounded number of copies per step
# --------------------------------------------------------------------------- #
def _decode_all(counts=None):
    backend.manual_seed(3)
    model = minitf.Transformer(30, 30, d_model=16, num_heads=2, num_encoder_layers=1,
                               num_decoder_layers=1, d_ff=32)
    src = _batch(V=30)[0]
    out = {}
    for name, run in [("greedy", lambda: greedy_decode(model, src, max_len=6)),
                      ("greedy_nocache", lambda: greedy_decode(model, src, max_len=6, use_cache=False)),
                      ("beam", lambda: beam_search(model, src, beam_size=3, max_len=6, return_scores=True)),
                      ("beam_nocache", lambda: beam_search(model, src, beam_size=3, max_len=6, use_cache=False))]:
        if counts is not None:
            counts.reset()
        out[name] = run()
        if counts is not None:
            out[name + "_counts"] = counts.as_dict()
    return out


def test_decoding_on_the_strict_backend():
    reference = _decode_all()
    with strict_xp.active() as counts:
        strict = _decode_all(counts)
    for name in ("greedy", "greedy_nocache", "beam", "beam_nocache"):
        assert strict[name] == reference[name], name
    steps = 6
    for name in ("greedy", "greedy_nocache"):
        c = strict[name + "_counts"]
        # per step one copy of the chosen tokens to the host (who is done); uploads only
        # for the host source and when a sentence leaves the batch
        assert c["scalar_reads"] == 0 and c["to_host"] <= steps and c["to_device"] <= 1 + steps, c
    for name in ("beam", "beam_nocache"):
        c = strict[name + "_counts"]
        # per step one copy of the "done" flags; at the end scores, lengths, tokens
        assert c["scalar_reads"] == 0 and c["to_host"] <= steps + 3, c


# --------------------------------------------------------------------------- #
# a few gradient checks run on the stand-in too (float64 central differences)
# --------------------------------------------------------------------------- #
@pytest.mark.usefixtures("float64")
def test_layer_gradients_on_the_strict_backend(strict):
    linear = randomize(Linear(3, 4), 1)
    assert_gradients_match(linear.forward, linear.backward, {"x": random_array(1, (2, 3, 3))},
                           {"weight": linear.weight, "bias": linear.bias})
    norm = randomize(LayerNorm(5), 2)
    assert_gradients_match(norm.forward, norm.backward, {"x": random_array(2, (2, 3, 5))},
                           {"gamma": norm.gamma, "beta": norm.beta})
    embedding = Embedding(4, 3)
    ids = backend.asarray(np.array([[1, 1, 3], [0, 1, 2]]))
    assert_gradients_match(lambda: embedding.forward(ids), embedding.backward, {}, {"weight": embedding.weight})
    dropout = Dropout(0.3)
    assert_gradients_match(dropout.forward, dropout.backward, {"x": random_array(3, (2, 4))}, reseed=5)


@pytest.mark.usefixtures("float64")
def test_attention_and_loss_gradients_on_the_strict_backend(strict):
    mha = randomize(MultiHeadAttention(4, 2), 4)
    pad = backend.asarray(np.array([[False, False, True], [False, False, False]]))
    assert_gradients_match(lambda x, m: mha.forward(x, m, key_padding_mask=pad), mha.backward,
                           {"x": random_array(4, (2, 2, 4)), "memory": random_array(5, (2, 3, 4))},
                           dict(mha.named_parameters()))
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.1, ignore_index=PAD)
    target = backend.asarray(np.array([[1, 2, 0], [3, 0, 0]]))
    assert_gradients_match(lambda z: backend.xp.asarray(loss_fn(z, target)), lambda g: loss_fn.backward(float(g)),
                           {"logits": random_array(6, (2, 3, 4), 3.0)})
