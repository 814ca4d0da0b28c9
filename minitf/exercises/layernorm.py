"""Exercise: LayerNorm over the last axis, y = gamma * (x - mean) / sqrt(var + eps) + beta
(docs/layers/layernorm.md).

Write ``backward``: add dL/dgamma and dL/dbeta into their ``.grad`` (+=) and return dL/dx.
The mean and the variance depend on every x of the row: dx has three terms. Check it:

    python -m minitf.exercise check layernorm.py
"""
from minitf.backend import xp
from minitf.module import Module, Parameter

EXERCISE = "layernorm"


class LayerNorm(Module):
    """gamma (D,), beta (D,); x (..., D) -> y (..., D)."""

    def __init__(self, d_model, eps=1e-5):
        self.gamma = Parameter(xp.ones(d_model))
        self.beta = Parameter(xp.zeros(d_model))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(axis=-1, keepdims=True)
        xc = x - mean                                            # centred
        var = (xc * xc).mean(axis=-1, keepdims=True)
        rstd = 1.0 / xp.sqrt(var + self.eps)                     # 1 / sigma
        xhat = xc * rstd                                         # normalised
        self.save_for_backward(xhat, rstd)
        return xhat * self.gamma.data + self.beta.data

    def backward(self, dy):
        """dy (..., D) -> dx (..., D); adds dgamma (D,) and dbeta (D,)."""
        xhat, rstd = self.saved_tensors()
        # your code: dgamma and dbeta sum over every row; dx = rstd * (three terms)
        raise NotImplementedError("LayerNorm.backward is not written yet")
