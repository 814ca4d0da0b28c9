#!/usr/bin/env bash
# GPU checks for minitf, for a machine with an NVIDIA GPU. Run from anywhere:
#
#     bash scripts/gpu_check.sh            # at most about 11 minutes: every step is time-boxed
#
# Written for the project's GPU test machine as it is: no network (nothing is installed
# here: a missing module is reported, not fetched), `python3` is the interpreter that has
# CuPy, NumPy, pytest and hypothesis (set PYTHON to use another), and minitf is not
# installed: the checkout is put first on PYTHONPATH, so every step imports it from here.
#
# 1. the GPU (nvidia-smi) and the Python modules, and where minitf is imported from;
# 2. every CUDA source of minitf/cuda_kernels.py compiled with NVRTC (tests/test_cuda_sources.py);
# 3. the gradient/property tests and tests/test_gpu.py (each kernel against its NumPy
#    reference) on the CuPy backend (hypothesis profile "quick": 5 examples per test);
# 4. one training step on NumPy and on CuPy compared (scripts/compare_devices.py);
# 5. the base configuration timed on the GPU (benchmarks/benchmark.py);
# 6. the base preset trained for about 3 minutes on a prepared synthetic corpus of WMT 2014
#    English-German's shape (scripts/wmt_gpu_throughput.py): target tokens/s, the fraction
#    of the GPU's peak, GPU memory (skipped where train.py has no --corpus-dir);
# 7. GPT-2 small (124M) training steps at block 1024 (scripts/gpt_gpu_throughput.py): tokens/s,
#    the fraction of the GPU's float32 matmul peak, the memory CuPy's pool holds.
# Exit status: 0 when every step passed, 1 otherwise (each step still runs).
#
# tests/test_gpu_check_script.py runs this script on the CPU (a dry run: nvidia-smi and
# CuPy replaced by stand-ins, smaller test and benchmark sets and shapes through the variables
# below); the script has not been run on a GPU yet.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
status=0
PY=${PYTHON:-python3}
TESTS=${GPU_CHECK_TESTS:-tests/test_layers.py tests/test_attention.py tests/test_transformer.py \
tests/test_loss_optim.py tests/test_decode.py tests/test_gpu.py}
BENCH=${GPU_CHECK_BENCH:---config base --steps 10}
WMT=${GPU_CHECK_WMT:---pairs 200000 --minutes 3}
GPT=${GPU_CHECK_GPT:---shape gpt2 --batch 8 --block 1024 --steps 20}

step() { printf '\n=== %s  (%s)\n' "$1" "$(date +%T)"; }
fail() { echo "*** FAILED: $1"; status=1; }

step "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || fail "nvidia-smi"

step "Python modules (nothing is installed by this script)"
command -v "$PY" >/dev/null || { fail "no interpreter '$PY' (set PYTHON)"; exit 1; }
$PY - <<'EOF' || { fail "a module is missing (see above); install it on a machine with network"; exit 1; }
import importlib, sys
missing = []
for name in ("numpy", "cupy", "pytest", "hypothesis"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '?')}")
    except ImportError as error:
        missing.append(f"{name} ({error})")
try:
    import torch
    print(f"torch {torch.__version__}")
except ImportError:
    print("(no torch: the benchmark times minitf alone)")
import minitf
print(f"minitf from {minitf.__file__}")
if missing:
    sys.exit("missing: " + ", ".join(missing))
EOF
$PY -c "import cupy; print('CuPy', cupy.__version__, '| CUDA devices:', cupy.cuda.runtime.getDeviceCount())" \
    || { fail "CuPy sees no device"; exit 1; }

step "every CUDA source compiled by NVRTC"
timeout 60 $PY -m pytest -q -p no:warnings -p no:cacheprovider tests/test_cuda_sources.py -rs \
    || fail "NVRTC compile test (exit $?)"

step "tests on CuPy (MINITF_DEVICE=gpu)"
# shellcheck disable=SC2086  # TESTS is a list of paths
MINITF_DEVICE=gpu HYPOTHESIS_PROFILE=quick timeout 180 $PY -m pytest -q -p no:warnings -p no:cacheprovider \
    $TESTS -rs || fail "tests on CuPy (exit $?; 124 = timed out)"

step "CPU vs GPU: one training step of the same seeded model"
timeout 45 $PY scripts/compare_devices.py || fail "compare_devices.py (exit $?)"

step "benchmark on the GPU ($BENCH)"
# shellcheck disable=SC2086
timeout 120 $PY benchmarks/benchmark.py --device gpu --in-process $BENCH || fail "benchmark (exit $?)"

step "base preset on a WMT-shaped prepared corpus ($WMT)"
# shellcheck disable=SC2086
timeout 420 $PY scripts/wmt_gpu_throughput.py $WMT || fail "wmt_gpu_throughput.py (exit $?; 124 = timed out)"

step "GPT-2 small training steps at block 1024 ($GPT)"
# shellcheck disable=SC2086
timeout 180 $PY scripts/gpt_gpu_throughput.py $GPT || fail "gpt_gpu_throughput.py (exit $?; 124 = timed out)"

step "done"
[ $status -eq 0 ] && echo "all GPU checks passed" || echo "some GPU checks FAILED (see *** above)"
exit $status
