"""The layers of Llama-family decoders: RMSNorm, rotary position embedding, the SwiGLU feed-forward and
grouped-query attention. Gradients against float64 central differences (tests/helpers.assert_gradients_match:
rtol 1e-6, atol 1e-7, which also checks that no input, parameter or upstream gradient is changed), their
algebraic properties, the key/value cache against the full causal forward, and parity with Hugging Face's
LlamaRMSNorm, apply_rotary_pos_emb with LlamaRotaryEmbedding (default and llama3), LlamaMLP, LlamaAttention and
Qwen2Attention: forward values and gradients (PyTorch autograd) to a relative 1e-10 in float64, as in
tests/test_gpt2_parity.py. Hugging Face computes RMSNorm, the rotary angles and eager attention's softmax in
float32 whatever the input: the parity tests give its modules exact float64 forms of the same lines (and SDPA,
float64 throughout on the CPU), and check the unchanged float32 forms to float32's precision. The parity tests
skip where the ``bench`` extra (torch, transformers) is missing."""
import contextlib

import pytest
from hypothesis import given, settings, strategies as st

from minitf import backend
from minitf.attention import GroupedQueryAttention
from minitf.layers import RMSNorm, SwiGLU
from minitf.module import no_grad, stacked_forwards
from minitf.rotary import ROPE_TYPES, RotaryEmbedding, default_inv_freq, llama3_inv_freq, rotate_half
from tests.helpers import (LN_RTOL, assert_gradients_match, np, padding_masks, random_array, randomize,
                           relative_difference, seeds, small)

pytestmark = pytest.mark.usefixtures("float64")

PARITY_RTOL = 1e-10  # float64 in another order agrees to ~1e-15; a wrong layout, sign or grouping is O(1) off
hugging_face = pytest.mark.extra("torch", "bench"), pytest.mark.extra("transformers", "bench")


def parity(test):
    for mark in hugging_face:
        test = mark(test)
    return test


even_head_dims = st.integers(1, 4).map(lambda half: 2 * half)


@st.composite
def rope_settings(draw):
    """(rope_type, theta, its parameters): linear's factor; the llama3 ones spread so that wavelengths fall below,
    inside and above the band that is interpolated."""
    rope_type = draw(st.sampled_from(ROPE_TYPES))
    theta = draw(st.sampled_from([10.0, 500.0, 10000.0]))
    if rope_type == "default":
        return rope_type, theta, {}
    if rope_type == "linear":
        return rope_type, theta, dict(factor=draw(st.sampled_from([0.5, 2.0, 4.0])))
    low = draw(st.sampled_from([0.5, 1.0, 2.0]))
    return rope_type, theta, dict(factor=draw(st.sampled_from([2.0, 8.0, 32.0])), low_freq_factor=low,
                                  high_freq_factor=low * draw(st.sampled_from([2.0, 4.0])),
                                  original_max_position_embeddings=draw(st.sampled_from([8, 64, 8192])))


def host(a):
    return backend.to_numpy(a)


# --------------------------------------------------------------------------- #
# RMSNorm
# --------------------------------------------------------------------------- #
@given(B=small, L=small, D=st.integers(1, 6), seed=seeds, scale=st.floats(0.01, 100), shift=st.floats(-50, 50))
def test_rmsnorm_gradients(B, L, D, seed, scale, shift):
    layer = randomize(RMSNorm(D, eps=1e-6), seed + 1)
    x = random_array(seed, (B, L, D), scale) + shift
    # LN_RTOL: rows of tiny size make it steep (rstd up to 1000), as for LayerNorm
    assert_gradients_match(layer, x, seed=seed, rtol=LN_RTOL)


@given(D=st.integers(1, 64), seed=seeds, scale=st.floats(0.01, 100), shift=st.floats(-5, 5))
def test_rmsnorm_rows_have_unit_root_mean_square_and_keep_their_mean(D, seed, scale, shift):
    """eps = 0, weight 1: every row ends with root mean square 1 and is only scaled (no mean subtracted: a row
    of one value repeated stays that sign, unlike LayerNorm's 0)."""
    x = random_array(seed, (3, D), scale) + shift
    y = host(RMSNorm(D, eps=0.0).forward(x))
    assert np.allclose(np.sqrt((y * y).mean(-1)), 1.0, rtol=1e-12)
    ratio = y / host(x)
    assert np.allclose(ratio, ratio[:, :1], rtol=1e-12)  # one positive factor per row
    assert (ratio > 0).all()


# --------------------------------------------------------------------------- #
# Rotary position embedding
# --------------------------------------------------------------------------- #
@given(data=st.data(), B=small, T=small, h=st.integers(1, 3), head_dim=even_head_dims, start=st.integers(0, 40),
       seed=seeds)
def test_rotary_gradients(data, B, T, h, head_dim, start, seed):
    rope_type, theta, scaling = data.draw(rope_settings())
    rotary = RotaryEmbedding(head_dim, theta, rope_type, **scaling)
    assert_gradients_match(rotary, random_array(seed, (B, T, h, head_dim)), start=start, seed=seed)


@given(data=st.data(), T=small, head_dim=even_head_dims, start=st.integers(0, 1000), shift=st.integers(0, 1000),
       seed=seeds)
def test_rotary_is_a_rotation_whose_dot_products_see_only_the_distance(data, T, head_dim, start, shift, seed):
    """Each plane (x[i], x[dk/2 + i]) keeps its length; the backward, the turn by minus the angle, undoes the
    forward; and q . k of positions m, n equals that of m + s, n + s: attention sees only m - n."""
    rope_type, theta, scaling = data.draw(rope_settings())
    rotary = RotaryEmbedding(head_dim, theta, rope_type, **scaling)
    x = random_array(seed, (2, T, 1, head_dim))
    with no_grad():
        y = rotary.forward(x, start)
    half = head_dim // 2
    plane = lambda a: host(a[..., :half]) ** 2 + host(a[..., half:]) ** 2  # noqa: E731
    assert np.allclose(plane(y), plane(x), rtol=1e-12)
    with stacked_forwards():                     # two forwards before their backwards, as within attention
        rotary.forward(x, start)
        y = rotary.forward(x, start)
    assert np.allclose(host(rotary.backward(y)), host(x), rtol=1e-12, atol=1e-12)
    rotary.backward(x)  # the first forward's cache
    q, k = x[:1], x[1:]
    with no_grad():
        at_start = (host(rotary.forward(q, start))[0, :, None, 0] * host(rotary.forward(k, start))[0, None, :, 0])
        shifted = (host(rotary.forward(q, start + shift))[0, :, None, 0]
                   * host(rotary.forward(k, start + shift))[0, None, :, 0])
    assert np.allclose(at_start.sum(-1), shifted.sum(-1), rtol=1e-9, atol=1e-9)


def test_rotary_angles_are_position_times_inverse_frequency_on_both_halves():
    """The layout written out for dk = 4, theta 100: plane i of position p turns by p / 100^(2i/4), and the
    first coordinate of a plane is in the first half: x = e_0 at position 3 becomes cos(3) e_0 + sin(3) e_2."""
    rotary = RotaryEmbedding(4, theta=100.0)
    cos, sin = (host(a) for a in rotary.cos_sin(2, start=3))
    angles = np.array([[3.0, 0.3, 3.0, 0.3], [4.0, 0.4, 4.0, 0.4]])
    assert np.allclose(cos, np.cos(angles), rtol=1e-14) and np.allclose(sin, np.sin(angles), rtol=1e-14)
    with no_grad():
        y = host(rotary.forward(backend.asarray(np.array([1.0, 0, 0, 0]).reshape(1, 1, 1, 4)), start=3))
    assert np.allclose(y.ravel(), [np.cos(3.0), 0, np.sin(3.0), 0], atol=1e-15)
    assert np.array_equal(host(rotate_half(backend.asarray(np.array([1.0, 2, 3, 4])))), [-3, -4, 1, 2])


def test_llama3_frequencies_keep_the_short_scale_the_long_and_blend_those_between():
    """Llama 3.1's schedule written out: wavelengths 2 pi / inv_freq under original_max / high_freq_factor
    (16) stay, those over original_max / low_freq_factor (64) are divided by factor, those between are
    (1 - s) inv / factor + s inv with s = (original_max / wavelength - low) / (high - low)."""
    inv = default_inv_freq(6, 500.0)                                  # wavelengths 6.3, 49.9, 395
    scaled = llama3_inv_freq(inv, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=64)
    s = (64 / (2 * np.pi / inv[1]) - 1.0) / 3.0
    assert 0 < s < 1
    assert np.allclose(scaled, [inv[0], (1 - s) * inv[1] / 8 + s * inv[1], inv[2] / 8], rtol=1e-14)


def test_rotary_refuses_what_it_does_not_compute():
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported: use one of default, linear, llama3"):
        RotaryEmbedding(8, rope_type="yarn")
    with pytest.raises(ValueError, match="rope_type 'dynamic' is not supported"):
        RotaryEmbedding.from_rope_parameters(8, {"rope_type": "dynamic", "rope_theta": 10.0, "factor": 2.0})
    with pytest.raises(ValueError, match="even head_dim"):
        RotaryEmbedding(5)
    with pytest.raises(ValueError, match=r"takes the parameters \['factor', 'low_freq_factor'"):
        RotaryEmbedding(8, rope_type="llama3", factor=8.0)
    with pytest.raises(ValueError, match="high_freq_factor > low_freq_factor"):
        RotaryEmbedding(8, rope_type="llama3", factor=8.0, low_freq_factor=4.0, high_freq_factor=4.0,
                        original_max_position_embeddings=64)
    with pytest.raises(ValueError, match="head_dim 8 got vectors of 6"):
        RotaryEmbedding(8).forward(random_array(0, (1, 2, 1, 6)))


# --------------------------------------------------------------------------- #
# SwiGLU
# --------------------------------------------------------------------------- #
@given(B=small, L=small, D=small, F=small, bias=st.booleans(), seed=seeds, scale=st.floats(0.1, 5))
def test_swiglu_gradients(B, L, D, F, bias, seed, scale):
    layer = randomize(SwiGLU(D, F, bias=bias), seed + 1)
    assert (layer.gate_proj.bias is None) == (not bias) and layer.down_proj.weight.shape == (F, D)
    assert_gradients_match(layer, random_array(seed, (B, L, D), scale), seed=seed)


# --------------------------------------------------------------------------- #
# Grouped-query attention
# --------------------------------------------------------------------------- #
@st.composite
def gqa_shapes(draw):
    """(num_heads, num_kv_heads, head_dim): ungrouped (Hkv = H), grouped, and one key/value head."""
    num_kv_heads = draw(st.integers(1, 2))
    return num_kv_heads * draw(st.integers(1, 3)), num_kv_heads, draw(even_head_dims)


@given(data=st.data(), B=small, T=small, D=small, shape=gqa_shapes(), qkv_bias=st.booleans(), causal=st.booleans(),
       seed=seeds)
def test_grouped_query_attention_gradients(data, B, T, D, shape, qkv_bias, causal, seed):
    H, Hkv, head_dim = shape
    rope_type, theta, scaling = data.draw(rope_settings())
    qk_norm = data.draw(st.sampled_from([None, "head", "projection"]))  # Qwen3's per head, OLMoE's whole
    layer = randomize(GroupedQueryAttention(D, H, Hkv, head_dim, qkv_bias=qkv_bias, qk_norm=qk_norm,
                                            rotary=RotaryEmbedding(head_dim, theta, rope_type, **scaling)), seed + 1)
    pad = data.draw(st.none() | padding_masks(B, T, allow_all_padded=True))
    assert_gradients_match(layer, random_array(seed, (B, T, D)), key_padding_mask=pad, causal=causal, seed=seed)


def _repeated_kv(grouped):
    """The ungrouped layer (num_kv_heads = num_heads) whose key/value heads are the grouped layer's, each
    repeated for the G query heads that read it: the same function written with no grouping."""
    H, Hkv, E = grouped.num_heads, grouped.num_kv_heads, grouped.head_dim
    D = grouped.q_proj.weight.shape[0]
    plain = GroupedQueryAttention(D, H, H, E, qkv_bias=grouped.q_proj.bias is not None, rotary=grouped.rotary)
    state = grouped.state_dict()
    for name, value in state.items():
        if name.startswith(("k_proj", "v_proj")):  # output columns (..., Hkv*E): each head's E columns G times
            heads = value.reshape(value.shape[:-1] + (Hkv, E))
            state[name] = np.repeat(heads, H // Hkv, axis=-2).reshape(value.shape[:-1] + (H * E,))
    plain.load_state_dict(state)
    return plain


@given(data=st.data(), B=small, T=small, D=small, shape=gqa_shapes(), seed=seeds)
def test_grouped_attention_equals_multi_head_attention_over_repeated_key_value_heads(data, B, T, D, shape, seed):
    """Query head j reads key/value head j // G: the same output as the ungrouped layer whose k and v weights
    repeat each head G times in a row; and its k/v weight gradients are the sums of the repeats' ones."""
    H, Hkv, E = shape
    grouped = randomize(GroupedQueryAttention(D, H, Hkv, E, qkv_bias=True), seed + 1)
    plain = _repeated_kv(grouped)
    x, G = random_array(seed, (B, T, D)), random_array(seed + 2, (B, T, D))
    pad = data.draw(padding_masks(B, T))
    with stacked_forwards():                     # the two share their rotary layer: two caches before the backwards
        y_grouped, y_plain = grouped(x, key_padding_mask=pad), plain(x, key_padding_mask=pad)
    assert np.allclose(host(y_grouped), host(y_plain), rtol=1e-12, atol=1e-13)
    dx_grouped, dx_plain = grouped.backward(G), plain.backward(G)
    assert np.allclose(host(dx_grouped), host(dx_plain), rtol=1e-12, atol=1e-13)
    for name in ("k_proj.weight", "v_proj.bias"):
        summed = host(dict(plain.named_parameters())[name].grad)
        summed = summed.reshape(summed.shape[:-1] + (Hkv, H // Hkv, E)).sum(-2).reshape(summed.shape[:-1] + (-1,))
        assert np.allclose(host(dict(grouped.named_parameters())[name].grad), summed, rtol=1e-12, atol=1e-13)


@settings(max_examples=15)
@given(data=st.data(), B=small, D=small, shape=gqa_shapes(), qkv_bias=st.booleans(), seed=seeds)
def test_decoding_with_the_cache_equals_the_full_causal_forward(data, B, D, shape, qkv_bias, seed):
    """Steps of 1 to 5 positions through the key/value cache (rotary positions offset by its length, through
    a doubling of its room) give the rows of one causal forward over the whole sequence, padding mask too."""
    H, Hkv, E = shape
    steps = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=6), label="steps")
    T = sum(steps)
    layer = randomize(GroupedQueryAttention(D, H, Hkv, E, qkv_bias=qkv_bias,
                                            rotary=RotaryEmbedding(E, 500.0, "llama3", factor=8.0, low_freq_factor=1.0,
                                                                   high_freq_factor=4.0,
                                                                   original_max_position_embeddings=8)), seed + 1)
    x = random_array(seed, (B, T, D))
    pad = data.draw(st.none() | padding_masks(B, T))
    with no_grad():
        full = host(layer(x, key_padding_mask=pad))
        cache, rows, done = {}, [], 0
        for n in steps:
            mask = None if pad is None else pad[:, :done + n]
            rows.append(host(layer(x[:, done:done + n], key_padding_mask=mask, cache=cache)))
            done += n
    assert cache["length"] == T
    assert np.allclose(np.concatenate(rows, axis=1), full, rtol=1e-12, atol=1e-13)


def test_grouped_query_attention_refuses_bad_shapes_and_a_cache_with_gradients():
    with pytest.raises(ValueError, match="num_heads must be a multiple of num_kv_heads, got num_heads=6, "
                                         "num_kv_heads=4"):
        GroupedQueryAttention(12, 6, 4)
    with pytest.raises(ValueError, match="d_model must be divisible by num_heads"):
        GroupedQueryAttention(10, 4, 2)
    with pytest.raises(ValueError, match="rotary embedding's head_dim 4 is not the heads' 6"):
        GroupedQueryAttention(12, 2, 1, rotary=RotaryEmbedding(4))
    layer = GroupedQueryAttention(8, 4, 2)
    assert layer.head_dim == 2 and layer.o_proj.bias is None and layer.q_proj.bias is None
    with pytest.raises(ValueError, match="cache is for decoding under no_grad"):
        layer(random_array(0, (1, 2, 8)), cache={})


def test_a_float32_model_stays_float32():
    """The rotary tables are computed in float64 but cast to the input's dtype, so none of the four layers
    promotes a float32 model's activations or gradients to float64 (twice the memory, silently)."""
    with backend.default_dtype("float32"):
        x = backend.asarray(np.random.default_rng(0).normal(size=(2, 3, 8)), dtype=np.float32)
        rotary = RotaryEmbedding(4, 500.0, "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=8)
        for layer, inputs in [(RMSNorm(8), x), (SwiGLU(8, 5), x), (rotary, x.reshape(2, 3, 2, 4)),
                              (GroupedQueryAttention(8, 2, 1, rotary=rotary), x)]:
            y = layer(inputs)
            dx = layer.backward(y)
            assert y.dtype == np.float32 and dx.dtype == np.float32, type(layer).__name__
            assert all(p.grad.dtype == np.float32 for p in layer.parameters())


# --------------------------------------------------------------------------- #
# Parity with Hugging Face (float64, PyTorch autograd on their side)
# --------------------------------------------------------------------------- #
def _hf():
    import torch
    import transformers
    return torch, transformers


def tensor(a):
    torch, _ = _hf()
    return torch.from_numpy(np.array(host(a), dtype=np.float64))


def linear_from(ours, theirs):
    """Copy a torch nn.Linear (weight (out, in)) into a minitf Linear (weight (in, out))."""
    ours.weight.data[...] = backend.asarray(theirs.weight.detach().numpy().T)
    if theirs.bias is not None:
        ours.bias.data[...] = backend.asarray(theirs.bias.detach().numpy())


def assert_linear_grads(ours, theirs, floor=0.0):
    assert relative_difference(host(ours.weight.grad), theirs.weight.grad.numpy().T, floor) < PARITY_RTOL
    if theirs.bias is not None:
        assert relative_difference(host(ours.bias.grad), theirs.bias.grad.numpy(), floor) < PARITY_RTOL


def llama_config(D=8, H=2, Hkv=2, head_dim=4, F=8, rope=None, **extra):
    _, transformers = _hf()
    rope = rope or {"rope_type": "default", "rope_theta": 10000.0}
    return transformers.LlamaConfig(hidden_size=D, num_attention_heads=H, num_key_value_heads=Hkv, head_dim=head_dim,
                                    intermediate_size=F, max_position_embeddings=100000, rope_parameters=dict(rope),
                                    attn_implementation="sdpa", **extra)


class _Float64Torch:
    """``torch`` with ``torch.float`` meaning float64: Hugging Face's own inverse-frequency code, run with it
    in place of torch, is the exact float64 form of what it computes in float32."""

    def __init__(self, torch):
        self._torch, self.float = torch, torch.float64

    def __getattr__(self, name):
        return getattr(self._torch, name)


@contextlib.contextmanager
def hf_rotary_in_float64():
    """LlamaRotaryEmbedding built and run in float64: its inv_freq from its own functions with float32 read
    as float64, its forward the same lines with the float32 casts made float64."""
    torch, _ = _hf()
    from transformers import modeling_rope_utils
    from transformers.models.llama import modeling_llama

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * self.inv_freq.to(torch.float64)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(modeling_llama, "torch", _Float64Torch(torch))
        patch.setattr(modeling_rope_utils, "torch", _Float64Torch(torch))
        patch.setattr(modeling_llama.LlamaRotaryEmbedding, "forward", forward)
        yield modeling_llama


@parity
@settings(max_examples=10)
@given(B=small, L=small, D=small, seed=seeds, scale=st.floats(0.01, 100), eps=st.sampled_from([1e-6, 1e-5, 0.1]))
def test_rmsnorm_matches_hugging_face_llama_rmsnorm(B, L, D, seed, scale, eps):
    torch, _ = _hf()
    from transformers.models.llama import modeling_llama
    theirs = modeling_llama.LlamaRMSNorm(D, eps=eps).to(torch.float64)
    x = random_array(seed, (B, L, D), scale)
    with torch.no_grad():
        theirs.weight.normal_(1.0, 0.5, generator=torch.Generator().manual_seed(seed % 2**31))
        float32 = theirs(tensor(x)).numpy()  # its own forward: the statistics in float32

    def forward64(self, hidden_states):  # the same lines without the cast to float32
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states

    ours = RMSNorm(D, eps=eps)
    ours.weight.data[...] = backend.asarray(theirs.weight.detach().numpy())
    G = random_array(seed + 1, (B, L, D))
    y = ours(x)
    dx = ours.backward(G)
    xt = tensor(x).requires_grad_()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(modeling_llama.LlamaRMSNorm, "forward", forward64)
        yt = theirs(xt)
    yt.backward(tensor(G))
    assert relative_difference(host(y), yt.detach().numpy()) < PARITY_RTOL
    # dx = rstd (dxhat - xhat mean(dxhat xhat)) cancels to almost 0 where D = 1 or eps is small beside x^2:
    # measured against the size of its terms, rstd |dy weight|, not against its own
    terms = host(G) * host(ours.weight.data) / np.sqrt((host(x) ** 2).mean(-1, keepdims=True) + eps)
    assert relative_difference(host(dx), xt.grad.numpy(), floor=float(np.abs(terms).max())) < PARITY_RTOL
    assert relative_difference(host(ours.weight.grad), theirs.weight.grad.numpy()) < PARITY_RTOL
    assert relative_difference(host(y), float32) < 1e-6


@parity
@settings(max_examples=10)
@given(data=st.data(), B=small, T=small, h=st.integers(1, 3), head_dim=st.integers(1, 8).map(lambda n: 2 * n),
       start=st.integers(0, 3000), seed=seeds)
def test_rotary_matches_hugging_face_apply_rotary_pos_emb(data, B, T, h, head_dim, start, seed):
    """Against LlamaRotaryEmbedding's cos, sin for position_ids start .. start+T-1 and apply_rotary_pos_emb
    (unsqueeze_dim=2: positions on axis 1, as here), default and llama3: values and gradients."""
    torch, _ = _hf()
    rope_type, theta, scaling = data.draw(rope_settings())
    rope = {"rope_type": rope_type, "rope_theta": theta} | scaling
    config = llama_config(D=head_dim * h, H=h, Hkv=h, head_dim=head_dim, rope=rope)
    from transformers.models.llama import modeling_llama
    float32_inv_freq = modeling_llama.LlamaRotaryEmbedding(config).inv_freq.numpy()
    with hf_rotary_in_float64() as modeling:
        theirs = modeling.LlamaRotaryEmbedding(config)
        ours = RotaryEmbedding.from_rope_parameters(head_dim, config.rope_parameters)
        assert relative_difference(host(ours.inv_freq), theirs.inv_freq.numpy()) < PARITY_RTOL
        assert relative_difference(host(ours.inv_freq), float32_inv_freq) < 1e-6
        q, k = random_array(seed, (B, T, h, head_dim)), random_array(seed + 1, (B, T, h, head_dim))
        Gq, Gk = random_array(seed + 2, q.shape), random_array(seed + 3, k.shape)
        position_ids = torch.arange(start, start + T)[None].expand(B, T)
        qt, kt = tensor(q).requires_grad_(), tensor(k).requires_grad_()
        cos, sin = theirs(qt, position_ids)
        qr, kr = modeling.apply_rotary_pos_emb(qt, kt, cos, sin, unsqueeze_dim=2)
        (qr * tensor(Gq)).sum().add((kr * tensor(Gk)).sum()).backward()
    with stacked_forwards():                     # queries and keys, as within attention
        yq, yk = ours(q, start), ours(k, start)
    dk, dq = ours.backward(Gk), ours.backward(Gq)
    for mine, hf in [(yq, qr.detach()), (yk, kr.detach()), (dq, qt.grad), (dk, kt.grad)]:
        assert relative_difference(host(mine), hf.numpy()) < PARITY_RTOL


@parity
@settings(max_examples=10)
@given(B=small, L=small, D=small, F=small, bias=st.booleans(), seed=seeds)
def test_swiglu_matches_hugging_face_llama_mlp(B, L, D, F, bias, seed):
    torch, _ = _hf()
    from transformers.models.llama import modeling_llama
    torch.manual_seed(seed % 2**31)
    config = llama_config(D=D, H=1, Hkv=1, head_dim=2, F=F, mlp_bias=bias, hidden_act="silu")
    theirs = modeling_llama.LlamaMLP(config).to(torch.float64)
    ours = SwiGLU(D, F, bias=bias)
    for name in ("gate_proj", "up_proj", "down_proj"):
        linear_from(getattr(ours, name), getattr(theirs, name))
    x, G = random_array(seed, (B, L, D)), random_array(seed + 1, (B, L, D))
    y = ours(x)
    dx = ours.backward(G)
    xt = tensor(x).requires_grad_()
    yt = theirs(xt)
    yt.backward(tensor(G))
    assert relative_difference(host(y), yt.detach().numpy()) < PARITY_RTOL
    assert relative_difference(host(dx), xt.grad.numpy()) < PARITY_RTOL
    for name in ("gate_proj", "up_proj", "down_proj"):
        assert_linear_grads(getattr(ours, name), getattr(theirs, name))


@parity
@settings(max_examples=10)
@given(data=st.data(), B=small, T=small, shape=gqa_shapes(), family=st.sampled_from(["llama", "qwen2"]),
       seed=seeds)
def test_grouped_query_attention_matches_hugging_face(data, B, T, shape, family, seed):
    """LlamaAttention (no biases) and Qwen2Attention (q, k, v biases), with SDPA (float64 throughout), a
    causal mask with key padding, the rotary cos, sin of LlamaRotaryEmbedding: output, dx and every weight's
    gradient."""
    torch, transformers = _hf()
    H, Hkv, E = shape
    D = H * data.draw(st.integers(1, 3), label="D / H")  # their config wants D a multiple of H
    rope_type, theta, scaling = data.draw(rope_settings())
    rope = {"rope_type": rope_type, "rope_theta": theta} | scaling
    torch.manual_seed(seed % 2**31)
    if family == "llama":
        from transformers.models.llama.modeling_llama import LlamaAttention as Attention
        config = llama_config(D=D, H=H, Hkv=Hkv, head_dim=E, rope=rope)
    else:
        from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention as Attention
        config = transformers.Qwen2Config(hidden_size=D, num_attention_heads=H, num_key_value_heads=Hkv, head_dim=E,
                                          intermediate_size=4, max_position_embeddings=100000,
                                          rope_parameters=dict(rope), attn_implementation="sdpa")
    theirs = Attention(config, layer_idx=0).to(torch.float64)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if name.endswith("bias"):  # their init leaves biases at 0
                p.normal_(0.0, 0.5)
    ours = GroupedQueryAttention(D, H, Hkv, E, qkv_bias=family == "qwen2",
                                 rotary=RotaryEmbedding.from_rope_parameters(E, config.rope_parameters))
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        linear_from(getattr(ours, name), getattr(theirs, name))
    x, G = random_array(seed, (B, T, D)), random_array(seed + 1, (B, T, D))
    pad = data.draw(padding_masks(B, T))
    y = ours(x, key_padding_mask=pad)
    dx = ours.backward(G)
    with hf_rotary_in_float64() as modeling:
        cos, sin = modeling.LlamaRotaryEmbedding(config)(tensor(x), torch.arange(T)[None].expand(B, T))
    keep = torch.from_numpy(host(~pad))[:, None, None, :] & torch.ones(T, T, dtype=torch.bool).tril()  # (B, 1, T, T)
    xt = tensor(x).requires_grad_()
    yt, _ = theirs(xt, position_embeddings=(cos, sin), attention_mask=keep)
    yt.backward(tensor(G))
    assert relative_difference(host(y), yt.detach().numpy()) < PARITY_RTOL
    # each gradient against the largest of the layer's: where a query sees one key only (the others padding or
    # in its future) its weights are constant, the gradient of q_proj exactly 0 here and rounding (1e-20) there
    floor = max(float(p.grad.abs().max()) for p in [xt, *theirs.parameters()])
    assert relative_difference(host(dx), xt.grad.numpy(), floor) < PARITY_RTOL
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert_linear_grads(getattr(ours, name), getattr(theirs, name), floor)
