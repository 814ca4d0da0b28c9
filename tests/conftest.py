"""Shared test set-up: hypothesis profiles and helpers.

Profiles: ``ci`` (default) keeps the suite within minutes on 2 cores;
``quick`` (5 examples) is for the time-boxed GPU check; ``thorough`` draws many
more examples for local runs:
    HYPOTHESIS_PROFILE=thorough python -m pytest

``MINITF_STRICT=1`` runs every test on the strict CuPy-like stand-in array module
(tests/strict_xp.py): a quick CPU check that the code and the tests keep host and
device arrays apart, as they must on a GPU.
"""
import os

import pytest
from hypothesis import HealthCheck, settings

from minitf import backend

settings.register_profile("ci", max_examples=30, deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("quick", max_examples=5, deadline=None,  # scripts/gpu_check.sh: a time-boxed GPU run
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def float64():
    """Gradient checks run in float64: central differences need the precision."""
    with backend.default_dtype("float64"):
        yield


@pytest.fixture(autouse=True)
def _cpu_and_seed():
    backend.manual_seed(0)
    yield


if os.environ.get("MINITF_STRICT") == "1":
    from tests import strict_xp

    @pytest.fixture(autouse=True)
    def _strict_backend(request, _cpu_and_seed):
        if request.path.name == "test_backend.py":  # those test the device selection itself
            yield
            return
        if request.path.name == "test_learns.py":
            pytest.skip("800 training steps are too slow through the strict wrapper; "
                        "tests/test_strict_backend.py covers the training step")
        with strict_xp.active():
            yield


@pytest.fixture
def corpus(tmp_path):
    """A tiny word-by-word German-English corpus in tmp_path, as train.py flags."""
    from tests.runs import make_corpus
    return make_corpus(tmp_path)
