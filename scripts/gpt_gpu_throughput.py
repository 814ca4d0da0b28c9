"""GPT-2 small (124M) training steps at block 1024 on one GPU: tokens/s, the fraction of the
GPU's float32 matmul peak that makes, and the GPU memory it takes.

    python3 scripts/gpt_gpu_throughput.py [--batch 8] [--block 1024] [--steps 20] [--shape gpt2]

The step is ``MinitfGPTStep`` of benchmarks/common.py (zero_grad, forward, next-token
cross-entropy, backward, Adam; dropout 0.1) on random token ids, on the GPU (CuPy), float32.
After ``--warmup`` steps, ``--steps`` steps are timed (each ends with a device synchronisation):
tokens/s = batch x block / median step; model FLOPs per step are the matmuls' (per layer the
projections 2 N (4 D^2 + 2 D F), the scores and P V 4 B L^2 D; the output 2 N D V; backward
twice the forward); "% of peak" is their rate over the best float32 GFLOP/s of one (2048 x
2048) @ (2048 x 2048) CuPy product measured in this process (``matmul_peak_gflops``, as
benchmarks/benchmark.py reports it). Memory: the bytes CuPy's memory pool holds after the
steps (it only grows: its peak; parameters, gradients, Adam's moments and activations).

Called by scripts/gpu_check.sh; ``--shape tiny`` (with a small ``--block``) is its CPU dry run.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from minitf import backend  # noqa: E402
from benchmarks.common import GPT_SHAPES, MinitfGPTStep, gpt_batch, matmul_peak_gflops  # noqa: E402


def gpt_flops(shape):
    """Matmul FLOPs of one GPT training step (see the module docstring)."""
    B, L, D, F, V = shape["batch"], shape["block"], shape["d_model"], shape["d_ff"], shape["vocab_size"]
    N = B * L
    return 3 * (shape["num_layers"] * (2 * N * (4 * D * D + 2 * D * F) + 4 * B * L * L * D) + 2 * N * D * V)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=["gpt2", "tiny"], default="gpt2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    shape = GPT_SHAPES[args.shape] | dict(batch=args.batch, block=args.block)
    if not 1 <= args.block <= shape["max_len"] or args.batch < 1 or args.steps < 1 or args.warmup < 0:
        parser.error(f"need 1 <= --block <= {shape['max_len']}, --batch and --steps >= 1, --warmup >= 0; "
                     f"got {args.block}, {args.batch}, {args.steps}, {args.warmup}")
    backend.set_device("gpu")
    peak = matmul_peak_gflops("gpu")
    pool = backend.xp.get_default_memory_pool()
    step = MinitfGPTStep(shape, batch=gpt_batch(shape))
    for i in range(args.warmup):
        step(i)
    times, losses = [], []
    for i in range(args.steps):
        start = time.perf_counter()
        losses.append(step(args.warmup + i))
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    achieved = gpt_flops(shape) / median / 1e9
    print(f"GPT {args.shape} ({step.num_parameters:,} parameters), batch {args.batch} x block {args.block}, "
          f"float32, {args.steps} steps after {args.warmup} warm-up: median step {median * 1e3:.1f} ms "
          f"({min(times) * 1e3:.1f}-{max(times) * 1e3:.1f}), {args.batch * args.block / median:,.0f} tokens/s, "
          f"{achieved:,.0f} GFLOP/s = {achieved / peak:.1%} of the float32 matmul peak ({peak:,.0f} GFLOP/s); "
          f"CuPy pool {pool.total_bytes() / 2 ** 20:,.0f} MiB; loss {losses[0]:.3f} -> {losses[-1]:.3f}")


if __name__ == "__main__":
    main()
