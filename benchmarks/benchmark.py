"""Training-step (and decoding) speed of minitf against an equivalent PyTorch model.

    python benchmarks/benchmark.py --config tiny|small|base|all [--device cpu|gpu] [--steps N] [--decode]

What is timed
-------------
One full training step: zero the gradients, forward, label-smoothed loss (its value
read as a Python float, as a training loop logs it), backward, Adam update; on the
GPU followed by a device synchronisation. minitf and PyTorch run in the same process,
each warmed up first, then alternately (minitf step, PyTorch step, minitf step, ...),
so that both see the same machine state; the table shows the median.

The PyTorch model is ``torch.nn.Transformer`` with the minitf recipe: shared source,
target and output embedding (``F.linear(h, embedding.weight)``), embeddings scaled by
sqrt(d_model), sinusoidal positions, post-LN, dropout 0.1 on the embeddings and on every
sublayer output, ``batch_first=True``, the same padding masks (pad id 0) and a causal
target mask, ``nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)``, Adam with
betas (0.9, 0.98) and eps 1e-9. To do exactly minitf's work, the two things
``nn.Transformer`` adds are switched off: the final LayerNorm after each stack
(``encoder.norm = decoder.norm = None``) and the extra dropouts that the paper does
not have (on the attention weights and inside the feed-forward network). Both models
then have the same parameter count (printed). The batch is built once on the host
(random ids, each sentence padded to a random length in [L/2, L]) and copied to the
device once for each framework.

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
import math
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

np = backend.host

CONFIGS = {
    "tiny": dict(vocab=1000, d_model=64, heads=4, layers=2, d_ff=256, batch=32, src_len=20, tgt_len=20),
    "small": dict(vocab=8000, d_model=256, heads=4, layers=3, d_ff=1024, batch=64, src_len=32, tgt_len=32),
    "base": dict(vocab=8000, d_model=512, heads=8, layers=6, d_ff=2048, batch=16, src_len=32, tgt_len=32),
}
DEFAULT_STEPS = {"tiny": 30, "small": 10, "base": 10}
PAD, BOS, EOS = 0, 2, 3


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


def make_batch(c, seed=0):
    """Host int64 arrays src (B, S), tgt_in (B, T), tgt_out (B, T); real tokens, then pad."""
    rng = np.random.default_rng(seed)
    B, S, T, V = c["batch"], c["src_len"], c["tgt_len"], c["vocab"]
    src = rng.integers(4, V, (B, S))
    tgt = rng.integers(4, V, (B, T + 1))
    src_len = rng.integers(S // 2, S + 1, B)
    tgt_len = rng.integers(T // 2, T + 1, B)             # tokens of tgt_out, the last one EOS
    src[np.arange(S)[None, :] >= src_len[:, None]] = PAD
    tgt[:, 0] = BOS
    tgt[np.arange(B), tgt_len] = EOS
    tgt[np.arange(T + 1)[None, :] > tgt_len[:, None]] = PAD
    return src, tgt[:, :-1].copy(), tgt[:, 1:].copy()


def blas_threads():
    """Threads of NumPy's BLAS (OpenBLAS via ctypes, else threadpoolctl, else the env)."""
    try:
        import threadpoolctl
        infos = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
        if infos:
            return int(infos[0]["num_threads"])
    except ImportError:
        pass
    try:
        import ctypes
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
        for path in sorted(paths):
            lib = ctypes.CDLL(path)
            for name in ("openblas_get_num_threads", "openblas_get_num_threads64_",
                         "scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads"):
                if hasattr(lib, name):
                    return int(getattr(lib, name)())
    except OSError:
        pass
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return os.cpu_count() or 1


def matmul_peak_gflops(device, n=2048, repeats=5):
    """Best float32 GFLOP/s of an (n x n) @ (n x n) product with the active array module."""
    xp = backend.xp
    rng = np.random.default_rng(0)
    a = backend.asarray(rng.standard_normal((n, n)), dtype=np.float32)
    b = backend.asarray(rng.standard_normal((n, n)), dtype=np.float32)
    xp.matmul(a, b)                                      # warm-up
    backend.synchronize()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        xp.matmul(a, b)
        backend.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best / 1e9


# --------------------------------------------------------------------------- #
# minitf
# --------------------------------------------------------------------------- #
def build_minitf(c):
    minitf.manual_seed(0)
    model = minitf.Transformer(c["vocab"], c["vocab"], d_model=c["d_model"], num_heads=c["heads"],
                               num_encoder_layers=c["layers"], num_decoder_layers=c["layers"],
                               d_ff=c["d_ff"], dropout=0.1, share_embeddings=True, pad_id=PAD)
    return model


def minitf_stepper(c, batch):
    model = build_minitf(c)
    loss_fn = minitf.LabelSmoothedCrossEntropy(smoothing=0.1, ignore_index=PAD)
    optimizer = minitf.Adam(model.parameters(), lr=minitf.WarmupSchedule(c["d_model"], 4000),
                            betas=(0.9, 0.98), eps=1e-9)
    src, tgt_in, tgt_out = (backend.asarray(a) for a in batch)   # on the device once

    def step():
        optimizer.zero_grad()
        loss = loss_fn(model(src, tgt_in), tgt_out)              # a Python float: synchronises
        model.backward(loss_fn.backward())
        optimizer.step()
        backend.synchronize()
        return loss

    return step, model.num_parameters()


# --------------------------------------------------------------------------- #
# PyTorch
# --------------------------------------------------------------------------- #
def torch_stepper(c, batch, device):
    import torch
    from torch import nn

    torch.manual_seed(0)
    dev = torch.device("cuda" if device == "gpu" else "cpu")
    D, V = c["d_model"], c["vocab"]

    class TorchTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(V, D)
            nn.init.normal_(self.embed.weight, 0.0, D ** -0.5)
            self.core = nn.Transformer(d_model=D, nhead=c["heads"], num_encoder_layers=c["layers"],
                                       num_decoder_layers=c["layers"], dim_feedforward=c["d_ff"],
                                       dropout=0.1, batch_first=True, norm_first=False)
            self.core.encoder.norm = None                        # post-LN stacks end without a norm
            self.core.decoder.norm = None
            for layer in list(self.core.encoder.layers) + list(self.core.decoder.layers):
                layer.dropout = nn.Identity()                    # no dropout inside the FFN (paper: none)
                for attn in (getattr(layer, "self_attn", None), getattr(layer, "multihead_attn", None)):
                    if attn is not None:
                        attn.dropout = 0.0                       # no dropout on attention weights
            self.dropout = nn.Dropout(0.1)
            position = torch.arange(max(c["src_len"], c["tgt_len"]), dtype=torch.float64)[:, None]
            inv_freq = torch.exp(torch.arange(0, D, 2, dtype=torch.float64) * (-math.log(10000.0) / D))
            table = torch.zeros(position.shape[0], D, dtype=torch.float64)
            table[:, 0::2] = torch.sin(position * inv_freq)
            table[:, 1::2] = torch.cos(position * inv_freq[: D // 2])
            self.register_buffer("pe", table.float())

        def forward(self, src, tgt_in):
            scale = math.sqrt(D)
            x = self.dropout(self.embed(src) * scale + self.pe[: src.shape[1]])
            y = self.dropout(self.embed(tgt_in) * scale + self.pe[: tgt_in.shape[1]])
            T = tgt_in.shape[1]                                  # bool masks throughout: True = not allowed
            causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=src.device), diagonal=1)
            src_pad, tgt_pad = src == PAD, tgt_in == PAD
            h = self.core(x, y, tgt_mask=causal, src_key_padding_mask=src_pad,
                          tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad, tgt_is_causal=True)
            return nn.functional.linear(h, self.embed.weight)   # tied output projection

    model = TorchTransformer().to(dev).train()
    loss_fn = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    src, tgt_in, tgt_out = (torch.from_numpy(a).to(dev) for a in batch)
    sync = torch.cuda.synchronize if device == "gpu" else (lambda: None)

    def step():
        optimizer.zero_grad()
        logits = model(src, tgt_in)
        loss = loss_fn(logits.reshape(-1, V), tgt_out.reshape(-1))
        value = loss.item()                                      # the logged scalar: synchronises
        loss.backward()
        optimizer.step()
        sync()
        return value

    return step, sum(p.numel() for p in model.parameters())


def torch_version():
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


# --------------------------------------------------------------------------- #
# measurements
# --------------------------------------------------------------------------- #
def _status_bytes(field):
    """A memory field of /proc/self/status (VmRSS: resident now, VmHWM: its peak), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024                # reported in kB
    raise RuntimeError(f"no {field} in /proc/self/status")


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
    start = _status_bytes("VmRSS")
    step, _ = (torch_stepper(c, batch, "cpu") if framework == "torch" else minitf_stepper(c, batch))
    for _ in range(3):
        step()
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over from the parent across
    # exec, so a subprocess of a big process would report the parent's peak
    peak = _status_bytes("VmHWM")
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
    """Warm every stepper up, then run them alternately; seconds per step for each."""
    for step in steppers.values():
        for _ in range(warmup):
            step()
    times = {name: [] for name in steppers}
    for _ in range(steps):
        for name, step in steppers.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return times


def benchmark_config(name, args, peak, have_torch):
    c = CONFIGS[name]
    batch = make_batch(c)
    tokens = int((batch[2] != PAD).sum())
    flops = model_flops(c)
    memory = {}
    if args.device == "gpu":                             # both allocators start empty
        pool = backend.xp.get_default_memory_pool()
        pool.free_all_blocks()
        if have_torch:
            import torch
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    steppers, params = {}, {}
    steppers["minitf"], params["minitf"] = minitf_stepper(c, batch)
    if have_torch:
        steppers["PyTorch"], params["PyTorch"] = torch_stepper(c, batch, args.device)
    times = time_steps(steppers, args.steps or DEFAULT_STEPS[name], args.warmup)
    if args.device == "gpu":
        memory["minitf"] = pool.total_bytes() / 2 ** 20
        if have_torch:
            memory["PyTorch"] = torch.cuda.max_memory_reserved() / 2 ** 20
            memory["PyTorch allocated"] = torch.cuda.max_memory_allocated() / 2 ** 20
    elif not args.skip_memory:
        for framework in steppers:
            memory[framework] = cpu_peak_memory("torch" if framework == "PyTorch" else "minitf", name)

    medians = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n### {name}: vocab {c['vocab']}, d_model {c['d_model']}, {c['heads']} heads, "
          f"{c['layers']}+{c['layers']} layers, d_ff {c['d_ff']}, batch {c['batch']}, "
          f"lengths {c['src_len']}/{c['tgt_len']}\n")
    print(f"{tokens} target tokens per step (non-pad), {flops / 1e9:.1f} GFLOP per step (model matmuls, "
          f"forward + backward), parameters: " + ", ".join(f"{k} {v:,}" for k, v in params.items())
          + f"; {len(times['minitf'])} timed steps each\n")
    mem_label = "peak memory (MiB)" + (" [RSS growth]" if args.device == "cpu" else " [pool / reserved]")
    print(f"| framework | median step (ms) | target tokens/s | GFLOP/s | % of matmul peak | {mem_label} |")
    print("|---|---:|---:|---:|---:|---:|")
    for k, t in medians.items():
        m = memory.get(k)
        m_text = "n/a" if m is None else f"{m:.0f}"
        if k == "PyTorch" and "PyTorch allocated" in memory:
            m_text += f" ({memory['PyTorch allocated']:.0f} allocated)"
        label = "minitf" if k == "minitf" else f"PyTorch {torch_version()}"
        print(f"| {label} | {t * 1e3:.1f} | {tokens / t:,.0f} | {flops / t / 1e9:.1f} | "
              f"{100 * flops / t / 1e9 / peak:.0f}% | {m_text} |")
    if "PyTorch" in medians:
        ratio = medians["minitf"] / medians["PyTorch"]
        m_ratio = (memory["minitf"] / memory["PyTorch"]
                   if memory.get("minitf") and memory.get("PyTorch") else None)
        print(f"| minitf / PyTorch | {ratio:.2f}x | {1 / ratio:.2f}x | {1 / ratio:.2f}x | | "
              f"{'n/a' if m_ratio is None else f'{m_ratio:.2f}x'} |")
    return medians


def benchmark_decode(name, args):
    c = dict(CONFIGS[name], batch=64)
    model = build_minitf(c)
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
    parser.add_argument("--config", choices=list(CONFIGS) + ["all"], default="tiny")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"timed steps per framework (default {DEFAULT_STEPS})")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per framework first")
    parser.add_argument("--decode", action="store_true", help="also time greedy and beam-4 decoding")
    parser.add_argument("--decode-repeats", type=int, default=3)
    parser.add_argument("--no-torch", action="store_true", help="time minitf alone")
    parser.add_argument("--skip-memory", action="store_true", help="CPU: skip the peak-memory subprocesses")
    parser.add_argument("--memory-probe", choices=["minitf", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.memory_probe:
        return memory_probe(args.memory_probe, args.config)
    backend.set_device(args.device)
    threads = blas_threads()
    have_torch = torch_version() is not None and not args.no_torch
    torch_note = None
    if have_torch:
        import torch
        torch.set_num_threads(threads)
        if args.device == "gpu" and not torch.cuda.is_available():
            have_torch = False
            torch_note = (f"- PyTorch {torch_version()} sees no CUDA device (a CPU-only build?); "
                          "minitf alone")
    peak = matmul_peak_gflops(args.device)
    print(f"## minitf {minitf.__version__} training-step benchmark ({args.device})\n")
    print(f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"NumPy {np.__version__}" + (f", CuPy {backend.xp.__version__}" if args.device == "gpu" else ""))
    if args.device == "gpu":
        props = backend.xp.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        print(f"- GPU: {name}")
    print(f"- threads: NumPy BLAS {threads}" + (f", torch.get_num_threads() {torch.get_num_threads()}"
                                               if have_torch else ""))
    if have_torch:
        print(f"- PyTorch {torch_version()}")
    elif torch_note:
        print(torch_note)
    elif args.no_torch:
        print("- PyTorch: skipped (--no-torch); minitf alone")
    else:
        print("- PyTorch: not installed (pip install -e .[bench]); minitf alone")
    print(f"- float32 matmul peak (2048^3, same process): {peak:.0f} GFLOP/s")
    print(f"- load average before the run: {os.getloadavg()[0]:.2f} (other work on the machine skews timings)")
    for name in (CONFIGS if args.config == "all" else [args.config]):
        benchmark_config(name, args, peak, have_torch)
        if args.decode:
            benchmark_decode(name, args)


if __name__ == "__main__":
    main()
