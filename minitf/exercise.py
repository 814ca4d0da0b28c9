"""Backward-pass exercises (cs231n style): the forward is written, the backward is yours,
and one command says whether it is right and, if not, which input or parameter is wrong
and how (docs/exercises.md).

    python -m minitf.exercise list                   # the exercises
    python -m minitf.exercise start layernorm        # copies the exercise to ./layernorm.py
    python -m minitf.exercise check layernorm.py     # exit 0 when every check passes

The check is the gradient test of minitf.testing, with the same protocol checks: every
float input gets a gradient of its shape, the incoming gradient is left unchanged, the
parameters' ``.grad`` accumulate with +=, and every entry matches float64 central
differences (max |a - n| <= 1e-6 max(|a|, |n|) + 1e-7). The inputs are small and fixed,
with what each layer needs to show its mistakes: repeated ids, padding, two heads, dk > 1.
"""
import dataclasses
import pathlib
import shutil
import sys
from types import SimpleNamespace

from minitf import backend
from minitf.draws import random_array, randomize
from minitf.gradcheck.report import print_check
from minitf.study.tools import (TIME_LIMIT, add_time_limit, check_time_limit, guarded, load_object, one_line_parser,
                                run_tool)

EXERCISES_DIR = pathlib.Path(__file__).resolve().parent / "exercises"
B, T, D, V = 2, 3, 4, 7


@dataclasses.dataclass(frozen=True)
class Slip:
    """A mistake an exercise recognises in one array's gradient: ``gradient(r)`` is that array's gradient as a
    backward with the mistake computes it, from ``r``, what the exercise's ``reference(inputs, params, dy)``
    returns (the forward's values and the upstream gradient dy). When the learner's gradient of ``array``
    equals it (and the right gradient does not), that array's hint line says ``hint``."""
    array: str  # an input's name or a parameter's (module.named_parameters()): "x", "weight", "gate_proj.weight"
    hint: str
    gradient: object  # gradient(r) -> the array with the slip in it


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise: the class the learner writes ``backward`` for (``class_name`` in minitf/exercises/NAME.py),
    how the check builds it, and what a failed check may say about each array."""
    name: str
    class_name: str
    summary: str
    page: str
    build: object  # build(cls, rng) -> (forward, backward, inputs, module)
    hints: dict = dataclasses.field(default_factory=dict)  # {array: what may be missing or wrong in it}, said
    #   when its gradient is off everywhere by no one factor and no slip below is seen; an array not named: none
    terms: object = None  # terms(inputs, upstream) -> {array: {name: (formula, array)}}, the right gradient's terms
    slips: tuple = ()  # the Slips recognised, each for one array, the first that matches told
    reference: object = None  # reference(inputs, params, dy) -> r for the slips; params {name: values}

    def slip_gradients(self, inputs, params, upstream):
        """{array: [(hint, gradient with the slip)]} for this check's inputs, parameters and upstream gradient."""
        if not self.slips:
            return {}
        r = self.reference(inputs, {name: p.data for name, p in params.items()}, upstream[0])
        found = {}
        for slip in self.slips:
            found.setdefault(slip.array, []).append((slip.hint, slip.gradient(r)))
        return found


def _plain(make):
    """An exercise whose forward takes float inputs only: f(cls, rng) -> (module, inputs)."""
    def build(cls, rng):
        module, inputs = make(cls, rng)
        return module.forward, module.backward, inputs, module
    return build


def _relu_input(rng):
    x = random_array(rng, (B, T, D))
    return x + 0.1 * ((x >= 0) * 2.0 - 1.0)  # |x| >= 0.1: no difference straddles the kink


def _attention(cls, rng):
    from minitf.attention import attention_keep_mask
    H, S, dk = 2, 4, 2
    pad = backend.asarray(backend.host.arange(S)[None, :] >= backend.host.array([[S], [S - 1]]))  # row 1: last key pads
    keep = attention_keep_mask(pad, False, T, S)
    module = cls()
    inputs = {name: random_array(rng, (B, H, length, dk)) for name, length in (("Q", T), ("K", S), ("U", S))}
    return (lambda Q, K, U: module.forward(Q, K, U, keep)), module.backward, inputs, module


def _loss(cls, rng):
    module = cls(0.1, ignore_index=0)
    target = rng.integers(1, V, (B, T))
    target[0, -1] = target[1, -2:] = 0  # padding: 3 real tokens of 6
    target = backend.asarray(target)
    return (lambda z: backend.asarray(module.forward(z, target))), (lambda g: module.backward(float(g))), \
        {"logits": random_array(rng, (B, T, V), 2.0)}, module


def _gelu(cls, rng):
    exact, tanh = cls(), cls("tanh")  # both forms, each on its own input: a wrong one is named
    return (lambda x_erf, x_tanh: backend.xp.stack([exact.forward(x_erf), tanh.forward(x_tanh)])), \
        (lambda dy: (exact.backward(dy[0]), tanh.backward(dy[1]))), \
        {"x_erf": random_array(rng, (B, T, D), 2.0), "x_tanh": random_array(rng, (B, T, D), 2.0)}, exact


def _embedding(cls, rng):
    module = randomize(cls(V, D), rng)
    ids = rng.integers(0, V, (B, T))
    ids[1, 0] = ids[0, 0] = ids[0, 2]  # one id three times
    ids = backend.asarray(ids)
    return (lambda: module.forward(ids)), module.backward, {}, module


def _rotary(cls, rng):
    module = cls(4, theta=100.0)  # dk 4: two pairs turned at two frequencies
    return (lambda x: module.forward(x, start=2)), module.backward, {"x": random_array(rng, (B, T, 2, 4))}, module


def _tanh_reference(inputs, params, dy):
    x = inputs["x"]
    return SimpleNamespace(x=x, y=backend.xp.tanh(x), dy=dy)


#: tanh's usual slips, apart on x of scale 2 (tanh, 1 - tanh, 1 - tanh^2 and 1 - x^2 far from each other); a
#: forgotten dy is told by the checker for any layer
TANH_SLIPS = (
    Slip("x", "dx = dy tanh(x): tanh is not its own derivative, tanh'(x) = 1 - tanh(x)^2", lambda r: r.dy * r.y),
    Slip("x", "dx = dy (1 - tanh(x)): the square is missing, tanh'(x) = 1 - tanh(x)^2",
         lambda r: r.dy * (1.0 - r.y)),
    Slip("x", "dx = dy (1 - x^2): the derivative is written with the input x; it is 1 - y^2 with the output "
         "y = tanh(x)", lambda r: r.dy * (1.0 - r.x * r.x)),
)

#: the masked-LM check's labels, B = 2 sequences of T = 5 positions: M = 3 masked, each with its original token
#: (MLM_TOKENS there; the exercise's label is ignore_index everywhere else, where its safe label is 0). M, T, B and
#: B T all differ, so each wrong divisor is a factor of its own
MLM_MASKED = ((False, True, False, True, False), (False, False, True, False, False))
MLM_TOKENS = ((0, 4, 0, 2, 0), (0, 0, 6, 0, 0))


def _masked_lm_loss(cls, rng):
    module, host = cls(), backend.host
    masked = host.array(MLM_MASKED)
    labels = backend.asarray(host.where(masked, host.array(MLM_TOKENS), module.ignore_index))
    logits = random_array(rng, masked.shape + (V,), 2.0)
    return (lambda z: backend.asarray(module.forward(z, labels))), (lambda g: module.backward(float(g))), \
        {"logits": logits}, module


def _masked_lm_reference(inputs, params, dy):
    from minitf.layers import softmax
    xp, z = backend.xp, inputs["logits"]
    masked = backend.asarray(MLM_MASKED)
    onehot = (xp.arange(z.shape[-1]) == backend.asarray(MLM_TOKENS)[..., None]) * 1.0  # the safe labels' one-hot
    return SimpleNamespace(g=dy, p=softmax(z), onehot=onehot, keep=masked[..., None] * 1.0)


def _masked_lm_slips():
    B, T = len(MLM_MASKED), len(MLM_MASKED[0])
    M = sum(map(sum, MLM_MASKED))
    unmasked = (f"dlogits is not 0 at the {B * T - M} unmasked positions (label -100): they carry no loss, so their "
                f"gradient is 0; only the M = {M} masked positions get softmax - onehot")
    over = f"not by the M = {M} masked positions the mean is over"
    return tuple(Slip("logits", unmasked, lambda r, n=n: r.g * (r.p - r.onehot) / n) for n in (M, T, B, B * T, 1)) + (
        Slip("logits", f"dlogits = dloss (softmax - onehot) / T: divided by the sequence length T = {T}, {over}",
             lambda r: r.g * (r.p - r.onehot) * r.keep / T),
        Slip("logits", f"dlogits = dloss (softmax - onehot) / B: divided by the batch B = {B}, {over}",
             lambda r: r.g * (r.p - r.onehot) * r.keep / B),
        Slip("logits", f"dlogits = dloss (softmax - onehot) / (B T): divided by all B T = {B * T} positions, not by "
             f"the M = {M} masked ones the mean is over", lambda r: r.g * (r.p - r.onehot) * r.keep / (B * T)),
        Slip("logits", f"dlogits = dloss (softmax - onehot): not divided by M = {M}: the loss is the mean over the "
             "masked positions", lambda r: r.g * (r.p - r.onehot) * r.keep),
        Slip("logits", "dlogits = dloss softmax / M: the one-hot of the label is not subtracted: "
             "d(-log p[label])/dlogits = softmax - onehot(label)", lambda r: r.g * r.p * r.keep / M),
        Slip("logits", "dlogits = -dloss onehot / M: the softmax is missing: d(-log p[label])/dlogits = softmax - "
             "onehot(label), the softmax through log-sum-exp", lambda r: -r.g * r.onehot * r.keep / M),
    )


MASKED_LM_SLIPS = _masked_lm_slips()


def _silu_terms(inputs, upstream):
    from minitf.layers import sigmoid
    x, (dy,) = inputs["x"], upstream
    s = sigmoid(x)
    return {"x": {"the product rule's first term": ("dy sigmoid(x)", dy * s),
                  "the product rule's second term": ("dy x sigmoid(x) (1 - sigmoid(x))", dy * x * s * (1.0 - s))}}


def _gelu_terms(inputs, upstream):
    import math

    from minitf.layers import GELU_CUBIC, SQRT_2_OVER_PI
    xp = backend.xp
    (dy,) = upstream  # the two forms' outputs stacked: dy[0] for x_erf, dy[1] for x_tanh
    x, z = inputs["x_erf"], inputs["x_tanh"]
    cdf = 0.5 * (1.0 + backend.erf(x / math.sqrt(2.0)))
    pdf = xp.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    t = xp.tanh(SQRT_2_OVER_PI * (z + GELU_CUBIC * z ** 3))
    du_dz = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * z * z)
    return {"x_erf": {"the product rule's first term": ("dy Phi(x)", dy[0] * cdf),
                      "the product rule's second term": ("dy x phi(x)", dy[0] * x * pdf)},
            "x_tanh": {"the product rule's first term": ("dy (1 + t) / 2", dy[1] * 0.5 * (1.0 + t)),
                       "the product rule's second term": ("dy x (1 - t^2) / 2 du/dx",
                                                          dy[1] * 0.5 * z * (1.0 - t * t) * du_dz)}}


def _rows(a):
    """a (..., D) summed over every leading axis -> (D,): a per-feature parameter's gradient."""
    return a.reshape(-1, a.shape[-1]).sum(axis=0)


def _over_rows(x, d):
    """x^T d over every leading axis: x (..., D), d (..., F) -> (D, F), a Linear weight's gradient."""
    return x.reshape(-1, x.shape[-1]).T @ d.reshape(-1, d.shape[-1])


def _rmsnorm_reference(inputs, params, dy):
    x, w = inputs["x"], params["weight"]
    rstd = 1.0 / backend.xp.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6)
    xhat = x * rstd
    dxhat = dy * w
    return SimpleNamespace(x=x, dy=dy, rstd=rstd, xhat=xhat, dxhat=dxhat,
                           through_rstd=xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))


RMSNORM_SLIPS = (
    Slip("x", "dx holds LayerNorm's term through the row's mean, -mean(dxhat): RMSNorm subtracts no mean (its rms "
         "is of x itself, not of x - mean(x) as a variance is), so dx = rstd (dxhat - xhat mean(dxhat xhat))",
         lambda r: r.rstd * (r.dxhat - r.dxhat.mean(axis=-1, keepdims=True) - r.through_rstd)),
    Slip("x", "dx = rstd (dxhat - mean(dxhat)) is LayerNorm's term through the mean, and RMSNorm subtracts no mean; "
         "its own term is the one through the row's rstd: dx = rstd (dxhat - xhat mean(dxhat xhat))",
         lambda r: r.rstd * (r.dxhat - r.dxhat.mean(axis=-1, keepdims=True))),
    Slip("x", "the sign of the term through the row's rstd is flipped: rstd = 1 / sqrt(mean(x^2) + eps) falls as "
         "|x| grows, so dx = rstd (dxhat - xhat mean(dxhat xhat))",
         lambda r: r.rstd * (r.dxhat + r.through_rstd)),
    Slip("x", "the term through the row's rstd is missing: rstd depends on every x of the row, so "
         "dx = rstd (dxhat - xhat mean(dxhat xhat)), not rstd dxhat",
         lambda r: r.rstd * r.dxhat),
    Slip("x", "the weight is missing from dx: y = xhat weight, so dxhat = dy weight, then "
         "dx = rstd (dxhat - xhat mean(dxhat xhat))",
         lambda r: r.rstd * (r.dy - r.xhat * (r.dy * r.xhat).mean(axis=-1, keepdims=True))),
    Slip("weight", "dweight = the sum over rows of dy xhat, the normalised x (y = xhat weight), not dy x",
         lambda r: _rows(r.dy * r.x)),
    Slip("weight", "dweight = the sum over rows of dy xhat (y = xhat weight); the sum of dy alone is LayerNorm's "
         "dbeta, and RMSNorm has no beta",
         lambda r: _rows(r.dy)),
)


def _rotate_half(x):
    """[x1, x2] -> [-x2, x1] over the last axis: the code's pairs are i and i + dk/2."""
    half = x.shape[-1] // 2
    return backend.xp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _rotate_adjacent(x):
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...): pairs of adjacent dimensions (Meta's interleaved layout)."""
    return backend.xp.stack([-x[..., 1::2], x[..., ::2]], axis=-1).reshape(x.shape)


def _rotary_reference(inputs, params, dy):
    xp = backend.xp
    dk, T = inputs["x"].shape[-1], inputs["x"].shape[1]
    inv_freq = 1.0 / 100.0 ** (xp.arange(0, dk, 2) / dk)             # the exercise's theta 100
    freqs = xp.arange(2, 2 + T)[:, None] * inv_freq[None, :]          # positions from start 2
    angles = xp.concatenate([freqs, freqs], axis=-1)
    return SimpleNamespace(dy=dy, cos=xp.cos(angles)[:, None, :], sin=xp.sin(angles)[:, None, :])


ADJACENT = ("dx pairs adjacent dimensions (x_0 with x_1, x_2 with x_3: Meta's interleaved layout), but this code "
            "pairs the halves, x_i with x_{i + dk/2} (rotate_half, Hugging Face's layout): "
            "dx = dy cos - rotate_half(dy) sin")
ROTARY_SLIPS = (
    Slip("x", "dx turns dy by +angle, the forward's turn again: a turn's transpose is the turn by -angle "
         "(rotate_half's transpose is -rotate_half), so dx = dy cos - rotate_half(dy) sin",
         lambda r: r.dy * r.cos + _rotate_half(r.dy) * r.sin),
    Slip("x", ADJACENT, lambda r: r.dy * r.cos - _rotate_adjacent(r.dy) * r.sin),
    Slip("x", ADJACENT, lambda r: r.dy * r.cos + _rotate_adjacent(r.dy) * r.sin),
    Slip("x", "the rotate_half(dy) sin term is missing: y = x cos + rotate_half(x) sin reads x twice",
         lambda r: r.dy * r.cos),
    Slip("x", "cos and sin are swapped: dx = dy cos - rotate_half(dy) sin",
         lambda r: r.dy * r.sin - _rotate_half(r.dy) * r.cos),
)


def _swiglu_reference(inputs, params, dy):
    from minitf.layers import sigmoid
    x, Wg, Wu, Wd = inputs["x"], params["gate_proj.weight"], params["up_proj.weight"], params["down_proj.weight"]
    g, u = x @ Wg, x @ Wu
    s = sigmoid(g)
    a = g * s
    dh = dy @ Wd.T
    silu_prime = s + g * s * (1.0 - s)
    return SimpleNamespace(x=x, Wg=Wg, Wu=Wu, a=a, u=u, dh=dh, silu_prime=silu_prime, du=dh * a,
                           dg=silu_prime * dh * u)


SWAPPED = ("gate and up swapped: SiLU acts on gate_proj's output, so gate_proj.backward takes act.backward(dh u) "
           "and up_proj.backward takes dh a")
FACTORS = "the product rule's factors swapped: h = a u, so da = dh u (the other factor) and du = dh a"
SWIGLU_SLIPS = (
    Slip("gate_proj.weight", "gate_proj.weight got up_proj's gradient, x^T (dh a): " + SWAPPED,
         lambda r: _over_rows(r.x, r.du)),
    Slip("up_proj.weight", "up_proj.weight got gate_proj's gradient, x^T act.backward(dh u): " + SWAPPED,
         lambda r: _over_rows(r.x, r.dg)),
    Slip("x", "dx sent each path through the other's projection: " + SWAPPED,
         lambda r: r.dg @ r.Wu.T + r.du @ r.Wg.T),
    Slip("x", FACTORS, lambda r: (r.dh * r.u) @ r.Wu.T + (r.silu_prime * r.dh * r.a) @ r.Wg.T),
    Slip("gate_proj.weight", FACTORS, lambda r: _over_rows(r.x, r.silu_prime * r.dh * r.a)),
    Slip("up_proj.weight", FACTORS, lambda r: _over_rows(r.x, r.dh * r.u)),
    Slip("x", "SiLU's backward is skipped on the gate path: gate_proj.backward takes act.backward(dh u), "
         "dh u silu'(g), not dh u", lambda r: r.du @ r.Wu.T + (r.dh * r.u) @ r.Wg.T),
    Slip("gate_proj.weight", "SiLU's backward is skipped on the gate path: gate_proj.backward takes "
         "act.backward(dh u), dh u silu'(g), not dh u", lambda r: _over_rows(r.x, r.dh * r.u)),
    Slip("x", "dx holds the gate path alone: x reaches y through up_proj too, so "
         "dx = up_proj.backward(dh a) + gate_proj.backward(act.backward(dh u))", lambda r: r.dg @ r.Wg.T),
    Slip("x", "dx holds the up path alone: x reaches y through gate_proj too, so "
         "dx = up_proj.backward(dh a) + gate_proj.backward(act.backward(dh u))", lambda r: r.du @ r.Wu.T),
)


def _gqa_reference(inputs, params, dy):
    from minitf.attention import attention_keep_mask, scaled_dot_product_attention
    from minitf.attention import scaled_dot_product_attention_backward
    Q, K, U = inputs["Q"], inputs["K"], inputs["U"]
    B, H, T, E = Q.shape
    Hkv = K.shape[1]
    K_rep, U_rep = backend.xp.repeat(K, H // Hkv, axis=1), backend.xp.repeat(U, H // Hkv, axis=1)
    _, P = scaled_dot_product_attention(Q, K_rep, U_rep, attention_keep_mask(None, True, T, T))
    _, dK_rep, dU_rep = scaled_dot_product_attention_backward(dy, Q, K_rep, U_rep, P)
    return SimpleNamespace(shape=(B, Hkv, H // Hkv, T, E), K=dK_rep, U=dU_rep)


def _gqa_slips(array):
    name = f"d{array}"

    def grouped(r):  # (B, Hkv, G, T, E): query head j = i G + g reads key/value head i
        return getattr(r, array).reshape(r.shape)

    def interleaved(r):  # (B, G, Hkv, T, E): query head j = g Hkv + i, as if it read key/value head j % Hkv
        B, Hkv, G, T, E = r.shape
        return getattr(r, array).reshape(B, G, Hkv, T, E)

    return (
        Slip(array, f"{name} holds the first query head's gradient of each group only: all G query heads of a "
             f"group read its key/value head, so each adds its share: {name} = {name}_rep.reshape(B, Hkv, G, T, "
             f"E).sum(axis=2)", lambda r: grouped(r)[:, :, 0]),
        Slip(array, f"{name} averages the G query heads of each group: each one reads the key/value head and adds "
             f"its whole share, a sum, not a mean", lambda r: grouped(r).mean(axis=2)),
        Slip(array, f"{name} sums the wrong query heads: key/value head i serves the query heads j // G = i, the G "
             f"heads in a row (xp.repeat), not every Hkv-th one (j % Hkv, the order of xp.tile): "
             f"{name} = {name}_rep.reshape(B, Hkv, G, T, E).sum(axis=2)", lambda r: interleaved(r).sum(axis=1)),
    )


def _gqa(cls, rng):
    module = cls(2)  # 4 query heads over 2 key/value heads: G = 2, so a first-head-only dK or a wrong group shows
    inputs = {"Q": random_array(rng, (B, 4, T, 2)), "K": random_array(rng, (B, 2, T, 2)),
              "U": random_array(rng, (B, 2, T, 2))}
    return module.forward, module.backward, inputs, module


#: the relative_bias exercise's shape: N layers per stack, H heads, T positions, its tables' buckets and distance
BIAS_LAYERS, BIAS_HEADS, BIAS_LENGTH, BIAS_BUCKETS, BIAS_DISTANCE = 2, 2, 7, 8, 6


def _relative_bias(cls, rng):
    module = randomize(cls(BIAS_HEADS, BIAS_BUCKETS, BIAS_DISTANCE), rng)
    scores = random_array(rng, (2, BIAS_LAYERS, B, BIAS_HEADS, BIAS_LENGTH, BIAS_LENGTH))
    return module.forward, module.backward, {"scores": scores}, module


def _relative_bias_reference(inputs, params, dy):
    """dy (2, N, B, H, T, T) and each stack's buckets, flattened (T*T,): the encoder's bidirectional, the
    decoder's of the past only."""
    from minitf.attention import relative_position_bucket
    np = backend.host
    relative = np.arange(BIAS_LENGTH)[None, :] - np.arange(BIAS_LENGTH)[:, None]  # j - i  (T, T)
    return SimpleNamespace(dy=dy, buckets=[backend.asarray(relative_position_bucket(
        relative, bidirectional, BIAS_BUCKETS, BIAS_DISTANCE).reshape(-1)) for bidirectional in (True, False)])


def _bias_table(r, stack, layers=slice(None), scatter_add=True):
    """The (buckets, H) gradient of ``stack``'s table from dy of its ``layers``, summed over them and the batch:
    a scatter-add of every query-key pair, or (``scatter_add`` False) the fancy-index ``+=`` that keeps one pair
    per bucket, run on this backend as a learner's would be."""
    rows = r.dy[stack, layers].sum(axis=(0, 1)).reshape(BIAS_HEADS, -1).T    # (T*T, H)
    table = backend.xp.zeros((BIAS_BUCKETS, BIAS_HEADS))
    if scatter_add:
        backend.add_at_rows(table, r.buckets[stack], rows)
    else:
        table[r.buckets[stack]] += rows
    return table


def _relative_bias_slips():
    slips = ()
    for stack, array in enumerate(("encoder", "decoder")):
        slips += (
            Slip(array, f"{array}.grad[buckets] += ... keeps one query-key pair per bucket (a bucket met many times "
                 "is written once, not summed): every pair in a bucket adds its share, a scatter-add "
                 "(backend.add_at_rows, xp.add.at)", lambda r, s=stack: _bias_table(r, s, scatter_add=False)),
            Slip(array, f"d{array} holds the first layer's gradient only: every layer of the stack adds the same "
                 "bias, so its table's gradient sums dy over all N layers (and every sentence)",
                 lambda r, s=stack: _bias_table(r, s, slice(0, 1))),
        )
    return slips + (
        Slip("encoder", "the decoder's gradient is added into the encoder's table too: each stack has its own table, "
             "the decoder's gradient (its causal buckets) goes to decoder.grad only",
             lambda r: _bias_table(r, 0) + _bias_table(r, 1)),
    )


RELATIVE_BIAS_SLIPS = _relative_bias_slips()


ROUTER_K = 2  # of E = 4 experts


def _router(cls, rng):
    E, N = 4, 5
    mixtral, qwen = cls(ROUTER_K, True), cls(ROUTER_K, False)  # both forms, each on its own inputs: a wrong one is named
    inputs = {"logits_mixtral": random_array(rng, (N, E), 2.0), "out_mixtral": random_array(rng, (N, E, D)),
              "logits_qwen": random_array(rng, (N, E), 2.0), "out_qwen": random_array(rng, (N, E, D))}
    return (lambda zm, om, zq, oq: backend.xp.stack([mixtral.forward(zm, om), qwen.forward(zq, oq)])), \
        (lambda dy: mixtral.backward(dy[0]) + qwen.backward(dy[1])), inputs, mixtral


def _router_reference(inputs, params, dy):
    """Per form (r.mixtral renormalised, r.qwen not; dy[0] and dy[1] their upstream gradients): the forward's
    values and the gradients the usual slips of docs/moe.md compute."""
    from minitf.layers import softmax, softmax_backward
    from minitf.moe import put_rows, top_k
    xp = backend.xp
    forms = {}
    for i, (form, renormalised) in enumerate((("mixtral", True), ("qwen", False))):
        z, out, g = inputs[f"logits_{form}"], inputs[f"out_{form}"], dy[i]
        p = softmax(z)                                                  # over all E  (N, E)
        idx, c = top_k(p, ROUTER_K)                                     # (N, k)
        t = c.sum(axis=-1, keepdims=True)                               # (N, 1)
        dw = (g[:, None, :] * xp.take_along_axis(out, idx[..., None], axis=1)).sum(axis=-1)      # (N, k)

        def to_logits(dchosen, p=p, idx=idx):  # dp: dchosen at the chosen experts, 0 elsewhere; softmax's backward
            dp = xp.zeros_like(p)
            put_rows(dp, idx, dchosen)
            return softmax_backward(p, dp)

        q = c / t                                                       # the softmax of the chosen logits alone
        over_chosen = xp.zeros_like(p)
        put_rows(over_chosen, idx, q * (dw - (dw * q).sum(axis=-1, keepdims=True)))
        every = p / t if renormalised else p                            # the weight every expert would get  (N, E)
        forms[form] = SimpleNamespace(every_expert=every[..., None] * g[:, None, :],   # (N, E, D)
                                      no_jacobian=to_logits(dw / t), over_chosen=over_chosen)
    return SimpleNamespace(**forms)


EVERY_EXPERT = ("every expert got a gradient: top-k chose k of them, and the others are not in y, so dout is "
                "w_j dy at each chosen expert idx_j and 0 at the others")
OVER_CHOSEN = ("the softmax's backward is taken over the k chosen logits alone: p is the softmax over all E experts, "
               "so dp (dw at the chosen experts, 0 elsewhere) goes through softmax_backward(p, dp) over all E (with "
               "renormalisation the two agree, without it they do not)")
#: the router's three usual slips (docs/moe.md); the softmax over the chosen logits alone is the right gradient of
#: the renormalised form (the same function there), so it is a slip of the Qwen form's logits only
ROUTER_SLIPS = (
    Slip("out_mixtral", EVERY_EXPERT, lambda r: r.mixtral.every_expert),
    Slip("out_qwen", EVERY_EXPERT, lambda r: r.qwen.every_expert),
    Slip("logits_mixtral", "the renormalisation's Jacobian is dropped: w = c / t with t = sum(c) depends on every "
         "chosen c, so dc = (dw - <dw, w>) / t, not dw / t", lambda r: r.mixtral.no_jacobian),
    Slip("logits_qwen", OVER_CHOSEN, lambda r: r.qwen.over_chosen),
)


EXERCISES = {e.name: e for e in [
    Exercise("linear", "Linear", "y = x W + b: dW, db and dx", "layers/linear.md",
             _plain(lambda cls, rng: (randomize(cls(D, 3), rng), {"x": random_array(rng, (B, T, D))})),
             {"x": "dx = dy W^T", "weight": "dW = x^T dy, summed over every position",
              "bias": "db = dy, summed over every position"}),
    Exercise("relu", "ReLU", "y = max(x, 0): dx", "layers/relu.md",
             _plain(lambda cls, rng: (cls(), {"x": _relu_input(rng)})),
             {"x": "dx = dy where x > 0 and 0 elsewhere"}),
    Exercise("softmax", "Softmax", "y = softmax(x): dx without the Jacobian", "layers/softmax.md",
             _plain(lambda cls, rng: (cls(), {"x": random_array(rng, (B, T, 5), 2.0)})),
             {"x": "dx = y (dy - sum(dy y) over the row): the part through the row's sum"}),
    Exercise("layernorm", "LayerNorm", "LayerNorm: dgamma, dbeta and the three terms of dx", "layers/layernorm.md",
             _plain(lambda cls, rng: (randomize(cls(D), rng), {"x": random_array(rng, (B, T, D))})),
             {"x": "dx's three terms: dxhat, the part through the row's mean, the part through its rstd",
              "gamma": "dgamma = dy xhat, summed over every row", "beta": "dbeta = dy, summed over every row"}),
    Exercise("attention", "Attention", "softmax(Q K^T / sqrt(dk)) U with a padding mask: dQ, dK, dU",
             "layers/attention.md", _attention,
             {array: "the softmax's backward from dP to dS, the part through each row's sum"
              for array in ("Q", "K")} | {"U": "dU = P^T dO"}),
    Exercise("loss", "LabelSmoothedCrossEntropy", "label-smoothed cross-entropy over non-pad tokens: dlogits",
             "layers/loss.md", _loss,
             {"logits": "dlogits = (softmax(z) - q) / (non-pad tokens), q the smoothed target"}),
    Exercise("embedding", "Embedding", "y = W[ids] sqrt(D): the scatter-add into dW", "layers/embedding.md",
             _embedding, {"weight": "dW[id] = sqrt(D) times the sum of dy over the positions of that id"}),
    Exercise("gelu", "GELU", "y = x Phi(x), exact (erf) and GPT-2's tanh form: dx", "gpt.md", _gelu,
             {"x_erf": "y' = Phi(x) + x phi(x): the product rule's second term holds the usual slips",
              "x_tanh": "y' = (1 + t) / 2 + x (1 - t^2) / 2 du/dx: the product rule's second term, with "
                        "tanh' = 1 - t^2 and du/dx, holds the usual slips"}, _gelu_terms),
    Exercise("silu", "SiLU", "y = x sigmoid(x), Marian's activation: dx", "pretrained.md",
             _plain(lambda cls, rng: (cls(), {"x": random_array(rng, (B, T, D), 3.0)})),
             {"x": "y' = s + x s (1 - s) with s = sigmoid(x): the product rule's two terms, and sigmoid' = s (1 - s) "
                   "written with s, not with SiLU's output"}, _silu_terms),
    Exercise("rmsnorm", "RMSNorm", "RMSNorm, the Llama family's norm: dweight and the two terms of dx",
             "layers/rmsnorm.md",
             _plain(lambda cls, rng: (randomize(cls(D), rng), {"x": random_array(rng, (B, T, D))})),
             {"x": "dx = rstd (dxhat - xhat mean(dxhat xhat)), dxhat = dy weight: no term through a mean (none is "
                   "subtracted), the part through the row's rstd kept",
              "weight": "dweight = dy xhat summed over every row (y = xhat weight), added with +="},
             slips=RMSNORM_SLIPS, reference=_rmsnorm_reference),
    Exercise("rotary", "RotaryEmbedding", "rotary positions on (B, T, heads, dk): dx, the rotation back",
             "layers/rotary.md", _rotary,
             {"x": "dx = dy cos - rotate_half(dy) sin: rotate_half's transpose is -rotate_half (the turn back)"},
             slips=ROTARY_SLIPS, reference=_rotary_reference),
    Exercise("swiglu", "SwiGLU", "down(silu(gate(x)) * up(x)): the product rule and x's two paths",
             "layers/swiglu.md",
             _plain(lambda cls, rng: (randomize(cls(D, 6), rng), {"x": random_array(rng, (B, T, D))})),
             {"x": "dx = up_proj's dx + gate_proj's dx: x reaches y by both paths",
              "gate_proj.weight": "dW_gate = x^T act.backward(dh u), through SiLU's backward",
              "up_proj.weight": "dW_up = x^T (dh a)",
              "down_proj.weight": "dW_down = (a u)^T dy, summed over every position"},
             slips=SWIGLU_SLIPS, reference=_swiglu_reference),
    Exercise("gqa", "GroupedQueryAttention", "grouped-query attention: 4 query heads over 2 key/value heads, "
             "dK and dU summed over each group", "layers/gqa.md", _gqa,
             {"Q": "dQ is the attention's backward's dQ, each query head its own (Q is not shared)",
              "K": "dK = dK_rep summed over the G query heads that read each key/value head",
              "U": "dU = dU_rep summed over the G query heads that read each key/value head"},
             slips=_gqa_slips("K") + _gqa_slips("U"), reference=_gqa_reference),
    Exercise("tanh", "Tanh", "y = tanh(x), BERT's pooler: dx written with y", "bert.md",
             _plain(lambda cls, rng: (cls(), {"x": random_array(rng, (B, T, D), 2.0)})),  # scale 2: the slips apart
             {"x": "dx = dy (1 - y^2) with y = tanh(x), the output"}, slips=TANH_SLIPS, reference=_tanh_reference),
    Exercise("masked_lm_loss", "MaskedLMLoss", "cross-entropy over the masked positions only: dlogits", "bert.md",
             _masked_lm_loss,
             {"logits": "dlogits = dloss (softmax - onehot(label)) / M at the M masked positions, 0 elsewhere"},
             slips=MASKED_LM_SLIPS, reference=_masked_lm_reference),
    Exercise("relative_bias", "SharedBias", "T5's relative position bias, one table per stack: the scatter-add",
             "t5.md", _relative_bias,
             {"scores": "dscores = dy: the bias is added, the scores pass straight through",
              **{array: f"d{array}[bucket, h] = the sum of dy[..., h, i, j] over every pair (i, j) in that bucket, "
                        f"every sentence and every layer of the {array}'s stack: a scatter-add"
                 for array in ("encoder", "decoder")}},
             slips=RELATIVE_BIAS_SLIPS, reference=_relative_bias_reference),
    Exercise("router", "Router", "a mixture of experts' router: top-k of a softmax, renormalised or not",
             "moe.md", _router,
             {"out_mixtral": "dout = w_j dy at the chosen experts idx_j, 0 at the others",
              "out_qwen": "dout = w_j dy at the chosen experts idx_j, 0 at the others",
              "logits_mixtral": "dw = <dy, out[idx]>, dc = (dw - <dw, w>) / t (the renormalisation's Jacobian), "
                                "then the softmax's backward over all E experts with dp = dc at the chosen, 0 "
                                "elsewhere",
              "logits_qwen": "dw = <dy, out[idx]> is dc (no renormalisation), then the softmax's backward over all E "
                             "experts with dp = dc at the chosen, 0 elsewhere"},
             slips=ROUTER_SLIPS, reference=_router_reference),
]}


def check(path, seed=0, time_limit=TIME_LIMIT):
    """Check the exercise in the file ``path``; prints the report, returns 0 (right) or 1. A file that
    is no exercise is one line on stderr (2); the learner's code failing, running past ``time_limit``
    seconds or Ctrl-C raise :class:`minitf.study.tools.UserCodeError` (one line)."""
    path = pathlib.Path(path)

    def refuse(message):
        print(f"error: {message}", file=sys.stderr)
        return 2

    def load(name):  # the file runs as it loads: a loop at its top level meets the time limit too
        return guarded(lambda: load_object(f"{path}:{name}"), path, time_limit, wrap=False)

    try:
        name = load("EXERCISE")
    except ValueError as error:
        return refuse(f"{error} (an exercise file sets EXERCISE = \"linear\", ...; "
                      f"start one with python -m minitf.exercise start NAME)")
    if not isinstance(name, str) or name not in EXERCISES:
        return refuse(f"{path} says EXERCISE = {name!r}; expected one of the names {', '.join(map(repr, EXERCISES))}")
    exercise = EXERCISES[name]
    try:
        cls = load(exercise.class_name)
    except ValueError as error:
        return refuse(f"{error}: exercise {name} is the class {exercise.class_name} (python -m minitf.exercise "
                      f"start {name} writes it)")
    rng = backend.host_rng(seed)
    print(f"{path.name}: exercise {name} ({exercise.summary}), float64 central differences")

    def run():
        forward, backward, inputs, module = exercise.build(cls, rng)
        params = dict(module.named_parameters())
        terms = (lambda upstream: exercise.terms(inputs, upstream)) if exercise.terms is not None else None
        return print_check(forward, backward, inputs, params, seed=seed, entries=3, caches=True, terms=terms,
                           term_hint=exercise.hints,
                           slips=lambda upstream: exercise.slip_gradients(inputs, params, upstream))

    with backend.default_dtype("float64"):
        backend.manual_seed(seed)
        try:  # the learner's forward or backward failing: one line, where it failed
            failed = guarded(run, path, time_limit, unwrapped=(NotImplementedError,))
        except NotImplementedError as error:
            print(f"not written yet: {error}")
            return 1
    if failed:
        print(f"{exercise.class_name}.backward is wrong: see the FAIL lines above "
              f"(docs/{exercise.page} derives it)")
        return 1
    print(f"{exercise.class_name}.backward is right: every check passed")
    return 0


def main(argv=None):
    parser = one_line_parser(prog="python -m minitf.exercise", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="list the exercises")
    start = commands.add_parser("start", help="copy an exercise into a directory (default: here)")
    start.add_argument("name", choices=list(EXERCISES))
    start.add_argument("--to", default=".", help="directory to write NAME.py into")
    checker = commands.add_parser("check", help="check your backward in FILE")
    checker.add_argument("file")
    checker.add_argument("--seed", type=int, default=0)
    add_time_limit(checker)
    args = parser.parse_args(argv)
    if args.command == "list":
        for e in EXERCISES.values():
            print(f"{e.name:{max(map(len, EXERCISES))}s} {e.summary}  (docs/{e.page})")
        return 0
    if args.command == "start":
        if pathlib.Path(args.to).exists() and not pathlib.Path(args.to).is_dir():
            parser.error(f"--to {args.to} is a file; --to takes a directory to write {args.name}.py into")
        target = pathlib.Path(args.to) / f"{args.name}.py"
        if target.exists():
            parser.error(f"{target} exists already; check it with python -m minitf.exercise check {target}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(EXERCISES_DIR / f"{args.name}.py", target)
        print(f"wrote {target}: write the backward, then: python -m minitf.exercise check {target}")
        return 0
    if not pathlib.Path(args.file).is_file():
        parser.error(f"no such file: {args.file}")
    check_time_limit(parser, args.time_limit)
    return check(args.file, args.seed, args.time_limit)


if __name__ == "__main__":
    raise SystemExit(run_tool(main))
