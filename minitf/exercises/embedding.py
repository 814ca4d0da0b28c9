"""Exercise: the embedding, y = W[ids] * sqrt(D) (docs/layers/embedding.md).

Write ``backward``: add dL/dW into ``self.weight.grad``. An id may occur several times in a
batch: every occurrence adds to its row (a scatter-add). ids get no gradient: return None.
Check it:

    python -m minitf.exercise check embedding.py
"""
import math

from minitf.backend import xp
from minitf.module import Module, Parameter

EXERCISE = "embedding"


class Embedding(Module):
    """weight (V, D); ids (B, L) ints -> y (B, L, D)."""

    def __init__(self, vocab_size, d_model):
        self.weight = Parameter(xp.zeros((vocab_size, d_model)))
        self.scale = math.sqrt(d_model)

    def forward(self, ids):
        self.save_for_backward(ids)
        return self.weight.data[ids] * self.scale

    def backward(self, dy):
        """dy (B, L, D) -> None; adds dW (V, D)."""
        (ids,) = self.saved_tensors()
        # your code: which rows of W did each position read, and with what factor?
        raise NotImplementedError("Embedding.backward is not written yet")
