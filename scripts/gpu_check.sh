#!/usr/bin/env bash
# GPU checks for minitf, for a machine with an NVIDIA GPU (CUDA 12). Run from anywhere:
#
#     bash scripts/gpu_check.sh            # at most 8 minutes: every step is time-boxed (150+180+45+100 s)
#
# 1. installs the gpu, test and bench extras (skipped when CuPy already imports: the
#    machine may have no network);
# 2. runs the gradient/property tests and tests/test_gpu.py on the CuPy backend
#    (hypothesis profile "quick": 5 examples per test, CuPy compiles every kernel once);
# 3. compares one training step on NumPy and CuPy (scripts/compare_devices.py);
# 4. times the base configuration on the GPU (benchmarks/benchmark.py).
# Exit status: 0 when every step passed, 1 otherwise (each step still runs).
# Written on a CPU-only machine: this script itself has not been run on a GPU yet.
set -u
cd "$(dirname "$0")/.."
status=0
PY=${PYTHON:-python}

step() { printf '\n=== %s  (%s)\n' "$1" "$(date +%T)"; }
fail() { echo "*** FAILED: $1"; status=1; }

step "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || fail "nvidia-smi"

step "install (.[gpu,test,bench])"
if $PY -c "import cupy, hypothesis, pytest" 2>/dev/null; then
    echo "CuPy, pytest and hypothesis already import; not reinstalling"
    $PY -c "import torch" 2>/dev/null || echo "(no torch: the benchmark will time minitf alone)"
else
    timeout 150 $PY -m pip install -q -e ".[gpu,test,bench]" || fail "pip install -e .[gpu,test,bench]"
fi
$PY -c "import cupy; print('CuPy', cupy.__version__, '| CUDA devices:', cupy.cuda.runtime.getDeviceCount())" \
    || { fail "CuPy does not import or sees no device"; exit 1; }

step "tests on CuPy (MINITF_DEVICE=gpu)"
MINITF_DEVICE=gpu HYPOTHESIS_PROFILE=quick timeout 180 $PY -m pytest -q -p no:warnings \
    tests/test_layers.py tests/test_attention.py tests/test_transformer.py tests/test_loss_optim.py \
    tests/test_decode.py tests/test_gpu.py -rs || fail "tests on CuPy (exit $?; 124 = timed out)"

step "CPU vs GPU: one training step of the same seeded model"
timeout 45 $PY scripts/compare_devices.py || fail "compare_devices.py (exit $?)"

step "benchmark: base on the GPU"
timeout 100 $PY benchmarks/benchmark.py --config base --device gpu --steps 10 || fail "benchmark (exit $?)"

step "done"
[ $status -eq 0 ] && echo "all GPU checks passed" || echo "some GPU checks FAILED (see *** above)"
exit $status
