"""Exercise: SiLU ("swish"), y = x sigmoid(x) elementwise, sigmoid(x) = 1 / (1 + exp(-x)): the
feed-forward activation of the Marian (opus-mt) translation models (docs/pretrained.md derives its
backward beside GELU's; docs/layers/silu.md).

Write ``backward``: return dL/dx from dL/dy. The forward saves x and s = sigmoid(x), so the backward
needs no exponential. Check it:

    python -m minitf.exercise check silu.py
"""
from minitf.layers import sigmoid  # 1 / (1 + exp(-x)), elementwise; exp(-x) = inf gives the limit 0
from minitf.module import Module

EXERCISE = "silu"


class SiLU(Module):
    """x (...) -> y (...), the same shape."""

    def forward(self, x):
        s = sigmoid(x)                                           # s = sigmoid(x)
        self.save_for_backward(x, s)
        return x * s                                             # y = x sigmoid(x)

    def backward(self, dy):
        """dy (...) -> dx (...)."""
        x, s = self.saved_tensors()
        # your code: the product rule on x * sigmoid(x), and sigmoid's derivative written with s alone
        raise NotImplementedError("SiLU.backward is not written yet")
