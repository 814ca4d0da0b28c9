"""The hand-checkable trace (minitf/trace.py, docs/trace.md).

1. every gradient the trace records agrees with central differences: the gradient of
   every parameter, and the upstream gradient dy of every module call (found by
   perturbing that one call's output);
2. the numbers it prints for the hand-checked steps (LayerNorm, the 2x2 attention of
   one head, the loss and its gradient) match a computation from the printed inputs
   with plain NumPy, written here from the formulas and not from minitf;
3. the wrappers are gone afterwards;
4. the views of minitf.study.walk: the LayerNorm variance term is the derivative of the loss
   along the row (scale invariance where docs/trace.md says so), the walk's file:line
   references point at the lines it prints and its tied-weight sum adds up, and the
   gradient norms of --grad-norms agree with central differences;
5. ``--checkpoint PATH`` (a translation run, a GPT run, a Llama folder made by transformers): the trace names
   every module that ran, and its loss and parameter gradients are those of a plain forward and backward of the
   loaded model on the same ids; a big array prints as its corners; its refusals are one line.
"""
import contextlib
import io
import json
import pathlib
import re

import numpy as np
import pytest

from minitf import backend, kinds, trace
from minitf.study import walk
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


def analytic_and_numeric(model, loss):
    """(the gradient the traced backward left in every parameter, float64 central differences of
    ``loss(model)`` with step H), each flattened in the model's parameter order."""
    with default_dtype("float64"):
        flat = FlatBuffers.flatten(model.parameters())  # every parameter becomes a view of this buffer
        theta = flat.data
        analytic = backend.to_numpy(flat.grad).copy()
        numeric = np.zeros_like(analytic)
        for i in range(theta.size):
            old = float(theta[i])
            theta[i] = old + H
            plus = loss(model)
            theta[i] = old - H
            minus = loss(model)
            theta[i] = old
            numeric[i] = (plus - minus) / (2 * H)
    return analytic, numeric


def test_parameter_gradients_agree_with_finite_differences(traced):
    _, model, _ = traced
    analytic, numeric = analytic_and_numeric(model, loss_of)
    assert np.abs(analytic).max() > 1e-3               # not trivially zero
    assert np.abs(analytic - numeric).max() <= 1e-6 * np.abs(numeric).max() + 1e-8


def perturbed_loss(model, name, call, index, delta, loss=loss_of):
    """The loss (``loss(model)``) with ``delta`` added to entry ``index`` of the output of call ``call``
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
        return loss(model)
    finally:
        del module.forward


def test_every_recorded_upstream_gradient_agrees_with_finite_differences(traced):
    assert upstream_gradients_checked(*traced[:2], loss_of) >= 25  # embeddings (twice), every norm, dropout, ...


def upstream_gradients_checked(tracer, model, loss):
    """How many module calls of ``tracer``'s records have the upstream gradient dy (their backward's input) that
    central differences of ``loss(model)`` give, found by perturbing that one call's output (asserted)."""
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
                numeric[index] = (perturbed_loss(model, record.name, record.call, index, H, loss)
                                  - perturbed_loss(model, record.name, record.call, index, -H, loss)) / (2 * H)
            assert np.abs(dy - numeric).max() <= 1e-6 * np.abs(numeric).max() + 1e-8, record.name
            checked += 1
    return checked


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
    a = printed("--only", "decoder.layers.0.ff_block.norm")     # the norm docs/trace.md works through
    x = a["f_x"]
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + 1e-5)             # gamma = 1, beta = 0 in the trace
    np.testing.assert_allclose(a["f_y"], y, atol=2e-4)
    # backward with gamma = 1: dx = r (dy - mean(dy) - xhat mean(dy xhat))
    dy, r = a["b_dy"], 1 / np.sqrt(var + 1e-5)
    variance_term = (dy * y).mean(-1, keepdims=True)
    dx = r * (dy - dy.mean(-1, keepdims=True) - y * variance_term)
    np.testing.assert_allclose(a["b_dx"], dx, atol=3e-4)
    assert np.abs(variance_term).max() > 1e-2       # the example shows all three terms at work
    assert np.abs(a["b_dx"] - r * (dy - dy.mean(-1, keepdims=True))).max() > 1e-2


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


# --------------------------------------------------------------------------- #
# minitf.study.walk: --norm-terms, --walk, --grad-norms
# --------------------------------------------------------------------------- #
def scaled_loss(model, name, row, factor):
    """The loss with row ``row`` (batch 0) of the output of module ``name`` multiplied by ``factor``."""
    module = dict(trace.named_modules(model))[name]
    original = module.forward

    def forward(*args, **kwargs):
        y = original(*args, **kwargs).copy()
        y[0, row] *= factor
        return y

    module.forward = forward
    try:
        return loss_of(model)
    finally:
        del module.forward


SCALE_INVARIANT = {"encoder.layers.0.attn_block.norm", "decoder.layers.0.cross_attn_block.norm"}


def test_layernorm_variance_term_is_the_derivative_along_the_row(traced):
    """D mean(dxhat * xhat) = d/dc L(c y_row) at c = 1, measured by scaling the row; it vanishes
    (to the epsilon of the next LayerNorm) exactly for the two norms that feed a zero-bias
    feed-forward block and then a LayerNorm, as docs/trace.md explains."""
    tracer, model, _ = traced
    D = trace.CONFIG["d_model"]
    small = set()
    with default_dtype("float64"):
        rows = walk.norm_terms(tracer)
        assert len(rows) == 10                          # 5 norms x 2 positions
        for name, row, _, variance_term in rows:
            numeric = (scaled_loss(model, name, row, 1 + H) - scaled_loss(model, name, row, 1 - H)) / (2 * H)
            assert abs(D * variance_term - numeric) <= 1e-6, (name, row)
            if abs(numeric) < 1e-5:
                small.add(name)
            else:
                assert abs(numeric) > 1e-3, (name, row)  # clearly apart from the invariant ones
    assert small == SCALE_INVARIANT


def printed_places(text):
    """The (file, line, code) places a printed walk names, each checked: the file's line there starts with the code."""
    root = pathlib.Path(__file__).resolve().parents[1]
    places = re.findall(r"^   (minitf/\S+\.py):(\d+)  (.+)$", text, re.M)
    for path, number, code in places:
        line = (root / path).read_text(encoding="utf-8").splitlines()[int(number) - 1]
        assert line.strip().startswith(code), (path, number, code, line)
    return places


def walk_output(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert trace.main(["--walk", *argv]) == 0
    return out.getvalue()


def test_walk_points_at_the_lines_it_prints_and_its_tied_sum_adds_up(traced):
    _, model, _ = traced
    text = walk_output()
    assert len(printed_places(text)) >= 20
    # tied uses 1, 2, 3 and their sum: row 4 of each, as printed
    rows = [np.array([float(v) for v in re.findall(r"-?\d+\.\d+", row)])
            for row in re.findall(r"^   \(5, 4\)\s+norm \S+\s+row (\[.*\])$", text, re.M)]
    assert len(rows) == 4
    np.testing.assert_allclose(rows[0] + rows[1] + rows[2], rows[3], atol=3e-4)
    np.testing.assert_allclose(rows[3], backend.to_numpy(model.src_embed.weight.grad)[4], atol=6e-5)
    steps = re.findall(r"^\s*(\d+) ", text, re.M)
    assert [int(n) for n in steps] == list(range(1, len(steps) + 1))


def test_source_line_needs_exactly_one_match():
    from minitf.layers import LayerNorm
    where, code = walk.source_line(LayerNorm.backward_rows, "return rstd * (dxhat")
    assert where.startswith("minitf/layers.py:") and code.startswith("return rstd")
    with pytest.raises(LookupError, match="0 lines"):
        walk.source_line(LayerNorm.backward_rows, "no such code")
    with pytest.raises(LookupError, match="lines contain"):
        walk.source_line(LayerNorm.backward_rows, "dxhat")


WALKED_MODELS = {  # the shapes of model the trace's examples do not have, each traced on its example's ids
    "transformer pre-LN": dict(pre_norm=True),
    "transformer untied": dict(share_embeddings=False),
    **{f"gpt {activation}": dict(activation=activation) for activation in ("relu", "gelu", "gelu_tanh", "silu")},
    "gpt post-LN, sinusoidal, untied": dict(pre_norm=False, positions="sinusoidal", tie_embeddings=False),
}


@pytest.mark.parametrize("name", list(WALKED_MODELS))
def test_every_step_of_the_walk_names_its_line_for_every_shape_of_model(name):
    """The one walk (the kind's, Kind.walk: trace --walk prints it, the inspection page draws it) names the
    line of minitf that computes each step for every layout, activation and kind of positions, not only for the
    trace's examples: each names exactly one line, and only a tied matrix's sum of uses names none."""
    import minitf
    root = pathlib.Path(__file__).resolve().parents[1]
    with default_dtype("float64"):
        if name.startswith("gpt"):
            tracer, model, _ = trace.run_gpt(minitf.GPT(**dict(trace.GPT_CONFIG, **WALKED_MODELS[name])))
        else:
            tracer, model, _ = trace.run(minitf.Transformer(**dict(trace.CONFIG, **WALKED_MODELS[name])))
    kind = kinds.get("gpt" if name.startswith("gpt") else "transformer")
    steps = [s for s in kind.walk(tracer, model).steps if not isinstance(s, str)]
    assert len(steps) >= 12
    for step in steps:
        if step.code is not None:
            path, number = walk.source_line(*step.code)[0].split(":")
            line = (root / path).read_text(encoding="utf-8").splitlines()[int(number) - 1]
            assert line.strip().startswith(walk.source_line(*step.code)[1]), (step.label, line)
    tied = "untied" not in name
    assert [s.label for s in steps if s.code is None] == ([steps[-1].label] if tied else []), name
    assert all("= use 1 + use 2" in s.label for s in steps if s.code is None)


def test_the_walk_is_the_kinds_and_a_kind_without_one_says_so(traced):
    """trace and the page ask the model's kind for its walk (no table of model classes); a kind that has none is
    one line naming it."""
    from minitf.training.kind import Kind

    class Bare(Kind):
        name = "bare"

    with pytest.raises(NotImplementedError, match="no backward walk for a --model bare model"):
        Bare().walk(traced[0], traced[1])
    assert not hasattr(walk, "WALKS") and not hasattr(walk, "backward_walk")


# --------------------------------------------------------------------------- #
# The Llama's walk (python -m minitf.trace --model llama --walk; minitf.llama.study)
# --------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def traced_llama():
    with default_dtype("float64"):
        return kinds.get("llama").trace_example().run()


def llama_loss(model):
    """The Llama example's next-token loss, recomputed from scratch (no tracer)."""
    import minitf
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    with minitf.no_grad():
        return loss_fn(model(np.array(trace.GPT_IDS)), np.array(trace.GPT_NEXT))


def test_the_llama_walk_is_made_of_the_real_gradients(traced_llama):
    """Every upstream gradient the Llama example records (each RMSNorm, projection, SiLU, the rotary embedding's two
    calls, each block) and every parameter's gradient agree with central differences; the walk's arrays are those
    records: dK is the rotary's first backward's dy (k turned last) in attention's layout, dk and dq its outputs, the sum of tied uses is
    the embedding's gradient."""
    tracer, model, _ = traced_llama
    assert upstream_gradients_checked(tracer, model, llama_loss) >= 18  # every module call but the model
    analytic, numeric = analytic_and_numeric(model, llama_loss)
    assert np.abs(analytic).max() > 1e-3 and np.abs(analytic - numeric).max() <= 1e-6 * np.abs(numeric).max() + 1e-8
    labelled = [s for s in kinds.get("llama").walk(tracer, model).steps if not isinstance(s, str)]
    steps = {start: s for s in labelled for start in [s.label[:len(start)] for start in (
        "layers.0.self_attn: dK = dK_rep", "layers.0.self_attn.rotary: dk = dK turne",
        "layers.0.self_attn.rotary: dq = dQ turne", "embed_tokens.weight.grad = use 1 + ", "lm_head: W.grad += dl",
        "embed_tokens: W.grad[ids] ")]}
    rotary = [r for r in tracer.records if r.name == "layers.0.self_attn.rotary" and r.kind == "backward"]
    assert [r.call for r in rotary] == [0, 1]
    dK = dict(rotary[0].inputs)["dy"]  # (B, T, Hkv, dk); the walk shows it as its line makes it, (B, Hkv, T, dk)
    assert dK.shape == (1, 4, 2, 2)
    assert np.array_equal(steps["layers.0.self_attn: dK = dK_rep"].array, dK.transpose(0, 2, 1, 3))
    assert np.array_equal(steps["layers.0.self_attn.rotary: dk = dK turne"].array, dict(rotary[0].outputs)["dx"])
    assert np.array_equal(steps["layers.0.self_attn.rotary: dq = dQ turne"].array, dict(rotary[1].outputs)["dx"])
    total = steps["embed_tokens.weight.grad = use 1 + "].array
    np.testing.assert_allclose(total, backend.to_numpy(model.embed_tokens.weight.grad), rtol=1e-12)
    np.testing.assert_allclose(steps["lm_head: W.grad += dl"].array + steps["embed_tokens: W.grad[ids] "].array,
                               total, rtol=1e-12)


def test_the_llama_walks_dk_and_dv_steps_are_the_arrays_their_lines_make():
    """Steps 14 and 17 cite GroupedQueryAttention.backward's lines dK = dK_rep.reshape(...).sum(axis=2) and
    dU = dU_rep.reshape(...).sum(axis=2): the walk shows those very arrays, in their (B, Hkv, T, dk) layout (the
    locals of the backward, caught as it returns), not the rotary's or v_proj's views of them."""
    import sys

    from minitf.attention import GroupedQueryAttention
    from minitf.llama.study import build_trace_model
    from minitf.study.tracer import run_next_token
    caught = {}

    def catch(frame, event, arg):
        if event == "return" and frame.f_code is GroupedQueryAttention.backward.__code__:
            caught.update({k: backend.to_numpy(frame.f_locals[k]).copy() for k in ("dK", "dU")})

    with default_dtype("float64"):
        sys.setprofile(catch)
        try:
            tracer, model, _ = run_next_token(build_trace_model())
        finally:
            sys.setprofile(None)
    steps = {s.label.split(" = ")[0]: s for s in kinds.get("llama").walk(tracer, model).steps if not isinstance(s, str)}
    assert caught["dK"].shape == caught["dU"].shape == (1, 2, 4, 2)
    for label, name in (("layers.0.self_attn: dK", "dK"), ("layers.0.self_attn: dU", "dU")):
        assert label in steps, sorted(steps)
        assert steps[label].array.shape == caught[name].shape, (label, steps[label].array.shape)
        np.testing.assert_allclose(steps[label].array, caught[name], rtol=1e-12, atol=1e-15)


LLAMA_SHAPES = {"tied, 4 query heads over 2": {}, "untied, multi-head (G = 1)": dict(tie_word_embeddings=False,
                                                                                        num_kv_heads=4),
                "multi-query (1 key/value head), 2 blocks": dict(num_kv_heads=1, num_layers=2)}


@pytest.mark.parametrize("name", list(LLAMA_SHAPES))
def test_every_step_of_the_llama_walk_names_its_line(name):
    """Each step names the one line of minitf that computes it (the file and line as the source is now), for
    grouped, multi-head and multi-query attention, tied and untied; only a tied matrix's sum names none."""
    from minitf.llama.study import build_trace_model
    from minitf.study.tracer import run_next_token
    root = pathlib.Path(__file__).resolve().parents[1]
    with default_dtype("float64"):
        tracer, model, _ = run_next_token(build_trace_model(**LLAMA_SHAPES[name]))
    steps = [s for s in kinds.get("llama").walk(tracer, model).steps if not isinstance(s, str)]
    assert len(steps) == 4 + 16 * model.config.num_layers + 1 + model.config.tie_word_embeddings
    for step in steps:
        if step.code is not None:
            path, number = walk.source_line(*step.code)[0].split(":")
            line = (root / path).read_text(encoding="utf-8").splitlines()[int(number) - 1]
            assert line.strip().startswith(walk.source_line(*step.code)[1]), (step.label, line)
    assert [s.label for s in steps if s.code is None] == ([steps[-1].label] if "untied" not in name else [])


def test_trace_prints_the_llama_walk_with_its_lines():
    text = walk_output("--model", "llama")
    assert len(printed_places(text)) == 21
    assert "4 query heads over 2 key/value heads" in text and "rotary" in text


def test_the_trace_views_take_no_other_option(capsys):
    with pytest.raises(SystemExit) as error:
        trace.main(["--walk", "--no-params"])
    assert error.value.code == 2 and "take no other option" in capsys.readouterr().err


SMALL = dict(src_vocab_size=20, tgt_vocab_size=20, d_model=8, num_heads=2, num_encoder_layers=2,
             num_decoder_layers=2, d_ff=16, dropout=0.0, share_embeddings=True, pad_id=0)


def stack_loss(model, batch, point, delta):
    """The loss of gradient_norms' batch with ``delta`` added to ``point``: the output of a
    stack ("decoder out") or the input of a layer ("encoder.layers.1 in")."""
    import minitf
    name, where = point.split(" ")
    module = dict(trace.named_modules(model))[name]
    original = module.forward

    def forward(x, *args, **kwargs):
        if where == "in":
            return original(x + delta, *args, **kwargs)
        return original(x, *args, **kwargs) + delta

    src, tgt = batch
    loss_fn = minitf.LabelSmoothedCrossEntropy(smoothing=trace.SMOOTHING, ignore_index=0)
    module.forward = forward
    try:
        with minitf.no_grad():
            return loss_fn(model(src[:, 1:], tgt[:, :-1]), tgt[:, 1:])
    finally:
        del module.forward


@pytest.mark.parametrize("pre_norm", [False, True])
def test_gradient_norms_agree_with_finite_differences(pre_norm):
    import minitf
    batch = (2, 3)
    points, blocks = walk.gradient_norms(pre_norm, SMALL, batch, seed=1)
    assert list(points) == ["decoder out", "decoder.layers.1 in", "decoder.layers.0 in",
                            "encoder out", "encoder.layers.1 in", "encoder.layers.0 in"]
    assert len(blocks) == (2 if pre_norm else 3 * 2 + 2 * 2)  # pre-LN: the two final LayerNorms
    with default_dtype("float64"):
        backend.manual_seed(1)                          # the same model and batch as gradient_norms
        model = minitf.Transformer(**dict(SMALL, pre_norm=pre_norm))
        rng = np.random.default_rng(1)
        data = tuple(rng.integers(2, SMALL["src_vocab_size"], (batch[0], batch[1] + 1)) for _ in range(2))
        shape = (batch[0], batch[1], SMALL["d_model"])
        for point, norm in points.items():
            numeric = np.zeros(shape)
            for index in np.ndindex(*shape):
                delta = np.zeros(shape)
                delta[index] = H
                numeric[index] = (stack_loss(model, data, point, delta) - stack_loss(model, data, point, -delta)) / (2 * H)
            assert abs(norm - np.linalg.norm(numeric)) <= 1e-6 * norm, point


# --------------------------------------------------------------------------- #
# The GPT example (--model gpt, docs/gpt.md)
# --------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def traced_gpt():
    with default_dtype("float64"):
        tracer, model, loss = trace.run_gpt()
    return tracer, model, loss


def gpt_loss_of(model):
    import minitf
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    with minitf.no_grad():
        return loss_fn(model(np.array(trace.GPT_IDS)), np.array(trace.GPT_NEXT))


def test_gpt_trace_parameter_gradients_agree_with_finite_differences(traced_gpt):
    tracer, model, loss = traced_gpt
    assert type(model).__name__ == "GPT" and model.config.pre_norm and model.config.positions == "learned"
    assert loss == pytest.approx(gpt_loss_of(model), abs=1e-12)
    analytic, numeric = analytic_and_numeric(model, gpt_loss_of)
    assert np.abs(analytic).max() > 1e-3
    assert np.abs(analytic - numeric).max() <= 1e-6 * np.abs(numeric).max() + 1e-8
    called = {r.name for r in tracer.records}
    for name, module in trace.named_modules(model):
        if type(module).__name__ not in ("ModuleList", "SublayerConnection"):
            assert name in called, name
        assert "forward" not in vars(module) and "backward" not in vars(module)


def test_gpt_walk_points_at_its_lines_and_its_scatter_adds_add_up(traced_gpt):
    tracer, model, _ = traced_gpt
    text = walk_output("--model", "gpt")
    assert len(printed_places(text)) >= 14
    steps = re.findall(r"^\s*(\d+) ", text, re.M)
    assert [int(n) for n in steps] == list(range(1, len(steps) + 1))
    assert "GELU" in text and "final_norm" in text and "cross" not in text.replace("no cross-attention", "")

    def backward_of(name):
        record = next(r for r in tracer.records if r.kind == "backward" and r.name == name)
        return dict(record.inputs + record.outputs + record.grads)

    # the shift: the last position has no next token, so its dlogits row (and, by causality, its
    # row of every gradient below) is 0; the others are (softmax - onehot(next)) / 3
    dlogits = backward_of("loss")["dlogits"][0]
    z = dict(next(r for r in tracer.records if r.kind == "forward" and r.name == "").outputs)["y"][0]
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    expected = (p - np.eye(5)[[*trace.GPT_NEXT[0][:-1], 0]]) / 3
    expected[-1] = 0
    np.testing.assert_allclose(dlogits, expected, atol=1e-12)
    dx = backward_of("positional")["dx"][0]
    assert not dx[-1].any() and np.abs(dx[:-1]).min(axis=-1).max() > 0
    # learned positions: P.grad[0:L] = dy summed over the batch (B = 1: dy itself); the embedding's
    # add.at sums the rows where an id repeats (token 3 at positions 0 and 2)
    np.testing.assert_allclose(backward_of("positional")["weight"], dx, atol=1e-15)
    embedding_use = backward_of("embed")["weight"]
    np.testing.assert_allclose(embedding_use[3], dx[0] + dx[2], atol=1e-15)
    np.testing.assert_allclose(embedding_use[trace.GPT_IDS[0][3]], dx[3], atol=1e-15)
    # tied: the generator's use plus the embedding's is the parameter's gradient, as printed
    total = backward_of("generator")["weight"] + embedding_use
    np.testing.assert_allclose(total, backend.to_numpy(model.embed.weight.grad), atol=1e-15)
    rows = [np.array([float(v) for v in re.findall(r"-?\d+\.\d+", row)])
            for row in re.findall(r"^   \(5, 4\)\s+norm \S+\s+row (\[.*\])$", text, re.M)]
    assert len(rows) == 3
    np.testing.assert_allclose(rows[0] + rows[1], rows[2], atol=3e-4)


def test_gpt_trace_prints_every_call_with_its_shapes_and_refuses_grad_norms(capsys):
    assert trace.main(["--model", "gpt", "--no-params"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("trace: GPT")
    for call in ["forward embed", "forward positional", "forward decoder.layers.0.feed_forward.activation",
                 "backward decoder.final_norm", "backward loss", "backward positional"]:
        assert re.search(rf"^\s*{re.escape(call)}$", out, re.M), call
    assert re.search(r"-> dlogits\s+\(1, 4, 5\)", out) and "cross_attn" not in out
    with pytest.raises(SystemExit) as error:
        trace.main(["--model", "gpt", "--grad-norms"])
    assert error.value.code == 2 and "takes no --model" in capsys.readouterr().err


# --------------------------------------------------------------------------- #
# --checkpoint PATH: any run or folder the loader reads, one short text through it
# --------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def translation_run(tmp_path_factory):
    from tests.runs import QUIET, TINY, make_corpus, train
    folder = tmp_path_factory.mktemp("nmt")
    assert train(make_corpus(folder) + TINY + QUIET + ["--max-steps", "2", "--out", folder / "run"]) == 0
    return folder / "run"


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    from tests.runs import train
    from tests.test_lm_train import TINY_GPT, make_text
    folder = tmp_path_factory.mktemp("gpt")
    assert train(make_text(folder) + TINY_GPT + ["--max-steps", "2", "--out", folder / "run"]) == 0
    return folder / "run"


def direct_gradients(path, text):
    """(loss, {name: gradient}, ids) of one plain forward and backward (no tracer) of the model at ``path``, its
    weights cast to float64 here, on ``text`` cut as trace --help says: a translation model's source is its first 7
    tokens and </s>, its target the same text's, after the decoder's start token; a language model's ids are the
    first 8 tokens, each scored on the next."""
    import minitf
    loaded = minitf.load(path)
    model, tokenizer = loaded.model, loaded.tokenizer
    with default_dtype("float64"):
        for p in model.parameters():
            p.data, p.grad = p.data.astype(np.float64), np.zeros(p.data.shape)
        model.zero_grad()
        if hasattr(model, "encoder"):
            config = model.config
            start = config.decoder_start_id if config.decoder_start_id is not None else tokenizer.bos_id
            end = config.eos_id if config.eos_id is not None else tokenizer.eos_id
            src = list(tokenizer.encode([text])[0][:7]) + [end]
            tgt = list(getattr(tokenizer, "encode_target", tokenizer.encode)([text])[0][:7])
            loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=model.pad_id)
            loss = loss_fn(model(np.array([src]), np.array([[start] + tgt])), np.array([tgt + [end]]))
            ids = (src, [start] + tgt, tgt + [end])
        else:
            ids = list(tokenizer.encode([text])[0][:8])
            loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
            loss = loss_fn(model(np.array([ids])), np.array([ids[1:] + [-1]]))
            ids = (ids,)
        model.backward(loss_fn.backward())
    return float(loss), {n: backend.to_numpy(p.grad) for n, p in model.named_parameters()}, ids


def printed_parameters(out):
    """{name: (value, grad)} of the parameters the trace printed whole (those of at most 64 entries)."""
    found = {}
    for name, value, grad in re.findall(r"^  (\S+)\n    value +\(\d+,\) +\[([^.\]]*\.[^\]]*)\]\n    grad +\(\d+,\) +"
                                        r"\[([^\]]*)\]$", out, re.M):
        if "..." not in value + grad:
            found[name] = tuple(np.array([float(v) for v in part.split()]) for part in (value, grad))
    return found


def check_traced(path, text, capsys, start):
    """trace --checkpoint PATH --text TEXT: it opens with the model, names every module that ran, and its loss and
    every parameter gradient are those of a plain forward and backward of the loaded model on the same ids."""
    assert trace.main(["--checkpoint", str(path), "--text", text]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"trace: {start}") and f"from {path}, float64" in out
    loss, grads, ids = direct_gradients(path, text)
    for sequence in ids:
        assert str([sequence]) in out.splitlines()[2]
    assert float(re.search(r"; loss (\S+)$", out.splitlines()[2]).group(1)) == pytest.approx(loss, abs=1e-6)
    example = trace.loaded_example(path, text)
    with default_dtype("float64"):
        tracer, model, traced_loss = example.run()
    assert float(traced_loss) == pytest.approx(loss, rel=1e-12)
    traced = dict(model.named_parameters())
    assert set(traced) == set(grads)
    for name, grad in grads.items():
        assert traced[name].data.dtype == np.float64
        np.testing.assert_allclose(backend.to_numpy(traced[name].grad), grad, rtol=1e-10, atol=1e-14, err_msg=name)
    ran = {r.name for r in tracer.records if r.kind == "forward" and "/" not in r.name}
    for name in ran - {""}:
        assert re.search(rf"^\s*forward {re.escape(name)}(  \(call 1 of \d+\))?$", out, re.M), name
        assert re.search(rf"^\s*backward {re.escape(name)}(  \(call \d+ of \d+.*\))?$", out, re.M), name
    shown = printed_parameters(out)
    assert shown, "no parameter printed whole"
    for name, (_, grad) in shown.items():
        np.testing.assert_allclose(grad, grads[name], atol=6e-5, err_msg=name)   # 4 decimals
    assert all(len(line) < 400 for line in out.splitlines())
    return out


def test_trace_of_a_translation_run_is_its_plain_forward_and_backward(translation_run, capsys):
    out = check_traced(translation_run, "Der Hund sieht ein Haus und die Katze.", capsys, "Transformer")
    assert "forward encoder.layers.0.self_attn" in out and "backward decoder.layers.0.cross_attn" in out


@pytest.mark.extra("safetensors", "hf")
def test_trace_of_a_marian_folder_starts_its_decoder_as_the_folder_says(tmp_path, capsys):
    """A Marian folder (a random minitf model with Marian's options saved by save_pretrained): the decoder starts
    from its <pad> (decoder_start_id), both sides end with its </s> = 0, the target side is read by its target
    vocabulary."""
    from tests.marian_files import minitf_marian_folder
    folder = tmp_path / "opus-mt"
    V = minitf_marian_folder(folder).config.src_vocab_size
    out = check_traced(folder, "Der Hund läuft", capsys, "Transformer")
    ids = re.search(r"src_ids (\[\[.*?\]\]), tgt_in_ids (\[\[.*?\]\]), tgt_out (\[\[.*?\]\])", out).groups()
    src, tgt_in, tgt_out = (json.loads(sequence)[0] for sequence in ids)
    assert tgt_in[0] == V - 1 and src[-1] == tgt_out[-1] == 0 and tgt_in[1:] == tgt_out[:-1]


def test_trace_of_a_gpt_run_is_its_plain_forward_and_backward(gpt_run, capsys):
    check_traced(gpt_run, "the dog sees a bird in the red house", capsys, "GPT")
    assert trace.main(["--checkpoint", str(gpt_run), "--text", "the cat", "--first", "LayerNorm", "--no-params"]) == 0
    out = capsys.readouterr().out
    assert "forward decoder.layers.0.self_attn_block.norm" in out and "parameters and their" not in out
    # --norm-terms reads any tracer: one row per position (a character each) of every LayerNorm that ran (pre-LN: 2
    # per layer and the final one); the terms themselves are checked on the built-in example above
    assert trace.main(["--checkpoint", str(gpt_run), "--text", "the cat", "--norm-terms"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()[2:] if line.strip()]
    import minitf
    model = minitf.load(gpt_run).model
    norms = sum(type(m).__name__ == "LayerNorm" for _, m in trace.named_modules(model))
    assert norms == 2 * model.config.num_layers + 1 and len(rows) == norms * len("the cat")


def llama_folder(tmp_path_factory):
    from tests.test_llama import make_folder
    return make_folder(tmp_path_factory.mktemp("llama") / "folder")


@pytest.mark.extra("tokenizers", "hf")
@pytest.mark.extra("torch", "bench")
@pytest.mark.extra("transformers", "bench")
@pytest.mark.extra("safetensors", "bench")
def test_trace_of_a_llama_folder_is_its_plain_forward_and_backward(tmp_path_factory, tmp_path, capsys):
    folder = llama_folder(tmp_path_factory)
    out = check_traced(folder, "the cat sees a dog and the dog likes the cat", capsys, "Llama")
    assert "forward layers.0.self_attn.rotary" in out and "backward layers.1.mlp.act" in out
    broken = tmp_path / "broken"
    broken.mkdir()
    for file in folder.iterdir():
        (broken / file.name).write_bytes(file.read_bytes())
    (broken / "config.json").write_text("{not json", encoding="utf-8")
    assert trace.main(["--checkpoint", str(broken)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config.json is not readable JSON" in err[0]


def test_a_big_array_prints_as_its_corners():
    from minitf.study.tracer import format_array
    text = format_array("logits", np.arange(8 * 58101, dtype=np.float64).reshape(8, 58101) / 7, "  ")
    lines = text.splitlines()
    assert len(lines) == 7 and "..." in text and len(text) < 1000
    assert lines[0].split("[[")[1].split()[0] == "0.0000" and f"{(8 * 58101 - 1) / 7:.4f}" in lines[-1]


def test_checkpoint_refusals_are_one_line(gpt_run, tmp_path, capsys):
    for argv, words in ((["--checkpoint", str(gpt_run), "--model", "gpt"], "fixes the model"),
                        (["--checkpoint", str(gpt_run), "--walk"], "minitf.inspect"),
                        (["--checkpoint", str(gpt_run), "--grad-norms"], "minitf.inspect"),
                        (["--text", "the cat"], "--text goes with --checkpoint")):
        with pytest.raises(SystemExit) as error:
            trace.main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert error.value.code == 2 and len(err) == 1 and words in err[0], argv
    for argv, words in ((["--checkpoint", str(tmp_path / "missing")], "does not exist"),
                        (["--checkpoint", str(gpt_run), "--text", "t"], "at least 2"),
                        (["--checkpoint", str(gpt_run), "--text", ""], "gives no")):
        assert trace.main(argv) == 1, argv
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("minitf.trace: error: ") and words in err[0], argv
        assert captured.out == ""
