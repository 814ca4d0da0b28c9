"""Backward passes with the bugs people really write, each next to the right line,
for ``python -m minitf.gradcheck LAYER --bug NAME`` (and docs/bugs.md).

Every case pairs the library's own (correct) forward with a backward written out
here from the inputs it saved itself, so it does not depend on how the layers
cache their tensors. With ``buggy=False`` the same backward runs the right line
and passes the check: the failure comes from that one line alone.

Each build function takes a host random generator and returns
``(forward, backward, inputs, params)`` for :func:`minitf.gradcheck.compare_gradients`.
Shapes are small and fixed (B 2, S 4, T 3, D 4, H 2, F 6, V 7), with what each bug
needs to show: repeated ids, padding, two heads, dk > 1.
"""
import dataclasses
import math

from minitf import backend
from minitf.backend import xp
from minitf.draws import random_array, randomize
from minitf.module import no_grad

B, S, T, D, H, F, V = 2, 4, 3, 4, 2, 6, 7
DK = D // H
EPS = 1e-5  # LayerNorm epsilon, passed explicitly so the hand-written backward uses the same


@dataclasses.dataclass(frozen=True)
class Bug:
    """One realistic bug: the layer it lives in, what it is, and what the check's
    output points at (``hint``, printed after the table)."""
    name: str
    layer: str
    summary: str
    hint: str
    build: object  # build(rng, buggy) -> (forward, backward, inputs, params)


# --------------------------------------------------------------------------- #
# 1. LayerNorm: the term through the variance forgotten
# --------------------------------------------------------------------------- #
def _layernorm(rng, buggy):
    from minitf.layers import LayerNorm
    ln = randomize(LayerNorm(D, eps=EPS), rng)
    saved = {}

    def forward(x):
        saved["x"] = x
        with no_grad():
            return ln(x)

    def backward(dy):
        x = saved["x"]
        xc = x - x.mean(axis=-1, keepdims=True)
        rstd = 1.0 / xp.sqrt((xc * xc).mean(axis=-1, keepdims=True) + EPS)
        xhat = xc * rstd
        ln.gamma.grad += (dy * xhat).reshape(-1, D).sum(axis=0)
        ln.beta.grad += dy.reshape(-1, D).sum(axis=0)
        dxhat = dy * ln.gamma.data
        if buggy:
            dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True))  # treats sigma as a constant
        else:
            dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
        return dx

    x = random_array(rng, (B, T, D), dtype=None)
    return forward, backward, {"x": x}, {"gamma": ln.gamma, "beta": ln.beta}


# --------------------------------------------------------------------------- #
# 2 and 3. Scaled dot-product attention: the 1/sqrt(dk) scale, and a causal mask
# rebuilt in backward one diagonal off
# --------------------------------------------------------------------------- #
def _attention_scale(rng, buggy):
    from minitf.attention import attention_keep_mask, scaled_dot_product_attention
    pad = backend.asarray(backend.host.arange(S)[None, :] >= backend.host.array([[S], [S - 1]]))
    keep = attention_keep_mask(pad, False, T, S)
    saved = {}

    def forward(Q, K, U):
        saved["QKV"] = Q, K, U
        O, saved["P"] = scaled_dot_product_attention(Q, K, U, keep)
        return O

    def backward(dO):
        (Q, K, U), P = saved["QKV"], saved["P"]
        scale = 1.0 / math.sqrt(Q.shape[-1])
        dP = dO @ U.swapaxes(-1, -2)
        dU = P.swapaxes(-1, -2) @ dO
        dA = P * (dP - (dP * P).sum(axis=-1, keepdims=True))
        if buggy:
            dQ, dK = dA @ K, dA.swapaxes(-1, -2) @ Q  # A = Q K^T * scale, but the scale is dropped
        else:
            dQ, dK = (dA @ K) * scale, (dA.swapaxes(-1, -2) @ Q) * scale
        return dQ, dK, dU

    inputs = {name: random_array(rng, (B, H, length, DK), dtype=None)
              for name, length in (("Q", T), ("K", S), ("U", S))}
    return forward, backward, inputs, {}


def _recomputed_probabilities(Q, K, future):
    """softmax(Q K^T / sqrt(dk)) with the keys where ``future`` is True masked out: the
    backward of a memory-saving (flash-style) attention recomputes P instead of storing it."""
    scores = (Q @ K.swapaxes(-1, -2)) / math.sqrt(Q.shape[-1])
    scores = xp.where(future, backend.finfo(scores.dtype).min / 2, scores)
    e = xp.exp(scores - scores.max(axis=-1, keepdims=True)) * ~future
    total = e.sum(axis=-1, keepdims=True)
    return e / xp.where(total > 0, total, 1)


def _attention_causal(rng, buggy):
    from minitf.attention import attention_keep_mask, scaled_dot_product_attention
    keep = attention_keep_mask(None, True, T, T)  # the forward's mask is the library's (right)
    saved = {}

    def forward(Q, K, U):
        saved["QKV"] = Q, K, U
        return scaled_dot_product_attention(Q, K, U, keep)[0]

    def backward(dO):
        Q, K, U = saved["QKV"]
        if buggy:
            future = xp.triu(xp.ones((T, T), dtype=bool), k=0)  # k=0 also masks the diagonal: i may not see i
        else:
            future = xp.triu(xp.ones((T, T), dtype=bool), k=1)  # key j is in query i's future when j > i
        P = _recomputed_probabilities(Q, K, future)
        dP = dO @ U.swapaxes(-1, -2)
        dU = P.swapaxes(-1, -2) @ dO
        dA = P * (dP - (dP * P).sum(axis=-1, keepdims=True))
        scale = 1.0 / math.sqrt(Q.shape[-1])
        return (dA @ K) * scale, (dA.swapaxes(-1, -2) @ Q) * scale, dU

    inputs = {name: random_array(rng, (B, H, length, DK), dtype=None)
              for name, length in (("Q", T), ("K", T), ("U", T))}
    return forward, backward, inputs, {}


# --------------------------------------------------------------------------- #
# 4. Residual block: the skip path's gradient dropped
# --------------------------------------------------------------------------- #
def _residual(rng, buggy):
    """A pre-LN block y = x + FFN(LayerNorm(x)) from the library's own layers."""
    from minitf.layers import LayerNorm
    from minitf.transformer import FeedForward
    norm, ff = randomize(LayerNorm(D, eps=EPS), rng), randomize(FeedForward(D, F), rng)

    def forward(x):
        return x + ff(norm(x))

    def backward(dy):
        dh = ff.backward(dy)                      # the sublayer path: y = x + FFN(h), h = LN(x)
        if buggy:
            dx = norm.backward(dh)                # only the sublayer path
        else:
            dx = dy + norm.backward(dh)           # y = x + ...: the skip path passes dy straight through
        return dx

    params = {f"norm.{n}": p for n, p in norm.named_parameters()} | {f"ff.{n}": p for n, p in ff.named_parameters()}
    return forward, backward, {"x": random_array(rng, (B, T, D), dtype=None)}, params


# --------------------------------------------------------------------------- #
# 5. Embedding: fancy-index += instead of a scatter-add
# --------------------------------------------------------------------------- #
def _embedding(rng, buggy):
    from minitf.layers import Embedding
    emb = Embedding(V, D)
    ids = rng.integers(0, V, (B, T))
    ids[1, 0] = ids[0, 0] = ids[0, 2]  # one id three times: the case the bug gets wrong
    ids = backend.asarray(ids)
    scale = math.sqrt(D)  # Embedding multiplies by sqrt(d_model)

    def forward():
        with no_grad():
            return emb(ids)

    def backward(dy):
        rows = dy.reshape(-1, D) * scale
        if buggy:
            emb.weight.grad[ids.reshape(-1)] += rows  # a repeated id is written, not added, again
        else:
            xp.add.at(emb.weight.grad, ids.reshape(-1), rows)  # sums the rows of repeated ids
        return None

    return forward, backward, {}, {"weight": emb.weight}


# --------------------------------------------------------------------------- #
# 6. Multi-head attention: heads split by reshape without the transpose
# --------------------------------------------------------------------------- #
def _mha(rng, buggy):
    from minitf.attention import MultiHeadAttention, attention_keep_mask, scaled_dot_product_attention
    from minitf.attention import scaled_dot_product_attention_backward
    mha = randomize(MultiHeadAttention(D, H), rng)
    keep = attention_keep_mask(None, True, T, T)
    saved = {}

    def split(x):  # (B, T, D) -> (B, H, T, dk)
        if buggy:
            return x.reshape(B, H, T, DK)  # same shape, wrong entries: mixes positions and heads
        return x.reshape(B, T, H, DK).transpose(0, 2, 1, 3)

    def merge(x):  # (B, H, T, dk) -> (B, T, D), the inverse of split
        if buggy:
            return x.reshape(B, T, D)
        return x.transpose(0, 2, 1, 3).reshape(B, T, D)

    def forward(x):
        saved["x"] = x
        with no_grad():
            return mha(x, causal=True)  # the library's forward splits heads correctly

    def backward(dy):
        x, W, b = saved["x"], mha.w_qkv.data, mha.b_qkv.data
        qkv = (x.reshape(-1, D) @ W + b).reshape(B, T, 3 * D)
        # the forward's Q, K, V and P, recomputed with the right split
        Q, K, U = (qkv[..., i * D:(i + 1) * D].reshape(B, T, H, DK).transpose(0, 2, 1, 3) for i in range(3))
        O, P = scaled_dot_product_attention(Q, K, U, keep)
        o = O.transpose(0, 2, 1, 3).reshape(B, T, D)
        mha.w_o.grad += o.reshape(-1, D).T @ dy.reshape(-1, D)
        mha.b_o.grad += dy.reshape(-1, D).sum(axis=0)
        do = (dy.reshape(-1, D) @ mha.w_o.data.T).reshape(B, T, D)
        dQ, dK, dU = scaled_dot_product_attention_backward(split(do), Q, K, U, P)
        dqkv = xp.concatenate([merge(dQ), merge(dK), merge(dU)], axis=-1).reshape(-1, 3 * D)
        mha.w_qkv.grad += x.reshape(-1, D).T @ dqkv
        mha.b_qkv.grad += dqkv.sum(axis=0)
        return (dqkv @ W.T).reshape(B, T, D)

    return forward, backward, {"x": random_array(rng, (B, T, D), dtype=None)}, dict(mha.named_parameters())


# --------------------------------------------------------------------------- #
# 7. Loss: the mean over all B*T positions instead of the real tokens
# --------------------------------------------------------------------------- #
def _loss(rng, buggy):
    from minitf.layers import softmax
    from minitf.loss import LabelSmoothedCrossEntropy
    eps, pad = 0.1, 0
    loss_fn = LabelSmoothedCrossEntropy(eps, ignore_index=pad)
    target = rng.integers(1, V, (B, T))
    target[0, -1] = target[1, -2:] = pad  # padded batch: 3 of the 6 positions are pad
    target = backend.asarray(target)
    saved = {}

    def forward(z):
        saved["z"] = z
        with no_grad():
            return backend.asarray(loss_fn(z, target))  # the library's loss: a mean over real tokens

    def backward(dloss):
        z = saved["z"]
        keep = (target != pad)[..., None]
        q = xp.full(z.shape, eps / V, dtype=z.dtype)  # smoothed target: eps/V everywhere ...
        xp.put_along_axis(q, target[..., None], 1.0 - eps + eps / V, axis=-1)  # ... + (1-eps) at y
        if buggy:
            n = B * T  # every position counts, pad included
        else:
            n = keep.sum()  # only the non-pad tokens
        return dloss * (softmax(z) - q) * keep / n

    return forward, backward, {"logits": random_array(rng, (B, T, V), 2.0, dtype=None)}, {}


# --------------------------------------------------------------------------- #
# 8. Softmax: the subtracted sum of the Jacobian forgotten
# --------------------------------------------------------------------------- #
def _softmax(rng, buggy):
    from minitf.layers import softmax
    saved = {}

    def forward(x):
        saved["y"] = y = softmax(x)
        return y

    def backward(dy):
        y = saved["y"]
        if buggy:
            dx = y * dy  # only the diagonal of the Jacobian diag(y) - y y^T
        else:
            dx = y * (dy - (dy * y).sum(axis=-1, keepdims=True))
        return dx

    return forward, backward, {"x": random_array(rng, (B, T, D), 2.0, dtype=None)}, {}


# --------------------------------------------------------------------------- #
# 9. Tied weights: the second use overwrites the first use's gradient
# --------------------------------------------------------------------------- #
def _tied(rng, buggy):
    """ids -> Embedding -> h -> logits = h W^T, one W for both (paper 3.4)."""
    from minitf.layers import Embedding
    emb = Embedding(V, D)
    W = emb.weight
    ids = backend.asarray(rng.integers(0, V - 2, (B, T)))  # ids V-2 and V-1 unused: their rows show it
    scale = math.sqrt(D)

    def forward():
        with no_grad():
            return emb(ids) @ W.data.T

    def backward(dlogits):
        h = W.data[ids] * scale
        W.grad += dlogits.reshape(-1, V).T @ h.reshape(-1, D)           # the projection's use
        dh = (dlogits.reshape(-1, V) @ W.data) * scale
        dW_embedding = xp.zeros_like(W.grad)
        xp.add.at(dW_embedding, ids.reshape(-1), dh)
        if buggy:
            W.grad[...] = dW_embedding   # "the embedding's gradient": replaces the projection's
        else:
            W.grad += dW_embedding       # a shared weight collects every use
        return None

    return forward, backward, {}, {"weight": W}


# --------------------------------------------------------------------------- #
# 10. Learned positions: the table's gradient averaged over the batch, not summed
# --------------------------------------------------------------------------- #
def _learned_positions(rng, buggy):
    """y = x + P[start : start + T] on B sequences: every sequence reads the same rows."""
    from minitf.layers import LearnedPositionalEmbedding
    table = randomize(LearnedPositionalEmbedding(T + 2, D), rng)  # max_len 5: rows 0 and 4 are not read
    start = 1

    def forward(x):
        with no_grad():
            return table(x, start=start)

    def backward(dy):
        if buggy:
            table.weight.grad[start:start + T] += dy.mean(axis=0)  # "the average gradient of the batch"
        else:
            table.weight.grad[start:start + T] += dy.sum(axis=0)   # each sequence read the row: all add
        return dy

    return forward, backward, {"x": random_array(rng, (B, T, D), dtype=None)}, {"weight": table.weight}


# --------------------------------------------------------------------------- #
# 11. GELU: the product rule's second term forgotten
# --------------------------------------------------------------------------- #
def _gelu(rng, buggy):
    from minitf.layers import GELU
    gelu = GELU()
    saved = {}

    def forward(x):
        saved["x"] = x
        with no_grad():
            return gelu(x)

    def backward(dy):
        x = saved["x"]
        cdf = 0.5 * (1.0 + backend.erf(x * (1.0 / math.sqrt(2.0))))      # Phi(x)
        if buggy:
            return dy * cdf  # y = x Phi(x) differentiated as x times a constant, ReLU's habit
        pdf = xp.exp(-0.5 * (x * x)) * (1.0 / math.sqrt(2.0 * math.pi))    # phi(x) = Phi'(x)
        return dy * (cdf + x * pdf)

    return forward, backward, {"x": random_array(rng, (B, T, D), 2.0, dtype=None)}, {}


BUGS = {bug.name: bug for bug in [
    Bug("no-variance-term", "layernorm", "LayerNorm backward without the term through the variance",
        "dx is off, dgamma and dbeta are right: within each row the error is proportional to xhat, "
        "the missing -xhat * mean(dxhat * xhat) term (sigma depends on x too)", _layernorm),
    Bug("no-scale", "attention", "the 1/sqrt(dk) scale forgotten in attention backward",
        "dU is right; dQ and dK are off everywhere by one constant factor, analytic/numeric = sqrt(dk): "
        "a scale on the path through the scores A = Q K^T / sqrt(dk)", _attention_scale),
    Bug("causal-off-by-one", "attention", "backward recomputes P with a causal mask one diagonal off",
        "analytic dQ is exactly 0 at query 1 and numeric is not: backward's P lets query 1 see key 0 "
        "only, the forward's keys 0 and 1; the recomputed mask hides the diagonal (triu k=0, not k=1)", _attention_causal),
    Bug("no-skip-gradient", "residual", "the residual skip path's gradient dropped",
        "the parameters are right, dx is not: analytic - numeric = -G (the upstream gradient) "
        "everywhere, exactly what the skip path y = x + ... adds", _residual),
    Bug("fancy-index-add", "embedding", "grad[ids] += g instead of a scatter-add",
        "only rows of ids that occur more than once are off: analytic holds one occurrence's "
        "gradient, numeric the sum of all; fancy-index += writes a repeated index once (use add.at)", _embedding),
    Bug("reshape-heads", "mha", "heads split by reshape without the transpose",
        "w_o and b_o are right, w_qkv, b_qkv and x are off: the bug sits between the two projections, "
        "where heads are split and merged; (B, T, D) -> (B, T, H, dk) needs a transpose to (B, H, T, dk)", _mha),
    Bug("mean-over-all-tokens", "loss", "the loss divided by B*T instead of the number of non-pad tokens",
        "every entry is off by one factor, analytic/numeric = (non-pad tokens)/(B*T), and pad rows "
        "are 0 in both: the normaliser counts padding", _loss),
    Bug("no-subtracted-sum", "softmax", "softmax backward without the subtracted sum",
        "within each row the error is proportional to y = softmax(x): the -y y^T part of the Jacobian, "
        "y * sum(dy * y), is missing", _softmax),
    Bug("tied-overwrite", "tied", "a tied weight's gradient overwritten (=) instead of accumulated (+=)",
        "rows of ids not in the batch have analytic 0 but numeric != 0: only the last use (the "
        "embedding) survived, the output projection's gradient was overwritten", _tied),
    Bug("position-mean", "learned_positions", "the position table's gradient averaged over the batch",
        "x is right; weight is off by one factor, analytic/numeric = 1/B, and the rows no position read are 0 "
        "in both: every sequence of the batch read the same rows, so their gradients add (sum over the "
        "batch, not mean)", _learned_positions),
    Bug("gelu-no-product-term", "gelu", "GELU backward as Phi(x) alone, the product rule's x phi(x) forgotten",
        "off almost everywhere by no single factor, least near x = 0 and for large |x|: analytic - numeric "
        "= -x phi(x) dy, the product rule's second term (y = x Phi(x), and Phi depends on x too)", _gelu),
]}


def build(name, rng, buggy=True):
    """``(forward, backward, inputs, params)`` of bug ``name`` (``buggy=False``: the right line)."""
    return BUGS[name].build(rng, buggy)
