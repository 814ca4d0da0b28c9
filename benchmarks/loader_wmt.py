"""The memory-mapped batch loader on a prepared corpus: time to the first batch, the
loader's time per batch, and the memory a training process holds beyond the arrays.

    python benchmarks/loader_wmt.py PREPARED [--max-tokens 25000] [--batches 200]
    mpiexec -n 2 python benchmarks/loader_wmt.py PREPARED --touch   # shared through the page cache?

Prints, per process: seconds to open the folder, to compute the lengths and to cut
epoch 0 into token-count batches (``minitf.nmt.data.token_batches``, the trainer's
rule, at the base preset's ``--max-tokens 25000``); the median and the 90th
percentile of ``IndexedCorpus.batch`` over ``--batches`` batches, taken in the epoch's
order (alternating with nothing: it is the only work); the resident memory after
each stage. ``--touch`` then reads every id of the training split (as an epoch does)
and prints /proc/self/smaps_rollup's Rss, Pss and private memory: with two ranks the
corpus pages are counted once between them (Pss about half of their Rss), not copied.
"""
import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from minitf.backend import host as np  # noqa: E402
from minitf.nmt.data import token_batches  # noqa: E402
from minitf.nmt.data import IndexedCorpus  # noqa: E402


def memory():
    """{field: MiB} from /proc/self/smaps_rollup (Linux)."""
    fields = {}
    try:
        for line in pathlib.Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return fields


def rss():
    return f"RSS {memory().get('Rss', float('nan')):.0f} MiB"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prepared", type=pathlib.Path)
    parser.add_argument("--max-tokens", type=int, default=25000)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--touch", action="store_true")
    args = parser.parse_args(argv)
    rank = ""
    if "mpi4py" in sys.modules or any(k.startswith("PMI_") for k in __import__("os").environ):
        from mpi4py import MPI
        rank = f"rank {MPI.COMM_WORLD.Get_rank()}: "
    print(f"{rank}start {rss()}", flush=True)
    t = time.perf_counter()
    corpus = IndexedCorpus(args.prepared)
    opened = time.perf_counter() - t
    t = time.perf_counter()
    lengths = corpus.lengths("train")
    measured = time.perf_counter() - t
    t = time.perf_counter()
    batches, skipped = token_batches(*lengths, args.max_tokens, seed=1, epoch=0, max_len=250)
    cut = time.perf_counter() - t
    print(f"{rank}{lengths[0].size:,} pairs: open {opened:.2f} s, lengths {measured:.2f} s, "
          f"{len(batches):,} batches of <= {args.max_tokens} tokens in {cut:.2f} s; {rss()}", flush=True)
    times, tokens = [], []
    for index in batches[:args.batches]:
        t = time.perf_counter()
        src, tgt_in, tgt_out = corpus.batch("train", index)
        times.append(time.perf_counter() - t)
        tokens.append(src.size)
    times = np.array(times) * 1000
    print(f"{rank}batch(): median {np.median(times):.2f} ms, 90th percentile {np.percentile(times, 90):.2f} ms "
          f"over {times.size} batches (median {int(np.median(tokens)):,} padded source tokens); {rss()}",
          flush=True)
    if args.touch:
        total = 0
        for side in ("src", "tgt"):
            flat = corpus._flat["train", side]
            for start in range(0, flat.size, 1 << 24):
                total += int(flat[start:start + (1 << 24)].sum(dtype=np.int64))
        m = memory()
        corpus_mib = sum(corpus._flat["train", s].nbytes + corpus._offsets["train", s].nbytes
                         for s in ("src", "tgt")) / 2 ** 20
        print(f"{rank}after reading every training id (checksum {total}): Rss {m.get('Rss', 0):.0f} MiB, "
              f"Pss {m.get('Pss', 0):.0f} MiB, private {m.get('Private_Clean', 0) + m.get('Private_Dirty', 0):.0f}"
              f" MiB, shared {m.get('Shared_Clean', 0) + m.get('Shared_Dirty', 0):.0f} MiB; the training arrays "
              f"are {corpus_mib:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
