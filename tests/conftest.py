"""Shared test set-up: hypothesis profiles and helpers.

Profiles: ``ci`` (default) keeps the suite within minutes on 2 cores;
``quick`` (5 examples) is for the time-boxed GPU check; ``thorough`` draws many
more examples for local runs:
    HYPOTHESIS_PROFILE=thorough python -m pytest

``MINITF_STRICT=1`` runs every test on the strict CuPy-like stand-in array module
(tests/strict_xp.py): a quick CPU check that the code and the tests keep host and
device arrays apart, as they must on a GPU.
"""
import importlib.util
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

# `python train.py` in a subprocess runs one process unless a test asks for ranks (it would start
# itself under mpiexec on every core: tests/test_data_parallel.py checks that path on purpose)
os.environ["MINITF_RANKS"] = "1"


def pytest_runtest_setup(item):
    """``@pytest.mark.extra(MODULE, EXTRA)``: a test that needs an optional extra skips, with the
    reason, where MODULE is missing (the README's test command installs only ``.[test,mpi]``);
    .ci/run's second step installs the extras and runs these tests with ``-m extra``."""
    for mark in item.iter_markers("extra"):
        module, extra = mark.args
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module}: pip install -e '.[{extra}]' (CI runs it in a second step)")


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


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    """Reference runs built once per session and shared by every test that needs one
    (each ~0.3 s): ``ref``: 6 steps, checkpoints at 2, 4, 6; ``vocab48``, ``dmodel32``,
    ``othertok``: runs whose checkpoints do not fit ``ref`` (another vocabulary size,
    model width, tokenizer). Tests only read them (a test that changes a run works on
    a copy, ``tests.runs.copy_run``); the end of the session checks that none changed."""
    from tests.runs import QUIET, TINY, make_corpus, snapshot, train
    base = tmp_path_factory.mktemp("world")
    corpus = make_corpus(base)
    other_corpus_dir = base / "other"
    other_corpus_dir.mkdir()
    other_corpus = make_corpus(other_corpus_dir, seed=1)
    common = TINY + QUIET + ["--max-steps", "6", "--save-every", "2", "--dropout", "0.2"]
    runs = {"ref": (corpus, []), "vocab48": (corpus, ["--vocab-size", "48"]),
            "dmodel32": (corpus, ["--d-model", "32"]), "othertok": (other_corpus, [])}
    for name, (data, extra) in runs.items():
        assert train(data + common + extra + ["--out", base / name]) == 0, name
    before = {name: snapshot(base / name) for name in runs}
    yield dict(base=base, corpus=corpus, common=common, **{name: base / name for name in runs})
    changed = [name for name in runs if snapshot(base / name) != before[name]]
    assert not changed, f"a test changed the shared reference runs {changed}: work on a copy (copy_run)"
