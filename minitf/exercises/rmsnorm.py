"""Exercise: RMSNorm over the last axis, y = weight * x / sqrt(mean(x^2) + eps): the Llama family's
norm, LayerNorm without the mean and without beta (docs/layers/rmsnorm.md).

Write ``backward``: add dL/dweight into its ``.grad`` (+=) and return dL/dx. No mean is subtracted,
so dx has one term fewer than LayerNorm's: the part through each row's rstd remains. Check it:

    python -m minitf.exercise check rmsnorm.py
"""
from minitf.backend import xp
from minitf.module import Module, Parameter

EXERCISE = "rmsnorm"


class RMSNorm(Module):
    """weight (D,); x (..., D) -> y (..., D)."""

    def __init__(self, d_model, eps=1e-6):
        self.weight = Parameter(xp.ones(d_model))
        self.eps = eps

    def forward(self, x):
        rstd = 1.0 / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps)   # 1 / rms  (..., 1)
        xhat = x * rstd                                                          # normalised  (..., D)
        self.save_for_backward(xhat, rstd)
        return xhat * self.weight.data

    def backward(self, dy):
        """dy (..., D) -> dx (..., D); adds dweight (D,)."""
        xhat, rstd = self.saved_tensors()
        # your code: dweight sums over every row; dx = rstd * (dxhat - the part through rstd)
        raise NotImplementedError("RMSNorm.backward is not written yet")
