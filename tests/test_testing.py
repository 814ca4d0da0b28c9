"""minitf.testing, the public gradient-test kit: the module form of assert_gradients_match
checks inputs and parameters, fails on a wrong backward, refuses float32 and catches a
backward that mutates its input; the strategies draw what they promise.
Tolerances: the defaults RTOL 1e-6, ATOL 1e-7 (float64 central differences)."""
import pytest
from hypothesis import given, strategies as st

import minitf
from minitf import backend, testing
from minitf.backend import xp

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


class _Mutating(minitf.Module):
    def forward(self, x):
        self.x = x
        return x * x

    def backward(self, dy):
        self.x *= 2  # mutates its input in place, then uses it: d(x^2) = 2x
        return dy * self.x


def test_a_wrong_backward_fails():
    with pytest.raises(AssertionError, match="x: relative error"):
        testing.assert_gradients_match(_WrongScale(), testing.random_array(0, (2, 3)))


def test_a_mutating_backward_fails():
    with pytest.raises(AssertionError, match="input x was mutated"):
        testing.assert_gradients_match(_Mutating(), testing.random_array(0, (2, 3)))


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
