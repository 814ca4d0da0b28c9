"""Strategies and assertions shared by the gradient tests."""
from hypothesis import strategies as st

from minitf import backend
from minitf.backend import xp
from minitf.gradcheck import compare_gradients, gradients_match

np = backend.host


def random_array(seed, shape, scale=1.0):
    """Normal values from a hypothesis-drawn seed, as a float64 device array."""
    return backend.asarray(np.random.default_rng(seed).normal(0.0, scale, shape), dtype=xp.float64)


def randomize(module, seed, scale=0.5):
    """Random values in every parameter (biases and LayerNorm gains too), so that
    no gradient is checked only at its initial zero/one value or at a ReLU kink."""
    for i, p in enumerate(module.parameters()):
        p.data[...] = random_array(seed + 101 * i, p.shape, scale)
    return module


seeds = st.integers(0, 2**32 - 1)
small = st.integers(1, 4)


@st.composite
def padding_masks(draw, batch, length, allow_all_padded=False):
    """(B, L) bool, True = padding. Real tokens first, then padding, as a data
    loader makes them; with ``allow_all_padded`` a row may be padding only."""
    low = 0 if allow_all_padded else 1
    lengths = [draw(st.integers(low, length)) for _ in range(batch)]
    mask = np.arange(length)[None, :] >= np.array(lengths)[:, None]
    return backend.asarray(mask)


def assert_gradients_match(forward, backward, inputs, params=(), seed=0, tol=1e-6, atol=1e-7, reseed=None):
    """Every analytical gradient matches central differences (float64) by
    :func:`minitf.gradcheck.gradients_match`: max |a - n| <= tol * max(|a|, |n|) + atol;
    and backward leaves its inputs unchanged."""
    before = {name: backend.to_numpy(a).copy() for name, a in inputs.items()}
    report = compare_gradients(forward, backward, inputs, dict(params), seed=seed, reseed=reseed)
    assert report, "nothing was checked"
    for name, analytic, numeric, error in report:
        assert gradients_match(analytic, numeric, tol, atol), \
            f"{name}: relative error {error:.2e}\nanalytic={analytic}\nnumeric={numeric}"
    for name, a in inputs.items():  # backward must not mutate its inputs
        assert np.array_equal(before[name], backend.to_numpy(a)), f"input {name} was mutated"
    return report
