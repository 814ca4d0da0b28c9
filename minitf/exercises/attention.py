"""Exercise: scaled dot-product attention with a mask (docs/layers/attention.md),

    A = Q K^T / sqrt(dk),   P = softmax(A) over the keys a query may see,   O = P U.

Write ``backward``: return dQ, dK, dU from dO. Masked entries have P = 0. Check it:

    python -m minitf.exercise check attention.py
"""
import math

from minitf import backend
from minitf.backend import xp
from minitf.module import Module

EXERCISE = "attention"


class Attention(Module):
    """Q (B, H, Tq, dk), K (B, H, Tk, dk), U (B, H, Tk, dk), keep bool (broadcastable to
    (B, H, Tq, Tk), True = may attend) -> O (B, H, Tq, dk)."""

    def forward(self, Q, K, U, keep=None):
        scale = 1.0 / math.sqrt(Q.shape[-1])
        A = (Q @ K.swapaxes(-1, -2)) * scale                     # scores  (B, H, Tq, Tk)
        if keep is not None:
            A = xp.where(keep, A, backend.finfo(A.dtype).min / 2)  # masked: a very negative score
        e = xp.exp(A - A.max(axis=-1, keepdims=True))
        if keep is not None:
            e *= keep                                            # exact zeros where masked
        total = e.sum(axis=-1, keepdims=True)
        P = e / xp.where(total > 0, total, 1)                    # P = softmax(A)  (B, H, Tq, Tk)
        self.save_for_backward(Q, K, U, P)
        return P @ U                                             # O = P U  (B, H, Tq, dk)

    def backward(self, dO):
        """dO (B, H, Tq, dk) -> (dQ, dK, dU), each the shape of its input."""
        Q, K, U, P = self.saved_tensors()
        # your code: O = P U, then P = softmax(A) row by row, then A = Q K^T * scale
        raise NotImplementedError("Attention.backward is not written yet")
