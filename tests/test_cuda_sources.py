"""Every CUDA source of the package compiles with NVRTC, for every architecture the README
names, on a machine without a GPU (no device is needed to compile CUDA C to PTX).

Needs the ``cuda-compile`` extra (``cupy-cuda12x``, for its NVRTC binding, and
``nvidia-cuda-nvrtc-cu12``, the compiler library); skipped, with the reason, where either
is missing. The kernels' arithmetic is checked against the NumPy references only on a GPU
(tests/test_gpu.py, run by scripts/gpu_check.sh).
"""
import pathlib
import re

import pytest

from minitf import cuda_kernels

ROOT = pathlib.Path(__file__).resolve().parents[1]
needs_nvrtc = pytest.mark.extra("cupy_backends", "cuda-compile")


def _nvrtc():
    """NVRTC through CuPy's binding, or a skip naming what is missing."""
    try:
        from cupy_backends.cuda.libs import nvrtc
    except Exception as error:  # no cupy wheel (ImportError), or a broken one
        pytest.skip(f"needs CuPy's NVRTC binding (pip install -e .[cuda-compile]): {error}")
    try:
        nvrtc.getVersion()
    except Exception as error:  # the binding is there, the compiler library is not
        pytest.skip(f"needs the NVRTC library (pip install nvidia-cuda-nvrtc-cu12): {error}")
    return nvrtc


def compile_ptx(source, arch, name="kernel.cu"):
    """PTX text of ``source`` for virtual architecture ``arch``; NVRTCError carries the log."""
    nvrtc = _nvrtc()
    program = nvrtc.createProgram(source, name, [], [])
    try:
        try:
            nvrtc.compileProgram(program, [f"-arch={arch}", "--std=c++14"])
        except nvrtc.NVRTCError as error:
            raise AssertionError(f"{name} ({arch}) does not compile:\n{nvrtc.getProgramLog(program)}") from error
        ptx = nvrtc.getPTX(program)
    finally:
        nvrtc.destroyProgram(program)
    return ptx.decode() if isinstance(ptx, bytes) else ptx


@needs_nvrtc
@pytest.mark.parametrize("arch", cuda_kernels.ARCHITECTURES)
@pytest.mark.parametrize("name", sorted(cuda_kernels.SOURCES))
def test_every_kernel_source_compiles(name, arch):
    supported = _nvrtc().getSupportedArchs()
    if int(arch.split("_")[1]) not in supported:     # e.g. NVRTC 13 dropped Volta (70)
        pytest.skip(f"this NVRTC {_nvrtc().getVersion()} does not compile for {arch} (supports {supported})")
    source, entries, reference = cuda_kernels.SOURCES[name]
    assert reference, f"{name}: name its NumPy reference"
    ptx = compile_ptx(source, arch, f"{name}.cu")
    defined = set(re.findall(r"\.entry\s+(\w+)", ptx))
    assert set(entries) <= defined, f"{name}: entry points {sorted(set(entries) - defined)} missing from the PTX"


@needs_nvrtc
def test_a_broken_kernel_is_refused_with_the_compilers_message():
    with pytest.raises(AssertionError, match="undefined|identifier"):
        compile_ptx('extern "C" __global__ void broken(float* x) { x[0] = y; }', "compute_90", "broken.cu")


def test_no_kernel_source_lives_outside_cuda_kernels():
    """Every kernel the package builds comes from minitf/cuda_kernels.py, so the test above
    covers all of them: no inline RawKernel / ElementwiseKernel / ReductionKernel source elsewhere."""
    offenders = [str(path.relative_to(ROOT)) for path in (ROOT / "minitf").rglob("*.py")
                 if path.name != "cuda_kernels.py"
                 and re.search(r"\b(RawKernel|RawModule|ElementwiseKernel|ReductionKernel)\b", path.read_text())]
    assert not offenders, f"kernel sources outside minitf/cuda_kernels.py: {offenders}"
