"""The exercises of ``python -m minitf.exercise``: each, filled with the library's own
backward (the solution), passes the checker; filled with a planted bug, it fails with a
message naming the wrong array and how it is wrong; an unfilled one says "not written yet".
The checker is minitf.gradcheck's (float64 central differences, rtol 1e-6, atol 1e-7)."""
import pytest

from minitf import exercise

#: exercise -> the library's backward, as a line of the filled file (the solution)
SOLUTIONS = {
    "linear": "backward = minitf.Linear.backward",
    "relu": "backward = minitf.ReLU.backward",
    "softmax": "backward = minitf.Softmax.backward",
    "layernorm": "backward = minitf.LayerNorm.backward",
    "attention": "def backward(self, dO):\n        return minitf.scaled_dot_product_attention_backward(dO, *self.saved_tensors())",
    "loss": "backward = minitf.LabelSmoothedCrossEntropy.backward",
    # the library's backward reads the padding row (Marian's); the exercise's Embedding has none
    "embedding": "padding_idx = None\n    backward = minitf.Embedding.backward",
    "gelu": "backward = minitf.GELU.backward",
    "silu": "backward = minitf.SiLU.backward",
    "rmsnorm": "backward = minitf.RMSNorm.backward",
    "rotary": "backward = minitf.RotaryEmbedding.backward",
    "swiglu": "backward = minitf.SwiGLU.backward",
    "gqa": """def backward(self, dO):
        Q, K_rep, U_rep, P = self.saved_tensors()
        dQ, dK_rep, dU_rep = minitf.scaled_dot_product_attention_backward(dO, Q, K_rep, U_rep, P)
        B, H, T, E = dK_rep.shape
        return dQ, dK_rep.reshape(B, H // self.group, self.group, T, E).sum(axis=2), \\
            dU_rep.reshape(B, H // self.group, self.group, T, E).sum(axis=2)""",
    # BERT's two (docs/bert.md): no core layer holds them, the derivation's result is the solution
    "tanh": """def backward(self, dy):
        x, y = self.saved_tensors()
        return dy * (1.0 - y * y)""",
    "masked_lm_loss": """def backward(self, dloss=1.0):
        saved = self.saved_tensors()
        onehot = xp.arange(saved.p.shape[-1]) == saved.safe_labels[..., None]
        return dloss * (saved.p - onehot) * saved.masked[..., None] / saved.count""",
    # the library's: RelativePositionBias.backward, after T5Stack.backward summed the layers (and T5Attention the batch)
    "relative_bias": """def backward(self, dy):
        enc, dec = self.saved_tensors()
        d = dy.sum(axis=(1, 2))
        H = d.shape[1]
        backend.add_at_rows(self.encoder.grad, enc.reshape(-1), d[0].reshape(H, -1).T)
        backend.add_at_rows(self.decoder.grad, dec.reshape(-1), d[1].reshape(H, -1).T)
        return dy""",
    # no library class mixes given expert outputs: minitf.moe.SparseMoE.backward's lines on the exercise's cache
    "router": """def backward(self, dy):
        p, idx, t, w, chosen = self.saved_tensors()
        dout = xp.zeros(p.shape + dy.shape[-1:], dtype=dy.dtype)
        xp.put_along_axis(dout, idx[..., None], w[..., None] * dy[:, None, :], axis=1)
        dw = (dy[:, None, :] * chosen).sum(axis=-1)
        dc = (dw - (dw * w).sum(axis=-1, keepdims=True)) / t if self.renormalise else dw
        dp = xp.zeros_like(p)
        xp.put_along_axis(dp, idx, dc, axis=-1)
        return softmax_backward(p, dp), dout""",
}

#: exercise -> (a planted bug, what the checker must print about it)
BUGS = {
    "linear": ("""def backward(self, dy):
        (x,) = self.saved_tensors()
        self.weight.grad += x.reshape(-1, x.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])
        return dy @ self.weight.data.T          # db forgotten""",
               "hint: analytic is 0 everywhere"),
    "relu": ("""def backward(self, dy):
        (y,) = self.saved_tensors()
        return dy * (y >= 0)                    # y >= 0 is True everywhere: no mask""",
             "furthest off: x["),
    "softmax": ("""def backward(self, dy):
        (y,) = self.saved_tensors()
        return y * dy                           # the -y y^T part forgotten""",
                "furthest off: x["),
    "layernorm": ("""def backward(self, dy):
        xhat, rstd = self.saved_tensors()
        self.gamma.grad += (dy * xhat).reshape(-1, xhat.shape[-1]).sum(axis=0)
        self.beta.grad += dy.reshape(-1, xhat.shape[-1]).sum(axis=0)
        dxhat = dy * self.gamma.data
        return rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True))   # the variance term forgotten""",
                  "furthest off: x["),
    "attention": ("""def backward(self, dO):
        Q, K, U, P = self.saved_tensors()
        dQ, dK, dU = minitf.scaled_dot_product_attention_backward(dO, Q, K, U, P)
        return dQ * 2 ** 0.5, dK * 2 ** 0.5, dU  # the 1/sqrt(dk) scale forgotten""",
                  "hint: analytic = 1.414 x numeric in every entry"),
    "loss": ("""def backward(self, dloss=1.0):
        saved = self.saved_tensors()
        V = saved.p.shape[-1]
        q = 0.1 / V + 0.9 * (xp.arange(V) == saved.safe_target[..., None])
        return dloss * (saved.p - q) * saved.keep[..., None] / saved.keep.size  # over all B*T positions""",
             "hint: analytic = 0.5 x numeric in every entry"),
    "embedding": ("""def backward(self, dy):
        (ids,) = self.saved_tensors()
        self.weight.grad[ids.reshape(-1)] += dy.reshape(-1, dy.shape[-1]) * self.scale  # not a scatter-add""",
                  "hint: only"),
    "gelu": ("""def backward(self, dy):
        x, cdf, t = self.saved_tensors()
        if t is None:
            return dy * cdf                      # the product rule's x phi(x) forgotten
        du_dx = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x)
        return dy * (cdf + 0.5 * x * (1.0 - t * t) * du_dx)""",
             "furthest off: x_erf["),
    "silu": ("""def backward(self, dy):
        x, s = self.saved_tensors()
        return dy * s                            # the product rule's x sigmoid(x) (1 - sigmoid(x)) forgotten""",
             "the product rule's second term"),
    "rmsnorm": ("""def backward(self, dy):
        xhat, rstd = self.saved_tensors()
        self.weight.grad += (dy * xhat).reshape(-1, xhat.shape[-1]).sum(axis=0)
        dxhat = dy * self.weight.data
        return rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                       - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))   # LayerNorm's mean term kept""",
                "furthest off: x["),
    "rotary": ("""def backward(self, dy):
        cos, sin = self.saved_tensors()
        return dy * cos + rotate_half(dy) * sin   # the forward's turn again, not its transpose""",
               "furthest off: x["),
    "swiglu": ("""def backward(self, dy):
        a, u = self.saved_tensors()
        dh = self.down_proj.backward(dy)
        return self.gate_proj.backward(self.act.backward(dh * u))   # the path through up_proj forgotten""",
               "up_proj.weight"),
    "gqa": ("""def backward(self, dO):
        Q, K_rep, U_rep, P = self.saved_tensors()
        dQ, dK_rep, dU_rep = minitf.scaled_dot_product_attention_backward(dO, Q, K_rep, U_rep, P)
        B, H, T, E = dK_rep.shape
        return dQ, dK_rep[:, ::self.group], dU_rep[:, ::self.group]   # the group's first query head only""",
            "furthest off: K["),
    "tanh": ("""def backward(self, dy):
        x, y = self.saved_tensors()
        return dy * y                            # tanh itself, not 1 - tanh^2""",
             "hint: dx = dy tanh(x): tanh is not its own derivative"),
    "masked_lm_loss": ("""def backward(self, dloss=1.0):
        saved = self.saved_tensors()
        onehot = xp.arange(saved.p.shape[-1]) == saved.safe_labels[..., None]
        return dloss * (saved.p - onehot) / saved.count   # every position, masked or not""",
                       "hint: dlogits is not 0 at the 7 unmasked positions (label -100): they carry no loss"),
    "relative_bias": ("""def backward(self, dy):
        enc, dec = self.saved_tensors()
        d = dy.sum(axis=(1, 2))
        H = d.shape[1]
        self.encoder.grad[enc.reshape(-1)] += d[0].reshape(H, -1).T   # not a scatter-add: one pair per bucket
        self.decoder.grad[dec.reshape(-1)] += d[1].reshape(H, -1).T
        return dy""", "hint: encoder.grad[buckets] += ... keeps one query-key pair per bucket"),
}

#: the router's three usual slips (docs/moe.md), each a change of the solution, and the hint the checker gives on
#: each array it gets wrong (the softmax over the chosen logits alone is the renormalised form's right gradient)
ROUTER_SLIPS = {
    "every expert gets a gradient": (
        ("""        dout = xp.zeros(p.shape + dy.shape[-1:], dtype=dy.dtype)
        xp.put_along_axis(dout, idx[..., None], w[..., None] * dy[:, None, :], axis=1)""",
         """        dout = (p / t if self.renormalise else p)[..., None] * dy[:, None, :]   # chosen or not"""),
        {"out_mixtral": "every expert got a gradient", "out_qwen": "every expert got a gradient"}),
    "the renormalisation's Jacobian dropped": (
        ("dc = (dw - (dw * w).sum(axis=-1, keepdims=True)) / t if self.renormalise else dw",
         "dc = dw / t if self.renormalise else dw"),
        {"logits_mixtral": "the renormalisation's Jacobian is dropped"}),
    "the softmax over the chosen logits only": (
        ("""        dp = xp.zeros_like(p)
        xp.put_along_axis(dp, idx, dc, axis=-1)
        return softmax_backward(p, dp), dout""", """        q = w if self.renormalise else w / t
        dz = xp.zeros_like(p)
        xp.put_along_axis(dz, idx, q * (dw - (dw * q).sum(axis=-1, keepdims=True)), axis=-1)
        return dz, dout"""),
        {"logits_qwen": "over the k chosen logits alone"}),
}
BUGS["router"] = (SOLUTIONS["router"].replace(*ROUTER_SLIPS["the renormalisation's Jacobian dropped"][0]),
                  "hint: the renormalisation's Jacobian is dropped")


def filled(tmp_path, name, body):
    """A learner's file: the exercise with ``body`` as its class's backward."""
    cls = exercise.EXERCISES[name].class_name
    path = tmp_path / f"my_{name}.py"
    path.write_text(f"import minitf\nfrom minitf.exercises.{name} import *\n"
                    f"from minitf.exercises.{name} import {cls} as _Exercise\n\n\n"
                    f"class {cls}(_Exercise):\n    {body}\n")
    return path


def test_there_are_at_least_six_exercises_each_with_a_solution_and_a_bug():
    assert len(exercise.EXERCISES) >= 6
    assert set(SOLUTIONS) == set(BUGS) == set(exercise.EXERCISES)
    for name in exercise.EXERCISES:
        assert (exercise.EXERCISES_DIR / f"{name}.py").is_file()


@pytest.mark.parametrize("name", list(exercise.EXERCISES))
def test_the_librarys_backward_passes(name, tmp_path, capsys):
    assert exercise.main(["check", str(filled(tmp_path, name, SOLUTIONS[name]))]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "backward is right" in out


@pytest.mark.parametrize("name", list(exercise.EXERCISES))
def test_a_planted_bug_fails_and_says_how(name, tmp_path, capsys):
    body, message = BUGS[name]
    assert exercise.main(["check", str(filled(tmp_path, name, body))]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and message in out and "backward is wrong" in out, out


@pytest.mark.parametrize("slip", list(ROUTER_SLIPS))
def test_the_router_checker_names_each_usual_slip(slip, tmp_path, capsys):
    """Each slip of docs/moe.md fails exactly the arrays it gets wrong, each told that slip's hint (through the
    exercise's Slips); the softmax over the chosen logits alone is right for the renormalised (Mixtral) form, the
    same function there, and named on the Qwen form's logits."""
    (old, new), expected = ROUTER_SLIPS[slip]
    assert old in SOLUTIONS["router"]
    assert exercise.main(["check", str(filled(tmp_path, "router", SOLUTIONS["router"].replace(old, new)))]) == 1
    out = capsys.readouterr().out
    assert {array for array, status in rows(out).items() if status == "FAIL"} == set(expected), out
    found = hints(out)
    assert set(found) == set(expected), out
    for array, text in expected.items():
        assert text in found[array], (array, found[array], out)


@pytest.mark.parametrize("bug, message", [
    ("(1.0 - t) * du_dx", "the product rule's second term"),         # tanh' = 1 - tanh^2, not 1 - tanh
    ("(1.0 - t * t) * SQRT_2_OVER_PI", "the product rule's second term"),  # du/dx without the cubic's 3 x^2
])
def test_a_wrong_tanh_gelu_backward_is_named_and_the_exact_form_still_passes(bug, message, tmp_path, capsys):
    """GELU's exercise checks its two forms on two inputs: a slip in the tanh form's chain rule
    fails x_tanh alone, so the learner knows which branch to look at."""
    body = f"""def backward(self, dy):
        x, cdf, t = self.saved_tensors()
        if t is None:
            return dy * (cdf + x * xp.exp(-0.5 * x * x) / (2 * math.pi) ** 0.5)
        du_dx = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x)
        return dy * (cdf + 0.5 * x * {bug})"""
    assert exercise.main(["check", str(filled(tmp_path, "gelu", body))]) == 1
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.startswith("x_")}
    assert rows == {"x_erf": "ok", "x_tanh": "FAIL"}, out
    assert "furthest off: x_tanh[" in out and message in out and "docs/gpt.md" in out, out


@pytest.mark.parametrize("wrong", [
    "dy * x * s * (1.0 - s)",             # the product rule's first term, sigmoid(x), forgotten
    "dy * (s + x * (1.0 - s))",           # sigmoid' = 1 - s, not s (1 - s)
    "dy * (s + s * (1.0 - s))",           # the x of x sigmoid'(x) forgotten
    "dy * (s + x * y * (1.0 - y))",       # sigmoid' from SiLU's output y = x s instead of s
])
def test_each_usual_slip_in_silus_backward_fails_the_check(wrong, tmp_path, capsys):
    """SiLU's check runs on x of scale 3, both signs: each of the usual slips in y' = s + x s (1 - s)
    is off almost everywhere, and the checker sends the learner to the derivation."""
    body = f"""def backward(self, dy):
        x, s = self.saved_tensors()
        y = x * s
        return {wrong}"""
    assert exercise.main(["check", str(filled(tmp_path, "silu", body))]) == 1
    out = capsys.readouterr().out
    assert "furthest off: x[" in out and "SiLU.backward is wrong" in out and "docs/pretrained.md" in out, out
    assert "mean" not in out and "normaliser" not in out, out  # SiLU has neither: the hint fits the layer


@pytest.mark.parametrize("name, body", [
    ("silu", """def backward(self, dy):
        x, s = self.saved_tensors()
        return s + x * s * (1.0 - s)             # y'(x), never multiplied by dy"""),
    ("relu", """def backward(self, dy):
        (y,) = self.saved_tensors()
        return (y > 0) * 1.0                     # the mask alone, never multiplied by dy"""),
    ("tanh", """def backward(self, dy):
        x, y = self.saved_tensors()
        return 1.0 - y * y                       # tanh'(x), never multiplied by dy"""),
])
def test_a_backward_that_never_multiplies_by_the_upstream_gradient_is_told_so(name, body, tmp_path, capsys):
    """y'(x) returned as it is: the gradient of sum(y), the one for dy = 1. No term is missing, so the hint says
    that dy was not applied, and names no term."""
    assert exercise.main(["check", str(filled(tmp_path, name, body))]) == 1
    out = capsys.readouterr().out
    assert "hint: analytic = the gradient of sum(outputs), the one for dy = 1" in out, out
    assert "upstream gradient dy is not applied" in out, out
    assert "term" not in out, out


@pytest.mark.parametrize("body, missing, present", [
    ("dy * x * s * (1.0 - s)", "= dy sigmoid(x) in every entry: the product rule's first term", "second term"),
    ("dy * s", "= dy x sigmoid(x) (1 - sigmoid(x)) in every entry: the product rule's second term", "first term"),
])
def test_a_silu_backward_without_one_product_rule_term_is_told_which(body, missing, present, tmp_path, capsys):
    """Each term of y' = s + x s (1 - s) forgotten in turn: the hint names the one that is missing,
    not the one that is there, and nothing SiLU does not have (a mean, a normaliser of the row)."""
    body = f"""def backward(self, dy):
        x, s = self.saved_tensors()
        return {body}"""
    assert exercise.main(["check", str(filled(tmp_path, "silu", body))]) == 1
    out = capsys.readouterr().out
    assert f"hint: numeric - analytic {missing} is missing" in out, out
    assert present not in out and "mean" not in out and "normaliser" not in out, out


def test_a_gelu_backward_without_one_term_in_each_form_is_told_which_per_form(tmp_path, capsys):
    """GELU's two forms, each without one product-rule term: each array's hint names its own."""
    body = """def backward(self, dy):
        x, cdf, t = self.saved_tensors()
        if t is None:
            return dy * cdf                      # x phi(x) forgotten
        du_dx = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x)
        return dy * (0.5 * x * (1.0 - t * t) * du_dx)  # (1 + t) / 2 forgotten"""
    assert exercise.main(["check", str(filled(tmp_path, "gelu", body))]) == 1
    out = capsys.readouterr().out
    hints = [line for line in out.splitlines() if line.startswith("  hint:")]
    assert hints == ["  hint: numeric - analytic = dy x phi(x) in every entry: the product rule's second term is "
                     "missing",
                     "  hint: numeric - analytic = dy (1 + t) / 2 in every entry: the product rule's first term is "
                     "missing"], out


def test_a_gradient_of_the_wrong_shape_gets_one_verdict(tmp_path, capsys):
    """dx summed over the batch axis: the protocol's FAIL names the shape, the array's row says it
    was not compared, and no "nothing was checked" contradicts it (x is there to check)."""
    body = """def backward(self, dy):
        x, s = self.saved_tensors()
        return (dy * (s + x * s * (1.0 - s))).sum(axis=0)"""
    assert exercise.main(["check", str(filled(tmp_path, "silu", body))]) == 1
    out = capsys.readouterr().out
    assert "FAIL input x: its gradient has shape (3, 4), x has (2, 3, 4)" in out, out
    assert "nothing was checked" not in out and "0 of 0" not in out, out
    assert "0 of 1 arrays match" in out and "not compared" in out and "SiLU.backward is wrong" in out, out


@pytest.mark.parametrize("seed", [0, 4])
def test_a_wrong_backward_is_not_reported_as_a_stale_cache(seed, tmp_path, capsys):
    """The exact form's derivative in the tanh branch is off by about 1e-3 relative: one random
    direction at 1e-4 may pass it on the check's first inputs and fail it on the second (seeds 0
    and 4). That is a wrong backward, not a cache kept from an earlier forward: the checker names
    x_tanh and says nothing of a cache."""
    body = """def backward(self, dy):
        x, cdf, t = self.saved_tensors()
        pdf = xp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        return dy * (cdf + x * pdf)              # the exact form's derivative, in the tanh branch too"""
    assert exercise.main(["check", str(filled(tmp_path, "gelu", body)), "--seed", str(seed)]) == 1
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.startswith("x_")}
    assert rows == {"x_erf": "ok", "x_tanh": "FAIL"}, out
    assert "cache" not in out and "furthest off: x_tanh[" in out, out


@pytest.mark.parametrize("name", list(exercise.EXERCISES))
def test_a_fresh_copy_says_not_written_yet(name, tmp_path, capsys):
    assert exercise.main(["start", name, "--to", str(tmp_path)]) == 0
    assert exercise.main(["check", str(tmp_path / f"{name}.py")]) == 1
    assert "not written yet" in capsys.readouterr().out


def test_a_file_that_is_no_exercise_is_one_line(tmp_path, capsys):
    path = tmp_path / "other.py"
    path.write_text("x = 1\n")
    assert exercise.main(["check", str(path)]) == 2
    assert "defines no 'EXERCISE'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as error:
        exercise.main(["check", str(tmp_path / "missing.py")])
    assert error.value.code == 2


def test_the_output_shown_in_docs_exercises_md_is_current(tmp_path, capsys):
    import pathlib
    import re

    from minitf import backend
    from tests.test_docs import output_matches
    if backend.get_device() != "cpu":
        pytest.skip("the shown output is from the CPU backend")
    page = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "exercises.md").read_text(encoding="utf-8")
    shown = re.search(r"^```text recorded: python -m minitf.exercise check my_linear.py[^\n]*\n(.*?)^```",
                      page, re.M | re.S).group(1)
    exercise.main(["check", str(filled(tmp_path, "linear", BUGS["linear"][0]))])
    assert output_matches(shown, capsys.readouterr().out)


# --------------------------------------------------------------------------- #
# Hints per array and per slip: each exercise names the slips it recognises in each array's gradient
# (minitf.exercise.Slip); a wrong solution gets, on each failing array's hint line, the slip it made there,
# never another array's hint.
# --------------------------------------------------------------------------- #
def hints(out):
    """{array: its hint line} of a report: each "furthest off: NAME[" line and the hint line after it."""
    lines = out.splitlines()
    return {lines[i].split("furthest off: ")[1].split("[")[0]: lines[i + 1] for i in range(len(lines) - 1)
            if "furthest off: " in lines[i] and lines[i + 1].startswith("  hint:")}


def rows(out):
    """{array: ok or FAIL} from the report's table."""
    return {line.split()[0]: line.split()[-1] for line in out.splitlines()
            if line.split() and line.split()[-1] in ("ok", "FAIL") and not line.startswith("FAIL")}


RMSNORM = """def backward(self, dy):
        xhat, rstd = self.saved_tensors()
        self.weight.grad += {dweight}
        dxhat = dy * self.weight.data
        return {dx}"""
RIGHT_RMS_DWEIGHT = "(dy * xhat).reshape(-1, xhat.shape[-1]).sum(axis=0)"
RIGHT_RMS_DX = "rstd * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))"
ROTARY = """def backward(self, dy):
        cos, sin = self.saved_tensors()
        return {dx}"""
SWIGLU = """def backward(self, dy):
        a, u = self.saved_tensors()
        dh = self.down_proj.backward(dy)
        {body}"""
GQA = """def backward(self, dO):
        Q, K_rep, U_rep, P = self.saved_tensors()
        dQ, dK_rep, dU_rep = minitf.scaled_dot_product_attention_backward(dO, Q, K_rep, U_rep, P)
        B, H, T, E = dK_rep.shape
        G, Hkv = self.group, H // self.group
        return dQ, {dK}, {dU}"""
RIGHT_DK = "dK_rep.reshape(B, Hkv, G, T, E).sum(axis=2)"
RIGHT_DU = "dU_rep.reshape(B, Hkv, G, T, E).sum(axis=2)"
BIAS = SOLUTIONS["relative_bias"]


SLIP_CASES = [
    # RMSNorm's dx with LayerNorm's term through the mean (the variance's x - mean where RMSNorm has x)
    ("rmsnorm", RMSNORM.format(dweight=RIGHT_RMS_DWEIGHT, dx="rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True) "
                               "- xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))"),
     {"x": "subtracts no mean"}),
    # the sign of the term through rstd flipped
    ("rmsnorm", RMSNORM.format(dweight=RIGHT_RMS_DWEIGHT,
                               dx="rstd * (dxhat + xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))"),
     {"x": "sign of the term through the row's rstd"}),
    # dweight from x, not from the normalised xhat; dx right
    ("rmsnorm", RMSNORM.format(dweight="(dy * xhat / rstd).reshape(-1, xhat.shape[-1]).sum(axis=0)", dx=RIGHT_RMS_DX),
     {"weight": "not dy x"}),
    # rotary: adjacent dimensions paired (Meta's interleaved layout) where the code pairs the halves
    ("rotary", ROTARY.format(dx="dy * cos - xp.stack([-dy[..., 1::2], dy[..., ::2]], axis=-1).reshape(dy.shape) "
                                "* sin"),
     {"x": "pairs adjacent dimensions"}),
    # rotary: the forward's turn again, not its transpose (the sign of the rotate_half term)
    ("rotary", ROTARY.format(dx="dy * cos + rotate_half(dy) * sin"), {"x": "the turn by -angle"}),
    # SwiGLU: gate and up swapped, SiLU's backward sent into up_proj and dh a into gate_proj
    ("swiglu", SWIGLU.format(body="return self.up_proj.backward(self.act.backward(dh * u)) + "
                                  "self.gate_proj.backward(dh * a)"),
     {"x": "gate and up swapped", "gate_proj.weight": "gate and up swapped", "up_proj.weight": "gate and up swapped"}),
    # SwiGLU: the product rule's factors swapped
    ("swiglu", SWIGLU.format(body="return self.up_proj.backward(dh * u) + "
                                  "self.gate_proj.backward(self.act.backward(dh * a))"),
     {"x": "factors swapped", "gate_proj.weight": "factors swapped", "up_proj.weight": "factors swapped"}),
    # grouped-query attention: only the first query head of each group's dK (and dU), not the sum over the group
    ("gqa", GQA.format(dK="dK_rep.reshape(B, Hkv, G, T, E)[:, :, 0]", dU=RIGHT_DU), {"K": "first query head"}),
    ("gqa", GQA.format(dK=RIGHT_DK, dU="dU_rep.reshape(B, Hkv, G, T, E)[:, :, 0]"), {"U": "first query head"}),
    # grouped-query attention: the group read as interleaved (query head j reads key/value head j % Hkv)
    ("gqa", GQA.format(dK="dK_rep.reshape(B, G, Hkv, T, E).sum(axis=1)",
                       dU="dU_rep.reshape(B, G, Hkv, T, E).sum(axis=1)"),
     {"K": "query heads j // G", "U": "query heads j // G"}),
    # T5's bias tables: a fancy-index += where a scatter-add belongs (one query-key pair per bucket kept)
    ("relative_bias", BIAS.replace("backend.add_at_rows(self.encoder.grad, enc.reshape(-1), ",
                                   "self.encoder.grad[enc.reshape(-1)] += (")
                          .replace("backend.add_at_rows(self.decoder.grad, dec.reshape(-1), ",
                                   "self.decoder.grad[dec.reshape(-1)] += ("),
     {"encoder": "keeps one query-key pair per bucket", "decoder": "keeps one query-key pair per bucket"}),
    # the first layer of each stack only
    ("relative_bias", BIAS.replace("d = dy.sum(axis=(1, 2))", "d = dy[:, 0].sum(axis=1)"),
     {"encoder": "the first layer's gradient only", "decoder": "the first layer's gradient only"}),
    # the decoder's gradient scattered into the encoder's table: the decoder's own table gets none
    ("relative_bias", BIAS.replace("add_at_rows(self.decoder.grad", "add_at_rows(self.encoder.grad"),
     {"encoder": "the decoder's gradient is added into the encoder's table", "decoder": "analytic is 0 everywhere"}),
]


@pytest.mark.parametrize("name, body, expected", SLIP_CASES)
def test_each_slip_gets_its_own_hint_on_its_own_array(name, body, expected, tmp_path, capsys):
    """A planted wrong solution: exactly the arrays it gets wrong fail, each hint line names the slip made in
    that array, and no array is told another array's or another slip's hint."""
    assert exercise.main(["check", str(filled(tmp_path, name, body))]) == 1
    out = capsys.readouterr().out
    failed = {array for array, status in rows(out).items() if status == "FAIL"}
    assert failed == set(expected), out
    found = hints(out)
    assert set(found) == set(expected), out
    others = {text for _, _, e in SLIP_CASES for text in e.values()} - set(expected.values())
    for array, text in expected.items():
        assert text in found[array], (array, found[array], out)
        assert not any(other in found[array] for other in others), (array, found[array])
        assert "off almost everywhere" not in found[array], found[array]


def test_a_slip_in_one_array_is_not_told_another_arrays_hint(tmp_path, capsys):
    """RMSNorm's dx right and dweight off by no slip it knows (dy * rstd): the hint names dweight's formula,
    not dx's (the exercise's hints are per array)."""
    body = RMSNORM.format(dweight="(dy * rstd).reshape(-1, xhat.shape[-1]).sum(axis=0)", dx=RIGHT_RMS_DX)
    assert exercise.main(["check", str(filled(tmp_path, "rmsnorm", body))]) == 1
    out = capsys.readouterr().out
    found = hints(out)
    assert set(found) == {"weight"}, out
    assert "dweight" in found["weight"] and "dx" not in found["weight"], found["weight"]


@pytest.mark.parametrize("name, body", [
    ("rmsnorm", RMSNORM.format(dweight="xhat.reshape(-1, xhat.shape[-1]).sum(axis=0)",
                               dx="rstd * (self.weight.data - xhat * (self.weight.data * xhat).mean(axis=-1, "
                                  "keepdims=True))")),
    ("swiglu", SWIGLU.format(body="dh = self.down_proj.weight.data.sum(axis=1) + 0 * dh   # dy never used\n"
                                  "        return self.up_proj.backward(dh * a) + "
                                  "self.gate_proj.backward(self.act.backward(dh * u))")),
])
def test_a_forgotten_upstream_gradient_is_told_so_in_a_layer_that_is_not_elementwise(name, body, tmp_path, capsys):
    """A backward that never multiplies by dy gives the gradient of sum(outputs) (dy = 1): in RMSNorm and the
    SwiGLU, where an entry of dx depends on every entry of dy's row, that is not analytic x dy = numeric entry by
    entry; the checker compares with the numeric gradient for dy = 1 and says that dy is not applied."""
    assert exercise.main(["check", str(filled(tmp_path, name, body))]) == 1
    out = capsys.readouterr().out
    found = hints(out)
    assert found, out
    for array, text in found.items():
        assert "upstream gradient dy is not applied" in text, (array, text)


def test_a_shape_error_suggests_summing_broadcast_axes_only_for_a_broadcast_input(tmp_path, capsys):
    """dK returned per query head (B, H, T, E) where K is (B, Hkv, T, E): K was repeated, never broadcast, so
    the FAIL line says to sum the copies, not "the axes that broadcasting added"; an input that was broadcast
    (b (4,) added to x (2, 3, 4)) still gets that advice."""
    body = GQA.format(dK="dK_rep", dU=RIGHT_DU)
    assert exercise.main(["check", str(filled(tmp_path, "gqa", body))]) == 1
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("FAIL input K"))
    assert "broadcasting" not in line and "repeat" in line, line
    silu = """def backward(self, dy):
        x, s = self.saved_tensors()
        return (dy * (s + x * s * (1.0 - s))).sum(axis=0)"""
    assert exercise.main(["check", str(filled(tmp_path, "silu", silu))]) == 1
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("FAIL input x"))
    assert "broadcasting" not in line, line

    from minitf import backend
    from minitf.draws import random_array
    from minitf.gradcheck.protocol import protocol_problems
    with backend.default_dtype("float64"):
        inputs = {"x": random_array(0, (2, 3, 4)), "b": random_array(1, (4,))}
        problems = protocol_problems(lambda x, b: x + b, lambda dy: (dy, dy), inputs)
    assert any("input b" in p and "broadcasting added" in p for p in problems), problems


@pytest.mark.parametrize("body, message", [
    ("dy * y", "dx = dy tanh(x): tanh is not its own derivative"),
    ("dy * (1.0 - y)", "dx = dy (1 - tanh(x)): the square is missing"),
    ("dy * (1.0 - x * x)", "dx = dy (1 - x^2): the derivative is written with the input x"),
])
def test_each_usual_slip_in_tanhs_backward_is_named(body, message, tmp_path, capsys):
    """tanh's check runs on x of scale 2, where tanh(x), 1 - tanh(x), 1 - tanh(x)^2 and 1 - x^2 are far apart:
    each slip gives its own gradient, and the hint names it (not a generic "off almost everywhere"). A forgotten dy
    is told as in any layer (test_a_backward_that_never_multiplies_by_the_upstream_gradient_is_told_so)."""
    body = f"""def backward(self, dy):
        x, y = self.saved_tensors()
        return {body}"""
    assert exercise.main(["check", str(filled(tmp_path, "tanh", body))]) == 1
    out = capsys.readouterr().out
    assert f"hint: {message}" in out and "Tanh.backward is wrong" in out and "docs/bert.md" in out, out
    assert "off almost everywhere" not in out, out


@pytest.mark.parametrize("body, message", [
    ("(p - onehot) * keep / 5", "divided by the sequence length T = 5, not by the M = 3 masked positions"),
    ("(p - onehot) * keep / 2", "divided by the batch B = 2, not by the M = 3 masked positions"),
    ("(p - onehot) * keep / 10", "divided by all B T = 10 positions, not by the M = 3 masked ones"),
    ("(p - onehot) * keep", "not divided by M = 3: the loss is the mean over the masked positions"),
    ("p * keep / 3", "the one-hot of the label is not subtracted"),
    ("-onehot * keep / 3", "the softmax is missing"),
    ("(p - onehot) / 3", "not 0 at the 7 unmasked positions (label -100): they carry no loss"),
    ("(p - onehot) / 10", "not 0 at the 7 unmasked positions (label -100): they carry no loss"),
])
def test_each_usual_slip_in_the_masked_lm_losss_backward_is_named(body, message, tmp_path, capsys):
    """3 of 2 x 5 positions masked: each wrong divisor is its own factor (3/5, 3/2, 3/10, 3), and the hint names
    the divisor, not "a constant factor"; the gradient at an unmasked position is named before anything else."""
    body = f"""def backward(self, dloss=1.0):
        saved = self.saved_tensors()
        p, keep = saved.p, saved.masked[..., None]
        onehot = (xp.arange(p.shape[-1]) == saved.safe_labels[..., None]) * 1.0
        return dloss * ({body})"""
    assert exercise.main(["check", str(filled(tmp_path, "masked_lm_loss", body))]) == 1
    out = capsys.readouterr().out
    assert message in out and "MaskedLMLoss.backward is wrong" in out and "docs/bert.md" in out, out
    assert "constant factor" not in out, out
