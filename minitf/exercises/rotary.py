"""Exercise: rotary positions (RoPE), y = x cos + rotate_half(x) sin on queries or keys (B, T, heads,
dk), each pair (x_i, x_{i + dk/2}) turned by the angle position * theta^(-2i/dk) (docs/layers/rotary.md).

Write ``backward``: return dL/dx. A rotation's transpose is the rotation back: rotate_half's
transpose is -rotate_half. Check it:

    python -m minitf.exercise check rotary.py
"""
from minitf.backend import xp
from minitf.module import Module

EXERCISE = "rotary"


def rotate_half(x):
    """[x1, x2] -> [-x2, x1] over the last axis (Hugging Face's layout: the pairs are i and i + dk/2)."""
    half = x.shape[-1] // 2
    return xp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class RotaryEmbedding(Module):
    """x (B, T, h, dk) -> y (B, T, h, dk); positions start, start + 1, ... (a cached step's offset)."""

    def __init__(self, head_dim, theta=10000.0):
        self.inv_freq = 1.0 / theta ** (xp.arange(0, head_dim, 2) / head_dim)   # (dk/2,)

    def forward(self, x, start=0):
        positions = xp.arange(start, start + x.shape[1])                         # (T,)
        freqs = positions[:, None] * self.inv_freq[None, :]                      # (T, dk/2)
        angles = xp.concatenate([freqs, freqs], axis=-1)                         # (T, dk): both halves
        cos, sin = xp.cos(angles)[:, None, :], xp.sin(angles)[:, None, :]        # (T, 1, dk): every head
        self.save_for_backward(cos, sin)
        return x * cos + rotate_half(x) * sin

    def backward(self, dy):
        """dy (B, T, h, dk) -> dx (B, T, h, dk)."""
        cos, sin = self.saved_tensors()
        # your code: the transposed rotation (the turn by -angle)
        raise NotImplementedError("RotaryEmbedding.backward is not written yet")
