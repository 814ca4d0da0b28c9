"""Scaled dot-product and multi-head attention (paper 3.2), and Llama's grouped-query attention, forward
and backward side by side, so one gradient can be followed from the output projection back to the
queries, keys and values in this one file.

Masks are boolean "keep" arrays, True where a query may attend to a key,
broadcastable to (B, H, Tq, Tk). ``key_padding_mask`` follows PyTorch: True
marks a padding key that must be ignored.

Dropout on the attention weights (BERT's ``attention_probs_dropout_prob``, GPT-2's ``attn_pdrop``, T5's
``dropout_rate``): ``drop``, a mask (B, H, Tq, Tk) of 0 (dropped) and 1 / (1 - p) (kept) drawn by the module's
:class:`minitf.layers.Dropout` (:meth:`~minitf.layers.Dropout.draw_mask`), multiplies the weights P after the
softmax, before P U; None (p = 0, or eval mode): nothing drawn, nothing multiplied.
"""
import math

from minitf import backend
from minitf.backend import xp
from minitf.layers import Dropout, Linear, RMSNorm, init_array, matmul_rows
from minitf.module import Module, Parameter, is_grad_enabled
from minitf.rotary import RotaryEmbedding


def attention_keep_mask(key_padding_mask=None, causal=False, num_queries=None, num_keys=None):
    """Combine padding and causality into one boolean keep-mask.

    key_padding_mask: (B, Tk) bool, True = padding key.  ->  keep (B, 1, 1, Tk)
    causal: query i (of the last ``num_queries`` positions) sees keys j <= i.  ->  (1, 1, Tq, Tk)
    Returns None when nothing is masked.
    """
    keep = None
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]
    if causal:
        offset = num_keys - num_queries  # earlier positions already in the key/value cache
        future = xp.triu(xp.ones((num_queries, num_keys), dtype=bool), k=1 + offset)
        causal_keep = ~future[None, None]
        keep = causal_keep if keep is None else keep & causal_keep
    return keep


# --------------------------------------------------------------------------- #
# Attention(Q, K, V) = softmax(Q K^T / sqrt(dk)) V                 (paper eq. 1)
# The values are called U here and the scores A (V is the vocabulary size, S the source
# length; docs/README.md, the glossary).
# --------------------------------------------------------------------------- #
#: Products of fewer multiply-adds than this (Tq * Tk * dk a head) run on one BLAS thread (OpenBLAS's threshold,
#: 4 x 65536): the whole attention core of such heads runs on blocks of batch rows on the threads. Larger products
#: stay on BLAS's own threads, and only the softmax is split: both pools at once oversubscribe the cores (a
#: (4, 12, 512, 64) core and backward took 1086 ms split, 287 ms not, on 2 cores).
SMALL_PRODUCT = 1 << 18


def scaled_dot_product_attention(Q, K, U, keep=None, drop=None):
    """Q (B, H, Tq, dk), K (B, H, Tk, dk), values U (B, H, Tk, dk), keep bool or None; ``drop`` the dropout mask
    (B, H, Tq, Tk) on the weights or None (the module docstring).

    Returns ``O`` (B, H, Tq, dk) and the attention weights ``P`` (B, H, Tq, Tk), before dropout.
    A query whose keys are all masked gets P = 0 and O = 0, never NaN.

    On ``backend.threads()`` threads, the same numbers: small heads (decoding's one query a row against its cache,
    short sentences) as blocks of batch rows, all of :func:`attend` in each (B x H / threads small products on
    each thread instead of B x H on one); larger ones with the softmax on blocks of rows.
    """
    if Q.shape[-2] * K.shape[-2] * Q.shape[-1] >= SMALL_PRODUCT:
        return attend(Q, K, U, keep, drop)
    # K first: the keys (B, H, Tk, dk) are the size of the work (a decoding step has one query a row)
    masks = {name: mask for name, mask in (("keep", keep), ("drop", drop)) if mask is not None}  # those given
    return backend.by_rows(lambda K, U, Q, *given: attend(Q, K, U, **dict(zip(masks, given))), K, U, Q,
                           *masks.values())


def attend(Q, K, U, keep=None, drop=None):
    """:func:`scaled_dot_product_attention`, its products on the calling thread (and BLAS's)."""
    scale = 1.0 / math.sqrt(Q.shape[-1])
    A = Q @ K.swapaxes(-1, -2)                                   # (B, H, Tq, Tk)
    A *= scale                                                   # A = Q K^T / sqrt(dk), in place
    # P = softmax(A), masked, in A's own memory (the core's largest array: no second one); on blocks of rows
    # on the threads (inline inside a block of the whole core)
    backend.by_rows(masked_softmax_in_place, A, *([] if keep is None else [keep]))
    P = A                                                        # (B, H, Tq, Tk)
    O = dropped(P, drop) @ U                                     # O = dropout(P) U  (B, H, Tq, dk)
    return O, P


def dropped(P, drop):
    """dropout(P) = P * drop, a new array (P is kept for the softmax's backward); P itself without a mask."""
    return P if drop is None else P * drop


def masked_softmax_in_place(A, keep=None):
    """A := softmax(A) over the last axis where ``keep`` (broadcast to A) is True, 0 elsewhere: each step in A's
    own memory, the plain NumPy line in its comment (the same numbers, bit for bit)."""
    if keep is not None:
        # a very negative (finite) score: exp() makes it 0, and no inf - inf = NaN
        xp.copyto(A, backend.finfo(A.dtype).min / 2, where=~keep)  # A = xp.where(keep, A, finfo.min / 2)
    A -= A.max(axis=-1, keepdims=True)                           # shifted for stability
    e = xp.exp(A, out=A)                                         # e = xp.exp(A - A.max(axis=-1, keepdims=True))
    if keep is not None:
        e *= keep                                                # exact zeros where masked
    total = e.sum(axis=-1, keepdims=True)
    e /= xp.where(total > 0, total, 1)                           # P = softmax(A) = e / total; all-masked row -> 0


def scaled_dot_product_attention_backward(dO, Q, K, U, P, drop=None):
    """From dL/dO (B, H, Tq, dk) to dQ, dK, dU, given the forward's Q, K, U, P and dropout mask ``drop`` (or
    None). On ``backend.threads()`` threads as the forward (the same numbers)."""
    if Q.shape[-2] * K.shape[-2] * Q.shape[-1] >= SMALL_PRODUCT:
        return attend_backward(dO, Q, K, U, P, drop)
    return backend.by_rows(attend_backward, dO, Q, K, U, P, *([] if drop is None else [drop]))


def attend_backward(dO, Q, K, U, P, drop=None):
    """:func:`scaled_dot_product_attention_backward`, its products on the calling thread (and BLAS's)."""
    scale = 1.0 / math.sqrt(Q.shape[-1])
    # O = dropout(P) U  =>  dP = dO U^T, dU = dropout(P)^T dO, then through the dropout (dropped_backward)
    dP = dropped_backward(dO @ U.swapaxes(-1, -2), drop)         # (B, H, Tq, Tk)
    dU = dropped(P, drop).swapaxes(-1, -2) @ dO                  # (B, H, Tk, dk)
    # P = softmax(A) row-wise  =>  dA = P * (dP - sum_j dP_j P_j); masked P = 0 gives dA = 0
    # dA = P * (dP - (dP * P).sum(axis=-1, keepdims=True)), in dP's memory, on blocks of rows (inline inside a block)
    backend.by_rows(softmax_backward_in_place, dP, P)
    dA = dP                                                      # (B, H, Tq, Tk)
    # A = Q K^T * scale  =>  dQ = dA K * scale,  dK = dA^T Q * scale
    dQ = dA @ K                                                  # (B, H, Tq, dk)
    dQ *= scale                                                  # dQ = (dA @ K) * scale, in place
    dK = dA.swapaxes(-1, -2) @ Q                                 # (B, H, Tk, dk)
    dK *= scale                                                  # dK = (dA^T @ Q) * scale, in place
    return dQ, dK, dU


def dropped_backward(dP_dropped, drop):
    """The gradient of the weights P from that of dropout(P) (B, H, Tq, Tk), in its memory."""
    if drop is not None:
        # dropout(P) = P * drop  =>  dP = d(dropout(P)) * drop  (0 where dropped)
        dP_dropped *= drop
    return dP_dropped


def softmax_backward_in_place(dP, P):
    """dP := P * (dP - sum_j dP_j P_j) over the last axis: the scores' gradient dA, in dP's memory."""
    dP -= (dP * P).sum(axis=-1, keepdims=True)
    dP *= P


def weights_dropout(p):
    """The :class:`Dropout` that draws an attention module's mask on its weights (it runs no forward of its own: the
    core multiplies), or None for p = 0: no dropout, and no module that never runs."""
    return Dropout(p) if p else None


def draw_weights_mask(dropout, Q, K):
    """The mask (B, H, Tq, Tk) of the weights of queries Q (B, H, Tq, dk) over keys K (B, H, Tk, dk), drawn by
    ``dropout`` (:func:`weights_dropout`'s); None, and nothing drawn, without one or in eval mode."""
    return None if dropout is None else dropout.draw_mask(Q.shape[:3] + K.shape[2:3], Q.dtype)


def append_to_cache(cache, k, v):
    """Keys and values k, v (B, T, D) of T new positions written after the L cached ones; returns all L + T
    of each (B, L + T, D), views. The cache keeps them in arrays with room for more positions, ``k_room`` and
    ``v_room`` (B, capacity, D), its first ``length`` positions filled, the capacity doubled when full: a step
    writes only its own positions (a concatenate would copy every earlier one, each step)."""
    B, T, D = k.shape
    L = cache.get("length", 0)
    if "k_room" not in cache or cache["k_room"].shape[1] < L + T:   # full: move to twice the room
        capacity = max(2 * (L + T), 16)
        for name in ("k_room", "v_room"):
            room = xp.empty((B, capacity, D), dtype=k.dtype)
            if L:
                room[:, :L] = cache[name][:, :L]                 # the earlier positions, once per doubling
            cache[name] = room
    cache["k_room"][:, L:L + T], cache["v_room"][:, L:L + T] = k, v
    cache["length"] = L + T
    return cache["k_room"][:, :L + T], cache["v_room"][:, :L + T]   # (B, L + T, D) each


# --------------------------------------------------------------------------- #
# MultiHead(Q, K, V) = Concat(head_1..head_h) W^O,
#   head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)                   (paper 3.2.2)
# --------------------------------------------------------------------------- #
class MultiHeadAttention(Module):
    """Multi-head attention for self-attention (``memory=None``) and
    encoder-decoder cross-attention (keys and values from ``memory``).

    Parameters: ``w_qkv`` (D, 3D) holds W^Q, W^K, W^V of all heads side by side
    (one matmul for self-attention), ``b_qkv`` (3D,), ``w_o`` (D, D), ``b_o`` (D,). ``dropout``: the
    probability of dropping an attention weight while training (the paper's 0: none; BERT's
    ``attention_probs_dropout_prob``, GPT-2's ``attn_pdrop``), its :class:`Dropout` ``weights_dropout`` (None at 0).
    """

    record_weights = False  # set True to keep the last attention weights P (before dropout) in ``self.weights``

    def __init__(self, d_model, num_heads, dropout=0.0):
        if d_model % num_heads != 0:
            raise ValueError(f"d_model must be divisible by num_heads, got d_model={d_model}, num_heads={num_heads}")
        self.d_model, self.num_heads = d_model, num_heads
        rng, limit = backend.init_rng(), math.sqrt(6.0 / (2 * d_model))  # Xavier per D x D block
        self.w_qkv = Parameter(init_array(rng.uniform(-limit, limit, (d_model, 3 * d_model))))
        self.b_qkv = Parameter(init_array(backend.host.zeros(3 * d_model)))
        self.w_o = Parameter(init_array(rng.uniform(-limit, limit, (d_model, d_model))))
        self.b_o = Parameter(init_array(backend.host.zeros(d_model)))
        self.weights_dropout = weights_dropout(dropout)

    def split_heads(self, x):
        """(B, L, D) -> (B, H, L, dk)"""
        B, L, _ = x.shape
        return x.reshape(B, L, self.num_heads, -1).transpose(0, 2, 1, 3)  # (B, L, H, dk) -> (B, H, L, dk)

    def merge_heads(self, x):
        """(B, H, L, dk) -> (B, L, D)"""
        B, _, L, _ = x.shape
        return x.transpose(0, 2, 1, 3).reshape(B, L, self.d_model)  # (B, L, H, dk) -> (B, L, D)

    def forward(self, x, memory=None, key_padding_mask=None, causal=False, cache=None):
        """x (B, Tq, D) queries; memory (B, Tk, D) or None for self-attention;
        key_padding_mask (B, Tk) bool; cache: a dict for incremental decoding
        (keys and values of earlier steps, or of the memory), only under no_grad().

        Returns y (B, Tq, D).
        """
        if memory is not None and memory.shape[0] != x.shape[0]:
            return self.forward_beams(x, memory, key_padding_mask, cache)
        D = self.d_model
        W, b = self.w_qkv.data, self.b_qkv.data
        if memory is None:
            qkv = matmul_rows(x, W) + b                          # [q k v] = x [W^Q W^K W^V] + b  (B, Tq, 3D)
            q, k, v = qkv[..., :D], qkv[..., D:2 * D], qkv[..., 2 * D:]  # each (B, Tq, D)
            if cache is not None:                                # earlier steps' keys/values, then these
                k, v = append_to_cache(cache, k, v)              # each (B, Tk, D)
        else:
            q = matmul_rows(x, W[:, :D]) + b[:D]                 # q = x W^Q + b^Q  (B, Tq, D)
            if cache is not None and "k" in cache:               # memory projected at step 0
                k, v = cache["k"], cache["v"]
            else:
                kv = matmul_rows(memory, W[:, D:]) + b[D:]       # [k v] = memory [W^K W^V] + b  (B, Tk, 2D)
                k, v = kv[..., :D], kv[..., D:]                  # each (B, Tk, D)
                if cache is not None:
                    cache["k"], cache["v"] = k, v
        Q, K, U = self.split_heads(q), self.split_heads(k), self.split_heads(v)  # (B, H, Tq|Tk, dk)
        keep = attention_keep_mask(key_padding_mask, causal, Q.shape[2], K.shape[2])
        drop = draw_weights_mask(self.weights_dropout, Q, K)     # (B, H, Tq, Tk), or None: no dropout
        O, P = scaled_dot_product_attention(Q, K, U, keep, drop)  # each head attends
        if self.record_weights:                                  # for pictures (docs/figures)
            self.weights = P
        o = self.merge_heads(O)                                  # Concat(head_1..head_H)  (B, Tq, D)
        y = matmul_rows(o, self.w_o.data) + self.b_o.data        # y = o W^O + b^O  (B, Tq, D)
        self.save_for_backward(x=x, memory=memory, Q=Q, K=K, U=U, P=P, drop=drop, o=o)
        return y

    def forward_beams(self, x, memory, key_padding_mask=None, cache=None):
        """Cross-attention of G beams per sentence while decoding: x (B*G, Tq, D), rows b*G to b*G + G - 1
        the beams of sentence b; memory (B, Tk, D) and key_padding_mask (B, Tk) once per sentence. Queries do
        not interact, so a sentence's G beams are G*Tq queries of one row: its keys and values are projected
        and attended to once, not G times. Under no_grad() only (no backward). Returns y (B*G, Tq, D)."""
        B = memory.shape[0]
        if is_grad_enabled() or x.shape[0] % B:
            raise ValueError(f"cross-attention needs memory's batch ({B}) equal to the queries' "
                             f"({x.shape[0]}), or a divisor of it under no_grad() (beams of a sentence)")
        y = self.forward(x.reshape(B, -1, self.d_model), memory, key_padding_mask, cache=cache)  # (B, G*Tq, D)
        return y.reshape(x.shape)                                                     # (B*G, Tq, D)

    def backward(self, dy):
        """dy (B, Tq, D) -> (dx (B, Tq, D), dmemory (B, Tk, D) or None); adds
        the gradients of w_qkv, b_qkv, w_o, b_o."""
        saved = self.saved_tensors()
        x, memory, D = saved.x, saved.memory, self.d_model
        # y = o W^O + b^O  =>  dW^O = o^T dy,  db^O = sum dy,  do = dy W^O^T
        self.w_o.grad += saved.o.reshape(-1, D).T @ dy.reshape(-1, D)           # (D, D)
        self.b_o.grad += dy.reshape(-1, D).sum(axis=0)                          # (D,)
        do = matmul_rows(dy, self.w_o.data.T)                                   # (B, Tq, D)
        # o = merge_heads(O)  =>  dO = split_heads(do)
        dQ, dK, dU = scaled_dot_product_attention_backward(
            self.split_heads(do), saved.Q, saved.K, saved.U, saved.P, saved.drop)  # (B, H, Tq|Tk, dk)
        W = self.w_qkv.data
        if memory is None:
            # Q = split_heads(q) ... => [dq dk dv] = the 3H heads' gradients side by side, in one copy
            dqkv = xp.concatenate([dX.transpose(0, 2, 1, 3) for dX in (dQ, dK, dU)], axis=2)  # (B, Tq, 3H, dk)
            dqkv = dqkv.reshape(-1, 3 * D)                                      # (B*Tq, 3D)
            # [q k v] = x W_qkv + b  =>  dW_qkv = x^T [dq dk dv],  dx = [dq dk dv] W_qkv^T
            self.w_qkv.grad += x.reshape(-1, D).T @ dqkv                        # (D, 3D)
            self.b_qkv.grad += dqkv.sum(axis=0)                                 # (3D,)
            return (dqkv @ W.T).reshape(x.shape), None                          # (B*Tq, D) -> (B, Tq, D)
        # Q = split_heads(q) ... => dq = merge_heads(dQ) ...
        dq, dk, dv = self.merge_heads(dQ), self.merge_heads(dK), self.merge_heads(dU)  # (B, Tq|Tk, D)
        # q = x W^Q + b^Q  =>  dW^Q = x^T dq,  dx = dq W^Q^T
        dq_rows = dq.reshape(-1, D)                                             # (B*Tq, D)
        self.w_qkv.grad[:, :D] += x.reshape(-1, D).T @ dq_rows                  # (D, D)
        self.b_qkv.grad[:D] += dq_rows.sum(axis=0)                              # (D,)
        dx = matmul_rows(dq, W[:, :D].T)                                        # (B, Tq, D)
        # [k v] = memory [W^K W^V] + b  =>  dW^KV = memory^T [dk dv],  dmemory = [dk dv] W^KV^T
        dkv = xp.concatenate([dk, dv], axis=-1)                                 # (B, Tk, 2D)
        self.w_qkv.grad[:, D:] += memory.reshape(-1, D).T @ dkv.reshape(-1, 2 * D)  # (D, 2D)
        self.b_qkv.grad[D:] += dkv.reshape(-1, 2 * D).sum(axis=0)               # (2D,)
        dmemory = matmul_rows(dkv, W[:, D:].T)                                  # (B, Tk, D)
        return dx, dmemory


# --------------------------------------------------------------------------- #
# Grouped-query attention (Ainslie et al. 2023): Llama's, Qwen2's, Mistral's self-attention
#   H query heads share Hkv key/value heads, G = H / Hkv each; rotary positions on q and k
# --------------------------------------------------------------------------- #
class GroupedQueryAttention(Module):
    """Causal self-attention of ``num_heads`` query heads over ``num_kv_heads`` key/value heads: query
    head j reads key/value head j // G, G = num_heads / num_kv_heads (G = 1: multi-head attention; Hkv = 1:
    multi-query attention). Queries and keys are turned by the rotary embedding before they meet.

    Submodules (Hugging Face's names): ``q_proj`` (D -> H*dk), ``k_proj`` and ``v_proj`` (D -> Hkv*dk), with
    biases when ``qkv_bias`` (Qwen2), ``o_proj`` (H*dk -> D) without; ``rotary`` a
    :class:`minitf.rotary.RotaryEmbedding` (default: rope_type "default", theta 10000). ``head_dim``
    defaults to D / H. ``qk_norm``: None, "head" (Qwen3's ``q_norm`` and ``k_norm``, an RMSNorm of each head's
    dk coordinates) or "projection" (OLMoE's, an RMSNorm of the whole projection, H*dk and Hkv*dk), of epsilon
    ``norm_eps``, on the queries and keys before they are turned.
    """
    record_weights = False  # set True to keep the last attention weights P (B, H, T, Tk) in ``self.weights``

    def __init__(self, d_model, num_heads, num_kv_heads=None, head_dim=None, qkv_bias=False, rotary=None,
                 qk_norm=None, norm_eps=1e-6):
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"num_heads must be a multiple of num_kv_heads, got num_heads={num_heads}, "
                             f"num_kv_heads={num_kv_heads}")
        if head_dim is None and d_model % num_heads:
            raise ValueError(f"d_model must be divisible by num_heads (or give head_dim), got d_model={d_model}, "
                             f"num_heads={num_heads}")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = head_dim or d_model // num_heads
        self.q_proj = Linear(d_model, num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = Linear(d_model, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = Linear(d_model, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = Linear(num_heads * self.head_dim, d_model, bias=False)
        self.rotary = rotary if rotary is not None else RotaryEmbedding(self.head_dim)
        if qk_norm not in (None, "head", "projection"):
            raise ValueError(f"qk_norm must be None, 'head' or 'projection', got {qk_norm!r}")
        self.qk_norm = qk_norm
        if qk_norm is not None:
            per_head = qk_norm == "head"
            self.q_norm = RMSNorm(self.head_dim if per_head else num_heads * self.head_dim, norm_eps)
            self.k_norm = RMSNorm(self.head_dim if per_head else num_kv_heads * self.head_dim, norm_eps)
        if self.rotary.head_dim != self.head_dim:
            raise ValueError(f"the rotary embedding's head_dim {self.rotary.head_dim} is not the heads' "
                             f"{self.head_dim}")

    def forward(self, x, key_padding_mask=None, causal=True, cache=None):
        """x (B, T, D); key_padding_mask (B, Tk) bool, True = padding, over the cached positions and these
        (Tk = cache length + T); cache: a dict for decoding (the rotated keys and values of earlier steps;
        these go on at the positions after them), only under no_grad().

        Returns y (B, T, D).
        """
        if cache is not None and is_grad_enabled():
            raise ValueError("the key/value cache is for decoding under no_grad(): its earlier positions get no "
                             "gradient; run the whole sequence without a cache to train")
        B, T, _ = x.shape
        H, Hkv, E, G = self.num_heads, self.num_kv_heads, self.head_dim, self.num_heads // self.num_kv_heads
        start = cache.get("length", 0) if cache is not None else 0  # positions already in the cache
        q, k = self.q_proj(x), self.k_proj(x)                           # (B, T, H*dk), (B, T, Hkv*dk)
        if self.qk_norm == "projection":                                # OLMoE: over the whole projection
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.reshape(B, T, H, E), k.reshape(B, T, Hkv, E)           # (B, T, H, dk), (B, T, Hkv, dk)
        if self.qk_norm == "head":                                      # Qwen3: over each head's dk
            q, k = self.q_norm(q), self.k_norm(k)
        q = self.rotary(q, start)                                       # (B, T, H, dk), turned
        k = self.rotary(k, start)                                       # (B, T, Hkv, dk), turned
        k = k.reshape(B, T, Hkv * E)                                    # (B, T, Hkv*dk)
        v = self.v_proj(x)                                              # (B, T, Hkv*dk)
        if cache is not None:                                           # earlier steps' keys/values, then these
            k, v = append_to_cache(cache, k, v)                         # each (B, Tk, Hkv*dk)
        Tk = k.shape[1]
        Q = q.transpose(0, 2, 1, 3)                                     # (B, H, T, dk)
        K = k.reshape(B, Tk, Hkv, E).transpose(0, 2, 1, 3)              # (B, Hkv, Tk, dk)
        U = v.reshape(B, Tk, Hkv, E).transpose(0, 2, 1, 3)              # (B, Hkv, Tk, dk)
        # each key/value head serves G query heads in a row: query head j reads key/value head j // G
        K_rep, U_rep = xp.repeat(K, G, axis=1), xp.repeat(U, G, axis=1)  # (B, H, Tk, dk) each
        keep = attention_keep_mask(key_padding_mask, causal, T, Tk)
        O, P = scaled_dot_product_attention(Q, K_rep, U_rep, keep)      # each query head attends
        if self.record_weights:                                         # for the inspection page
            self.weights = P
        o = O.transpose(0, 2, 1, 3).reshape(B, T, H * E)                # (B, T, H, dk) -> (B, T, H*dk)
        self.save_for_backward(Q=Q, K_rep=K_rep, U_rep=U_rep, P=P)
        return self.o_proj(o)                                           # y = o W^O  (B, T, D)

    def backward(self, dy):
        """dy (B, T, D) -> dx (B, T, D); adds the gradients of the four projections."""
        saved = self.saved_tensors()
        B, T, _ = dy.shape
        H, Hkv, E, G = self.num_heads, self.num_kv_heads, self.head_dim, self.num_heads // self.num_kv_heads
        # y = o W^O  =>  do = dy W^O^T (and dW^O)
        do = self.o_proj.backward(dy)                                   # (B, T, H*dk)
        # o = O.transpose(0, 2, 1, 3).reshape(B, T, H * E)  =>  the reshape, then the transpose, undone
        dO = do.reshape(B, T, H, E).transpose(0, 2, 1, 3)               # (B, H, T, dk)
        dQ, dK_rep, dU_rep = scaled_dot_product_attention_backward(dO, saved.Q, saved.K_rep, saved.U_rep, saved.P)
        # K_rep = repeat(K, G, axis=1)  =>  dK = the sum over the G query heads that read each key/value head
        dK = dK_rep.reshape(B, Hkv, G, T, E).sum(axis=2)                # (B, Hkv, G, T, dk) -> (B, Hkv, T, dk)
        dU = dU_rep.reshape(B, Hkv, G, T, E).sum(axis=2)                # (B, Hkv, G, T, dk) -> (B, Hkv, T, dk)
        # U = v.reshape(B, Tk, Hkv, E).transpose(0, 2, 1, 3), Tk = T without a cache  =>  dv
        dv = dU.transpose(0, 2, 1, 3).reshape(B, T, Hkv * E)            # (B, T, Hkv, dk) -> (B, T, Hkv*dk)
        # K = k.reshape(B, Tk, Hkv, E).transpose(0, 2, 1, 3), k = rotary(k_proj(x)...)  =>  turned back
        # (k was turned after q, so its cache is the one on top of the rotary's stack)
        dk = self.rotary.backward(dK.transpose(0, 2, 1, 3))             # (B, T, Hkv, dk)
        # Q = q.transpose(0, 2, 1, 3), q = rotary(q_proj(x)...)  =>  turned back
        dq = self.rotary.backward(dQ.transpose(0, 2, 1, 3))             # (B, T, H, dk)
        if self.qk_norm == "head":                                      # q, k = q_norm(q), k_norm(k) per head
            dq, dk = self.q_norm.backward(dq), self.k_norm.backward(dk)
        dk = dk.reshape(B, T, Hkv * E)                                  # (B, T, Hkv*dk)
        dq = dq.reshape(B, T, H * E)                                    # (B, T, H*dk)
        if self.qk_norm == "projection":                                # q, k = q_norm(q), k_norm(k) whole
            dq, dk = self.q_norm.backward(dq), self.k_norm.backward(dk)
        # q, k and v are all projections of x  =>  dx is the sum of the three paths
        return self.q_proj.backward(dq) + self.k_proj.backward(dk) + self.v_proj.backward(dv)


# --------------------------------------------------------------------------- #
# T5's attention (Raffel et al. 2020): no 1/sqrt(dk) on the scores, a learned bias by relative position added
#   A = Q K^T + bias,  P = softmax(A),  O = P U
# --------------------------------------------------------------------------- #
def relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """The bucket (host int64, the same shape) of each ``relative_position`` = key position - query position (host
    ints), as T5 draws them (Mesh TensorFlow's ``_relative_position_bucket``, Hugging Face's): with
    ``bidirectional`` (the encoder) half the buckets for keys after the query, half for the others; the decoder
    (not bidirectional) sees the past only, every key after the query in bucket 0. Within a half of n buckets,
    distances below n / 2 get one bucket each, and the other n / 2 buckets split the distances from n / 2 to
    ``max_distance`` evenly in log(distance); every distance from max_distance on shares the last bucket. The
    logarithm is taken in float32, step by step as PyTorch takes it (a distance on a bucket's edge falls on the
    same side)."""
    np = backend.host
    relative_position = np.asarray(relative_position, dtype=np.int64)
    buckets = np.zeros(relative_position.shape, dtype=np.int64)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0) * num_buckets         # keys after the query: the upper half
        distance = np.abs(relative_position)
    else:
        distance = -np.minimum(relative_position, 0)             # keys after the query: distance 0, bucket 0
    max_exact = num_buckets // 2                                 # distances 0 .. max_exact - 1: a bucket each
    with np.errstate(divide="ignore"):                           # log(0): taken, then not used (is_small)
        scaled = np.log(distance.astype(np.float32) / np.float32(max_exact))
    scaled /= np.float32(math.log(max_distance / max_exact))
    scaled *= np.float32(num_buckets - max_exact)
    large = max_exact + np.where(distance < max_exact, 0, scaled).astype(np.int64)  # truncated, as .to(long)
    return buckets + np.where(distance < max_exact, distance, np.minimum(large, num_buckets - 1))


class RelativePositionBias(Module):
    """T5's position information: a learned number per head for each bucket of key position - query position
    (:func:`relative_position_bucket`), added to the attention scores. The first layer of a stack computes it and
    every layer of the stack adds the same bias; none in cross-attention.

    Parameter ``weight`` (num_buckets, H) (Hugging Face's ``relative_attention_bias``, an embedding of the
    buckets). ``forward(Tq, Tk, start)`` -> bias (1, H, Tq, Tk): queries at positions start .. start + Tq - 1
    (decoding with a cache), keys at 0 .. Tk - 1. ``backward(dbias)`` takes (H, Tq, Tk), the bias's gradient
    summed over the batch and over every layer that added it.
    """

    def __init__(self, num_heads, num_buckets=32, max_distance=128, bidirectional=True, std=1.0):
        exact = num_buckets // 2 if bidirectional else num_buckets  # a direction's buckets; half of them exact
        if exact // 2 < 1 or max_distance <= exact // 2:
            raise ValueError(f"RelativePositionBias: {num_buckets} buckets and max_distance {max_distance} leave no "
                             f"logarithmic buckets: give at least 4 buckets and max_distance above {exact // 2}")
        self.weight = Parameter(init_array(backend.init_rng().normal(0.0, std, (num_buckets, num_heads))))
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional

    def buckets(self, num_queries, num_keys, start=0):
        """(Tq, Tk) device int64: the bucket of each query-key pair."""
        np = backend.host
        relative = np.arange(num_keys)[None, :] - (start + np.arange(num_queries))[:, None]  # key - query  (Tq, Tk)
        return backend.asarray(relative_position_bucket(relative, self.bidirectional, self.num_buckets,
                                                        self.max_distance))

    def forward(self, num_queries, num_keys, start=0):
        buckets = self.buckets(num_queries, num_keys, start)     # (Tq, Tk)
        self.save_for_backward(buckets)
        return self.weight.data[buckets].transpose(2, 0, 1)[None]  # bias[h, i, j] = W[bucket(i, j), h]  (1, H, Tq, Tk)

    def backward(self, dbias):
        """dbias (H, Tq, Tk) -> None (positions have no gradient); adds dW."""
        (buckets,) = self.saved_tensors()
        H = self.weight.shape[1]
        # bias[h, i, j] = W[bucket(i, j), h]  =>  dW[b, h] += the sum of dbias[h, i, j] over EVERY pair (i, j) in
        # bucket b: many pairs share a bucket (all those at one distance, and every far one), so a scatter-add
        # (add.at sums repeated indices; dW[buckets] += ... would keep one pair per bucket)
        backend.add_at_rows(self.weight.grad, buckets.reshape(-1), dbias.reshape(H, -1).T)  # (Tq*Tk, H) rows
        return None


def biased_attention(Q, K, U, bias=None, keep=None, drop=None):
    """Q (B, H, Tq, dk), K and U (B, H, Tk, dk); ``bias`` broadcastable to (B, H, Tq, Tk) or None; ``keep`` and the
    dropout mask ``drop`` as in :func:`scaled_dot_product_attention`. T5's attention core: the scores are not divided
    by sqrt(dk) (T5's initialisation puts that factor into W^Q instead). Returns O (B, H, Tq, dk) and P
    (B, H, Tq, Tk), before dropout."""
    A = Q @ K.swapaxes(-1, -2)                                   # A = Q K^T, no 1/sqrt(dk)  (B, H, Tq, Tk)
    if bias is not None:
        A += bias                                                # A = Q K^T + bias, in place
    backend.by_rows(masked_softmax_in_place, A, *([] if keep is None else [keep]))
    P = A                                                        # P = softmax(A), masked  (B, H, Tq, Tk)
    return dropped(P, drop) @ U, P                               # O = dropout(P) U  (B, H, Tq, dk)


def biased_attention_backward(dO, Q, K, U, P, drop=None):
    """From dL/dO (B, H, Tq, dk) to dQ, dK, dU and dA (B, H, Tq, Tk), the scores' gradient, which is the bias's
    too (before the sum over the axes the bias was broadcast along); ``drop`` the forward's dropout mask or None."""
    # O = dropout(P) U  =>  dP = dO U^T, dU = dropout(P)^T dO, then through the dropout (dropped_backward)
    dP = dropped_backward(dO @ U.swapaxes(-1, -2), drop)         # (B, H, Tq, Tk)
    dU = dropped(P, drop).swapaxes(-1, -2) @ dO                  # (B, H, Tk, dk)
    # P = softmax(A)  =>  dA = P * (dP - sum_j dP_j P_j), in dP's memory
    backend.by_rows(softmax_backward_in_place, dP, P)
    dA = dP                                                      # (B, H, Tq, Tk)
    # A = Q K^T + bias  =>  dQ = dA K,  dK = dA^T Q (no scale to multiply by),  dbias = dA
    return dA @ K, dA.swapaxes(-1, -2) @ Q, dU, dA


class T5Attention(Module):
    """T5's multi-head attention: self-attention (``memory=None``) or cross-attention over ``memory``, the scores
    not scaled, a position ``bias`` (from a :class:`RelativePositionBias`) added in self-attention.

    Submodules (Hugging Face's names): ``q``, ``k``, ``v`` (D -> H*dk) and ``o`` (H*dk -> D), :class:`Linear`
    without biases; ``head_dim`` dk need not be D / H (T5's d_kv). ``dropout``: on the attention weights while
    training (Hugging Face's T5Attention drops them with ``dropout_rate``), its :class:`Dropout` ``weights_dropout``
    (None at 0).
    """
    record_weights = False  # set True to keep the last attention weights P (B, H, Tq, Tk) in ``self.weights``

    def __init__(self, d_model, num_heads, head_dim, dropout=0.0):
        self.num_heads, self.head_dim = num_heads, head_dim
        self.q = Linear(d_model, num_heads * head_dim, bias=False)
        self.k = Linear(d_model, num_heads * head_dim, bias=False)
        self.v = Linear(d_model, num_heads * head_dim, bias=False)
        self.o = Linear(num_heads * head_dim, d_model, bias=False)
        self.weights_dropout = weights_dropout(dropout)

    def heads(self, x):
        """(B, L, H*dk) -> (B, H, L, dk)"""
        B, L, _ = x.shape
        return x.reshape(B, L, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)  # (B, L, H, dk) -> (B, H, L, dk)

    def merge(self, X):
        """(B, H, L, dk) -> (B, L, H*dk)"""
        B, _, L, _ = X.shape
        return X.transpose(0, 2, 1, 3).reshape(B, L, -1)         # (B, L, H, dk) -> (B, L, H*dk)

    def forward(self, x, memory=None, bias=None, key_padding_mask=None, causal=False, cache=None):
        """x (B, Tq, D) queries; memory (B, Tk, D) or None (self-attention); bias (1 or B, H, Tq, Tk) or None;
        key_padding_mask (B, Tk) bool, True = padding; cache: a dict for decoding under no_grad() (self-attention:
        the keys and values of earlier steps; cross-attention: the memory's, projected at the first step).
        While decoding, ``memory`` may hold one row per sentence for G beams each (x (B*G, Tq, D)): a sentence's
        G beams are G*Tq queries of one row. Returns y (B, Tq, D)."""
        if cache is not None and is_grad_enabled():
            raise ValueError("the key/value cache is for decoding under no_grad(): its earlier positions get no "
                             "gradient; run the whole sequence without a cache to train")
        if memory is not None and memory.shape[0] != x.shape[0]:  # beams of a sentence: one row of queries
            if is_grad_enabled() or x.shape[0] % memory.shape[0]:
                raise ValueError(f"cross-attention needs memory's batch ({memory.shape[0]}) equal to the queries' "
                                 f"({x.shape[0]}), or a divisor of it under no_grad() (beams of a sentence)")
            y = self.forward(x.reshape(memory.shape[0], -1, x.shape[-1]), memory, None, key_padding_mask,
                             cache=cache)                        # (B, G*Tq, D)
            return y.reshape(x.shape)                            # (B*G, Tq, D)
        Q = self.heads(self.q(x))                                # (B, H, Tq, dk)
        if memory is None:
            k, v = self.k(x), self.v(x)                          # each (B, Tq, H*dk)
            if cache is not None:                                # earlier steps' keys/values, then these
                k, v = append_to_cache(cache, k, v)              # each (B, Tk, H*dk)
        elif cache is not None and "k" in cache:                 # memory projected at step 0
            k, v = cache["k"], cache["v"]
        else:
            k, v = self.k(memory), self.v(memory)                # each (B, Tk, H*dk)
            if cache is not None:
                cache["k"], cache["v"] = k, v
        K, U = self.heads(k), self.heads(v)                      # (B, H, Tk, dk) each
        keep = attention_keep_mask(key_padding_mask, causal, Q.shape[2], K.shape[2])
        drop = draw_weights_mask(self.weights_dropout, Q, K)     # (B, H, Tq, Tk), or None: no dropout
        O, P = biased_attention(Q, K, U, bias, keep, drop)       # each head attends
        if self.record_weights:
            self.weights = P
        self.save_for_backward(Q=Q, K=K, U=U, P=P, drop=drop, cross=memory is not None)
        return self.o(self.merge(O))                             # y = Concat(heads) W^O  (B, Tq, D)

    def backward(self, dy):
        """dy (B, Tq, D) -> (dx (B, Tq, D), dmemory (B, Tk, D) or None, dbias (H, Tq, Tk): the scores' gradient
        summed over the batch, or None in cross-attention); adds the gradients of q, k, v, o."""
        saved = self.saved_tensors()
        dO = self.heads(self.o.backward(dy))                     # y = merge(O) W^O  =>  dO  (B, H, Tq, dk)
        dQ, dK, dU, dA = biased_attention_backward(dO, saved.Q, saved.K, saved.U, saved.P, saved.drop)
        dx = self.q.backward(self.merge(dQ))                     # q = x W^Q  (B, Tq, D)
        dk = self.k.backward(self.merge(dK))                     # k = x W^K or memory W^K  (B, Tk, D)
        dv = self.v.backward(self.merge(dU))                     # v = x W^V or memory W^V  (B, Tk, D)
        if saved.cross:                                          # no bias in cross-attention
            return dx, dk + dv, None                             # k and v read the memory: its paths add
        # the bias is broadcast over the batch  =>  its gradient is dA summed over the batch
        return dx + dk + dv, None, dA.sum(axis=0)                # q, k and v all read x: the three paths add
