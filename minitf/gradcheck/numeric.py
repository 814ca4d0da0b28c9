"""Numerical gradients by central differences, and the comparison of a layer's hand-written
backward with them: the measurement under every gradient check (minitf.testing, the tests,
``python -m minitf.gradcheck``, ``python -m minitf.exercise``).

A scalar loss ``L = sum(forward(inputs) * G)`` with a random upstream gradient
``G`` makes ``backward(G)`` the exact vector-Jacobian product to compare with

    dL/dx_i  ~  (L(x + h e_i) - L(x - h e_i)) / (2 h)        (error O(h^2))

Run it in float64 (``backend.default_dtype('float64')``): in float32 the
rounding error of L swamps the O(h^2) term.
"""
from minitf import backend
from minitf.backend import xp
from minitf.module import no_grad, stacked_forwards


def numerical_gradient(f, x, h=1e-6):
    """dL/dx of a scalar function ``f()`` that reads the array ``x``, by central
    differences on every entry. ``x`` is changed in place and restored."""
    if not x.flags.c_contiguous:
        raise ValueError("numerical_gradient needs a C-contiguous array (it perturbs x in place)")
    grad = xp.zeros_like(x)
    x_flat, grad_flat = x.reshape(-1), grad.reshape(-1)  # views (x must be contiguous)
    for i in range(x_flat.size):
        old = float(x_flat[i])
        x_flat[i] = old + h
        f_plus = f()
        x_flat[i] = old - h
        f_minus = f()
        x_flat[i] = old
        grad_flat[i] = (f_plus - f_minus) / (2 * h)
    return grad


def relative_error(analytic, numeric):
    """max |a - n| / max(max |a|, max |n|, 1e-12): 0 is perfect, 1e-10 to 1e-8 is typical in float64."""
    a, n = backend.to_numpy(analytic), backend.to_numpy(numeric)
    scale = max(float(abs(a).max(initial=0)), float(abs(n).max(initial=0)), 1e-12)
    return float(abs(a - n).max(initial=0)) / scale


def gradients_match(analytic, numeric, rtol=1e-6, atol=1e-7):
    """The pass criterion of every gradient check:
    max |a - n| <= rtol * max(|a|, |n|) + atol.

    ``atol`` covers the rounding noise of the differences themselves, about
    machine-eps * |L| / h = 1e-16 * |L| / 1e-6, which dominates when a gradient
    is tiny (a saturated softmax, the lower layers of a post-LN stack)."""
    a, n = backend.to_numpy(analytic), backend.to_numpy(numeric)
    scale = max(float(abs(a).max(initial=0)), float(abs(n).max(initial=0)))
    return float(abs(a - n).max(initial=0)) <= rtol * scale + atol


def as_tuple(value):
    """A forward's output or a backward's result as a tuple (one array is a tuple of one)."""
    return value if isinstance(value, tuple) else (value,)


def run_forward(forward, arrays, reseed=None):
    """``forward(*arrays)`` as a tuple, after ``backend.manual_seed(reseed)`` if set (the same dropout mask each
    time). A check calls a layer alone, sometimes twice before the two backwards (the cache rule) and with a
    learner's backward that may leave a cache behind: the checks judge the caches themselves, so the forward
    runs inside :func:`minitf.module.stacked_forwards`."""
    if reseed is not None:
        backend.manual_seed(reseed)
    with stacked_forwards():
        return as_tuple(forward(*arrays))


def upstream_gradients(outputs, seed):
    """The random upstream gradient G (one array per output, N(0, 1)) that makes
    ``L = sum(forward(inputs) * G)`` a scalar: a stream of its own, so that G does not
    repeat the values the inputs were drawn with."""
    rng = backend.host_rng([seed, 0x5EED])
    return tuple(backend.asarray(rng.standard_normal(o.shape), dtype=o.dtype) for o in outputs)


def sum_gradient(forward, inputs, params, name, h=1e-6, reseed=None):
    """d sum(forward(inputs)) / d(the array ``name``: an input, else a parameter) by central differences: the
    gradient a backward gives for dy = 1 (every entry of the upstream gradient one), which is what a backward
    that never applies dy returns, whatever the layer."""
    arrays = list(inputs.values())
    target = inputs[name] if name in inputs else dict(params)[name].data

    def loss():
        if reseed is not None:
            backend.manual_seed(reseed)
        with no_grad():
            return sum(float(o.sum()) for o in as_tuple(forward(*arrays)))

    return numerical_gradient(loss, target, h)


def compare_gradients(forward, backward, inputs, params=(), seed=0, h=1e-6, reseed=None):
    """Run ``forward(*inputs)`` and ``backward(G)`` once, then every numerical gradient.

    forward: callable on the ``inputs`` arrays; returns an array or a tuple of arrays.
    backward: callable on the upstream gradient(s); returns dL/d(input) for each
        input (an array, None for a non-differentiable input, or a tuple of these).
    inputs: dict name -> array; params: dict name -> Parameter.
    reseed: if set, ``backend.manual_seed(reseed)`` before every forward, so
        that dropout draws the same mask each time.

    Returns a list of ``(name, analytic, numeric, relative_error)``. Inputs without a
    returned gradient are left out here; :func:`minitf.gradcheck.protocol.protocol_problems`
    reports them.
    """
    names, arrays = list(inputs), list(inputs.values())
    params = dict(params)

    outputs = run_forward(forward, arrays, reseed)
    G = upstream_gradients(outputs, seed)
    for p in params.values():
        p.grad[...] = 0
    input_grads = as_tuple(backward(tuple(g.copy() for g in G) if len(G) > 1 else G[0].copy()))

    def loss():
        with no_grad():
            return sum(float((o * g).sum()) for o, g in zip(run_forward(forward, arrays, reseed), G))

    report = []
    for name, array, analytic in zip(names, arrays, input_grads):
        if analytic is None or getattr(analytic, "shape", None) != array.shape:
            continue
        numeric = numerical_gradient(loss, array, h)
        report.append((name, analytic, numeric, relative_error(analytic, numeric)))
    for name, p in params.items():
        analytic = p.grad.copy()
        numeric = numerical_gradient(loss, p.data, h)
        report.append((name, analytic, numeric, relative_error(analytic, numeric)))
    return report
