"""minitf's GPT against Hugging Face's GPT-2 (``transformers.GPT2LMHeadModel``): a small GPT-2
with random weights, made here (no download), saved with ``save_pretrained`` (safetensors) and read
by ``minitf.lm.gpt2.from_pretrained``, gives the same logits, next-token loss and gradient of every
parameter as PyTorch's autograd, in float64; greedy generation equals ``generate``; and a minitf
model written by ``save_pretrained`` loads in transformers with the same logits.

Tolerance: relative difference below 1e-10, as in tests/test_pytorch_parity.py: the same function
in float64 in another order agrees to ~1e-15; a wrong layout, mask or activation is O(1) off.
Skipped where the ``bench`` extra (torch, transformers, safetensors) is not installed."""
import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

REASON = 'needs the bench extra (torch, transformers, safetensors): pip install -e ".[bench]"'
torch = pytest.importorskip("torch", reason=REASON)
transformers = pytest.importorskip("transformers", reason=REASON)
pytest.importorskip("safetensors", reason=REASON)

import minitf  # noqa: E402
from minitf import backend  # noqa: E402
from minitf.gpt import GPT  # noqa: E402
from minitf.lm import gpt2  # noqa: E402
from minitf.lm.gpt2 import name_map  # noqa: E402
from minitf.sampling import generate  # noqa: E402
from minitf.testing import randomize, seeds  # noqa: E402
from tests.helpers import relative_difference  # noqa: E402

np = backend.host
RTOL = 1e-10

pytestmark = [pytest.mark.usefixtures("float64"), pytest.mark.extra("torch", "bench"),
              pytest.mark.extra("transformers", "bench"), pytest.mark.extra("safetensors", "bench")]


def hf_gpt2(seed, scale=None, **config):
    """A randomly initialised GPT2LMHeadModel in float64 (eval mode), with random LayerNorm gains and
    biases too, so that every term of the gradient counts; with ``scale``, every weight and gain
    ~ N(0, scale^2) and every bias 0 (the tokens, not the biases, decide the next token: greedy
    decoding does not fall into repeating one token at once)."""
    torch.manual_seed(seed)
    config = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0) | config
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config)).to(torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if scale is not None:
                p.normal_(0.0, scale) if "bias" not in name else p.zero_()
            elif name.endswith("bias") or "ln_" in name:  # HF's init leaves these at 0 and 1
                p.normal_(0.0, 0.5)
    return model.eval()


@st.composite
def gpt2_configs(draw):
    H = draw(st.integers(1, 3))
    return dict(vocab_size=draw(st.integers(5, 60)), n_positions=draw(st.integers(4, 12)),
                n_embd=H * draw(st.integers(2, 6)), n_layer=draw(st.integers(1, 2)), n_head=H,
                n_inner=draw(st.none() | st.integers(1, 12)),
                activation_function=draw(st.sampled_from(["gelu_new", "gelu", "relu", "swish", "silu"])),
                tie_word_embeddings=draw(st.booleans()))


@settings(max_examples=10)
@given(config=gpt2_configs(), seed=seeds, data=st.data())
def test_logits_loss_and_every_gradient_match_hugging_face_gpt2(config, seed, data, tmp_path_factory):
    hf = hf_gpt2(seed % 2**31, **config)
    folder = tmp_path_factory.mktemp("gpt2")
    hf.save_pretrained(folder)
    model = gpt2.from_pretrained(folder)
    assert model.embed.weight.data.dtype == np.float64 and model.config.activation in ("gelu_tanh", "gelu", "relu", "silu")
    B, L = data.draw(st.integers(1, 3)), data.draw(st.integers(1, config["n_positions"]))
    ids = np.random.default_rng(seed).integers(0, config["vocab_size"], (B, L))
    # the shift written out: position t's target is token t + 1; the last position has none (-1)
    targets = np.concatenate([ids[:, 1:], np.full((B, 1), -1)], axis=1)
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    model.zero_grad()
    logits = model(ids)
    loss = loss_fn(logits, targets)
    model.backward(loss_fn.backward())

    theirs_logits = hf(torch.from_numpy(ids)).logits
    assert relative_difference(backend.to_numpy(logits), theirs_logits.detach().numpy()) < RTOL
    if L > 1:  # one token: no next token, the mean over none is NaN in PyTorch and 0 in minitf
        # HF's own loss (labels=ids) shifts the same way but casts the logits to float32 first;
        # the same mean cross-entropy in float64:
        V = config["vocab_size"]
        their_loss = torch.nn.functional.cross_entropy(theirs_logits[:, :-1].reshape(-1, V),
                                                       torch.from_numpy(ids[:, 1:]).reshape(-1))
        their_loss.backward()
        assert abs(loss - their_loss.item()) <= RTOL * abs(their_loss.item())
        ours = dict(model.named_parameters())
        theirs = dict(hf.named_parameters())
        pairs = [(m, backend.to_numpy(ours[m].grad),
                  theirs[h if h == "lm_head.weight" else "transformer." + h].grad.numpy())
                 for h, m in name_map(model.config)]
        assert len(pairs) == len(ours) == len(theirs)
        largest = max(float(np.abs(b).max()) for _, _, b in pairs)
        for name, a, b in pairs:
            # a floor of 1e-3 of the largest gradient: the key bias's gradient is 0 in exact arithmetic
            # (softmax ignores a constant added to a row), rounding noise on both sides
            assert relative_difference(a, b, floor=1e-3 * largest) < RTOL, name


def test_greedy_generation_of_50_tokens_equals_hugging_face_generate(tmp_path):
    hf = hf_gpt2(3, scale=0.5, vocab_size=40, n_positions=64, n_embd=16, n_layer=2, n_head=2)
    hf.save_pretrained(tmp_path)
    model = gpt2.from_pretrained(tmp_path)
    prompt = np.random.default_rng(3).integers(1, 40, (2, 7))
    ours = generate(model, prompt, 50, temperature=0)
    theirs = hf.generate(torch.from_numpy(prompt), max_new_tokens=50, min_new_tokens=50, do_sample=False,
                         pad_token_id=0, eos_token_id=None)
    assert ours.shape == (2, 57)
    assert np.array_equal(ours, theirs.numpy())
    assert len(set(ours[:, 7:].ravel().tolist())) > 2  # not a trivial run of one token


def test_save_pretrained_loads_in_transformers_with_the_same_logits(tmp_path):
    backend.manual_seed(5)
    model = randomize(GPT.preset("gpt2", 30, max_len=10, d_model=12, num_heads=3, num_layers=2, d_ff=20,
                                 activation="gelu"), 5, scale=0.3)
    gpt2.save_pretrained(model, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, dtype=torch.float64).eval()
    ids = np.random.default_rng(5).integers(0, 30, (3, 10))
    with minitf.no_grad():
        ours = backend.to_numpy(model.eval()(ids))
    with torch.no_grad():
        theirs = hf(torch.from_numpy(ids)).logits.numpy()
    assert relative_difference(ours, theirs) < RTOL
    back = gpt2.from_pretrained(tmp_path)  # and back: the same arrays, bit for bit
    assert all(np.array_equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))
    assert back.config == dataclasses.replace(model.config, init="gpt2")
