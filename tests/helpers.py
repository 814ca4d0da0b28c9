"""Strategies and assertions shared by the gradient tests. They live in the public module
minitf.testing (so that a learner's own layer is tested the same way); this module keeps
the names the tests import."""
from minitf import backend
from minitf.testing import (ATOL, LN_RTOL, RTOL, arrays, assert_gradients_match, attention_masks,  # noqa: F401
                            padding_lengths, padding_masks, random_array, randomize, seeds, small,
                            upstream_gradients)

np = backend.host


def relative_difference(a, b, floor=0.0):
    """max |a - b| / max(max |a|, max |b|, floor): how the parity tests (PyTorch, GPT-2, Marian) compare arrays."""
    scale = max(float(np.abs(a).max(initial=0)), float(np.abs(b).max(initial=0)), floor, 1e-300)
    return float(np.abs(a - b).max(initial=0)) / scale
