"""minitf.testing, the public gradient-test kit: the module form of assert_gradients_match
checks inputs and parameters, refuses float32, and fails every layer of a catalogue of wrong
backward passes with a message that names what is wrong (a None or missing input gradient,
= instead of +=, a changed upstream gradient, an input changed by forward or backward, a
wrong shape, wrong numbers, and the realistic bugs of minitf.study.bugs), while the right layers
pass; the strategies draw what they promise.
Tolerances: the defaults RTOL 1e-6, ATOL 1e-7 (float64 central differences)."""
import re

import pytest
from hypothesis import given, strategies as st

import minitf
from minitf import backend, testing
from minitf.study import bugs
from minitf.backend import xp
from minitf.module import stacked_forwards

np = backend.host
pytestmark = pytest.mark.usefixtures("float64")


@given(x=testing.arrays((2, 3, 4)), seed=testing.seeds)
def test_module_form_checks_inputs_and_every_parameter(x, seed):
    layer = testing.randomize(minitf.Linear(4, 5), seed)
    report = testing.assert_gradients_match(layer, x, seed=seed)
    assert [name for name, *_ in report] == ["x", "weight", "bias"]


def test_module_form_passes_ids_and_keyword_arguments_through():
    emb = minitf.Embedding(5, 3)
    ids = backend.asarray(np.array([[1, 1, 4]]))
    assert [n for n, *_ in testing.assert_gradients_match(emb, ids)] == ["weight"]
    mha = testing.randomize(minitf.MultiHeadAttention(4, 2), 3)
    pad = backend.asarray(np.array([[False, False, True]]))
    testing.assert_gradients_match(mha, testing.random_array(1, (1, 3, 4)), key_padding_mask=pad, causal=True)


class _WrongScale(minitf.Module):
    """y = 2 x, with a backward that forgets the 2."""
    def forward(self, x):
        return 2 * x

    def backward(self, dy):
        return dy


def test_a_wrong_backward_fails():
    with pytest.raises(AssertionError, match="x: relative error") as error:
        testing.assert_gradients_match(_WrongScale(), testing.random_array(0, (2, 3)))
    message = str(error.value)
    assert "furthest off: x[" in message and "(analytic/numeric 0.5)" in message and "6 of 6 entries off" in message
    assert "hint: analytic = 0.5 x numeric in every entry: a constant factor" in message


# --- a catalogue of wrong layers: each must fail, naming what is wrong ------------------------
class _Scale(minitf.Module):
    """y = x * g with a parameter g (D,); ``mistake`` picks a wrong backward."""
    def __init__(self, mistake=None, d=3):
        self.g = minitf.Parameter(testing.random_array(7, (d,)))
        self.mistake = mistake

    def forward(self, x):
        if self.mistake == "forward-mutates-x":
            x *= 1.0  # an in-place op on the caller's array (harmless here, but it writes)
            x[..., 0] = x[..., 0] * 1.5
        self.save_for_backward(x)
        return x * self.g.data

    def backward(self, dy):
        (x,) = self.saved_tensors()
        dg = (dy * x).reshape(-1, x.shape[-1]).sum(axis=0)
        if self.mistake == "grad-assign":
            self.g.grad = dg                       # replaces the array: = instead of +=
        elif self.mistake == "grad-assign-view":
            self.g.grad[...] = dg                  # writes into it: = instead of +=
        elif self.mistake == "grad-scaled":
            self.g.grad *= 0.5
            self.g.grad += dg
        else:
            self.g.grad += dg
        if self.mistake == "backward-mutates-param":
            self.g.data -= 0.1 * dg
        if self.mistake == "no-return":
            return                                  # forgets `return dx`
        if self.mistake == "mutates-dy":
            dy *= self.g.data                       # changes the caller's gradient in place
            return dy
        if self.mistake == "wrong-shape":
            return (dy * self.g.data).sum(axis=0)   # summed over the batch: not x's shape
        return dy * self.g.data


class _Product(minitf.Module):
    """y = x * z, two float inputs."""
    def __init__(self, mistake=None):
        self.mistake = mistake

    def forward(self, x, z):
        self.save_for_backward(x, z)
        return x * z

    def backward(self, dy):
        x, z = self.saved_tensors()
        if self.mistake == "only-dx":
            return dy * z                           # dz forgotten: one gradient for two inputs
        if self.mistake == "dz-none":
            return dy * z, None
        return dy * z, dy * x


class _SkipBlock(minitf.Module):
    """y = x + tanh(x); ``mistake`` drops the skip path's gradient."""
    def __init__(self, mistake=None):
        self.mistake = mistake

    def forward(self, x):
        t = xp.tanh(x)
        self.save_for_backward(t)
        return x + t

    def backward(self, dy):
        (t,) = self.saved_tensors()
        return dy * (1 - t * t) + (0 if self.mistake else dy)


def _x(shape=(2, 2, 3), seed=0):
    return testing.random_array(seed, shape)


CATALOGUE = [  # (id, layer, inputs, what the message must say)
    ("no-return", lambda: _Scale("no-return"), lambda: [_x()], r"input x: backward returned None"),
    ("one-gradient-for-two-inputs", lambda: _Product("only-dx"), lambda: [_x(), _x(seed=1)],
     r"input z: no gradient; backward returned 1 value\(s\) for 2 inputs"),
    ("none-for-a-float-input", lambda: _Product("dz-none"), lambda: [_x(), _x(seed=1)],
     r"input z: backward returned None"),
    ("grad-assigned", lambda: _Scale("grad-assign"), lambda: [_x()],
     r"parameter g: backward overwrote .grad \(= instead of \+=\).*tied embeddings"),
    ("grad-assigned-in-place", lambda: _Scale("grad-assign-view"), lambda: [_x()],
     r"parameter g: backward overwrote .grad \(= instead of \+=\)"),
    ("grad-scaled", lambda: _Scale("grad-scaled"), lambda: [_x()],
     r"parameter g: a .grad that already held an array R did not end at R \+"),
    ("upstream-gradient-changed", lambda: _Scale("mutates-dy"), lambda: [_x()],
     r"incoming gradient dy: backward changed it in place"),
    ("forward-changes-its-input", lambda: _Scale("forward-mutates-x"), lambda: [_x()],
     r"input x: forward changed it in place"),
    ("backward-changes-a-parameter", lambda: _Scale("backward-mutates-param"), lambda: [_x()],
     r"parameter g: backward changed its values"),
    ("wrong-shape", lambda: _Scale("wrong-shape"), lambda: [_x()],
     r"input x: its gradient has shape \(2, 3\), x has \(2, 2, 3\)"),
    ("skip-path-dropped", lambda: _SkipBlock("drop"), lambda: [_x()],
     r"x: relative error.*\n.*furthest off: x\[.*\n  hint: analytic - numeric = -dy"),
    ("backward-mutates-input", lambda: _Mutating(), lambda: [_x()], r"input x: backward changed it in place"),
]


class _Mutating(minitf.Module):
    def forward(self, x):
        self.x = x
        return x * x

    def backward(self, dy):
        self.x *= 2  # mutates its input in place, then uses it: d(x^2) = 2x
        return dy * self.x


@pytest.mark.parametrize("make, inputs, message", [c[1:] for c in CATALOGUE], ids=[c[0] for c in CATALOGUE])
def test_each_wrong_layer_fails_naming_what_is_wrong(make, inputs, message):
    with pytest.raises(AssertionError, match=message):
        testing.assert_gradients_match(make(), *inputs())


@pytest.mark.parametrize("make, inputs", [(lambda: _Scale(), lambda: [_x()]),
                                          (lambda: _Product(), lambda: [_x(), _x(seed=1)]),
                                          (lambda: _SkipBlock(), lambda: [_x()])], ids=["scale", "product", "skip"])
def test_the_right_versions_of_the_catalogue_pass(make, inputs):
    testing.assert_gradients_match(make(), *inputs())


#: for each realistic bug: the array its message must name first, and a word of its hint
BUG_MESSAGES = {
    "no-variance-term": r"^x: relative error.*\n  furthest off: x\[",
    "no-scale": r"^Q: relative error.*\n.*\n  hint: analytic = 1.414 x numeric",
    "causal-off-by-one": r"^Q: relative error.*\n  furthest off: Q\[",
    "no-skip-gradient": r"^x: relative error.*\n.*\n  hint: analytic - numeric = -dy",
    "fancy-index-add": r"^weight: relative error.*\n.*\n  hint: only \d+ of 28 entries are off",
    "reshape-heads": r"^x: relative error",
    "mean-over-all-tokens": r"^logits: relative error.*\n.*\n  hint: analytic = 0.5 x numeric",
    "no-subtracted-sum": r"^x: relative error",
    "tied-overwrite": r"parameter weight: backward overwrote .grad \(= instead of \+=\)",
    "position-mean": r"^weight: relative error.*\n.*\n  hint: analytic = 0.5 x numeric",
    "gelu-no-product-term": r"^x: relative error.*\n.*\n  hint: off almost everywhere, by no single factor",
}


def _bug(name, buggy):
    rng = backend.host_rng(0)
    backend.manual_seed(0)
    forward, backward, inputs, params = bugs.build(name, rng, buggy=buggy)
    return forward, backward, inputs, params


def test_every_realistic_bug_has_an_expected_message():
    assert set(BUG_MESSAGES) == set(bugs.BUGS)


@pytest.mark.parametrize("name", list(bugs.BUGS))
def test_each_realistic_bug_fails_with_its_message_and_the_right_line_passes(name):
    forward, backward, inputs, params = _bug(name, buggy=True)
    with pytest.raises(AssertionError, match=BUG_MESSAGES[name]) as error:
        testing.assert_gradients_match(forward, backward, inputs, params, reseed=0)
    assert "hint: " in str(error.value) or "parameter" in str(error.value)
    testing.assert_gradients_match(*_bug(name, buggy=False), reseed=0)


def test_a_tied_weight_passes_when_it_accumulates():
    """One weight used twice (embedding and output projection): += keeps both uses."""
    emb = testing.randomize(minitf.Embedding(5, 3), 1)
    proj = minitf.OutputProjection(emb.weight)
    ids = backend.asarray(np.array([[1, 4, 1]]))
    testing.assert_gradients_match(lambda: proj(emb(ids)), lambda d: emb.backward(proj.backward(d)), {},
                                   {"weight": emb.weight})


def test_float32_is_refused():
    with backend.default_dtype("float32"):
        layer = minitf.Linear(2, 2)
    with pytest.raises(TypeError, match="float64"):
        testing.assert_gradients_match(layer, testing.random_array(0, (1, 2)))


def test_function_form_with_the_old_tol_name():
    layer = minitf.LayerNorm(3)
    testing.assert_gradients_match(layer.forward, layer.backward, {"x": testing.random_array(0, (2, 3))},
                                   dict(layer.named_parameters()), tol=testing.LN_RTOL)


@given(x=testing.arrays(st.tuples(testing.small, testing.small), away_from_zero=0.1),
       mask=testing.padding_masks(3, 4), keep=testing.attention_masks(2, 3, 4))
def test_strategies_draw_what_they_promise(x, mask, keep):
    assert x.dtype == np.float64 and float(abs(x).min()) >= 0.1
    assert mask.shape == (3, 4) and not backend.to_numpy(mask[:, 0]).any()  # one real token at least
    m = backend.to_numpy(mask)
    assert (np.sort(m, axis=1) == m).all()  # real tokens first, then padding
    assert keep is None or keep.dtype == bool and len(keep.shape) == 4


def test_upstream_gradients_have_the_shape():
    @given(g=testing.upstream_gradients((2, 5)))
    def check(g):
        assert g.shape == (2, 5) and isinstance(g, xp.ndarray)
    check()


# --- three wrong layers that pass the numbers alone (issue 27) --------------------------------
class _Affine(minitf.Module):
    """y = x * g + x^2: the gradient of g needs x, dx needs x too; ``mistake`` picks a wrong cache or .grad."""
    def __init__(self, mistake=None):
        self.g = minitf.Parameter(testing.random_array(7, (3,)))
        self.mistake = mistake

    def forward(self, x):
        if self.mistake == "first-forward-cache":
            if not hasattr(self, "x"):
                self.x = x                            # kept from the first call ever
        elif self.mistake == "attribute-cache":
            self.x = x                                # overwritten by a second call before backward
        else:
            self.save_for_backward(x)
        return x * self.g.data + x * x

    def backward(self, dy):
        x = self.x if self.mistake in ("first-forward-cache", "attribute-cache") else self.saved_tensors()[0]
        dg = (dy * x).reshape(-1, 3).sum(axis=0)
        if self.mistake == "grad-rebound":
            self.g.grad = self.g.grad + dg            # right numbers, in a new array
        else:
            self.g.grad += dg
        return dy * (self.g.data + 2 * x)


CACHE_AND_GRAD_MISTAKES = [
    ("grad-rebound", r"parameter g: backward replaced g.grad by a new array .*Adam"),
    ("first-forward-cache", r"backward used the cache of an earlier forward"),
    ("attribute-cache", r"called twice before its backwards .*the second forward overwrote the first one's cache"),
]


def _harm(mistake):
    """What the wrong layer does in training (compared with the right one): how far Adam moves g, or
    how far dx is off on a second batch or for the first of two calls."""
    if mistake == "grad-rebound":
        layer = _Affine(mistake)
        opt = minitf.Adam(layer.parameters(), lr=0.1)
        before = backend.to_numpy(layer.g.data).copy()
        layer.backward(layer.forward(_x()) * 0 + 1)
        opt.step()
        return abs(backend.to_numpy(layer.g.data) - before).max()
    wrong, right = _Affine(mistake), _Affine()
    for layer in (wrong, right):
        if mistake == "first-forward-cache":
            layer.backward(layer.forward(_x(seed=1)))
            layer.forward(_x(seed=2))
        else:
            with stacked_forwards():                       # as a layer called twice within one forward
                layer.forward(_x(seed=1)), layer.forward(_x(seed=2))
            layer.backward(_x(seed=3))
    return abs(backend.to_numpy(wrong.backward(_x(seed=3))) - backend.to_numpy(right.backward(_x(seed=3)))).max()


@pytest.mark.parametrize("mistake, message", CACHE_AND_GRAD_MISTAKES, ids=[m for m, _ in CACHE_AND_GRAD_MISTAKES])
def test_a_rebound_grad_or_a_stale_cache_fails_with_its_own_message(mistake, message):
    """Each wrong layer passes the numbers of one forward and one backward, and is wrong in training:
    Adam leaves g where it was (the rebound .grad), dx is off by O(1) on a second batch or a second call."""
    with pytest.raises(AssertionError, match=message) as error:
        testing.assert_gradients_match(_Affine(mistake), _x())
    others = [m for other, m in CACHE_AND_GRAD_MISTAKES if other != mistake]
    assert not any(re.search(m, str(error.value)) for m in others), str(error.value)
    assert _harm(mistake) == 0 if mistake == "grad-rebound" else _harm(mistake) > 0.1
    testing.assert_gradients_match(_Affine(), _x())  # the right version passes


def test_random_array_and_randomize_draw_from_a_seed_or_from_one_generators_stream():
    """The one random-array helper (the study tools' too): an int seed gives the same array every time, parameter
    i of randomize its own seed + 101 i; a Generator gives its next draws, in turn (the study tools' instances);
    dtype None is the backend's default dtype (minitf.study.bugs builds its layers in it)."""
    a = testing.random_array(7, (2, 3), 0.5)
    np.testing.assert_array_equal(backend.to_numpy(a), np.random.default_rng(7).normal(0.0, 0.5, (2, 3)))
    assert a.dtype == np.float64 and not np.array_equal(backend.to_numpy(testing.random_array(8, (2, 3), 0.5)),
                                                        backend.to_numpy(a))
    rng, again = np.random.default_rng(5), np.random.default_rng(5)
    layer = testing.randomize(minitf.Linear(3, 2), rng)
    x = testing.random_array(rng, (4,), 2.0)
    np.testing.assert_array_equal(backend.to_numpy(layer.weight.data), again.normal(0.0, 0.5, (3, 2)))
    np.testing.assert_array_equal(backend.to_numpy(layer.bias.data), again.normal(0.0, 0.5, (2,)))
    np.testing.assert_array_equal(backend.to_numpy(x), again.normal(0.0, 2.0, (4,)))
    layer = testing.randomize(minitf.Linear(3, 2), 11)
    bias = np.random.default_rng(11 + 101).normal(0.0, 0.5, 2)  # the second parameter's seed
    np.testing.assert_array_equal(backend.to_numpy(layer.bias.data), bias)
    with backend.default_dtype("float32"):
        assert testing.random_array(0, (2,), dtype=None).dtype == np.float32
        assert testing.random_array(0, (2,)).dtype == np.float64


class _MixWithoutDy(minitf.Module):
    """y = x M over the last axis (M fixed), with a backward that never multiplies by dy: ones M^T, the gradient of
    sum(y). Not elementwise: dx_i depends on every dy_j of the row."""
    M = np.arange(16.0).reshape(4, 4) / 10 - 0.7

    def forward(self, x):
        return x @ backend.asarray(self.M)

    def backward(self, dy):
        return xp.ones_like(dy) @ backend.asarray(self.M).T


def test_a_backward_without_dy_in_a_layer_that_is_not_elementwise_is_told_so():
    """assert_gradients_match compares a failing gradient with the measured gradient for dy = 1, so a backward that
    never applies dy is told so in a layer where dx_i depends on every dy_j (the entrywise a x dy = n test cannot)."""
    x = testing.random_array(0, (2, 3, 4))
    with pytest.raises(AssertionError, match="upstream gradient dy is not applied"):
        testing.assert_gradients_match(_MixWithoutDy(), x)
