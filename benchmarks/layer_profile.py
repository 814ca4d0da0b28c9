"""Where the milliseconds of one minitf training step go: per-layer forward and backward.

    python benchmarks/layer_profile.py --config base [--steps 5]
    python benchmarks/layer_profile.py --gpt default           # the GPT's step (benchmarks/gpt_step.py's shapes)

Every module of the model gets its ``forward`` and ``backward`` wrapped (on the
instance, the classes are untouched) with a timer that charges each call its *own*
time: the time of the modules it calls is subtracted and charged to them. The two
attention functions of ``minitf.attention`` (the per-head core: scores, softmax, P V
and their backward) are timed the same way, as "attention core", and so are the loss,
``zero_grad`` and the Adam step. Rows are grouped by class (one row per class and
phase, summed over every instance), with the median over ``--steps`` steps after one
warm-up. The timers add a few microseconds per call (a few hundred calls a step).
"""
import argparse
import collections
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import minitf  # noqa: E402
from minitf.training.errors import add_renamed  # noqa: E402
minitf.backend.keep_freed_memory()  # as train.py runs (no page faults for each fresh temporary)
from minitf import backend  # noqa: E402
from benchmarks.common import CONFIGS, GPT_SHAPES, MinitfGPTStep, MinitfStep, load_reference, make_batch  # noqa: E402


class Timers:
    """Own time per label, with a stack so that a parent is not charged its children."""

    def __init__(self):
        self.own = collections.defaultdict(float)
        self.stack = []                                   # [start, time spent in children]

    def wrap(self, label, function):
        def timed(*args, **kwargs):
            self.stack.append([time.perf_counter(), 0.0])
            try:
                return function(*args, **kwargs)
            finally:
                backend.synchronize()
                start, children = self.stack.pop()
                total = time.perf_counter() - start
                self.own[label] += total - children
                if self.stack:
                    self.stack[-1][1] += total
        return timed


def instrument(lib, model, loss_fn, optimizer, timers):
    """Wrap every module's forward/backward, the attention core, the loss and Adam
    (``lib`` is the minitf package, or the copy of another revision)."""
    for module in model.modules():
        name = type(module).__name__
        for phase in ("forward", "backward"):
            setattr(module, phase, timers.wrap((name, phase), getattr(module, phase)))
    for phase in ("forward", "backward"):
        setattr(loss_fn, phase, timers.wrap(("loss", phase), getattr(loss_fn, phase)))
    optimizer.step = timers.wrap(("Adam", "step"), optimizer.step)
    optimizer.zero_grad = timers.wrap(("zero_grad", ""), optimizer.zero_grad)
    attention = lib.attention
    originals = (attention.scaled_dot_product_attention, attention.scaled_dot_product_attention_backward)
    attention.scaled_dot_product_attention = timers.wrap(("attention core", "forward"), originals[0])
    attention.scaled_dot_product_attention_backward = timers.wrap(("attention core", "backward"), originals[1])
    return originals


def _profiled_step(lib, c, batch):
    """An instrumented training step of ``lib``'s model (``MinitfStep``, or ``MinitfGPTStep`` for a GPT shape),
    its timers, and an undo."""
    step = MinitfGPTStep(c, lib=lib) if c.get("kind") == "gpt" else MinitfStep(c, batch, lib=lib)
    timers = Timers()
    originals = instrument(lib, step.model, step.loss_fn, step.optimizer, timers)

    def undo():
        lib.attention.scaled_dot_product_attention, lib.attention.scaled_dot_product_attention_backward = originals

    return step, timers, undo


def profile(c, batch, steps=5, libs=(minitf,)):
    """For each of ``libs`` (run alternately, step by step, after one warm-up step each):
    {(label, phase): median own seconds per step} and the median whole step."""
    runs = [_profiled_step(lib, c, batch) for lib in libs]
    samples = [collections.defaultdict(list) for _ in runs]
    totals = [[] for _ in runs]
    try:
        for i in range(steps + 1):
            for (step, timers, _), sample, total in zip(runs, samples, totals):
                timers.own.clear()
                start = time.perf_counter()
                step()
                if i:                                     # the first step is a warm-up
                    total.append(time.perf_counter() - start)
                    for key, value in timers.own.items():
                        sample[key].append(value)
    finally:
        for _, _, undo in runs:
            undo()
    results = [({key: statistics.median(v) for key, v in sample.items()}, statistics.median(total))
               for sample, total in zip(samples, totals)]
    return results[0] if len(libs) == 1 else results


def print_comparison(before, after, ref):
    """Two profiles side by side (``before`` of revision ``ref``, ``after`` of the working tree)."""
    (rows_b, total_b), (rows_a, total_a) = before, after
    print(f"| layer (own time, all instances) | phase | {ref} ms | working tree ms | change ms |")
    print("|---|---|---:|---:|---:|")
    for key in sorted(set(rows_b) | set(rows_a), key=lambda k: -rows_b.get(k, 0)):
        b, a = rows_b.get(key, 0.0), rows_a.get(key, 0.0)
        print(f"| {key[0]} | {key[1]} | {b * 1e3:.1f} | {a * 1e3:.1f} | {(a - b) * 1e3:+.1f} |")
    print(f"| **whole step** (median) | | {total_b * 1e3:.1f} | {total_a * 1e3:.1f} | "
          f"{(total_a - total_b) * 1e3:+.1f} |")


def print_table(rows, total):
    """A markdown table, largest first, with each row's share of the step."""
    print("| layer (own time, all instances) | phase | ms per step | % of step |")
    print("|---|---|---:|---:|")
    for (label, phase), seconds in sorted(rows.items(), key=lambda kv: -kv[1]):
        print(f"| {label} | {phase} | {seconds * 1e3:.1f} | {100 * seconds / total:.1f}% |")
    forward = sum(s for (label, phase), s in rows.items() if phase == "forward")
    backward = sum(s for (label, phase), s in rows.items() if phase == "backward")
    print(f"| **all forwards** (incl. loss) | | {forward * 1e3:.1f} | {100 * forward / total:.1f}% |")
    print(f"| **all backwards** (incl. loss) | | {backward * 1e3:.1f} | {100 * backward / total:.1f}% |")
    other = total - sum(rows.values())
    print(f"| outside any timer (model glue, embeddings' ids check) | | {other * 1e3:.1f} | "
          f"{100 * other / total:.1f}% |")
    print(f"| **whole step** (median) | | {total * 1e3:.1f} | 100% |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=list(CONFIGS), default="base")
    parser.add_argument("--steps", type=int, default=5)
    add_renamed(parser, "--baseline", "--ref", metavar="REV",
                help="also profile this git revision, alternating (before / after)")
    parser.add_argument("--gpt", choices=list(GPT_SHAPES), help="profile the GPT's step of this shape instead")
    args = parser.parse_args(argv)
    c = CONFIGS[args.config] if args.gpt is None else dict(GPT_SHAPES[args.gpt], kind="gpt")
    if args.gpt:
        args.config = f"GPT {args.gpt}"
    print(f"{args.config}: median of {args.steps} steps, load average {os.getloadavg()[0]:.2f}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}\n")
    if args.baseline is None:
        print_table(*profile(c, None if args.gpt else make_batch(c), args.steps))
        return
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        minitf_ref = load_reference(args.baseline, folder)
        before, after = profile(c, None if args.gpt else make_batch(c), args.steps, libs=(minitf_ref, minitf))
    print_comparison(before, after, args.baseline)


if __name__ == "__main__":
    main()
