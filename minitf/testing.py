"""Gradient tests for your own layer: the hypothesis strategies and the assertion the
project's own tests use (tests/helpers.py re-exports them). docs/own_layer.md shows them
at work on a new layer.

    from hypothesis import given
    from minitf.testing import arrays, assert_gradients_match, small

    @given(x=arrays((2, 3, 4)))
    def test_my_layer(x):
        with minitf.backend.default_dtype("float64"):
            assert_gradients_match(MyLayer(4), x)

The check: a random upstream gradient G makes ``L = sum(forward(inputs) * G)`` a scalar,
``backward(G)`` must equal dL/d(each float input) and dL/d(each parameter) as measured by
float64 central differences with h = 1e-6 (minitf.gradcheck.numeric.compare_gradients), entry by entry:

    max |analytic - numeric| <= rtol * max(|analytic|, |numeric|) + atol
    rtol = 1e-6 (RTOL), atol = 1e-7 (ATOL)

Why these numbers: the central difference's truncation error is O(h^2) = 1e-12 times the third
derivative, its rounding error about 1e-16 * |L| / h = 1e-10 |L|; a right backward lands near
1e-9, a wrong one at O(1). Layers whose third derivative is large (LayerNorm on rows of tiny
variance) need rtol 1e-5 (LN_RTOL). Needs hypothesis (``pip install -e ".[test]"``).
"""
import inspect

from hypothesis import strategies as st

from minitf import backend
# random_array and randomize live in minitf.draws, which needs no hypothesis: the study tools
# (python -m minitf.gradcheck, python -m minitf.exercise) draw their arrays with them too
from minitf.draws import random_array, randomize  # noqa: F401 (the API)
from minitf.gradcheck.numeric import compare_gradients, gradients_match, sum_gradient  # noqa: F401 (the API)
from minitf.gradcheck.numeric import upstream_gradients as _upstream
from minitf.gradcheck.protocol import protocol_problems
from minitf.gradcheck.report import describe_worst, diagnose
from minitf.module import Module, no_grad

np = backend.host

RTOL = 1e-6     #: relative tolerance of assert_gradients_match (float64, h = 1e-6)
ATOL = 1e-7     #: absolute floor: rounding noise of the differences where a gradient is ~0
LN_RTOL = 1e-5  #: for anything containing a LayerNorm: steep rows at small d_model

#: hypothesis-drawn seeds: values are drawn from a seed, so a failing example is reproducible
#: and shrinks to a small seed, not to a large array of floats
seeds = st.integers(0, 2**32 - 1)
#: small sizes (batch, length, width): central differences cost two forwards per entry
small = st.integers(1, 4)


@st.composite
def arrays(draw, shape, scale=1.0, away_from_zero=0.0):
    """A float64 device array of ``shape`` (a tuple, or a strategy of tuples) with N(0, scale^2)
    entries. ``away_from_zero=m`` pushes every entry to |x| >= m: for layers with a kink at 0
    (ReLU), where the central difference straddles the kink and measures neither side."""
    if not isinstance(shape, tuple):
        shape = draw(shape)
    x = random_array(draw(seeds), shape, scale)
    if away_from_zero:
        x = x + away_from_zero * ((x >= 0) * 2.0 - 1.0)  # moves each entry m further from 0
    return x


def upstream_gradients(shape, scale=1.0):
    """dL/d(output) of ``shape`` for tests that call ``backward`` themselves."""
    return arrays(shape, scale)


def padding_lengths(batch, length, low=1):
    """``batch`` lengths in [low, length]: the real tokens of each row (then padding)."""
    return st.lists(st.integers(low, length), min_size=batch, max_size=batch)


@st.composite
def padding_masks(draw, batch, length, allow_all_padded=False):
    """(B, L) bool device array, True = padding. Real tokens first, then padding, as a data
    loader makes them; with ``allow_all_padded`` a row may be padding only."""
    lengths = draw(padding_lengths(batch, length, low=0 if allow_all_padded else 1))
    return backend.asarray(np.arange(length)[None, :] >= np.array(lengths)[:, None])


@st.composite
def attention_masks(draw, batch, num_queries, num_keys, allow_all_padded=False):
    """A keep-mask for ``scaled_dot_product_attention`` (True = may attend), broadcastable to
    (B, 1, Tq, Tk): random key padding, causal or not; or None (nothing masked)."""
    from minitf.attention import attention_keep_mask
    pad = draw(st.none() | padding_masks(batch, num_keys, allow_all_padded))
    return attention_keep_mask(pad, draw(st.booleans()), num_queries, num_keys)


def _float_arrays(arrays_by_name):
    return {name: a for name, a in arrays_by_name.items() if backend.is_array(a) and a.dtype.kind == "f"}


def assert_gradients_match(target, *args, params=None, seed=0, rtol=None, atol=ATOL, reseed=None, tol=None,
                           caches=None, **forward_kwargs):
    """Assert that a hand-written backward matches float64 central differences.

    Two forms:

    ``assert_gradients_match(module, *inputs, **forward_kwargs)``
        ``module.forward(*inputs, **forward_kwargs)`` and ``module.backward``; every
        parameter of ``module`` is checked (or those of ``params``, a dict name -> Parameter).
        Float inputs are checked against what backward returns for them (in order); integer
        inputs (token ids) and keyword arguments (masks, flags) are passed through.
    ``assert_gradients_match(forward, backward, inputs, params=(), ...)``
        ``inputs`` a dict name -> array, ``params`` a dict name -> Parameter; ``backward``
        returns one gradient per input (None for one without).

    Options: ``seed`` of the upstream gradient G; ``rtol`` (default RTOL = 1e-6; ``tol`` is its
    older name) and ``atol`` (ATOL = 1e-7) of the per-array criterion
    max |a - n| <= rtol * max(|a|, |n|) + atol; ``reseed``: reseed the backend before every
    forward (the same dropout mask each time); ``caches``: check that backward uses the cache
    of its own forward (:func:`minitf.gradcheck.protocol.cache_problems`), by default in the module form
    only (a function pair's backward may read its inputs from a closure).

    Before the numbers, the protocol (:func:`minitf.gradcheck.protocol.protocol_problems`): every float
    input gets a gradient of its shape (None, a missing one or too few fail, naming the
    input); the incoming gradient is unchanged after backward; parameter gradients
    accumulate (``=`` instead of ``+=`` fails) into the same array (``w.grad = w.grad + g``
    fails: Adam's flat buffer would never see it); neither forward nor backward changes an input
    or a parameter; and in the module form, backward uses its own forward's cache (a forward
    on other inputs first, and two calls before their two backwards). Also asserts that
    nothing was checked in less than float64 and that something was checked. A numeric mismatch names the array, its relative error, the entry
    furthest off (analytic, numeric, their ratio), how many entries are off, and a hint
    (:func:`minitf.gradcheck.report.diagnose`). Returns the report of
    :func:`minitf.gradcheck.numeric.compare_gradients`.
    """
    rtol = RTOL if rtol is None and tol is None else (rtol if rtol is not None else tol)
    if isinstance(target, Module):
        module = target
        names = [n for n, p in inspect.signature(module.forward).parameters.items()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(args) > len(names):
            raise TypeError(f"{type(module).__name__}.forward takes {len(names)} positional inputs, got {len(args)}")
        inputs = dict(zip(names, args))
        forward = (lambda *xs: module.forward(*xs, **forward_kwargs)) if forward_kwargs else module.forward
        backward = module.backward
        params = dict(module.named_parameters()) if params is None else dict(params)
        caches = True if caches is None else caches
    else:
        if forward_kwargs:
            raise TypeError(f"unexpected keyword arguments {sorted(forward_kwargs)} (only the module form passes "
                            "keyword arguments to forward)")
        forward, backward, inputs, *rest = (target,) + args
        if len(rest) > 1:
            raise TypeError("the function form is assert_gradients_match(forward, backward, inputs, params)")
        params = dict(rest[0] if rest else (params or {}))
    low = {name: str(a.dtype) for name, a in _float_arrays(inputs).items() if a.dtype != np.float64}
    low |= {name: str(p.data.dtype) for name, p in params.items() if p.data.dtype != np.float64}
    if low:
        raise TypeError(f"gradient checks need float64 (central differences lose everything in float32), got "
                        f"{low}; build the layer and its inputs under minitf.backend.default_dtype('float64')")
    # the protocol first: a mutated input or upstream gradient also spoils the numbers measured after it
    problems = protocol_problems(forward, backward, inputs, params, seed=seed, reseed=reseed, caches=bool(caches))
    assert not problems, "the backward breaks the layer protocol:\n" + "\n".join(problems)
    report = compare_gradients(forward, backward, inputs, params, seed=seed, reseed=reseed)
    assert report, "nothing was checked: no float input with a gradient and no parameter"
    failures = []
    upstream = None
    for name, analytic, numeric, error in report:
        if gradients_match(analytic, numeric, rtol, atol):
            continue
        if upstream is None:  # drawn as compare_gradients draws it (only the one-output case is used)
            with no_grad():
                outputs = forward(*inputs.values())
            upstream = _upstream(outputs if isinstance(outputs, tuple) else (outputs,), seed)
        unit = sum_gradient(forward, inputs, params, name, reseed=reseed)  # dy = 1: what a backward without dy gives
        hint = diagnose(analytic, numeric, upstream[0] if len(upstream) == 1 else None, rtol, atol, unit=unit)
        failures.append(f"{name}: relative error {error:.2e} > rtol {rtol:g}\n"
                        f"{describe_worst(name, analytic, numeric, rtol, atol)}\n"
                        f"  hint: {hint}")
    assert not failures, "\n".join(failures)
    return report
