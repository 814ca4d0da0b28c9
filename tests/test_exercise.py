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
}

#: the router's three usual slips (docs/moe.md), each a change of the solution, and what the checker names
ROUTER_SLIPS = {
    "every expert gets a gradient": (
        ("""        dout = xp.zeros(p.shape + dy.shape[-1:], dtype=dy.dtype)
        xp.put_along_axis(dout, idx[..., None], w[..., None] * dy[:, None, :], axis=1)""",
         """        dout = (p / t if self.renormalise else p)[..., None] * dy[:, None, :]   # chosen or not"""),
        "the zero gradient of the experts top-k did not choose is missing"),
    "the renormalisation's Jacobian dropped": (
        ("dc = (dw - (dw * w).sum(axis=-1, keepdims=True)) / t if self.renormalise else dw",
         "dc = dw / t if self.renormalise else dw"),
        "the renormalisation's Jacobian term -<dw, w> / t is missing"),
    "the softmax over the chosen logits only": (
        ("""        dp = xp.zeros_like(p)
        xp.put_along_axis(dp, idx, dc, axis=-1)
        return softmax_backward(p, dp), dout""", """        q = w if self.renormalise else w / t
        dz = xp.zeros_like(p)
        xp.put_along_axis(dz, idx, q * (dw - (dw * q).sum(axis=-1, keepdims=True)), axis=-1)
        return dz, dout"""),
        "logits_qwen"),  # the same function as Mixtral's (renormalised): only the Qwen form's logits fail
}
BUGS["router"] = (SOLUTIONS["router"].replace(*ROUTER_SLIPS["the renormalisation's Jacobian dropped"][0]),
                  "the renormalisation's Jacobian term")


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
    """Each slip of docs/moe.md fails and the hint names it; the softmax over the chosen logits alone is right
    for the renormalised (Mixtral) form, the same function there, and named for the Qwen form."""
    (old, new), message = ROUTER_SLIPS[slip]
    assert old in SOLUTIONS["router"]
    assert exercise.main(["check", str(filled(tmp_path, "router", SOLUTIONS["router"].replace(old, new)))]) == 1
    out = capsys.readouterr().out
    assert message in out, out
    if slip == "the softmax over the chosen logits only":
        assert "the softmax's backward over all E experts (not over the chosen k alone) is missing" in out
        assert not any(line.startswith("logits_mixtral") and "FAIL" in line for line in out.splitlines())


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
])
def test_a_backward_that_never_multiplies_by_the_upstream_gradient_is_told_so(name, body, tmp_path, capsys):
    """y'(x) returned as it is: analytic x G = numeric in every entry (G the upstream gradient). No
    term is missing, so the hint says that dy was not applied, and names no term."""
    assert exercise.main(["check", str(filled(tmp_path, name, body))]) == 1
    out = capsys.readouterr().out
    assert "hint: analytic x dy = numeric in every entry" in out and "upstream gradient dy is not applied" in out, out
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
