"""The backend seam: only minitf/backend.py imports numpy or cupy."""
import ast
import os
import pathlib
import platform
import re
import subprocess
import sys

import pytest

import minitf
from minitf import backend

PACKAGE = pathlib.Path(minitf.__file__).parent
ROOT = PACKAGE.parent


def test_only_the_backend_imports_numpy_or_cupy():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "backend.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}:{node.lineno} imports {n}" for n in names
                          if n.split(".")[0] in ("numpy", "cupy", "cupyx")]
    assert not offenders, offenders


def test_default_dtype_is_float32_and_switchable():
    assert backend.get_default_dtype() == backend.host.float32
    with backend.default_dtype("float64"):
        assert minitf.Linear(2, 3).weight.data.dtype == backend.host.float64
    assert minitf.Linear(2, 3).weight.data.dtype == backend.host.float32


def test_unknown_device_is_refused():
    with pytest.raises(ValueError, match="'cpu' or 'gpu'"):
        backend.set_device("tpu")


@pytest.mark.skipif(backend.gpu_available(), reason="a GPU is available here")
def test_gpu_without_cupy_or_device_names_the_fix():
    with pytest.raises(backend.DeviceError, match=r"pip install -e \.\[gpu\]|nvidia-smi"):
        backend.set_device("gpu")
    assert backend.get_device() == "cpu"


def test_same_seed_same_model():
    backend.manual_seed(7)
    a = minitf.Linear(3, 4).weight.data.copy()
    backend.manual_seed(7)
    b = minitf.Linear(3, 4).weight.data.copy()
    assert (backend.to_numpy(a) == backend.to_numpy(b)).all()


@pytest.mark.parametrize("message, names", [
    ("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version", "driver"),
    ("CuPy failed to load libcudart.so.12: OSError: libcudart.so.12: cannot open shared object file", "library"),
    ("cudaErrorNoDevice: no CUDA-capable device is detected", "device"),
])
def test_a_cuda_failure_names_the_missing_piece(monkeypatch, message, names):
    monkeypatch.setattr(backend, "_driver_library_loads", lambda: True)     # a driver is installed
    expected = {"driver": "driver is older", "library": r"CUDA library is missing.*\[ctk\]",
                "device": "sees no CUDA device"}[names]
    assert re.search(expected, backend.cuda_failure_reason(RuntimeError(message)))
    monkeypatch.setattr(backend, "_driver_library_loads", lambda: False)    # no driver at all
    assert "no NVIDIA driver was found" in backend.cuda_failure_reason(RuntimeError(message))


_FAULTS_SCRIPT = """
import resource, sys
import numpy
from minitf import backend
took = backend.keep_freed_memory() if sys.argv[1] == "keep" else None
size, count, steps = (int(a) for a in sys.argv[2:5])
def step():                                                   # like a training step: several large
    held = [numpy.ones(size, dtype=numpy.float32) for _ in range(count)]   # temporaries alive at once,
    del held                                                 # all freed at its end
step()                                                       # warm up: the heap grows once
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(steps):
    step()
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="mallopt is glibc's")
def test_keep_freed_memory_stops_the_page_faults_of_repeated_temporaries():
    """Freed 16 MiB temporaries come back from the heap instead of fresh memory: without
    the setting glibc returns them to the system (trim or munmap) and every step
    page-faults their 4 x 4,096 pages again; with it, almost none do."""
    took, kept = _faults("keep", 1 << 22, 4, 10)             # 4 x 16 MiB
    _, system = _faults("system", 1 << 22, 4, 10)
    assert took == "True"
    assert system > 2 * 4096, system                          # memory returned, then faulted in again
    assert kept < system / 20, (kept, system)


def _faults(mode, size, count, steps):
    """(whether keep_freed_memory took, page faults of ``steps`` steps after the first) of _FAULTS_SCRIPT."""
    out = subprocess.run([sys.executable, "-c", _FAULTS_SCRIPT, mode, str(size), str(count), str(steps)],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="mallopt is glibc's")
def test_keep_freed_memory_keeps_more_than_a_gibibyte_of_temporaries():
    """A step whose temporaries pass 1 GiB (3 x 512 MiB alive at once, as a SmolLM2-135M step's activations):
    with a trim threshold of 1 GiB glibc gave the memory above it back at each step's end and the next step
    faulted it in again (230,000 faults a step there); the setting never trims, so the steps after the first
    fault almost nothing in (a 512 MiB array is 131,072 pages)."""
    took, kept = _faults("keep", 1 << 27, 3, 2)
    assert took == "True"
    assert kept < 1000, kept
