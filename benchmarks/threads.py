"""One thread against several for NumPy's elementwise and row-wise work (``minitf.backend.by_rows``), per use.

    python benchmarks/threads.py                       # every part, backend.threads() threads (the default)
    python benchmarks/threads.py --threads 2 --rounds 7 --part adam --params 20000000
    python benchmarks/threads.py --part threshold      # where splitting starts to pay (THREAD_MIN_ELEMENTS)

Each part runs the same work with ``backend.thread_count(1)`` (the plain NumPy lines, inline) and with
``--threads``, alternating, a warm-up first; prints the median (lowest-highest) of each, their ratio, and
whether the two results are the same bytes (they must be: the threaded path is bit-identical; clipping's
norm, a whole-buffer sum, is equal to rounding instead).

Parts (shapes as in docs/benchmarks.md: opus-mt's fine-tuning step, 960 target tokens, vocabulary 58,101):
``adam`` one Adam step over ``--params`` float32 parameters (74M: opus-mt's), ``zero_grad``, ``clip`` (the
norm and the scaling); ``loss`` the label-smoothed loss forward and backward over (960, 58101) logits;
``layernorm`` forward and backward over (``--rows``, 512); ``silu``/``gelu`` forward and backward over
(``--rows``, 2048); ``dropout`` over (``--rows``, 512); ``softmax`` the attention core's forward and backward
over (B, H, T, T) = (32, 8, 64, 64); ``decode_attention`` one cached decoding step's attention core (64
sentences, 8 heads, one query against 30 cached positions); ``decode_normalizer`` beam search's log-softmax
normalizer over the vocabulary at one step (nmt/decode.py's ``shifted_exp_sums`` and the log), (beam x batch,
V) = (32, ``--vocab``) logits. ``threshold``: softmax over (rows, 512) for
growing row counts, to place ``backend.THREAD_MIN_ELEMENTS``. ``in_place --baseline REV``: GELU's tanh form (forward
and backward over (``--rows``, 768)) and the attention core with its backward at the default GPT run's shape
((16, 4, 128, 48), causal), this tree's code (each step into an array it already has) against revision REV's
(999164a: the plain lines, a fresh array for each operation), alternating, on 1 thread and on ``--threads``.

Timings on a busy machine mostly measure the other work: compare ratios of runs made on a quiet one.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import minitf  # noqa: E402
from minitf.training.errors import add_renamed  # noqa: E402
minitf.backend.keep_freed_memory()  # as train.py runs (no page faults for each fresh temporary)
from benchmarks.common import cpu_model, blas_description  # noqa: E402
from minitf import backend  # noqa: E402
from minitf.attention import MultiHeadAttention, scaled_dot_product_attention  # noqa: E402
from minitf.attention import scaled_dot_product_attention_backward  # noqa: E402
from minitf.layers import GELU, Dropout, LayerNorm, SiLU  # noqa: E402
from minitf.loss import LabelSmoothedCrossEntropy  # noqa: E402
from minitf.module import Parameter, no_grad  # noqa: E402
from minitf.optim import Adam, clip_grad_norm  # noqa: E402

np = backend.host


def rand(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * scale)


def as_list(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


def same_bytes(a, b):
    return all(np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes()
               for x, y in zip(as_list(a), as_list(b)))


def compare(name, setup, run, threads, rounds, result=None):
    """Alternate ``run(state)`` on 1 and ``threads`` threads (``setup()`` makes a fresh state before each, not
    timed); prints medians, ratio and whether ``result(state)`` is the same bytes on both."""
    times = {1: [], threads: []}
    results = {}
    for r in range(rounds + 1):                                 # round 0: the warm-up
        for count in ((1, threads) if r % 2 else (threads, 1)):
            state = setup()
            with backend.thread_count(count):
                start = time.perf_counter()
                run(state)
                elapsed = time.perf_counter() - start
            if r:
                times[count].append(elapsed)
            results[count] = (result or (lambda s: s))(state)
            del state
    one, many = statistics.median(times[1]), statistics.median(times[threads])
    same = same_bytes(results[1], results[threads])
    print(f"{name:18s} 1 thread {one * 1e3:9.2f} ms ({min(times[1]) * 1e3:.2f}-{max(times[1]) * 1e3:.2f})   "
          f"{threads} threads {many * 1e3:9.2f} ms ({min(times[threads]) * 1e3:.2f}-{max(times[threads]) * 1e3:.2f})"
          f"   {many / one:5.2f}x   {'same bytes' if same else 'DIFFERENT bytes'}", flush=True)
    return one, many, same


def adam_parts(args):
    n = args.params

    def setup():
        params = [Parameter(rand((n,), 1, 1e-2))]
        opt = Adam(params, lr=1e-4)
        opt.flat.grad[...] = rand((n,), 2, 1e-3)
        return opt
    compare("adam step", setup, lambda opt: opt.step(), args.threads, args.rounds,
            lambda opt: (opt.flat.data, opt.m, opt.v))
    compare("zero_grad", setup, lambda opt: opt.zero_grad(), args.threads, args.rounds, lambda opt: opt.flat.grad)
    compare("clip (norm+scale)", setup, lambda opt: clip_grad_norm(opt.params, 1e-3), args.threads, args.rounds,
            lambda opt: opt.flat.grad)


def loss_part(args):
    N, V = args.tokens, args.vocab

    def setup():
        logits = rand((1, N, V), 3, 3.0)
        target = np.random.default_rng(4).integers(1, V, (1, N))
        return {"logits": logits, "target": target, "fn": LabelSmoothedCrossEntropy(0.1)}

    def run(s):
        s["loss"] = s["fn"](s["logits"], s["target"])
        s["dlogits"] = s["fn"].backward()
    compare("loss fwd+bwd", setup, run, args.threads, args.rounds, lambda s: s["dlogits"])


def layer_part(name, make, shape, args):
    def setup():
        backend.manual_seed(0)
        return {"layer": make(), "x": rand(shape, 5, 2.0), "dy": rand(shape, 6)}

    def run(s):
        s["y"] = s["layer"](s["x"])
        s["dx"] = s["layer"].backward(s["dy"])
    compare(name, setup, run, args.threads, args.rounds, lambda s: (s["y"], s["dx"]))


def softmax_part(args):
    shape = (32, 8, 64, 64)

    def setup():
        return {"Q": rand(shape, 7), "K": rand(shape, 8), "U": rand(shape, 9), "dO": rand(shape, 10),
                "keep": ~np.triu(np.ones(shape[2:], dtype=bool), k=1)[None, None]}

    def run(s):
        s["O"], s["P"] = scaled_dot_product_attention(s["Q"], s["K"], s["U"], s["keep"])
        s["grads"] = scaled_dot_product_attention_backward(s["dO"], s["Q"], s["K"], s["U"], s["P"])
    compare("attention core", setup, run, args.threads, args.rounds, lambda s: [s["O"], s["P"], *s["grads"]])


def decode_attention_part(args):
    B, D, L = 64, 512, 30
    backend.manual_seed(0)
    attention = MultiHeadAttention(D, 8)

    def setup():
        cache = {}
        with no_grad():
            attention(rand((B, L, D), 11), cache=cache)          # 30 positions in the cache
        return {"cache": cache, "x": rand((B, 1, D), 12)}

    def run(s):
        with no_grad():
            for _ in range(12):                                   # the 12 attentions of a 6-layer decoder step
                s["y"] = attention.forward(s["x"], cache=dict(s["cache"], length=L))
    compare("decode attention", setup, run, args.threads, args.rounds, lambda s: s["y"])


def decode_normalizer_part(args):
    from minitf.nmt.decode import shifted_exp_sums
    logits = rand((32, args.vocab), 14, 3.0)                      # beam 4 x 8 sentences, or 32 greedy rows

    def setup():
        return {"logits": logits.copy(), "row_max": logits.max(axis=1, keepdims=True)}

    def run(s):
        s["log_sum"] = np.log(shifted_exp_sums(s["logits"], s["row_max"]))
    compare("decode normalizer", setup, run, args.threads, args.rounds, lambda s: (s["logits"], s["log_sum"]))


def threshold_part(args):
    from minitf.layers import softmax
    for rows in (32, 64, 128, 256, 512, 1024, 2048):
        x = rand((rows, 512), 13)
        saved = backend.THREAD_MIN_ELEMENTS
        backend.THREAD_MIN_ELEMENTS = 1                         # split whatever the size, to see the crossover
        try:
            compare(f"softmax {rows}x512", lambda: x, lambda x: softmax(x), args.threads, max(args.rounds, 21),
                    lambda x: softmax(x))
        finally:
            backend.THREAD_MIN_ELEMENTS = saved


def in_place_part(args):
    import tempfile
    from benchmarks.common import load_reference
    if not args.baseline:
        raise SystemExit("threads.py: --part in_place needs --baseline REV, the revision to compare with (999164a)")
    old = load_reference(args.baseline, tempfile.mkdtemp())
    x, dy = rand((args.rows, 768), 15, 2.0), rand((args.rows, 768), 16)
    Q, K, U, dO = (rand((16, 4, 128, 48), seed) for seed in (17, 18, 19, 20))
    keep = ~np.triu(np.ones((128, 128), dtype=bool), k=1)[None, None]

    def gelu(lib):
        layer = lib.layers.GELU("tanh")
        return lambda: (layer(x), layer.backward(dy))

    def attention(lib):
        def run():
            O, P = lib.attention.scaled_dot_product_attention(Q, K, U, keep)
            return (O, P) + tuple(lib.attention.scaled_dot_product_attention_backward(dO, Q, K, U, P))
        return run
    for name, make in (("gelu_tanh f+b", gelu), ("attention core f+b", attention)):
        runs = {args.baseline: make(old), "this tree": make(minitf)}
        for count in sorted({1, args.threads}):
            times, results = {k: [] for k in runs}, {}
            with backend.thread_count(count), old.backend.thread_count(count):
                for r in range(args.rounds + 1):                 # round 0: the warm-up
                    for key in (runs if r % 2 else reversed(list(runs))):
                        start = time.perf_counter()
                        results[key] = runs[key]()
                        if r:
                            times[key].append(time.perf_counter() - start)
            (a, ta), (b, tb) = times.items()
            same = same_bytes(*results.values())
            print(f"{name:20s} {count} thread(s): {a} {statistics.median(ta) * 1e3:.2f} ms, {b} "
                  f"{statistics.median(tb) * 1e3:.2f} ms ({min(tb) * 1e3:.2f}-{max(tb) * 1e3:.2f}): "
                  f"{statistics.median(tb) / statistics.median(ta):.2f}x   {'same bytes' if same else 'DIFFERENT'}",
                  flush=True)


PARTS = ("adam", "loss", "layernorm", "silu", "gelu", "dropout", "softmax", "decode_attention", "decode_normalizer")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=PARTS + ("all", "threshold", "in_place"), default="all")
    add_renamed(parser, "--baseline", "--ref", metavar="REV", help="in_place: the revision whose code to compare with")
    parser.add_argument("--threads", type=int, default=None, help="the threaded side (default: backend.threads())")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--params", type=int, default=74_000_000, help="Adam's parameters (opus-mt: 74M)")
    parser.add_argument("--tokens", type=int, default=960, help="the loss's rows (opus-mt's fine-tuning step)")
    parser.add_argument("--vocab", type=int, default=58101)
    parser.add_argument("--rows", type=int, default=4096, help="rows (B*T) of LayerNorm, SiLU, GELU, dropout")
    args = parser.parse_args(argv)
    args.threads = args.threads or max(backend.threads(), 2)
    print(f"{cpu_model()}, {len(os.sched_getaffinity(0))} CPUs; {blas_description()}; NumPy {np.__version__}; "
          f"1 thread against {args.threads}; median of {args.rounds} alternating rounds; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    parts = PARTS if args.part == "all" else (args.part,)
    for part in parts:
        if part == "adam":
            adam_parts(args)
        elif part == "loss":
            loss_part(args)
        elif part == "layernorm":
            layer_part("layernorm f+b", lambda: LayerNorm(512), (args.rows, 512), args)
        elif part == "silu":
            layer_part("silu f+b", SiLU, (args.rows, 2048), args)
        elif part == "gelu":
            layer_part("gelu f+b", GELU, (args.rows, 2048), args)
        elif part == "dropout":
            layer_part("dropout f+b", lambda: Dropout(0.1), (args.rows, 512), args)
        elif part == "softmax":
            softmax_part(args)
        elif part == "decode_attention":
            decode_attention_part(args)
        elif part == "decode_normalizer":
            decode_normalizer_part(args)
        elif part == "threshold":
            threshold_part(args)
        elif part == "in_place":
            in_place_part(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
