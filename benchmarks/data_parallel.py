"""Tokens/s of train.py's update: 1 process with 2 BLAS threads against 2 MPI ranks
with 1 thread each, on `tiny` and `small`, timed alternately in one run, and the
all-reduce's share of the 2-rank step; 1 process with 1 thread bounds what 2 ranks can
reach (each rank is such a process on half the batch).

    python benchmarks/data_parallel.py [--steps 12] [--rounds 2] [--corpus synthetic]
    python benchmarks/data_parallel.py --binding [--rounds 3]   # mpiexec's placement of the 2 ranks

Each measurement runs ``mpiexec -n R`` on this file with ``--worker`` (R = 1 or 2): the
worker builds a Trainer on the default run's sentences (or made-up ones) and times updates
after a warm-up."""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from benchmarks.common import CONFIGS, run_config_fields, synthetic_corpus, tokenized_corpus  # noqa: E402
from minitf.nmt.config import PRESETS  # noqa: E402
from minitf.nmt.corpora import DEFAULT_CACHE, default_corpus_splits  # noqa: E402

#: the model sizes timed: the tiny preset's shape (benchmark.py's `default`) and `small`
SIZES = {"tiny": run_config_fields(CONFIGS["default"]), "small": run_config_fields(CONFIGS["small"])}
#: the default run's vocabulary: the tied output projection over it is a large share of the step's matrix
#: products, and the default corpus's short sentences make the rest small (a 200-token vocabulary on made-up
#: 8-29-word sentences made 2 ranks look 1.77x one process; the default run's data: 1.32x, at most 1.40x)
VOCAB = PRESETS["tiny"]["vocab_size"]


def worker(size, steps, folder, out):
    from minitf.training.distributed import init_mpi
    from minitf.training.config import RunConfig
    from minitf.nmt.data import Corpus, read_splits, token_batches
    from minitf.training.tokenizer import Tokenizer
    from minitf.nmt.translation_trainer import TranslationTrainer
    world = init_mpi()
    config = RunConfig.from_preset("tiny", **SIZES[size], vocab_size=VOCAB, max_tokens=1500, dropout=0.1,
                                   lexicon=0.0, max_steps=10 ** 6)  # sentences only, as the default run
    tok = Tokenizer(pathlib.Path(folder) / "tokenizer.model")
    paths = json.loads((pathlib.Path(folder) / "paths.json").read_text())
    trainer = TranslationTrainer(config, pathlib.Path(folder) / "run", tok, Corpus(tok, read_splits(paths), lambda m: None), lambda m: None,
                      progress=False, world=world)
    batches, _ = token_batches(*trainer.corpus.lengths("train"), config.max_tokens, 1, 0)
    coll = trainer.collectives
    reduce_time = [0.0]
    if coll is not None:  # time the all-reduce inside the step
        inner = coll.allreduce

        def timed(buf):
            start = time.perf_counter()
            inner(buf)
            reduce_time[0] += time.perf_counter() - start
        coll.allreduce = timed
    lengths = trainer.corpus.lengths("train")
    def step(b):  # the one update, for one process or N ranks alike
        trainer.update([b], lengths)
    for b in batches[:2]:
        step(b)
    reduce_time[0] = 0.0
    tokens = sum(int(lengths[1][b].sum()) for b in batches[2:2 + steps])
    world.barrier()
    start = time.perf_counter()
    for b in batches[2:2 + steps]:
        step(b)
    world.barrier()
    elapsed = time.perf_counter() - start
    if world.is_root:
        pathlib.Path(out).write_text(json.dumps(dict(tokens_per_s=tokens / elapsed, step_s=elapsed / steps,
                                                     allreduce_share=reduce_time[0] / elapsed,
                                                     n_params=int(trainer.optimizer.flat.data.size))))


#: mpiexec (hydra) placements compared by --binding: its default, and each rank bound to its own core
BINDINGS = {"default": [], "bind-to core": ["-bind-to", "core"]}


def measure(size, ranks, steps, folder, binding=(), threads=None):
    threads = str(threads or 2 // ranks)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads,
               MKL_NUM_THREADS=threads)
    out = pathlib.Path(folder) / "result.json"
    subprocess.run(["mpiexec", *binding, "-n", str(ranks), sys.executable, __file__, "--worker", size, str(steps), folder,
                    str(out)], env=env, check=True)
    return json.loads(out.read_text())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--binding", action="store_true", help="compare mpiexec's placements of 2 ranks on tiny")
    p.add_argument("--corpus", choices=["default", "synthetic"], default="default",
                   help="default: the default run's sentences (fetched once into --cache-dir, as train.py does); "
                        "synthetic: made-up sentences of 8 to 29 words")
    p.add_argument("--cache-dir", type=pathlib.Path, default=DEFAULT_CACHE)
    p.add_argument("--worker", nargs=4)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker[0], int(args.worker[1]), *args.worker[2:])
    with tempfile.TemporaryDirectory() as folder:
        if args.corpus == "default":  # the data of the default run, its tokenizer trained as train.py trains it
            splits = default_corpus_splits(args.cache_dir)
            paths = {"train_src": splits["train_src"], "train_tgt": splits["train_tgt"]}
            tokenized_corpus(paths, VOCAB, pathlib.Path(folder) / "tokenizer.model")
        else:
            synthetic_corpus(folder, VOCAB, words=2 * VOCAB)  # enough word types for VOCAB pieces
            paths = {"train_src": f"{folder}/train.src", "train_tgt": f"{folder}/train.tgt"}
        paths.update(valid_src=paths["train_src"], valid_tgt=paths["train_tgt"])  # validation is not timed
        (pathlib.Path(folder) / "paths.json").write_text(json.dumps({k: str(v) for k, v in paths.items()}))
        print(f"corpus: {args.corpus}")
        print(f"cores: {os.cpu_count()}; load average before: {os.getloadavg()[0]:.2f} "
              "(another workload on the machine shows here and in the spread between rounds)")
        if args.binding:
            return compare_bindings(args, folder)
        results = {}
        for round_ in range(args.rounds):  # alternate: 1 process, 2 ranks, 1 process, 2 ranks ...
            for size in SIZES:
                for ranks, threads in ((1, 2), (2, 1), (1, 1)):
                    r = measure(size, ranks, args.steps, folder, threads=threads)
                    results.setdefault((size, ranks, threads), []).append(r)
                    print(f"round {round_ + 1} {size:5s} {ranks} rank(s) x {threads} thread(s): "
                          f"{r['tokens_per_s']:8.0f} target tokens/s, {1000 * r['step_s']:6.1f} ms/step"
                          + (f", all-reduce {100 * r['allreduce_share']:.1f}% of the step" if ranks == 2 else ""),
                          flush=True)
        for size in SIZES:
            one, two, single = (statistics.median(r["tokens_per_s"] for r in results[(size, *key)])
                                for key in ((1, 2), (2, 1), (1, 1)))
            # 2 ranks can at best do twice what one 1-thread process does (a little more: half batches fit caches)
            print(f"{size}: median of {args.rounds}: 2 ranks / 1 process = {two / one:.2f}x; bound 2 x (1 thread) / "
                  f"(2 threads) = {2 * single / one:.2f}x ({results[(size, 1, 2)][0]['n_params']:,} parameters)")
        print(f"load average after: {os.getloadavg()[0]:.2f}")


def compare_bindings(args, folder):
    """2 ranks on tiny under each mpiexec placement, alternating, with 1 process as the reference."""
    results = {}
    for round_ in range(args.rounds):
        for name, flags in [("1 process", None), *BINDINGS.items()]:
            r = measure("tiny", 1 if flags is None else 2, args.steps, folder, flags or ())
            results.setdefault(name, []).append(r["tokens_per_s"])
            print(f"round {round_ + 1} {name:13s}: {r['tokens_per_s']:8.0f} target tokens/s", flush=True)
    one = statistics.median(results["1 process"])
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name:13s}: median {median:8.0f} target tokens/s ({min(values):.0f}-{max(values):.0f}), "
              f"{median / one:.2f}x one process")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
