"""The hand-checkable trace (minitf/trace.py, docs/trace.md).

1. every gradient the trace records agrees with central differences: the gradient of
   every parameter, and the upstream gradient dy of every module call (found by
   perturbing that one call's output);
2. the numbers it prints for the hand-checked steps (LayerNorm, the 2x2 attention of
   one head, the loss and its gradient) match a computation from the printed inputs
   with plain NumPy, written here from the formulas and not from minitf;
3. the wrappers are gone afterwards.
"""
import contextlib
import io
import re

import numpy as np
import pytest

from minitf import backend, trace
from minitf.backend import default_dtype
from minitf.module import FlatBuffers

H = 1e-6


@pytest.fixture(scope="module")
def traced():
    with default_dtype("float64"):
        tracer, model, loss = trace.run()
    return tracer, model, loss


def loss_of(model):
    """The example's loss, recomputed from scratch (no tracer)."""
    import minitf
    loss_fn = minitf.LabelSmoothedCrossEntropy(smoothing=trace.SMOOTHING, ignore_index=trace.CONFIG["pad_id"])
    with minitf.no_grad():
        return loss_fn(model(np.array(trace.SRC), np.array(trace.TGT_IN)), np.array(trace.TGT_OUT))


def test_parameter_gradients_agree_with_finite_differences(traced):
    _, model, _ = traced
    with default_dtype("float64"):
        flat = FlatBuffers.flatten(model.parameters())  # every parameter becomes a view of this buffer
        theta = flat.data
        analytic = backend.to_numpy(flat.grad).copy()
        numeric = np.zeros_like(analytic)
        for i in range(theta.size):
            old = float(theta[i])
            theta[i] = old + H
            plus = loss_of(model)
            theta[i] = old - H
            minus = loss_of(model)
            theta[i] = old
            numeric[i] = (plus - minus) / (2 * H)
    assert np.abs(analytic).max() > 1e-3               # not trivially zero
    assert np.abs(analytic - numeric).max() <= 1e-6 * np.abs(numeric).max() + 1e-8


def perturbed_loss(model, name, call, index, delta):
    """The loss with ``delta`` added to entry ``index`` of the output of call ``call``
    of module ``name`` (a wrapper on that instance's forward, removed afterwards)."""
    module = dict(trace.named_modules(model))[name]
    original, count = module.forward, [0]

    def forward(*args, **kwargs):
        y = original(*args, **kwargs)
        if count[0] == call:
            y = y.copy()
            y[index] += delta
        count[0] += 1
        return y

    module.forward = forward
    try:
        return loss_of(model)
    finally:
        del module.forward


def test_every_recorded_upstream_gradient_agrees_with_finite_differences(traced):
    tracer, model, _ = traced
    modules = dict(trace.named_modules(model))
    checked = 0
    with default_dtype("float64"):
        for record in tracer.records:
            if record.kind != "forward" or record.name not in modules or record.name == "" \
                    or record.partner is None or len(record.outputs) != 1:
                continue
            backward = tracer.records[record.partner]
            dy = [value for name, value in backward.inputs if name not in ("self",)][0]
            y = record.outputs[0][1]
            assert dy.shape == y.shape, record.name
            numeric = np.zeros_like(dy)
            for index in np.ndindex(*y.shape):
                numeric[index] = (perturbed_loss(model, record.name, record.call, index, H)
                                  - perturbed_loss(model, record.name, record.call, index, -H)) / (2 * H)
            assert np.abs(dy - numeric).max() <= 1e-6 * np.abs(numeric).max() + 1e-8, record.name
            checked += 1
    assert checked >= 25          # embeddings (twice), every norm, dropout, linear, attention, ...


def test_records_cover_every_module_and_the_wrappers_are_removed(traced):
    tracer, model, _ = traced
    called = {r.name for r in tracer.records}
    for name, module in trace.named_modules(model):
        if type(module).__name__ not in ("ModuleList", "Residual", "SublayerConnection"):
            assert name in called, name
        assert "forward" not in vars(module) and "backward" not in vars(module)
    import minitf.attention
    assert minitf.attention.scaled_dot_product_attention.__module__ == "minitf.attention"
    assert any(r.name.endswith("/attention") for r in tracer.records)


# --------------------------------------------------------------------------- #
# The printed numbers of docs/trace.md, recomputed from the printed inputs
# --------------------------------------------------------------------------- #
ARRAY_LINE = re.compile(r"^\s*(?:-> )?(\w+)\s+\(([\d, ]*)\)\s+(.*)$")


def printed(*argv):
    """Run ``python -m minitf.trace ARGV`` in-process; {name: array} of what it prints for
    the first record (forward) and the one after it (backward), names prefixed f_/b_."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        trace.main(list(argv) + ["--no-params"])
    arrays, kind, current = {}, None, None
    for line in out.getvalue().splitlines():
        head = line.strip().split(" ")[0]
        if head in ("forward", "backward"):
            kind = head[0]
            continue
        match = ARRAY_LINE.match(line)
        if match and kind:
            name, shape = f"{kind}_{match.group(1)}", tuple(int(s) for s in match.group(2).split(",") if s.strip())
            current = [name, shape, match.group(3)]
            arrays.setdefault(name, current)
        elif current and line.strip():
            current[2] += " " + line.strip()
    result = {}
    for name, shape, text in arrays.values():
        numbers = re.findall(r"-?\d+\.\d+|-?\d+(?!\.)|True|False", text)
        if numbers and numbers[0] in ("True", "False"):
            continue
        values = np.array([float(n) for n in numbers])
        result[name] = values.reshape(shape) if shape else values[0]
    return result


def test_printed_layernorm_matches_the_formula():
    a = printed("--first", "LayerNorm")
    x = a["f_x"]
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + 1e-5)             # gamma = 1, beta = 0 in the trace
    np.testing.assert_allclose(a["f_y"], y, atol=2e-4)
    # backward with gamma = 1: dx = r (dy - mean(dy) - xhat mean(dy xhat))
    dy, r = a["b_dy"], 1 / np.sqrt(var + 1e-5)
    dx = r * (dy - dy.mean(-1, keepdims=True) - y * (dy * y).mean(-1, keepdims=True))
    np.testing.assert_allclose(a["b_dx"], dx, atol=3e-4)


def test_printed_attention_of_one_head_matches_the_formula():
    a = printed("--first", "MultiHeadAttention")
    Q, K, U = a["f_Q"][0, 0], a["f_K"][0, 0], a["f_U"][0, 0]    # batch 0, head 0: 2x2 each
    A = Q @ K.T / np.sqrt(2)
    P = np.exp(A) / np.exp(A).sum(-1, keepdims=True)
    np.testing.assert_allclose(a["f_P"][0, 0], P, atol=3e-4)
    np.testing.assert_allclose(a["f_O"][0, 0], P @ U, atol=3e-4)


def test_printed_loss_and_its_gradient_match_the_formula():
    a = printed("--first", "LabelSmoothedCrossEntropy")
    z, target = a["f_logits"][0], a["f_target"][0].astype(int)
    V, eps = z.shape[-1], trace.SMOOTHING
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    q = np.full_like(p, eps / V)
    q[np.arange(len(target)), target] += 1 - eps
    loss = -(q * np.log(p)).sum(-1).mean()           # two tokens, no padding
    assert abs(a["f_y"] - loss) < 1e-5
    np.testing.assert_allclose(a["b_dlogits"][0], (p - q) / len(target), atol=2e-4)
