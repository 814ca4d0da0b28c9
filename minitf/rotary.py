"""Rotary position embedding (RoPE, Su et al. 2021) of queries and keys, in Hugging Face's layout
(Llama, Qwen2, Mistral): the head vector's two halves are the two coordinates of dk/2 planes, plane i
turned by the angle position * inv_freq[i]. Forward and backward side by side; the backward is the
same rotation by minus the angle.

    y = x * cos + rotate_half(x) * sin,   rotate_half([x1, x2]) = [-x2, x1]
    cos, sin (T, dk) = cos, sin of position * [inv_freq, inv_freq],  inv_freq[i] = 1 / theta^(2i/dk)

Glossary as in minitf.layers; here h is a number of heads (queries' or keys').
"""
import math

from minitf import backend
from minitf.backend import xp
from minitf.module import Module

#: the frequency schedules this module computes (Hugging Face's ``rope_parameters["rope_type"]``)
ROPE_TYPES = ("default", "linear", "llama3")
#: the llama3 schedule's parameters, as Hugging Face's config names them
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
#: each schedule's parameters besides theta: {rope_type: keys} (linear: positions divided by ``factor``)
ROPE_KEYS = {"default": (), "linear": ("factor",), "llama3": LLAMA3_KEYS}


def default_inv_freq(head_dim, theta=10000.0):
    """inv_freq[i] = 1 / theta^(2i / dk) for i < dk/2 -> host float64 (dk/2,)."""
    return 1.0 / theta ** (backend.host.arange(0, head_dim, 2, dtype=backend.host.float64) / head_dim)


def llama3_inv_freq(inv_freq, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    """Llama 3.1's scaling of ``inv_freq`` (host (dk/2,)) -> host float64 (dk/2,) (Hugging Face's
    ``_compute_llama3_parameters``): wavelengths 2 pi / inv_freq shorter than
    original_max / high_freq_factor are kept, longer than original_max / low_freq_factor divided by
    ``factor``, and those in between interpolated between the two by how many wavelengths fit the
    original context."""
    np = backend.host
    old_context = original_max_position_embeddings
    low_freq_wavelen = old_context / low_freq_factor                 # longer than this: scaled by 1 / factor
    high_freq_wavelen = old_context / high_freq_factor               # shorter than this: kept
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)  # 0..1 in between
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, scaled)


def rotate_half(x):
    """[x1, x2] -> [-x2, x1] on the last axis (dk, its halves x1 and x2): each plane (x1[i], x2[i])
    turned by 90 degrees."""
    half = x.shape[-1] // 2
    return xp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class RotaryEmbedding(Module):
    """``y = x * cos + rotate_half(x) * sin`` for x (B, T, h, dk): position ``start + t`` of every
    head turned by its angles; no parameters.

    Positions are on axis 1 as in every minitf layer (Hugging Face's ``apply_rotary_pos_emb`` with
    ``unsqueeze_dim=2``); ``start`` is the first position (the length of a key/value cache).
    ``rope_type``: "default" (inv_freq = 1 / theta^(2i/dk)), "linear" (inv_freq / ``factor``: position p turned
    as p / factor, Hugging Face's ``_compute_linear_scaling_rope_parameters``) or "llama3" (Llama 3.1's scaling
    of it, with the four :data:`LLAMA3_KEYS` given as keyword arguments). Output (B, T, h, dk).
    """

    def __init__(self, head_dim, theta=10000.0, rope_type="default", **scaling):
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {rope_type!r} is not supported: use one of {', '.join(ROPE_TYPES)}")
        if head_dim % 2:
            raise ValueError(f"rotary embedding needs an even head_dim (pairs of coordinates), got {head_dim}")
        wanted = ROPE_KEYS[rope_type]
        if sorted(scaling) != sorted(wanted):
            raise ValueError(f"rope_type {rope_type!r} takes the parameters {list(wanted)}, got {sorted(scaling)}")
        if rope_type == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
            raise ValueError(f"llama3 rope needs high_freq_factor > low_freq_factor, got "
                             f"{scaling['high_freq_factor']} and {scaling['low_freq_factor']}")
        self.head_dim, self.theta, self.rope_type, self.scaling = head_dim, theta, rope_type, dict(scaling)
        inv_freq = default_inv_freq(head_dim, theta)
        if rope_type == "llama3":
            inv_freq = llama3_inv_freq(inv_freq, **scaling)
        if rope_type == "linear":
            inv_freq = inv_freq / scaling["factor"]                  # angle (p / factor) * inv_freq
        self.inv_freq = backend.asarray(inv_freq, dtype=xp.float64)  # (dk/2,)

    @classmethod
    def from_rope_parameters(cls, head_dim, rope_parameters):
        """From a Hugging Face config's ``rope_parameters`` dict (``rope_type``, ``rope_theta`` and the
        type's own keys; others, such as ``partial_rotary_factor`` 1.0, must be absent)."""
        params = dict(rope_parameters)
        rope_type = params.pop("rope_type", "default")
        theta = params.pop("rope_theta", 10000.0)
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {rope_type!r} is not supported: use one of {', '.join(ROPE_TYPES)}")
        return cls(head_dim, theta, rope_type, **params)

    def cos_sin(self, length, start=0, dtype=None):
        """cos, sin (length, dk) of positions ``start .. start+length-1``, computed in float64."""
        position = xp.arange(start, start + length, dtype=xp.float64)[:, None]   # (T, 1)
        freqs = position * self.inv_freq                                          # (T, dk/2)
        angles = xp.concatenate([freqs, freqs], axis=-1)                          # (T, dk): both halves
        dtype = dtype or backend.get_default_dtype()
        return xp.cos(angles).astype(dtype), xp.sin(angles).astype(dtype)

    def forward(self, x, start=0):
        """x (B, T, h, dk) -> y (B, T, h, dk)."""
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"rotary embedding of head_dim {self.head_dim} got vectors of {x.shape[-1]}")
        cos, sin = self.cos_sin(x.shape[1], start, x.dtype)
        cos, sin = cos[:, None, :], sin[:, None, :]              # (T, 1, dk): the same for every head
        self.save_for_backward(cos, sin)
        return x * cos + rotate_half(x) * sin                    # y = x cos + rotate_half(x) sin

    def backward(self, dy):
        """dy (B, T, h, dk) -> dx (B, T, h, dk)."""
        cos, sin = self.saved_tensors()
        # y = x cos + R x sin, R = rotate_half, whose transpose is -R (a 90 degree turn back), and sin is
        # the same on both halves so it commutes with R  =>  dx = dy cos - R(dy) sin: the turn by -angle
        return dy * cos - rotate_half(dy) * sin
