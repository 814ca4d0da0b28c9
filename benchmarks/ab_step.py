"""A/B one minitf training step: the working tree against a git revision, in one process.

    python benchmarks/ab_step.py --baseline HEAD --config small --rounds 10
    python benchmarks/ab_step.py --baseline HEAD --gpt default --rounds 10     # the GPT's step instead

The package as it is at ``--ref`` is extracted (``git show``) into a temporary folder
as ``minitf_ref`` (its imports rewritten), both versions build the same seeded model,
and their training steps (``MinitfStep`` of ``benchmarks/common.py``: zero_grad,
forward, loss, backward, Adam) run alternately on the same batch, both seeded alike
before every step (the same dropout masks), so both see the same machine state. Prints
the median and minimum step time of each, their ratio, and the largest parameter
difference after all steps (a check that the two compute the same thing: float32
summation order may differ, and Adam can move a parameter whose gradient is near zero
by up to about 2 lr either way).

Timings on a busy machine mostly measure the other work; NumPy's BLAS threads are
especially sensitive (set OPENBLAS_NUM_THREADS=1 to compare single-threaded).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import minitf  # noqa: E402
from minitf.training.errors import add_renamed  # noqa: E402
minitf.backend.keep_freed_memory()  # as train.py runs (no page faults for each fresh temporary)
from benchmarks.common import CONFIGS, GPT_SHAPES, MinitfGPTStep, MinitfStep, load_reference, make_batch  # noqa: E402

np = minitf.backend.host


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_renamed(parser, "--baseline", "--ref", default="HEAD", metavar="REV",
                help="git revision to compare with (default HEAD)")
    parser.add_argument("--config", choices=list(CONFIGS), default="small")
    parser.add_argument("--gpt", choices=list(GPT_SHAPES),
                        help="time the GPT's step (MinitfGPTStep) at this shape instead of --config's")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        minitf_ref = load_reference(args.baseline, folder)
        if args.gpt:  # each copy seeded once at 0 and drawing alike: the same dropout masks
            runs = {f"{args.baseline}": MinitfGPTStep(GPT_SHAPES[args.gpt], lib=minitf_ref),
                    "working tree": MinitfGPTStep(GPT_SHAPES[args.gpt])}
        else:
            c = CONFIGS[args.config]
            batch = make_batch(c)
            runs = {f"{args.baseline}": MinitfStep(c, batch, lib=minitf_ref, reseed=True),   # the same dropout masks
                    "working tree": MinitfStep(c, batch, reseed=True)}
        times = {name: [] for name in runs}
        losses = {name: [] for name in runs}
        for name, step in runs.items():
            losses[name].append(step(1))                 # warm-up
        for r in range(args.rounds):
            for name, step in runs.items():
                start = time.perf_counter()
                losses[name].append(step(r + 2))
                times[name].append(time.perf_counter() - start)
    what = f"GPT {args.gpt}" if args.gpt else args.config
    print(f"{what}, {args.rounds} alternating rounds, load average {os.getloadavg()[0]:.2f}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    for name in runs:
        print(f"  {name:>14}: median {statistics.median(times[name]) * 1e3:8.1f} ms   "
              f"min {min(times[name]) * 1e3:8.1f} ms   first losses {[round(v, 5) for v in losses[name][:3]]}")
    a, b = (statistics.median(times[name]) for name in runs)
    print(f"  working tree / {args.baseline}: {b / a:.3f} (median)")
    step_a, step_b = runs.values()  # the optimizer holds the flat parameter buffer
    diff = np.abs(minitf.backend.to_numpy(step_a.optimizer.flat.data)
                  - minitf.backend.to_numpy(step_b.optimizer.flat.data)).max()
    print(f"  largest parameter difference after all steps: {float(diff):.2e}")


if __name__ == "__main__":
    main()
