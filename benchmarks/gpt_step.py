"""One GPT training step: minitf.GPT against Hugging Face's GPT2LMHeadModel, each in a process of its own.

    python benchmarks/gpt_step.py --shape default|gpt2|tiny|all [--rounds 8] [--repeats 3] [--in-process]

What is timed: zero the gradients, forward, next-token cross-entropy (its value read as a
Python float), backward, Adam update (``MinitfGPTStep`` and ``TorchGPTStep`` of
``benchmarks/common.py``). The PyTorch model is ``transformers.GPT2LMHeadModel`` with the
config.json minitf would write for the same model (GPT-2's choices: pre-LN, tanh GELU, learned
positions, tied output projection), holding the same float32 parameters (copied from the minitf
model of the same seed; the first losses agree, printed) and the same dropout (0.1 on the embeddings and
the residual branches, none on the attention weights, as minitf; ``--dropout`` changes both);
``torch.optim.Adam`` with its default implementation and the same settings.

Method (as ``benchmarks/benchmark.py``): each framework runs in a fresh process of its own (this script with
``--worker``), ``--warmup`` untimed steps then ``--rounds`` timed ones; the processes take turns, ``--repeats``
of each, the order flipping every repeat (A B, B A, ...). In one process the two frameworks' threads meet:
PyTorch's OpenMP threads spin for a while after each of its parallel regions, on the cores minitf's next step
needs (the default shape, one process: minitf 220 ms against 242 ms for PyTorch; with
``OMP_WAIT_POLICY=PASSIVE``, no spinning, minitf 208-211 ms and PyTorch 254-257 ms: each side's number depends
on the other's threads). ``--in-process`` keeps that method: both in this process, alternating step by step.
Both use glibc's malloc as ``train.py`` does (``minitf.backend.keep_freed_memory``); PyTorch gets as many
threads (``torch.set_num_threads``) as NumPy's BLAS has. Prints, per shape, the median and spread (lowest,
highest) of each framework's steps, the ratio of the medians and the spread of the ratios of each repeat's
pair of medians (per round in one process). Shapes (``GPT_SHAPES``): ``default`` is the default
language-model run's (vocabulary 4096, d_model 192, 4 layers, 4 heads, d_ff 768, batch 16 x block 128);
``gpt2`` is GPT-2 small (124M parameters, vocabulary 50257) on batch 4 x block 64; ``tiny`` is for dry runs.
Needs the ``bench`` extra (torch, transformers); without it minitf is timed alone.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import minitf  # noqa: E402
minitf.backend.keep_freed_memory()  # as train.py runs (no page faults for each fresh temporary)
from benchmarks.common import (GPT_SHAPES, MinitfGPTStep, TorchGPTStep, Worker, blas_description,  # noqa: E402
                               blas_threads, cpu_model, matmul_peak_gflops, serve, spread)

ALL = ["default", "gpt2"]


def gpt_flops(shape):
    """Matmul FLOPs of one training step (forward and backward = 3 x forward): per layer the
    projections 2 N (4 D^2 + 2 D F) and the scores and P V 4 B L^2 D, and the output 2 N D V
    (N = B L tokens)."""
    B, L, D, F, V = shape["batch"], shape["block"], shape["d_model"], shape["d_ff"], shape["vocab_size"]
    N = B * L
    layer = 2 * N * (4 * D * D + 2 * D * F) + 4 * B * L * L * D
    return 3 * (shape["num_layers"] * layer + 2 * N * D * V)


def make_step(framework, shape, dropout):
    """A framework's step of ``shape``: minitf's, or PyTorch's holding the parameters of minitf's (seed 0)."""
    minitf_step = MinitfGPTStep(shape, dropout)
    return minitf_step if framework == "minitf" else TorchGPTStep(shape, minitf_step.model)


def in_process(name, args, have_torch):
    """Both frameworks in this process, alternating step by step: {framework: [seconds]}, first losses, counts
    and the per-round ratios."""
    shape = GPT_SHAPES[name]
    steps = {"minitf": MinitfGPTStep(shape, args.dropout)}
    if have_torch:
        steps["PyTorch"] = TorchGPTStep(shape, steps["minitf"].model)
    counts = {k: s.num_parameters for k, s in steps.items()}
    first = {k: s(0) for k, s in steps.items()}           # the first step: equal models, equal losses
    for i in range(1, args.warmup):
        for s in steps.values():
            s(i)
    times = {k: [] for k in steps}
    for r in range(args.rounds):
        for k, s in steps.items():
            start = time.perf_counter()
            s(args.warmup + r)
            times[k].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(times["minitf"], times["PyTorch"])] if have_torch else []
    return times, first, counts, ratios


def worker(args):
    """--worker FRAMEWORK: build the step, ``--warmup`` untimed steps, ``--rounds`` timed ones; the result is the
    worker's first line (``serve``)."""
    def start():
        if args.worker == "PyTorch":                      # (malloc as train.py's: at import, both frameworks)
            import torch
            torch.set_num_threads(blas_threads())
        step = make_step(args.worker, GPT_SHAPES[args.shape], args.dropout)
        first = step(0)
        for i in range(1, args.warmup):
            step(i)
        times = []
        for r in range(args.rounds):
            begin = time.perf_counter()
            step(args.warmup + r)
            times.append(time.perf_counter() - begin)
        return {"first": first, "times": times, "parameters": step.num_parameters}, None

    serve(start)


def in_processes(name, args, have_torch):
    """Each framework in fresh processes taking turns (``--repeats`` each, the order flipping): as in_process."""
    frameworks = ["minitf", "PyTorch"] if have_torch else ["minitf"]
    times, first, counts, medians = {k: [] for k in frameworks}, {}, {}, {k: [] for k in frameworks}
    argv = ["--shape", name, "--rounds", str(args.rounds), "--warmup", str(args.warmup), "--dropout", str(args.dropout)]
    for r in range(args.repeats):
        for framework in (frameworks if r % 2 == 0 else frameworks[::-1]):
            with Worker(__file__, framework, argv) as process:
                out = process.info
            times[framework] += out["times"]
            medians[framework].append(statistics.median(out["times"]))
            first[framework], counts[framework] = out["first"], out["parameters"]
    ratios = [a / b for a, b in zip(medians["minitf"], medians["PyTorch"])] if have_torch else []
    return times, first, counts, ratios


def bench_shape(name, args, have_torch):
    shape = GPT_SHAPES[name]
    times, first, counts, ratios = (in_process if args.in_process else in_processes)(name, args, have_torch)
    B, L = shape["batch"], shape["block"]
    flops = gpt_flops(shape)
    print(f"\n## {name}: vocabulary {shape['vocab_size']}, d_model {shape['d_model']}, {shape['num_layers']} layers, "
          f"{shape['num_heads']} heads, d_ff {shape['d_ff']}, batch {B} x block {L}; parameters "
          + ", ".join(f"{k} {v:,}" for k, v in counts.items()) + f"; dropout {args.dropout}")
    print("first-step loss: " + ", ".join(f"{k} {v:.6f}" for k, v in first.items()))
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    print("| framework | median step ms (spread) | tokens/s | GFLOP/s |")
    print("|---|---:|---:|---:|")
    for k, t in times.items():
        m = statistics.median(t)
        print(f"| {k} | {m * 1e3:.0f} ({spread(t)}) | {B * L / m:,.0f} | {flops / m / 1e9:.0f} |")
    if have_torch:
        ratio = statistics.median(times["minitf"]) / statistics.median(times["PyTorch"])
        per = "per-round ratios" if args.in_process else "ratios of each repeat's medians"
        print(f"\nminitf / PyTorch: **{ratio:.2f}x** (medians; {per} {spread(ratios, 1, 2)})")
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=list(GPT_SHAPES) + ["all"], default="all")
    parser.add_argument("--rounds", type=int, default=8, help="timed steps per framework (per process)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per framework first (at least 1)")
    parser.add_argument("--repeats", type=int, default=3, help="processes per framework, taking turns")
    parser.add_argument("--in-process", action="store_true",
                        help="both frameworks in this process, alternating step by step")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--worker", choices=["minitf", "PyTorch"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup < 1 or args.repeats < 1:
        parser.error(f"--rounds, --warmup and --repeats must be at least 1, got {args.rounds}, {args.warmup} "
                     f"and {args.repeats}")
    if args.worker:
        return worker(args)
    threads = blas_threads()
    try:
        import torch
        import transformers
        torch.set_num_threads(threads)
        versions = f"PyTorch {torch.__version__} ({torch.get_num_threads()} threads), transformers " \
                   f"{transformers.__version__}"
        have_torch = True
    except ImportError:
        versions, have_torch = 'no PyTorch (pip install -e ".[bench]"): minitf alone', False
    print(f"- command: `python benchmarks/gpt_step.py {' '.join(sys.argv[1:] if argv is None else argv)}`")
    print(f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}; load average before: {os.getloadavg()[0]:.2f}")
    print(f"- CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; NumPy {minitf.backend.host.__version__}, "
          f"BLAS {blas_description()}, {threads} threads; {versions}")
    print(f"- float32 matmul peak (2048^3, NumPy, best of 5): {matmul_peak_gflops('cpu'):.0f} GFLOP/s")
    print("- method: " + (f"one process, alternating step by step, {args.rounds} timed rounds after "
                          f"{args.warmup} warm-up step(s) each" if args.in_process else
                          f"a process per framework, {args.repeats} each taking turns (order flipping), "
                          f"{args.rounds} timed steps in each after {args.warmup} warm-up step(s)"))
    for name in (ALL if args.shape == "all" else [args.shape]):
        bench_shape(name, args, have_torch)


if __name__ == "__main__":
    main()
