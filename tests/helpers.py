"""Strategies and assertions shared by the gradient tests. They live in the public module
minitf.testing (so that a learner's own layer is tested the same way); this module keeps
the names the tests import."""
from minitf import backend
from minitf.testing import (ATOL, LN_RTOL, RTOL, arrays, assert_gradients_match, attention_masks,  # noqa: F401
                            padding_lengths, padding_masks, random_array, randomize, seeds, small,
                            upstream_gradients)

np = backend.host
