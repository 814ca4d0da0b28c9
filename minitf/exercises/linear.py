"""Exercise: Linear, y = x W + b (docs/layers/linear.md).

Write ``backward``: add dL/dW into ``self.weight.grad`` and dL/db into ``self.bias.grad``
(with +=: a weight may be used twice), and return dL/dx. Then check it:

    python -m minitf.exercise check linear.py
"""
from minitf.backend import xp
from minitf.layers import matmul_rows
from minitf.module import Module, Parameter

EXERCISE = "linear"


class Linear(Module):
    """weight (d_in, d_out), bias (d_out,); x (..., d_in) -> y (..., d_out)."""

    def __init__(self, d_in, d_out):
        self.weight = Parameter(xp.zeros((d_in, d_out)))
        self.bias = Parameter(xp.zeros(d_out))

    def forward(self, x):
        y = matmul_rows(x, self.weight.data)                     # y = x W
        y += self.bias.data
        self.save_for_backward(x)
        return y

    def backward(self, dy):
        """dy (..., d_out) -> dx (..., d_in); adds dW (d_in, d_out) and db (d_out,)."""
        (x,) = self.saved_tensors()
        # your code: dW sums over every leading (batch, position) index, so does db
        raise NotImplementedError("Linear.backward is not written yet")
