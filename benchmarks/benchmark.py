"""Training-step (and decoding) speed of minitf against an equivalent PyTorch model.

    python benchmarks/benchmark.py --config tiny|small|base|all [--device cpu|gpu] [--steps N] [--decode]

What is timed
-------------
One full training step: zero the gradients, forward, label-smoothed loss (its value
read as a Python float, as a training loop logs it), backward, Adam update; on the
GPU followed by a device synchronisation. By default each framework runs in its own
fresh process (this script with ``--worker``), and the processes alternate: minitf,
PyTorch, PyTorch, minitf, ... (``--repeats`` pairs); each process warms up, then times
``--steps`` steps. The table shows the median over every process's median step, the
spread (lowest and highest process median), and the ratio of the two frameworks in each
pair. ``--in-process`` instead runs both in this process, alternating step by step (the
first round's method); that biases the ratio on a CPU, where NumPy's OpenBLAS threads
and PyTorch's OpenMP threads then live in one process (see docs/benchmarks.md for the
measurement). Ratios depend on the CPU, its BLAS and the load: the header prints the
machine, the BLAS, the date and the command, so that a table can be reproduced.

Configurations (``benchmarks/common.py``): ``default`` is the default training preset of
``train.py`` (d_model 128, 2+2 layers, vocabulary 4000, ``--max-tokens 1500``) on the real
batches of the default corpus (``~/.cache/minitf/ding-de-en-v2``, its ``train-sentences.*``
split, the one ``python train.py`` trains on, cached by a first run; else ``train.*`` of
``--corpus``; read, tokenized with a BPE vocabulary trained as ``train.py`` does, and
batched by minitf.nmt's own ``Corpus`` and ``token_batches``; the first ``--real-batches``
batches of epoch 0 are used, by both frameworks in the same order); without the cached
corpus, one synthetic batch of 96 x 14 tokens, and the padding report is skipped with a
message. ``small`` and ``base`` are synthetic batches; ``tiny`` too (not in ``all``).
``all`` = default, small, base, then the per-layer profile of a minitf step at ``base``
(``benchmarks/layer_profile.py``, run in its own process).

Padding (default preset, real corpus): real tokens over padded tokens per side for
minitf's batcher (``minitf.nmt.data.token_batches``) against a length-sorted bucketing as
fairseq does it (sort by source then target length, cut when ``max(len) * count``
exceeds ``--max-tokens``, batch sizes rounded down to a multiple of 8), over one epoch.

The PyTorch model is ``minitf.pytorch.TorchTransformer``: ``torch.nn.Transformer``
(``batch_first``) made to compute minitf's function (the one tests/test_pytorch_parity.py
checks): shared source, target and output embedding, embeddings scaled by sqrt(d_model)
and drawn as minitf draws them, sinusoidal positions, post-LN with no final LayerNorm
after each stack, dropout 0.1 on the embeddings and on every sublayer output and nowhere
else (none on the attention weights or inside the feed-forward network), the same
padding masks (pad id 0) and a causal target mask; the loss is ``minitf.pytorch.loss``
(cross-entropy with ``ignore_index=0, label_smoothing=0.1``), Adam with betas (0.9,
0.98) and eps 1e-9. Both models have the same parameter count (printed). Both steps
come from ``benchmarks/common.py`` (``MinitfStep``, ``TorchStep``). The batch is built
once on the host (random ids, each sentence padded to a random length in [L/2, L]) and
copied to the device once for each framework.

Model FLOPs per step (counted analytically, matmuls only)
--------------------------------------------------------
A matmul (m x k) @ (k x n) costs 2 m n k FLOPs. With B batch, S source and T target
length, D d_model, F d_ff, V vocabulary, N_e / N_d layers, Ns = B S, Nt = B T:

    encoder layer  = 2 Ns (3 D^2 + D^2 + 2 D F)          QKV, output projection, FFN
                   + 4 B S^2 D                          scores Q K^T and P V (all heads)
    decoder layer  = 2 Nt (3 D^2 + D^2 + 2 D F)          self-attention projections, FFN
                   + 2 Nt (2 D^2) + 2 Ns (2 D^2)        cross-attention: Q, output; K, V of the memory
                   + 4 B T^2 D + 4 B T S D              self- and cross-attention scores and P V
    output         = 2 Nt D V                           logits = h W^T
    forward        = N_e * encoder layer + N_d * decoder layer + output
    training step  = 3 * forward                        backward = two matmuls per forward matmul

This count agrees exactly with ``torch.utils.flop_counter.FlopCounterMode`` run on one
step of the PyTorch model, except for the attention scores and P V, which that counter
does not see on the CPU (1.19 vs 1.13 GFLOP for tiny, the difference being those).
Padding positions are counted (both frameworks compute them); softmax, LayerNorm,
the loss, Adam and other elementwise work are not. GFLOP/s = FLOPs per step / median
step time. "matmul peak" is the float32 GFLOP/s of one (2048 x 2048) @ (2048 x 2048)
product measured in the same process (NumPy on the CPU, CuPy on the GPU), and
"% of peak" is minitf's fraction of it.

Peak memory
-----------
CPU: each framework is measured in its own fresh subprocess (this script with
``--memory-probe``), so that neither sees the other's allocations: the resident set
size (VmRSS in /proc/self/status) is read after the imports and the batch are ready,
then the model and optimizer are built and three training steps run, then the peak RSS
(VmHWM; not ``getrusage(RUSAGE_SELF).ru_maxrss``, which Linux carries over from the
parent process across exec) is read. The table shows peak minus the
starting RSS: parameters, gradients, optimizer state, activations and temporaries, as
the operating system saw them (allocator slack included, shared libraries excluded).
One-time runtime set-up is done before the starting RSS is read and is not counted:
one small matmul (the BLAS library allocates per-thread work buffers, tens of MiB, at
its first call) and, for PyTorch, a small Linear's backward and Adam step (autograd
engine and optimizer start-up).
GPU: in the timing process, both caching allocators are emptied before the models are
built; after the steps, ``cupy.get_default_memory_pool().total_bytes()`` (the bytes
CuPy's pool holds; it only grows, so this is its peak) and
``torch.cuda.max_memory_reserved()`` (the same notion for PyTorch's caching allocator;
``max_memory_allocated`` is printed too). Both include parameters, gradients and
optimizer state. Neither uses TF32 matmuls by default (CuPy: unless CUPY_TF32=1).

Decoding (--decode)
-------------------
Greedy and beam-4 search with ``minitf.nmt.decode`` on a batch of 64 source sentences,
32 new tokens each, with the key/value cache (``use_cache=True``) and by re-running
the decoder on the whole prefix (``use_cache=False``). To force exactly 32 steps for
every sentence, the decoders are called with ``max_len=32`` and ``eos_id=pad_id``:
the pad token is never generated (its log-probability is set to -inf), so no sentence
ends early. Tokens/s counts output tokens (64 x 32 per call), not beams.

PyTorch is optional (``pip install -e .[bench]``); without it minitf is timed alone.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing

import minitf  # noqa: E402
from minitf import backend  # noqa: E402
from minitf.nmt.decode import beam_search, greedy_decode  # noqa: E402
from benchmarks.common import (BOS, CONFIGS, CORPUS, DEFAULT_RUN, PAD, MinitfStep, TorchStep,  # noqa: E402
                               blas_description, blas_threads, build_model, cpu_model, default_corpus_paths,
                               first_batches, make_batch, matmul_peak_gflops, status_bytes, tokenized_corpus)

np = backend.host

DEFAULT_STEPS = {"default": 40, "tiny": 30, "small": 10, "base": 10}
ALL = ["default", "small", "base"]


# --------------------------------------------------------------------------- #
# the workload
# --------------------------------------------------------------------------- #
def model_flops(c):
    """Matmul FLOPs of one training step (forward + backward), see the module docstring."""
    B, S, T, D, F, V = c["batch"], c["src_len"], c["tgt_len"], c["d_model"], c["d_ff"], c["vocab"]
    Ns, Nt = B * S, B * T
    encoder_layer = 2 * Ns * (4 * D * D + 2 * D * F) + 4 * B * S * S * D
    decoder_layer = (2 * Nt * (4 * D * D + 2 * D * F) + 2 * Nt * 2 * D * D + 2 * Ns * 2 * D * D
                     + 4 * B * T * T * D + 4 * B * T * S * D)
    forward = c["layers"] * encoder_layer + c["layers"] * decoder_layer + 2 * Nt * D * V
    return 3 * forward


def torch_version():
    """PyTorch's version without importing it (this process may not time it), or None."""
    import importlib.metadata
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------------- #
# the machine
# --------------------------------------------------------------------------- #
def machine_lines(args, threads, peak):
    """The header: what a reader needs to reproduce (or discount) the numbers."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [f"- command: `python benchmarks/benchmark.py {' '.join(sys.argv[1:])}`",
             f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
             f"- CPU: {cpu_model()}, {os.cpu_count()} logical CPUs ({cores} usable), {platform.machine()}, "
             f"{platform.system()} {platform.release()}",
             f"- Python {platform.python_version()}, NumPy {np.__version__}, BLAS: {blas_description()}"
             + (f", CuPy {backend.xp.__version__}" if args.device == "gpu" else ""),
             f"- threads: NumPy BLAS {threads}, PyTorch torch.set_num_threads({threads}) in its process",
             f"- float32 matmul peak (2048^3, NumPy, best of 5): {peak:.0f} GFLOP/s",
             f"- load average before the run: {os.getloadavg()[0]:.2f} (other work on the machine skews timings; "
             "ratios also vary from one CPU to another)",
             "- method: " + ("both frameworks in this process, alternating step by step (--in-process)"
                             if args.in_process else
                             f"each framework in its own process, alternating, {args.repeats} processes each"),
             "- allocator: " + ("glibc malloc keeps freed memory for reuse in both frameworks' processes "
                                "(`--allocator retain`, as train.py runs minitf)" if args.allocator == "retain"
                                else "glibc malloc as it is, in both (`--allocator system`)")]
    return lines


# --------------------------------------------------------------------------- #
# measurements
# --------------------------------------------------------------------------- #


def memory_probe(framework, config_name):
    """Run in a fresh subprocess: peak RSS growth of building + 3 training steps (bytes)."""
    c = CONFIGS[config_name]
    batch = make_batch(c)
    if framework == "torch":
        import torch
        torch.set_num_threads(blas_threads())
        warm = torch.nn.Linear(512, 512)                 # BLAS buffers, autograd engine, Adam code paths:
        warm(torch.ones(512, 512)).sum().backward()      # one-time runtime set-up, not counted
        torch.optim.Adam(warm.parameters()).step()
    else:
        backend.xp.ones((512, 512)) @ backend.xp.ones((512, 512))   # large enough to use every thread
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")                             # reset VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass                                             # then VmHWM also covers the imports' peak
    start = status_bytes("VmRSS")
    step = TorchStep(c, batch, "cpu") if framework == "torch" else MinitfStep(c, batch)
    for _ in range(3):
        step()
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over from the parent across
    # exec, so a subprocess of a big process would report the parent's peak
    peak = status_bytes("VmHWM")
    print(json.dumps({"peak_growth": peak - start}))


def cpu_peak_memory(framework, config_name):
    """Peak RSS growth in MiB, measured in a subprocess; None when it failed."""
    result = subprocess.run([sys.executable, os.path.abspath(__file__), "--memory-probe", framework,
                             "--config", config_name], capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        print(f"  (memory probe for {framework} failed: {result.stderr.strip().splitlines()[-1:]})")
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])["peak_growth"] / 2 ** 20


def time_steps(steppers, steps, warmup):
    """In one process: warm every stepper up, then run them alternately step by step;
    seconds per step for each."""
    for step in steppers.values():
        for i in range(warmup):
            step(i)
    times = {name: [] for name in steppers}
    for i in range(steps):
        for name, step in steppers.items():
            start = time.perf_counter()
            step(i)
            times[name].append(time.perf_counter() - start)
    return times


# --------------------------------------------------------------------------- #
# the batches: synthetic, or the default preset's real ones
# --------------------------------------------------------------------------- #
def fairseq_buckets(src_lens, tgt_lens, max_tokens, multiple=8):
    """Length-sorted bucketing as fairseq's ``batch_by_size`` does it: sort by source,
    then target length; cut when ``max(len) * count`` would exceed ``max_tokens``; batch
    sizes rounded down to a multiple of ``multiple`` (when above it)."""
    src, tgt = np.asarray(src_lens), np.asarray(tgt_lens)
    order = np.lexsort((tgt, src))
    batches, current, longest = [], [], 0
    for index in order.tolist():
        new_longest = max(longest, int(src[index]), int(tgt[index]))
        if current and new_longest * (len(current) + 1) > max_tokens:
            keep = len(current) if len(current) < multiple else len(current) - len(current) % multiple
            batches.append(current[:keep])
            current = current[keep:]
            longest = max([max(int(src[i]), int(tgt[i])) for i in current], default=0)
            new_longest = max(longest, int(src[index]), int(tgt[index]))
        current.append(index)
        longest = new_longest
    if current:
        batches.append(current)
    return batches


def padding_report(name, batches, src_lens, tgt_lens):
    """One table row: real over padded tokens per side, batches, real target tokens per batch."""
    real_src = sum(int(src_lens[b].sum()) for b in batches)
    real_tgt = sum(int(tgt_lens[b].sum()) for b in batches)
    pad_src = sum(len(b) * int(src_lens[b].max()) for b in batches)
    pad_tgt = sum(len(b) * int(tgt_lens[b].max()) for b in batches)
    return (f"| {name} | {len(batches):,} | {100 * real_src / pad_src:.1f}% | {100 * real_tgt / pad_tgt:.1f}% | "
            f"{real_tgt / len(batches):,.0f} | {pad_src / len(batches):,.0f} / {pad_tgt / len(batches):,.0f} |")


def real_batches(count, corpus=CORPUS):
    """The default preset's first ``count`` batches of epoch 0 (host triples), and the
    padding report's lines; None (and a message) without the cached corpus."""
    paths = default_corpus_paths(corpus)
    if paths is None:
        return None, [f"(no cached default corpus at {corpus}: run `python train.py` once to fetch it; "
                      "the default preset is timed on one synthetic 96 x 14 batch and the padding report "
                      "is skipped)"]
    import tempfile
    with tempfile.TemporaryDirectory() as folder:                # the tokenizer train.py would train
        train = tokenized_corpus(paths, DEFAULT_RUN.vocab_size, os.path.join(folder, "tokenizer.model"))
    src_lens, tgt_lens = train.lengths("train")                 # + EOS (source), + BOS (target), as train.py
    epoch, triples = first_batches(train, count)
    max_tokens = DEFAULT_RUN.max_tokens
    lines = [f"Padding of one epoch of the default corpus ({len(src_lens):,} sentence pairs, --max-tokens "
             f"{max_tokens}; real tokens / padded tokens per side):\n",
             "| batcher | batches | source efficiency | target efficiency | real target tokens per batch "
             "| padded source / target tokens per batch |",
             "|---|---:|---:|---:|---:|---:|",
             padding_report("minitf (`token_batches`)", epoch, src_lens, tgt_lens),
             padding_report("length-sorted bucketing (fairseq's `batch_by_size`, multiple of 8)",
                            fairseq_buckets(src_lens, tgt_lens, max_tokens), src_lens, tgt_lens)]
    return triples, lines


def batch_flops(c, batches):
    """Mean model FLOPs of a step over ``batches`` (each batch's own B, S, T)."""
    return statistics.mean(model_flops(dict(c, batch=b[0].shape[0], src_len=b[0].shape[1],
                                            tgt_len=b[1].shape[1])) for b in batches)


# --------------------------------------------------------------------------- #
# each framework in its own process
# --------------------------------------------------------------------------- #
def worker(framework, config_name, batch_file, steps, warmup, device, allocator="retain"):
    """Run in a fresh process: build, warm up, time ``steps`` steps; print JSON."""
    c = CONFIGS[config_name]
    with np.load(batch_file) as data:
        batches = [(data[f"src{i}"], data[f"tgt_in{i}"], data[f"tgt_out{i}"]) for i in range(int(data["n"]))]
    backend.set_device(device)
    if allocator == "retain":
        backend.keep_freed_memory()                      # as train.py does; the same for both frameworks
    if framework == "torch":
        import torch
        torch.set_num_threads(blas_threads())
        step = TorchStep(c, batches, device)
    else:
        step = MinitfStep(c, batches)
    for i in range(warmup):
        step(i)
    times = []
    for i in range(steps):
        start = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - start)
    print(json.dumps({"times": times, "params": step.num_parameters}))


def time_in_processes(frameworks, config_name, batch_file, args, steps):
    """{framework: [per-process list of step seconds]}, {framework: parameters}: the
    frameworks' processes alternate, the order flipping every round (A B, B A, ...)."""
    runs, params = {f: [] for f in frameworks}, {}
    for r in range(args.repeats):
        for framework in (frameworks if r % 2 == 0 else frameworks[::-1]):
            command = [sys.executable, os.path.abspath(__file__), "--worker",
                       "torch" if framework == "PyTorch" else "minitf", "--config", config_name,
                       "--batch-file", batch_file, "--steps", str(steps), "--warmup", str(args.warmup),
                       "--device", args.device, "--allocator", args.allocator]
            result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
            if result.returncode != 0:
                raise RuntimeError(f"{framework} worker failed: {result.stderr.strip()[-2000:]}")
            out = json.loads(result.stdout.strip().splitlines()[-1])
            runs[framework].append(out["times"])
            params[framework] = out["params"]
    return runs, params


def benchmark_config(name, args, peak, have_torch):
    import tempfile
    c = CONFIGS[name]
    notes = []
    batches = None
    if name == "default":
        batches, notes = real_batches(args.real_batches, args.corpus)
    synthetic = batches is None
    if synthetic:
        batches = [make_batch(c)]
    tokens = statistics.mean(int((b[2] != PAD).sum()) for b in batches)        # real target tokens per step
    shapes = sorted({(b[0].shape[0], b[0].shape[1], b[1].shape[1]) for b in batches})
    flops = batch_flops(c, batches)
    steps = args.steps or (max(DEFAULT_STEPS[name], len(batches)) if not synthetic else DEFAULT_STEPS[name])
    frameworks = ["minitf"] + (["PyTorch"] if have_torch else [])
    memory = {}
    if args.in_process:
        if args.device == "gpu":                         # both allocators start empty
            pool = backend.xp.get_default_memory_pool()
            pool.free_all_blocks()
            if have_torch:
                import torch
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
        steppers = {}
        steppers["minitf"] = MinitfStep(c, batches)
        if have_torch:
            import torch
            torch.set_num_threads(blas_threads())
            steppers["PyTorch"] = TorchStep(c, batches, args.device)
        params = {name: step.num_parameters for name, step in steppers.items()}
        times = time_steps(steppers, steps, args.warmup)
        runs = {k: [v] for k, v in times.items()}
        if args.device == "gpu":
            memory["minitf"] = pool.total_bytes() / 2 ** 20
            if have_torch:
                memory["PyTorch"] = torch.cuda.max_memory_reserved() / 2 ** 20
                memory["PyTorch allocated"] = torch.cuda.max_memory_allocated() / 2 ** 20
    else:
        with tempfile.TemporaryDirectory() as folder:
            batch_file = os.path.join(folder, "batches.npz")
            arrays = {"n": np.array(len(batches))}
            for i, (src, tgt_in, tgt_out) in enumerate(batches):
                arrays.update({f"src{i}": src, f"tgt_in{i}": tgt_in, f"tgt_out{i}": tgt_out})
            np.savez(batch_file, **arrays)
            runs, params = time_in_processes(frameworks, name, batch_file, args, steps)
    if args.device == "cpu" and not args.skip_memory:
        for framework in frameworks:
            memory[framework] = cpu_peak_memory("torch" if framework == "PyTorch" else "minitf", name)

    per_run = {k: [statistics.median(run) for run in v] for k, v in runs.items()}   # each process's median
    medians = {k: statistics.median(v) for k, v in per_run.items()}
    print(f"\n### {name}: vocab {c['vocab']}, d_model {c['d_model']}, {c['heads']} heads, "
          f"{c['layers']}+{c['layers']} layers, d_ff {c['d_ff']}, "
          + (f"one synthetic batch of {c['batch']} x {c['src_len']}/{c['tgt_len']} tokens\n" if synthetic else
             f"the first {len(batches)} real batches of the default corpus (B x S/T from {shapes[0]} "
             f"to {shapes[-1]}), cycled\n"))
    print(f"{tokens:,.0f} target tokens per step (non-pad, mean), {flops / 1e9:.2f} GFLOP per step (model "
          f"matmuls, forward + backward), parameters: " + ", ".join(f"{k} {v:,}" for k, v in params.items())
          + f"; {len(runs['minitf'])} process(es) x {steps} timed steps each\n")
    mem_label = "peak memory (MiB)" + (" [RSS growth]" if args.device == "cpu" else " [pool / reserved]")
    print(f"| framework | median step (ms) | spread (ms, process medians) | target tokens/s | GFLOP/s "
          f"| % of matmul peak | {mem_label} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for k, t in medians.items():
        m = memory.get(k)
        m_text = "n/a" if m is None else f"{m:.0f}"
        if k == "PyTorch" and "PyTorch allocated" in memory:
            m_text += f" ({memory['PyTorch allocated']:.0f} allocated)"
        label = "minitf" if k == "minitf" else f"PyTorch {torch_version()}"
        spread = f"{min(per_run[k]) * 1e3:.1f}-{max(per_run[k]) * 1e3:.1f}"
        print(f"| {label} | {t * 1e3:.1f} | {spread} | {tokens / t:,.0f} | {flops / t / 1e9:.1f} | "
              f"{100 * flops / t / 1e9 / peak:.0f}% | {m_text} |")
    if "PyTorch" in medians:
        ratio = medians["minitf"] / medians["PyTorch"]
        pair_ratios = sorted(a / b for a, b in zip(per_run["minitf"], per_run["PyTorch"]))
        m_ratio = (memory["minitf"] / memory["PyTorch"]
                   if memory.get("minitf") and memory.get("PyTorch") else None)
        print(f"| minitf / PyTorch | **{ratio:.2f}x** | pairs {pair_ratios[0]:.2f}-{pair_ratios[-1]:.2f}x "
              f"| {1 / ratio:.2f}x | {1 / ratio:.2f}x | | {'n/a' if m_ratio is None else f'{m_ratio:.2f}x'} |")
    for line in notes:
        print(("\n" if line is notes[0] else "") + line)
    return medians


def print_profile(args):
    """The per-layer profile of one minitf step at base: benchmarks/layer_profile.py in its
    own process (as every timing here), its table passed through."""
    command = [sys.executable, os.path.join(HERE, "layer_profile.py"), "--config", "base",
               "--steps", str(args.profile_steps)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError(f"layer_profile.py failed: {result.stderr.strip()[-2000:]}")
    table = [line for line in result.stdout.splitlines() if line.startswith("|")]
    print(f"\n### where a minitf step goes at base (own time per layer class, median of "
          f"{args.profile_steps} steps, `benchmarks/layer_profile.py --config base` in its own process)\n")
    print("\n".join(table))


def benchmark_decode(name, args):
    c = dict(CONFIGS[name], batch=64)
    model = build_model(c)
    src, _, _ = make_batch(c, seed=1)
    src = backend.asarray(src)
    new_tokens, rows = 32, c["batch"]
    runs = [("greedy", lambda cache: greedy_decode(model, src, max_len=new_tokens, eos_id=PAD, pad_id=PAD,
                                                   bos_id=BOS, use_cache=cache)),
            ("beam 4", lambda cache: beam_search(model, src, beam_size=4, max_len=new_tokens, eos_id=PAD,
                                                 pad_id=PAD, bos_id=BOS, use_cache=cache))]
    print(f"\n#### decoding, {name} model: batch {rows}, {new_tokens} new tokens per sentence "
          f"(eos banned, so every sentence runs all steps)\n")
    print("| search | with cache (tokens/s) | without cache (tokens/s) | cache speedup |")
    print("|---|---:|---:|---:|")
    for label, run in runs:
        speeds = {}
        for cache in (True, False):
            out = run(cache)                                     # warm-up, and check the length
            assert all(len(h) == new_tokens for h in out), "a sentence stopped early"
            seconds = []
            for _ in range(args.decode_repeats):
                start = time.perf_counter()
                run(cache)
                backend.synchronize()
                seconds.append(time.perf_counter() - start)
            speeds[cache] = rows * new_tokens / statistics.median(seconds)
        print(f"| {label} | {speeds[True]:,.0f} | {speeds[False]:,.0f} | {speeds[True] / speeds[False]:.1f}x |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=list(CONFIGS) + ["all"], default="default")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"timed steps per process (default {DEFAULT_STEPS}; at least one pass over "
                             "the real batches)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per framework first")
    parser.add_argument("--repeats", type=int, default=3, help="processes per framework (alternating)")
    parser.add_argument("--in-process", action="store_true",
                        help="time both frameworks in this process, step by step (biased on the CPU)")
    parser.add_argument("--real-batches", type=int, default=40, help="default preset: real batches used")
    parser.add_argument("--corpus", default=CORPUS, help=f"folder with train.de, train.en (default {CORPUS})")
    parser.add_argument("--profile-steps", type=int, default=5, help="steps of the base profile")
    parser.add_argument("--no-profile", action="store_true", help="skip the per-layer profile (with all)")
    parser.add_argument("--decode", action="store_true", help="also time greedy and beam-4 decoding")
    parser.add_argument("--decode-repeats", type=int, default=3)
    parser.add_argument("--no-torch", action="store_true", help="time minitf alone")
    parser.add_argument("--allocator", choices=["retain", "system"], default="retain",
                        help="CPU processes: 'retain' (default) makes glibc's malloc keep freed memory for "
                             "reuse in both frameworks' processes, as train.py does for minitf "
                             "(minitf.backend.keep_freed_memory); 'system' leaves malloc as it is")
    parser.add_argument("--skip-memory", action="store_true", help="CPU: skip the peak-memory subprocesses")
    parser.add_argument("--memory-probe", choices=["minitf", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=["minitf", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--batch-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.memory_probe:
        return memory_probe(args.memory_probe, args.config)
    if args.worker:
        return worker(args.worker, args.config, args.batch_file, args.steps, args.warmup, args.device,
                      args.allocator)
    backend.set_device(args.device)
    threads = blas_threads()
    have_torch = torch_version() is not None and not args.no_torch
    torch_note = None
    if have_torch and args.device == "gpu":
        import torch
        if not torch.cuda.is_available():
            have_torch = False
            torch_note = (f"- PyTorch {torch_version()} sees no CUDA device (a CPU-only build?); "
                          "minitf alone")
    peak = matmul_peak_gflops(args.device)
    print(f"## minitf {minitf.__version__} training-step benchmark ({args.device})\n")
    for line in machine_lines(args, threads, peak):
        print(line)
    if args.device == "gpu":
        props = backend.xp.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        print(f"- GPU: {name}")
    if have_torch:
        print(f"- PyTorch {torch_version()}")
    elif torch_note:
        print(torch_note)
    elif args.no_torch:
        print("- PyTorch: skipped (--no-torch); minitf alone")
    else:
        print("- PyTorch: not installed (pip install -e .[bench]); minitf alone")
    names = ALL if args.config == "all" else [args.config]
    for name in names:
        benchmark_config(name, args, peak, have_torch)
        if args.decode:
            benchmark_decode(name, args)
    if (args.config in ("all", "base")) and not args.no_profile and args.device == "cpu":
        print_profile(args)


if __name__ == "__main__":
    main()
