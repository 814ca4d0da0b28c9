"""Exercise: grouped-query attention's heads (docs/layers/gqa.md). H query heads share Hkv key/value
heads, G = H / Hkv each: query head j reads key/value head j // G,

    K_rep = repeat(K, G, axis=1),   U_rep = repeat(U, G, axis=1),   O = attention(Q, K_rep, U_rep), causal.

Write ``backward``: return dQ, dK, dU from dO. The attention's own backward is written
(``scaled_dot_product_attention_backward``: the attention exercise's); yours is the way back through
the repeat, where each key/value head was read by G query heads. Check it:

    python -m minitf.exercise check gqa.py
"""
from minitf.attention import attention_keep_mask, scaled_dot_product_attention  # noqa: F401
from minitf.attention import scaled_dot_product_attention_backward  # noqa: F401 (for your backward)
from minitf.backend import xp
from minitf.module import Module

EXERCISE = "gqa"


class GroupedQueryAttention(Module):
    """Q (B, H, T, dk), K and U (B, Hkv, T, dk), H = G Hkv -> O (B, H, T, dk); causal."""

    def __init__(self, group):
        self.group = group                                       # G query heads per key/value head

    def forward(self, Q, K, U):
        G, T = self.group, Q.shape[2]
        K_rep, U_rep = xp.repeat(K, G, axis=1), xp.repeat(U, G, axis=1)   # (B, H, T, dk) each: head j reads j // G
        keep = attention_keep_mask(None, True, T, T)             # causal: query i sees keys j <= i
        O, P = scaled_dot_product_attention(Q, K_rep, U_rep, keep)
        self.save_for_backward(Q, K_rep, U_rep, P)
        return O                                                 # (B, H, T, dk)

    def backward(self, dO):
        """dO (B, H, T, dk) -> (dQ, dK, dU), each the shape of its input."""
        Q, K_rep, U_rep, P = self.saved_tensors()
        # your code: the attention's backward gives dQ, dK_rep, dU_rep; then back through the repeat
        raise NotImplementedError("GroupedQueryAttention.backward is not written yet")
