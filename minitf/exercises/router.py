"""Exercise: the router of a mixture of experts (docs/moe.md): the softmax over all E experts' logits, the top k,
their probabilities renormalised to sum 1 or not, and the outputs of the chosen experts mixed by them:

    p = softmax(logits)      over all E            (N, E)
    idx = the top k of p, c = p[idx]               (N, k)
    w = c / sum(c)  (renormalise=True, Mixtral)  or  w = c  (renormalise=False, Qwen2-MoE, OLMoE)
    y_n = sum_j w_nj out[n, idx_nj]                (N, D); out (N, E, D): each expert's output for each token

Write ``backward``: return (dL/dlogits, dL/dout). Top-k is a choice (no derivative of its own); the check runs
both forms, each on its own inputs (logits_mixtral and out_mixtral, logits_qwen and out_qwen). Check it:

    python -m minitf.exercise check router.py
"""
from minitf.backend import xp
from minitf.layers import softmax, softmax_backward  # noqa: F401 (softmax_backward: yours to use)
from minitf.module import Module
from minitf.moe import top_k

EXERCISE = "router"


class Router(Module):
    """logits (N, E), out (N, E, D) -> y (N, D): each token's top ``k`` experts' outputs, weighted."""

    def __init__(self, k, renormalise):
        self.k, self.renormalise = k, renormalise

    def forward(self, logits, out):
        p = softmax(logits)                                      # over all E  (N, E)
        idx, c = top_k(p, self.k)                                # the chosen experts, p of them  (N, k)
        t = c.sum(axis=-1, keepdims=True)                        # (N, 1)
        w = c / t if self.renormalise else c                     # (N, k)
        chosen = xp.take_along_axis(out, idx[..., None], axis=1)  # out[n, idx_nj]  (N, k, D)
        self.save_for_backward(p, idx, t, w, chosen)
        return (w[..., None] * chosen).sum(axis=1)               # y = sum_j w_j out[idx_j]  (N, D)

    def backward(self, dy):
        """dy (N, D) -> (dlogits (N, E), dout (N, E, D))."""
        p, idx, t, w, chosen = self.saved_tensors()
        # your code: dout (the chosen experts only), dw, the renormalisation's Jacobian where renormalise, then
        # the softmax's backward over all E
        raise NotImplementedError("Router.backward is not written yet")
