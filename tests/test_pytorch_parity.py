"""minitf against PyTorch autograd (minitf/pytorch.py, docs/pytorch.md): the same parameters in
``torch.nn.Transformer`` give the same logits, loss and gradient of every parameter, in float64,
on random configurations; and the conversion round-trips exactly.

Tolerance: relative difference below 1e-10. Both sides compute the same function in float64 in a
different order, so they agree to ~1e-15 relative; a wrong transpose, mask or norm is O(1) off.
Skipped where torch is not installed (pip install -e ".[bench]")."""
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

torch = pytest.importorskip("torch")

import minitf  # noqa: E402
import minitf.pytorch as mp  # noqa: E402
from minitf import backend  # noqa: E402
from minitf.testing import padding_lengths, randomize, seeds  # noqa: E402
from tests.helpers import relative_difference  # noqa: E402

np = backend.host
RTOL = 1e-10

pytestmark = [pytest.mark.usefixtures("float64"), pytest.mark.extra("torch", "bench")]


@st.composite
def configs_and_batches(draw):
    """A random model configuration and a batch with padding in source and target (real tokens
    first, at least one per row: an all-pad row is NaN in PyTorch, zeros in minitf)."""
    H = draw(st.integers(1, 3))
    # d_model >= 2: at d_model 1 every LayerNorm output is its bias, so the gradients through
    # it are pure rounding noise on both sides and a relative comparison is meaningless
    share = draw(st.booleans())
    V = draw(st.integers(4, 10))
    config = dict(src_vocab_size=V, tgt_vocab_size=V if share else draw(st.integers(4, 10)),
                  d_model=H * draw(st.integers(2 if H == 1 else 1, 3)), num_heads=H, num_encoder_layers=draw(st.integers(1, 2)),
                  num_decoder_layers=draw(st.integers(1, 2)), d_ff=draw(st.integers(1, 6)),
                  dropout=draw(st.sampled_from([0.0, 0.3])), share_embeddings=share, pad_id=0,
                  pre_norm=draw(st.booleans()))
    B, S, T = draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 5))
    seed = draw(seeds)
    rng = np.random.default_rng(seed)
    src = rng.integers(1, config["src_vocab_size"], (B, S))
    tgt = rng.integers(1, config["tgt_vocab_size"], (B, T + 1))
    src[np.arange(S)[None, :] >= np.array(draw(padding_lengths(B, S)))[:, None]] = 0
    tgt[np.arange(T + 1)[None, :] >= np.array(draw(padding_lengths(B, T + 1, low=2)))[:, None]] = 0
    return config, src, tgt[:, :-1], tgt[:, 1:], seed


@given(case=configs_and_batches(), smoothing=st.sampled_from([0.0, 0.1, 0.3]))
def test_logits_loss_and_every_gradient_match_pytorch_autograd(case, smoothing):
    config, src, tgt_in, tgt_out, seed = case
    backend.manual_seed(seed)
    model = randomize(minitf.Transformer(**config), seed)  # random gains and biases: every term counts
    if config["dropout"]:
        model.eval()  # dropout masks differ between the two; compare without them
    loss_fn = minitf.LabelSmoothedCrossEntropy(smoothing, ignore_index=0)
    model.zero_grad()
    logits = model(src, tgt_in)
    loss = loss_fn(logits, tgt_out)
    model.backward(loss_fn.backward())

    torch_model = mp.to_torch(model)
    assert next(torch_model.parameters()).dtype == torch.float64
    torch_logits = torch_model(torch.from_numpy(src), torch.from_numpy(tgt_in))
    torch_loss = mp.loss(torch_logits, torch.from_numpy(tgt_out), smoothing, ignore_index=0)
    torch_loss.backward()

    assert relative_difference(backend.to_numpy(logits), torch_logits.detach().numpy()) < RTOL
    assert abs(loss - torch_loss.item()) <= RTOL * abs(torch_loss.item())
    ours = dict(model.named_parameters())
    theirs = dict(torch_model.named_parameters())
    pairs = [(m, backend.to_numpy(ours[m].grad), theirs[t].grad.numpy().T if tr else theirs[t].grad.numpy())
             for m, t, tr in mp.parameter_map(model)]
    largest = max(float(np.abs(b).max()) for _, _, b in pairs)
    for name, a, b in pairs:
        # relative to at least 1e-3 of the largest gradient: some arrays' gradients are 0 in exact
        # arithmetic (the key bias: softmax ignores a constant added to a row; LayerNorm's beta at
        # d_model 1), and both sides hold only rounding noise there, amplified by 1/sqrt(LN eps)
        assert relative_difference(a, b, floor=1e-3 * largest) < RTOL, name


@given(case=configs_and_batches())
def test_round_trips_give_identical_parameters(case):
    config = case[0]
    backend.manual_seed(case[-1])
    model = randomize(minitf.Transformer(**config), case[-1])
    torch_model = mp.to_torch(model)
    back = mp.from_torch(torch_model)
    before, after = model.state_dict(), back.state_dict()
    assert before.keys() == after.keys()
    assert all(np.array_equal(before[k], after[k]) and after[k].dtype == np.float64 for k in before)
    again = mp.to_torch(back)  # torch -> minitf -> torch
    for (n1, p1), (n2, p2) in zip(torch_model.named_parameters(), again.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_final_norms_only_with_pre_ln_and_tied_weights_stay_tied(pre_norm):
    model = minitf.Transformer(9, 9, d_model=4, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                               d_ff=8, pre_norm=pre_norm)
    torch_model = mp.to_torch(model)
    assert (torch_model.transformer.encoder.norm is None) is (not pre_norm)
    assert (torch_model.transformer.decoder.norm is None) is (not pre_norm)
    assert torch_model.generator.weight is torch_model.src_embed.weight is torch_model.tgt_embed.weight
    assert len(list(torch_model.parameters())) == len(model.parameters())


def test_a_renamed_parameter_is_an_error_not_a_silent_skip():
    model = minitf.Transformer(9, 9, d_model=4, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=8)
    state = dict(mp.to_torch(model).named_parameters())
    del state["transformer.encoder.layers.0.norm1.weight"]
    with pytest.raises(KeyError):
        mp.from_torch_state(state, model)
    with pytest.raises(ValueError, match="not converted"):
        mp._check_names(mp.parameter_map(model), ["extra.weight"] + [n for n, _ in model.named_parameters()], [])


@pytest.mark.parametrize("option", [dict(activation="silu"), dict(positions="halves"), dict(layer_norm_eps=1e-6),
                                    dict(mask_target_padding=False)])
def test_a_model_with_a_marian_option_is_refused_not_converted_to_the_papers(option):
    """nn.Transformer computes ReLU, interleaved sinusoids, eps 1e-5 and masked target pads only: a model with another
    option would convert without error and compute something else."""
    model = minitf.Transformer(9, 9, d_model=4, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=8,
                               **option)
    with pytest.raises(ValueError, match=f"departs from it: .*{next(iter(option))}"):
        mp.to_torch(model)


def test_import_minitf_does_not_import_torch():
    code = "import sys, minitf, minitf.gradcheck, minitf.testing; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
