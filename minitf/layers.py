"""The small layers: Linear, Embedding, positional encoding (sinusoidal or learned), Dropout, LayerNorm,
ReLU, GELU, SiLU, Tanh, softmax; Llama's RMSNorm and SwiGLU feed-forward. Each forward sits next to its backward.

Dimension glossary (used in every docstring of the package):
    B batch, S source length, T target length, L any sequence length,
    D d_model, H heads, dk = D / H, F d_ff, V vocabulary size.
"""
import functools
import math

from minitf import backend
from minitf.backend import xp
from minitf.module import Module, Parameter


def init_array(array):
    """Initial values drawn on the host (from ``backend.init_rng()``, so that CPU and GPU
    start from the same numbers) -> a device array of the default float dtype, ready for
    ``Parameter(...)``."""
    return backend.asarray(array, dtype=backend.get_default_dtype())


def matmul_rows(x, w):
    """``x @ w`` for x (..., n) and a matrix w (n, m) -> (..., m), as one 2-D product
    over all the rows of x. (NumPy runs a stacked (B, L, n) @ (n, m) as B small
    products: several times slower, and over ten times when w is a transposed view.)"""
    return (x.reshape(-1, x.shape[-1]) @ w).reshape(x.shape[:-1] + (w.shape[-1],))


# --------------------------------------------------------------------------- #
# Linear: y = x W + b
# --------------------------------------------------------------------------- #
class Linear(Module):
    """``y = x @ W + b``.

    Parameters ``weight`` (d_in, d_out), ``bias`` (d_out,); input ``x`` (..., d_in),
    output ``y`` (..., d_out). Xavier-uniform init, zero bias.
    """

    def __init__(self, d_in, d_out, bias=True):
        limit = math.sqrt(6.0 / (d_in + d_out))
        self.weight = Parameter(init_array(backend.init_rng().uniform(-limit, limit, (d_in, d_out))))
        self.bias = Parameter(init_array(backend.host.zeros(d_out))) if bias else None

    def forward(self, x):
        y = matmul_rows(x, self.weight.data)                     # y = x W
        if self.bias is not None:
            y += self.bias.data
        self.save_for_backward(x)
        return y

    def backward(self, dy):
        """dy (..., d_out) -> dx (..., d_in); adds dW, db."""
        (x,) = self.saved_tensors()
        d_in, d_out = self.weight.shape
        # y = x @ W  =>  dW = x^T dy, summed over every leading (batch, position) index
        self.weight.grad += x.reshape(-1, d_in).T @ dy.reshape(-1, d_out)
        if self.bias is not None:
            # y += b  (broadcast over leading dims)  =>  db = sum of dy over them
            self.bias.grad += dy.reshape(-1, d_out).sum(axis=0)
        # y = x @ W  =>  dx = dy W^T
        return matmul_rows(dy, self.weight.data.T)


# --------------------------------------------------------------------------- #
# Embedding (paper 3.4): rows of W, multiplied by sqrt(d_model)
# --------------------------------------------------------------------------- #
class Embedding(Module):
    """``y = W[ids] * sqrt(D)`` (paper section 3.4).

    Parameter ``weight`` (V, D), normal with standard deviation D^-1/2, so that the scaled
    embedding has unit variance and the tied output projection gives unit-scale logits.
    Input ``ids`` (B, L) integers, output (B, L, D). ``scale=False``: ``y = W[ids]``.
    ``padding_idx``: that row gets no gradient from being looked up (PyTorch's ``nn.Embedding``
    option, which Marian's embeddings use: its decoder starts from the pad row, kept as it is).
    """

    def __init__(self, vocab_size, d_model, scale=True, padding_idx=None):
        std = d_model ** -0.5
        self.weight = Parameter(init_array(backend.init_rng().normal(0.0, std, (vocab_size, d_model))))
        self.scale = math.sqrt(d_model) if scale else 1.0
        self.padding_idx = padding_idx

    def forward(self, ids):
        self.save_for_backward(ids)
        return self.weight.data[ids] * self.scale

    def backward(self, dy):
        """dy (B, L, D) -> None (ids have no gradient); adds dW."""
        (ids,) = self.saved_tensors()
        D = self.weight.shape[1]
        padding_idx = self.padding_idx
        if padding_idx is not None:
            dy = dy * (ids != padding_idx)[..., None]            # the padding row's lookups add nothing
        # y = W[ids] * scale  =>  dW[v] += scale * sum of dy over the positions where ids == v
        # (add.at sums repeated ids; plain fancy-index += would keep only one of them)
        # xp.add.at(self.weight.grad, ids.reshape(-1), dy.reshape(-1, D) * self.scale), rows split among threads
        rows = backend.by_rows(lambda dy: dy * self.scale, dy.reshape(-1, D))
        backend.add_at_rows(self.weight.grad, ids.reshape(-1), rows)
        return None


class OutputProjection(Module):
    """Pre-softmax projection ``logits = h @ W^T (+ b)``, ``W`` (V, D). Tied (paper 3.4: one matrix
    for both embeddings and this) when ``weight`` is the embedding's own Parameter; untied
    when it is a Parameter of its own. ``bias=True`` adds a bias ``b`` (V,), zero at first (the
    paper has none; Marian's ``final_logits_bias``).

    Input ``h`` (B, T, D), output (B, T, V).
    """

    def __init__(self, weight, bias=False):
        self.weight = weight  # a Parameter, shared with an Embedding when tied
        self.bias = Parameter(init_array(backend.host.zeros(weight.shape[0]))) if bias else None

    def forward(self, h):
        self.save_for_backward(h)
        logits = matmul_rows(h, self.weight.data.T)              # logits = h W^T
        if self.bias is not None:
            logits += self.bias.data                             # logits += b
        return logits

    def backward(self, dlogits):
        """dlogits (B, T, V) -> dh (B, T, D); adds dW (on top of the embedding's use) and db."""
        (h,) = self.saved_tensors()
        V, D = self.weight.shape
        # logits = h @ W^T  =>  dW = dlogits^T h
        self.weight.grad += dlogits.reshape(-1, V).T @ h.reshape(-1, D)
        if self.bias is not None:
            # logits += b  (broadcast over batch and positions)  =>  db = sum of dlogits over them
            self.bias.grad += dlogits.reshape(-1, V).sum(axis=0)
        # logits = h @ W^T  =>  dh = dlogits W
        return matmul_rows(dlogits, self.weight.data)


# --------------------------------------------------------------------------- #
# Sinusoidal positional encoding (paper 3.5)
# --------------------------------------------------------------------------- #
#: where sin and cos go in a row of the table: "interleaved" (the paper's PE(pos, 2i) = sin,
#: PE(pos, 2i+1) = cos) or "halves" (Marian's, Hugging Face's MarianMTModel: all D/2 sines, then all
#: D/2 cosines, at the same frequencies). A fixed permutation of the D coordinates turns one into the other.
POSITION_LAYOUTS = ("interleaved", "halves")


def sinusoidal_table(length, d_model, start=0, dtype=None, layout="interleaved"):
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/D))  (the paper).

    ``layout="halves"`` puts the same values as PE(pos, i) = sin(...) and PE(pos, D/2 + i) = cos(...)
    for i < D/2 (Marian; an odd D has one more sine than cosines, as in Hugging Face's table).
    Returns (length, D) for positions ``start .. start+length-1``; any length works.
    """
    if layout not in POSITION_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(POSITION_LAYOUTS)}, got {layout!r}")
    position = xp.arange(start, start + length, dtype=xp.float64)[:, None]
    inv_freq = xp.exp(xp.arange(0, d_model, 2, dtype=xp.float64) * (-math.log(10000.0) / d_model))
    table = xp.zeros((length, d_model), dtype=xp.float64)
    table[:, 0::2] = xp.sin(position * inv_freq)
    table[:, 1::2] = xp.cos(position * inv_freq[: d_model // 2])
    if layout == "halves":  # the same columns in another order: the sines (even), then the cosines (odd)
        table = xp.concatenate([table[:, 0::2], table[:, 1::2]], axis=1)
    return table.astype(dtype or backend.get_default_dtype())


class PositionalEncoding(Module):
    """``y = x + PE[start : start + L]``; no parameters, computed for any length.

    Input ``x`` (B, L, D), output (B, L, D). ``start`` is the first position
    (incremental decoding feeds one position at a time). ``layout`` as in
    :func:`sinusoidal_table` (the paper's "interleaved", or Marian's "halves").
    """

    def __init__(self, d_model, layout="interleaved"):
        if layout not in POSITION_LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(POSITION_LAYOUTS)}, got {layout!r}")
        self.d_model, self.layout = d_model, layout
        self._table = None  # grown on demand, never truncates

    def table(self, length, dtype):
        if self._table is None or self._table.shape[0] < length or self._table.dtype != dtype:
            size = max(length, 2 * (0 if self._table is None else self._table.shape[0]), 64)
            self._table = sinusoidal_table(size, self.d_model, dtype=dtype, layout=self.layout)
        return self._table[:length]

    def forward(self, x, start=0):
        return x + self.table(start + x.shape[1], x.dtype)[start:]

    def backward(self, dy):
        # y = x + PE  =>  dx = dy (PE is a constant)
        return dy


# --------------------------------------------------------------------------- #
# Dropout (inverted): scale at training time, identity at evaluation
# --------------------------------------------------------------------------- #
class Dropout(Module):
    """``y = x * mask / (1 - p)`` with ``mask ~ Bernoulli(1 - p)`` while training;
    ``y = x`` in eval mode or when p = 0. The mask comes from the seeded backend rng."""

    def __init__(self, p):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x):
        mask = self.draw_mask(x.shape, x.dtype)
        self.save_for_backward(mask)
        if mask is None:
            return x
        return backend.by_rows(xp.multiply, x, mask)             # x * mask, on blocks of rows (threads)

    def draw_mask(self, shape, dtype):
        """The mask of one forward, of ``shape`` and ``dtype`` (:meth:`mask_of`), or None in eval mode or when
        p = 0: then nothing is drawn. For a layer that multiplies by the mask inside its own work (the attention
        weights: :mod:`minitf.attention`) from the same stream of numbers as every other dropout."""
        if not self.training or self.p == 0.0:
            return None
        # keep with probability 1-p, scaled so that E[y] = x (the draw on one thread: one stream of numbers)
        draw = backend.rng().random(shape, dtype=xp.float32)
        return backend.by_rows(lambda draw: self.mask_of(draw, dtype), draw)     # on blocks of rows (threads)

    def mask_of(self, draw, dtype):
        """The mask of uniform draws in [0, 1), of ``dtype``: 1/(1-p) where kept, 0 where dropped."""
        mask = (draw >= self.p).astype(dtype)
        mask *= 1.0 / (1.0 - self.p)
        return mask

    def backward(self, dy):
        (mask,) = self.saved_tensors()
        # y = x * mask  =>  dx = dy * mask
        return dy if mask is None else backend.by_rows(xp.multiply, dy, mask)


# --------------------------------------------------------------------------- #
# LayerNorm (Ba et al. 2016), over the last axis
# --------------------------------------------------------------------------- #
class LayerNorm(Module):
    """``y = gamma * (x - mean) / sqrt(var + eps) + beta`` over the last axis (D).

    Parameters ``gamma`` (D,) = 1, ``beta`` (D,) = 0; input and output (..., D).
    """

    def __init__(self, d_model, eps=1e-5):
        self.gamma = Parameter(init_array(backend.host.ones(d_model)))
        self.beta = Parameter(init_array(backend.host.zeros(d_model)))
        self.eps = eps

    def forward(self, x):
        # the rows of normalize below on blocks of rows on backend.threads() threads: the same numbers
        y, xhat, rstd = backend.by_rows(self.normalize, x)
        self.save_for_backward(xhat, rstd)
        return y

    def normalize(self, x):
        """(y, xhat, rstd) of x (..., D), each row on its own."""
        mean = x.mean(axis=-1, keepdims=True)
        xc = x - mean                                            # centred
        var = (xc * xc).mean(axis=-1, keepdims=True)
        rstd = 1.0 / xp.sqrt(var + self.eps)                     # 1 / sigma
        xhat = xc * rstd                                         # normalised
        return xhat * self.gamma.data + self.beta.data, xhat, rstd

    def backward(self, dy):
        """dy (..., D) -> dx (..., D); adds dgamma, dbeta."""
        xhat, rstd = self.saved_tensors()
        D = xhat.shape[-1]
        # y = gamma * xhat + beta  =>  dgamma = sum dy * xhat,  dbeta = sum dy
        self.gamma.grad += (dy * xhat).reshape(-1, D).sum(axis=0)
        self.beta.grad += dy.reshape(-1, D).sum(axis=0)
        # on blocks of rows (threads); named by its class, so that this backward also serves the exercise's class
        return backend.by_rows(functools.partial(LayerNorm.backward_rows, gamma=self.gamma.data), dy, xhat, rstd)

    @staticmethod
    def backward_rows(dy, xhat, rstd, gamma):
        """dx of rows of dy, given the forward's xhat and rstd of those rows and the gain gamma (D,)."""
        dxhat = dy * gamma
        # xhat = (x - mean) * rstd, where mean and rstd depend on every x of the row:
        # dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
        return rstd * (dxhat
                       - dxhat.mean(axis=-1, keepdims=True)
                       - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))


# --------------------------------------------------------------------------- #
# ReLU
# --------------------------------------------------------------------------- #
class ReLU(Module):
    """``y = max(x, 0)``, elementwise."""

    def forward(self, x):
        y = backend.by_rows(lambda x: xp.maximum(x, 0), x)      # y = max(x, 0), on blocks of rows (threads)
        self.save_for_backward(y)
        return y

    def backward(self, dy):
        (y,) = self.saved_tensors()
        # y = max(x, 0)  =>  dx = dy where x > 0 (equivalently y > 0), else 0
        return backend.by_rows(lambda dy, y: dy * (y > 0), dy, y)


# --------------------------------------------------------------------------- #
# Softmax (as functions: attention and the loss fold it into their own steps)
# --------------------------------------------------------------------------- #
def softmax(x, axis=-1):
    """``y_i = exp(x_i - max x) / sum_j exp(x_j - max x)`` (shifted for stability). Over the last axis of an
    array of two or more dimensions, on blocks of rows on ``backend.threads()`` threads (the same numbers)."""
    if axis in (-1, x.ndim - 1) and x.ndim > 1:
        return backend.by_rows(plain_softmax, x)
    return plain_softmax(x, axis)


def plain_softmax(x, axis=-1):
    """:func:`softmax` on the calling thread."""
    e = xp.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_backward(y, dy, axis=-1):
    """dL/dx from dL/dy for ``y = softmax(x)``, without forming the Jacobian.

    The Jacobian is ``diag(y) - y y^T``, so  ``dx = y * (dy - sum(dy * y))``. Over the last axis, on blocks of
    rows on ``backend.threads()`` threads as :func:`softmax`.
    """
    if axis in (-1, y.ndim - 1) and y.ndim > 1:
        return backend.by_rows(plain_softmax_backward, y, dy)
    return plain_softmax_backward(y, dy, axis)


def plain_softmax_backward(y, dy, axis=-1):
    """:func:`softmax_backward` on the calling thread."""
    return y * (dy - (dy * y).sum(axis=axis, keepdims=True))


class Softmax(Module):
    """Module wrapper of :func:`softmax` / :func:`softmax_backward` over the last axis."""

    def forward(self, x):
        y = softmax(x)
        self.save_for_backward(y)
        return y

    def backward(self, dy):
        (y,) = self.saved_tensors()
        return softmax_backward(y, dy)


# --------------------------------------------------------------------------- #
# Learned positional embedding (GPT-1, GPT-2): a trained table instead of sinusoids
# --------------------------------------------------------------------------- #
class LearnedPositionalEmbedding(Module):
    """``y = x + P[start : start + L]``, ``P`` a trained table with one row per position.

    Parameter ``weight`` (max_len, D), normal with standard deviation ``std`` (GPT-2: 0.02);
    input ``x`` (B, L, D), output (B, L, D). Unlike the sinusoids, positions from ``max_len``
    on have no row: asking for them is a ValueError. ``start`` as in :class:`PositionalEncoding`.
    """

    def __init__(self, max_len, d_model, std=0.02):
        self.weight = Parameter(init_array(backend.init_rng().normal(0.0, std, (max_len, d_model))))
        self.max_len = max_len

    def forward(self, x, start=0):
        L = x.shape[1]
        if start + L > self.max_len:
            raise ValueError(f"positions {start}..{start + L - 1} asked of a learned table of {self.max_len} "
                             f"positions; give at most {self.max_len} tokens (the model's max_len)")
        self.save_for_backward(start, L)
        return x + self.weight.data[start:start + L]             # y[b, l] = x[b, l] + P[start + l]

    def backward(self, dy):
        """dy (B, L, D) -> dx (B, L, D); adds dP."""
        start, L = self.saved_tensors()
        # y[b, l] = x[b, l] + P[start + l]  =>  dP[start + l] += sum over the batch of dy[b, l]: a
        # scatter-add of every row onto the table row it read (one slice here: positions are consecutive)
        self.weight.grad[start:start + L] += dy.sum(axis=0)
        # y = x + P[...]  =>  dx = dy
        return dy


# --------------------------------------------------------------------------- #
# GELU (Hendrycks and Gimpel 2016): GPT's activation
# --------------------------------------------------------------------------- #
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715  # the tanh approximation's cubic term


class GELU(Module):
    """``y = x Phi(x)``, elementwise, with Phi the standard normal CDF.

    ``approximate="none"``: Phi(x) = (1 + erf(x / sqrt 2)) / 2, exact (``backend.erf``).
    ``approximate="tanh"``: Phi(x) ~ (1 + tanh(u)) / 2 with u = sqrt(2/pi) (x + 0.044715 x^3),
    GPT-2's form (Hugging Face's "gelu_new", PyTorch's ``approximate="tanh"``).
    Input and output any shape.
    """

    def __init__(self, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        # the elements of rows below on blocks of rows on backend.threads() threads: the same numbers
        y, cdf, *t = backend.by_rows(self.rows, x)
        self.save_for_backward(x, cdf, t[0] if t else None)
        return y

    def rows(self, x):
        """(y, Phi(x)) of x, and tanh(u) for the tanh form; elementwise."""
        if self.approximate == "tanh":
            # u = SQRT_2_OVER_PI * (x + GELU_CUBIC * (x * x * x));  t = xp.tanh(u);  cdf = 0.5 * (1.0 + t)
            # (below one step at a time in u's memory: no fresh array for each operation)
            u = x * x
            u *= x                                               # x^3
            u *= GELU_CUBIC
            u += x
            u *= SQRT_2_OVER_PI                                  # u = sqrt(2/pi) (x + 0.044715 x^3)
            t = xp.tanh(u, out=u)
            cdf = t + 1.0
            cdf *= 0.5                                           # Phi(x) ~ (1 + tanh u) / 2
        else:
            # cdf = 0.5 * (1.0 + backend.erf(x * (1.0 / math.sqrt(2.0))))  (below in erf's own array)
            cdf = backend.erf(x * (1.0 / math.sqrt(2.0)))
            cdf += 1.0
            cdf *= 0.5                                           # Phi(x) = (1 + erf(x / sqrt 2)) / 2
        y = x * cdf                                              # y = x Phi(x)
        return (y, cdf, t) if self.approximate == "tanh" else (y, cdf)

    def backward(self, dy):
        """dy (any shape) -> dx (the same shape)."""
        x, cdf, t = self.saved_tensors()
        # the elements of backward_rows below on blocks of rows on backend.threads() threads: the same numbers
        return backend.by_rows(GELU.backward_rows, dy, x, cdf, *([] if t is None else [t]))

    @staticmethod
    def backward_rows(dy, x, cdf, t=None):
        """dx of dy, given the forward's x, Phi(x) and (tanh form) t; elementwise."""
        if t is None:
            # y = x Phi(x)  =>  dy/dx = Phi(x) + x phi(x),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
            # pdf = xp.exp(-0.5 * (x * x)) * (1.0 / math.sqrt(2.0 * math.pi));  dx = dy * (cdf + x * pdf)
            # (below one step at a time in one array)
            slope = x * x
            slope *= -0.5
            xp.exp(slope, out=slope)
            slope *= 1.0 / math.sqrt(2.0 * math.pi)              # phi(x)
            slope *= x
            slope += cdf                                         # y'(x) = Phi(x) + x phi(x)
            return dy * slope
        # y = x (1 + tanh u) / 2  =>  dy/dx = (1 + t) / 2 + x (1 - t^2) / 2 * du/dx,
        # du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2). In NumPy, below one step at a time in two arrays:
        # du_dx = SQRT_2_OVER_PI * (1.0 + (3.0 * GELU_CUBIC) * (x * x))
        # dy_dx = cdf + 0.5 * x * (1.0 - t * t) * du_dx
        du_dx = x * x
        du_dx *= 3.0 * GELU_CUBIC
        du_dx += 1.0
        du_dx *= SQRT_2_OVER_PI                                  # du/dx
        dy_dx = t * t
        xp.subtract(1.0, dy_dx, out=dy_dx)                       # 1 - t^2
        dy_dx *= 0.5 * x
        dy_dx *= du_dx                                           # 0.5 x (1 - t^2) du/dx
        dy_dx += cdf                                             # dy/dx
        return dy * dy_dx


# --------------------------------------------------------------------------- #
# SiLU (Elfwing et al. 2017; "swish" with beta 1, Ramachandran et al. 2017): Marian's activation
# --------------------------------------------------------------------------- #
def sigmoid(x):
    """``1 / (1 + exp(-x))``, elementwise, in x's dtype, on one fresh array. Where exp(-x) overflows (x below
    about -89 in float32, -710 in float64) it is inf and the quotient its limit, 0; float16 works in float32
    (its exp would overflow below x = -11, where the sigmoid is still 2e-5)."""
    e = xp.negative(x, dtype=xp.promote_types(x.dtype, xp.float32))  # -x: the steps below work in place
    with backend.host.errstate(over="ignore"):                   # exp(-x) = inf is right: 1 / (1 + inf) = 0
        xp.exp(e, out=e)                                         # exp(-x)
    e += 1.0                                                     # 1 + exp(-x)
    return xp.reciprocal(e, out=e).astype(x.dtype, copy=False)   # 1 / (1 + exp(-x))


class SiLU(Module):
    """``y = x sigmoid(x)``, elementwise (Hugging Face's "silu" and "swish"; Marian's FFN activation).
    Input and output any shape."""

    def forward(self, x):
        # the elements of rows below on blocks of rows on backend.threads() threads: the same numbers
        y, s = backend.by_rows(self.rows, x)
        self.save_for_backward(x, s)
        return y

    @staticmethod
    def rows(x):
        """(y, sigmoid(x)) of x, elementwise."""
        s = sigmoid(x)                                           # s = sigmoid(x)
        return x * s, s                                          # y = x sigmoid(x)

    def backward(self, dy):
        """dy (any shape) -> dx (the same shape)."""
        x, s = self.saved_tensors()
        return backend.by_rows(SiLU.backward_rows, dy, x, s)     # on blocks of rows (threads)

    @staticmethod
    def backward_rows(dy, x, s):
        """dx of dy, given the forward's x and s = sigmoid(x); elementwise."""
        # s = sigmoid(x)  =>  ds/dx = s (1 - s)      (sigmoid' = e^-x / (1 + e^-x)^2 = s (1 - s))
        ds_dx = s * (1.0 - s)
        # y = x sigmoid(x)  =>  dy/dx = s + x ds/dx  (the product rule)
        return dy * (s + x * ds_dx)


#: the feed-forward activations by name: the paper's ReLU, exact GELU, GPT-2's tanh GELU, Marian's SiLU
ACTIVATIONS = {"relu": ReLU, "gelu": GELU, "gelu_tanh": lambda: GELU("tanh"), "silu": SiLU}


def make_activation(name):
    """A new activation module from its name in :data:`ACTIVATIONS`."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]()


# --------------------------------------------------------------------------- #
# RMSNorm (Zhang and Sennrich 2019): Llama's LayerNorm, without the centring and the bias
# --------------------------------------------------------------------------- #
class RMSNorm(Module):
    """``y = x / sqrt(mean(x^2) + eps) * weight`` over the last axis (D): no mean subtracted, no bias
    (Hugging Face's ``LlamaRMSNorm``, which computes in float32 inside; this one in x's dtype).

    Parameter ``weight`` (D,) = 1; input and output (..., D).
    """

    def __init__(self, d_model, eps=1e-6):
        self.weight = Parameter(init_array(backend.host.ones(d_model)))
        self.eps = eps

    def forward(self, x):
        # the rows of normalize below on blocks of rows on backend.threads() threads: the same numbers
        y, xhat, rstd = backend.by_rows(self.normalize, x)
        self.save_for_backward(xhat, rstd)
        return y

    def normalize(self, x):
        """(y, xhat, rstd) of x (..., D), each row on its own."""
        rstd = 1.0 / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps)  # 1 / rms  (..., 1)
        xhat = x * rstd                                          # normalised  (..., D)
        return xhat * self.weight.data, xhat, rstd

    def backward(self, dy):
        """dy (..., D) -> dx (..., D); adds dweight."""
        xhat, rstd = self.saved_tensors()
        D = xhat.shape[-1]
        # y = xhat * weight  =>  dweight = sum dy * xhat over every row,  dxhat = dy * weight
        self.weight.grad += (dy * xhat).reshape(-1, D).sum(axis=0)
        return backend.by_rows(functools.partial(RMSNorm.backward_rows, weight=self.weight.data), dy, xhat, rstd)

    @staticmethod
    def backward_rows(dy, xhat, rstd, weight):
        """dx of rows of dy, given the forward's xhat and rstd of those rows and the gain weight (D,)."""
        dxhat = dy * weight
        # xhat = x * rstd, rstd = (mean(x^2) + eps)^-1/2 depends on every x of the row:
        # dx = rstd * (dxhat - xhat * mean(dxhat * xhat)), LayerNorm's backward less its mean term
        # -mean(dxhat): no mean is subtracted, so no path runs through one (docs/layers/rmsnorm.md)
        return rstd * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))


# --------------------------------------------------------------------------- #
# SwiGLU feed-forward (Shazeer 2020): Llama's, Qwen's, Mistral's MLP
# --------------------------------------------------------------------------- #
class SwiGLU(Module):
    """``y = down(silu(gate(x)) * up(x))``: two projections to F, one gated by the other's SiLU,
    and one back to D (Hugging Face's ``LlamaMLP``, names as there).

    Submodules ``gate_proj`` (D -> F), ``up_proj`` (D -> F), ``down_proj`` (F -> D), each a
    :class:`Linear`, without biases unless ``bias=True``; input and output (..., D).
    """

    def __init__(self, d_model, d_ff, bias=False):
        self.gate_proj = Linear(d_model, d_ff, bias=bias)
        self.up_proj = Linear(d_model, d_ff, bias=bias)
        self.down_proj = Linear(d_ff, d_model, bias=bias)
        self.act = SiLU()

    def forward(self, x):
        a = self.act(self.gate_proj(x))                          # a = silu(x W_gate)  (..., F)
        u = self.up_proj(x)                                      # u = x W_up  (..., F)
        self.save_for_backward(a, u)
        h = backend.by_rows(xp.multiply, a, u)                   # h = a * u, on blocks of rows (threads)
        return self.down_proj(h)                                 # y = (a * u) W_down  (..., D)

    def backward(self, dy):
        """dy (..., D) -> dx (..., D); adds the gradients of the three projections."""
        a, u = self.saved_tensors()
        dh = self.down_proj.backward(dy)                         # y = h W_down, h = a * u  (..., F)
        # h = a * u  =>  da = dh * u,  du = dh * a  (the product rule)
        da, du = backend.by_rows(lambda dh, u, a: (dh * u, dh * a), dh, u, a)   # on blocks of rows (threads)
        # u = x W_up and a = silu(x W_gate) both read x  =>  dx is the sum of the two paths
        return self.up_proj.backward(du) + self.gate_proj.backward(self.act.backward(da))


# --------------------------------------------------------------------------- #
# Tanh: BERT's pooler (dense, then tanh on the [CLS] position)
# --------------------------------------------------------------------------- #
class Tanh(Module):
    """``y = tanh(x)``, elementwise (BERT's pooler, RoBERTa's classification head). Input and output any shape."""

    def forward(self, x):
        y = backend.by_rows(xp.tanh, x)                          # y = tanh(x), on blocks of rows (threads)
        self.save_for_backward(y)
        return y

    def backward(self, dy):
        """dy (any shape) -> dx (the same shape)."""
        (y,) = self.saved_tensors()
        # y = tanh(x)  =>  dy/dx = 1 - tanh(x)^2 = 1 - y^2 (the output is all backward needs)
        return backend.by_rows(lambda dy, y: dy * (1.0 - y * y), dy, y)
