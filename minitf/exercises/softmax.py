"""Exercise: softmax over the last axis, y_i = exp(x_i) / sum_j exp(x_j) (docs/layers/softmax.md).

Write ``backward``: return dL/dx from dL/dy, without forming the (V, V) Jacobian
diag(y) - y y^T. Then check it:

    python -m minitf.exercise check softmax.py
"""
from minitf.backend import xp
from minitf.module import Module

EXERCISE = "softmax"


class Softmax(Module):
    """x (..., V) -> y (..., V), each row summing to 1."""

    def forward(self, x):
        e = xp.exp(x - x.max(axis=-1, keepdims=True))          # shifted for stability
        y = e / e.sum(axis=-1, keepdims=True)
        self.save_for_backward(y)
        return y

    def backward(self, dy):
        """dy (..., V) -> dx (..., V)."""
        (y,) = self.saved_tensors()
        # your code: the vector-Jacobian product dy^T (diag(y) - y y^T), row by row
        raise NotImplementedError("Softmax.backward is not written yet")
