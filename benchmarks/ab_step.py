"""A/B one minitf training step: the working tree against a git revision, in one process.

    python benchmarks/ab_step.py --ref HEAD --config small --rounds 10

The package as it is at ``--ref`` is extracted (``git show``) into a temporary folder
as ``minitf_ref`` (its imports rewritten), both versions build the same seeded model,
and their training steps (zero_grad, forward, loss, backward, Adam) run alternately on
the same batch, so both see the same machine state. Prints the median and minimum step
time of each, their ratio, and the largest parameter difference after all steps (a
check that the two compute the same thing: float32 summation order may differ, and Adam
can move a parameter whose gradient is near zero by up to about 2 lr either way).

Timings on a busy machine mostly measure the other work; NumPy's BLAS threads are
especially sensitive (set OPENBLAS_NUM_THREADS=1 to compare single-threaded).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import minitf  # noqa: E402
minitf.backend.keep_freed_memory()  # as train.py runs (no page faults for each fresh temporary)
from benchmark import CONFIGS, make_batch  # noqa: E402

np = minitf.backend.host


def extract_reference(ref, folder):
    """Write minitf/*.py at ``ref`` into folder/minitf_ref/ with imports renamed."""
    names = subprocess.run(["git", "-C", ROOT, "ls-tree", "--name-only", f"{ref}:minitf"],
                           capture_output=True, text=True, check=True).stdout.split()
    package = os.path.join(folder, "minitf_ref")
    os.makedirs(package)
    for name in names:
        if not name.endswith(".py"):
            continue
        text = subprocess.run(["git", "-C", ROOT, "show", f"{ref}:minitf/{name}"],
                              capture_output=True, text=True, check=True).stdout
        text = re.sub(r"\bfrom minitf\b", "from minitf_ref", text)
        text = re.sub(r"^import minitf$", "import minitf_ref", text, flags=re.M)
        with open(os.path.join(package, name), "w") as handle:
            handle.write(text)


def stepper(lib, c, batch):
    lib.manual_seed(0)
    model = lib.Transformer(c["vocab"], c["vocab"], d_model=c["d_model"], num_heads=c["heads"],
                            num_encoder_layers=c["layers"], num_decoder_layers=c["layers"],
                            d_ff=c["d_ff"], dropout=0.1)
    loss_fn = lib.LabelSmoothedCrossEntropy(0.1, 0)
    optimizer = lib.Adam(model.parameters(), lr=1e-4)
    src, tgt_in, tgt_out = batch

    def step(seed):
        lib.manual_seed(seed)                            # the same dropout masks in both
        optimizer.zero_grad()
        loss = loss_fn(model(src, tgt_in), tgt_out)
        model.backward(loss_fn.backward())
        optimizer.step()
        return loss

    return step, optimizer


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", default="HEAD", help="git revision to compare with (default HEAD)")
    parser.add_argument("--config", choices=list(CONFIGS), default="small")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    c = CONFIGS[args.config]
    batch = make_batch(c)
    with tempfile.TemporaryDirectory() as folder:
        extract_reference(args.ref, folder)
        sys.path.insert(0, folder)
        import minitf_ref
        runs = {f"{args.ref}": stepper(minitf_ref, c, batch), "working tree": stepper(minitf, c, batch)}
        times = {name: [] for name in runs}
        losses = {name: [] for name in runs}
        for name, (step, _) in runs.items():
            losses[name].append(step(1))                 # warm-up
        for r in range(args.rounds):
            for name, (step, _) in runs.items():
                start = time.perf_counter()
                losses[name].append(step(r + 2))
                times[name].append(time.perf_counter() - start)
    print(f"{args.config}, {args.rounds} alternating rounds, load average {os.getloadavg()[0]:.2f}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    for name in runs:
        print(f"  {name:>14}: median {statistics.median(times[name]) * 1e3:8.1f} ms   "
              f"min {min(times[name]) * 1e3:8.1f} ms   first losses {[round(v, 5) for v in losses[name][:3]]}")
    a, b = (statistics.median(times[name]) for name in runs)
    print(f"  working tree / {args.ref}: {b / a:.3f} (median)")
    (_, optimizer_a), (_, optimizer_b) = runs.values()  # the optimizer holds the flat parameter buffer
    diff = np.abs(minitf.backend.to_numpy(optimizer_a.flat.data) - minitf.backend.to_numpy(optimizer_b.flat.data)).max()
    print(f"  largest parameter difference after all steps: {float(diff):.2e}")


if __name__ == "__main__":
    main()
