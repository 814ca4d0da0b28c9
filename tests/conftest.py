"""Shared test set-up: hypothesis profiles and helpers.

Profiles: ``ci`` (default) keeps the suite within minutes on 2 cores;
``thorough`` draws many more examples for local runs:
    HYPOTHESIS_PROFILE=thorough python -m pytest
"""
import os

import pytest
from hypothesis import HealthCheck, settings

from minitf import backend

settings.register_profile("ci", max_examples=30, deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=200, deadline=None,
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
