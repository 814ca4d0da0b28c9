"""Exercise: the SwiGLU feed-forward, y = down(silu(gate(x)) * up(x)): the Llama family's MLP
(docs/layers/swiglu.md).

Write ``backward``: return dL/dx, the projections adding their own gradients (call their
``backward``). The product a * u needs the product rule, and x reaches y by two paths. Check it:

    python -m minitf.exercise check swiglu.py
"""
from minitf.layers import Linear, SiLU
from minitf.module import Module

EXERCISE = "swiglu"


class SwiGLU(Module):
    """Linear gate_proj, up_proj (D -> F), down_proj (F -> D), no biases; x (..., D) -> y (..., D)."""

    def __init__(self, d_model, d_ff):
        self.gate_proj = Linear(d_model, d_ff, bias=False)
        self.up_proj = Linear(d_model, d_ff, bias=False)
        self.down_proj = Linear(d_ff, d_model, bias=False)
        self.act = SiLU()

    def forward(self, x):
        a = self.act(self.gate_proj(x))                          # a = silu(x W_gate)  (..., F)
        u = self.up_proj(x)                                      # u = x W_up  (..., F)
        self.save_for_backward(a, u)
        return self.down_proj(a * u)                             # y = (a * u) W_down  (..., D)

    def backward(self, dy):
        """dy (..., D) -> dx (..., D); adds the gradients of the three projections."""
        a, u = self.saved_tensors()
        # your code: down_proj's backward, the product rule on a * u, then both paths back to x
        raise NotImplementedError("SwiGLU.backward is not written yet")
