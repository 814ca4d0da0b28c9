"""Numerical gradients by central differences, and a side-by-side comparison with a layer's
hand-written backward. The tests use these helpers (through minitf.testing), and so do the
learner's commands ``python -m minitf.gradcheck LAYER`` and ``python -m minitf.exercise``.

A scalar loss ``L = sum(forward(inputs) * G)`` with a random upstream gradient ``G`` makes
``backward(G)`` the exact vector-Jacobian product to compare with

    dL/dx_i  ~  (L(x + h e_i) - L(x - h e_i)) / (2 h)        (error O(h^2))

Run it in float64 (``backend.default_dtype('float64')``): in float32 the rounding error of L
swamps the O(h^2) term.

One module per job:

- ``numeric``: the central differences and the comparison (:func:`compare_gradients`,
  :func:`gradients_match`, the pass criterion);
- ``protocol``: the rules that matching numbers alone do not enforce (:func:`protocol_problems`,
  :func:`cache_problems`);
- ``report``: what a failed check says (:func:`diagnose`, :func:`describe_worst`) and the
  command-line report of one check (:func:`print_check`);
- ``catalogue``: the library's layers the command checks (``LAYERS``; add one with ``@layer``);
- ``command``: the command itself (:func:`main`); ``__main__`` runs it.

The learner's own code is loaded and run under guard by :mod:`minitf.study.tools`.
"""
from minitf.gradcheck.catalogue import LAYERS  # noqa: F401 (the API)
from minitf.gradcheck.command import main  # noqa: F401
from minitf.gradcheck.numeric import (compare_gradients, gradients_match, numerical_gradient,  # noqa: F401
                                      relative_error, sum_gradient, upstream_gradients)
from minitf.gradcheck.protocol import cache_problems, protocol_problems  # noqa: F401
from minitf.gradcheck.report import describe_worst, diagnose, print_check, worst_entry  # noqa: F401
