"""scripts/gpu_check.sh end to end on the CPU: a dry run that stubs only the device.

The GPU test machine has no network, `python3` (not `python`) and no installed minitf;
the dry run reproduces that: `python3` is this interpreter, `python` does not work,
`nvidia-smi` prints a made-up GPU, and CuPy is tests/fake_gpu/cupy (NumPy arrays, one
"device", each CUDA kernel emulated after its signature is checked against the launch).
The NVRTC compile step is real (skipped inside where the wheels are missing). The test
and benchmark sets and shapes are the small ones the script's variables allow (GPU_CHECK_TESTS,
GPU_CHECK_BENCH, GPU_CHECK_WMT, GPU_CHECK_GPT), so that the run takes a minute, not eleven.
"""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")


def test_the_script_installs_nothing_and_uses_python3():
    text = SCRIPT.read_text()
    code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if "pip" in line.split()], "the GPU machine has no network"
    assert "PY=${PYTHON:-python3}" in text


def test_dry_run_of_gpu_check_passes_on_the_cpu(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # this interpreter with its packages (a symlink would lose a virtual environment's site-packages)
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").write_text("#!/bin/sh\necho 'python: not on the GPU machine' >&2\nexit 127\n")
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'dry run (no GPU), 0.0, 0 MiB'\n")
    (bin_dir / "pip").write_text("#!/bin/sh\necho 'pip: no network on the GPU machine' >&2\nexit 1\n")
    for name in ("python3", "python", "nvidia-smi", "pip"):
        (bin_dir / name).chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "MINITF_DEVICE")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=str(ROOT / "tests" / "fake_gpu"),
               GPU_CHECK_TESTS="tests/test_gpu.py",
               GPU_CHECK_BENCH="--config tiny --steps 1 --warmup 0",
               GPU_CHECK_WMT=f"--pairs 400 --minutes 0.4 --max-tokens 150 --vocab-size 300 --work {tmp_path / 'wmt'}",
               GPU_CHECK_GPT="--shape tiny --batch 2 --block 16 --steps 2 --warmup 1")
    result = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "all GPU checks passed" in output
    assert f"minitf from {ROOT / 'minitf' / '__init__.py'}" in output   # the checkout, not an installed copy
    assert "11 passed" in output                                        # tests/test_gpu.py ran, none skipped
    assert "all CPU/GPU comparisons within tolerance" in output
    assert "base preset," in output and "target tokens/s" in output     # the WMT-shaped throughput part ran
    assert "GPT tiny (26,368 parameters), batch 2 x block 16" in output and "tokens/s" in output  # the GPT part ran
