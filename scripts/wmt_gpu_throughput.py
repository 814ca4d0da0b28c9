"""The base preset on a WMT-shaped corpus for a few minutes on one GPU: target tokens/s,
the fraction of the GPU's peak it reaches, and the GPU memory it takes.

    python3 scripts/wmt_gpu_throughput.py [--pairs 200000] [--minutes 3] [--precision fp32] [--work DIR]

1. a synthetic corpus of ``--pairs`` pairs with WMT 2014 English-German's shape
   (benchmarks/make_synthetic_wmt.py), prepared as memory-mapped arrays with the
   paper's 37,000-token BPE (minitf.nmt.prepare);
2. ``train.py --corpus-dir PREPARED --preset base --device gpu``, stopped with SIGTERM after
   ``--minutes`` (it saves a checkpoint and exits; no end-of-run decoding);
3. from the run's metrics.jsonl: target tokens/s (the trainer's own figure, over the
   second half of the steps, after warm-up), the model FLOPs per second that makes
   (:func:`train_flops`), their fraction of the GPU's dense peak for the precision
   (:data:`PEAK_TFLOPS`), and the most GPU memory nvidia-smi showed while it ran.

Called by scripts/gpu_check.sh; on a train.py without ``--corpus-dir`` it says so and
skips (exit 0).
"""
import argparse
import json
import pathlib
import signal
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: Dense peak TFLOP/s (no sparsity) by GPU name fragment and precision, from NVIDIA's data sheets
#: (SXM parts; H200 has H100's compute). fp16 and tf32 are tensor-core figures.
PEAK_TFLOPS = {
    "H200": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4},
    "H100": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0},
    "V100": {"fp32": 15.7, "tf32": 15.7, "fp16": 125.0},   # no TF32 mode: tf32 runs as fp32
}


def train_flops(d_model, d_ff, layers, vocab, src_tokens, tgt_tokens, src_len, tgt_len):
    """Model FLOPs of one training step (forward + backward = 3 x forward, 2 FLOPs a multiply-add).

    Matrix products only (they are nearly all of it): per source token the encoder's
    weights (4 d^2 attention + 2 d d_ff per layer) and its attention scores and sums
    (4 S d per layer); per target token the decoder's weights (8 d^2 + 2 d d_ff per
    layer), its self- and cross-attention (4 T d + 4 S d per layer) and the output
    projection (d x vocab). ``src_len``, ``tgt_len``: the padded lengths attention spans.
    """
    encoder = layers * (4 * d_model ** 2 + 2 * d_model * d_ff + 2 * src_len * d_model)
    decoder = layers * (8 * d_model ** 2 + 2 * d_model * d_ff + 2 * tgt_len * d_model + 2 * src_len * d_model)
    return 3 * 2 * (encoder * src_tokens + (decoder + d_model * vocab) * tgt_tokens)


def peak(gpu_name, precision):
    for fragment, table in PEAK_TFLOPS.items():
        if fragment in gpu_name:
            return table[precision] * 1e12
    return None


def gpu_memory_sampler(samples, stop):
    while not stop.is_set():
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10).stdout.split()
            samples.append(float(out[0]))
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            pass
        stop.wait(5)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "fp16"))
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--max-tokens", type=int, default=None, help="default: the base preset's 25000")
    parser.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/minitf-wmt-gpu"))
    args = parser.parse_args(argv)
    help_text = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], capture_output=True,
                               text=True).stdout
    if "--corpus-dir" not in help_text:
        print("skipped: this train.py has no --corpus-dir (the prepared-corpus flag); nothing measured")
        return 0
    from minitf.nmt.prepare import prepare_corpus

    text, prepared, run = args.work / "text", args.work / "prepared", args.work / f"run-{int(time.time())}"
    start = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_synthetic_wmt.py"), "--pairs", str(args.pairs),
                    "--out", str(text)], check=True)  # a command of its own, as a user would run it
    prepare_corpus(prepared, {s: (str(text / f"{s}.en"), str(text / f"{s}.de")) for s in ("train", "valid", "test")},
                   args.vocab_size, languages=("en", "de"), rebuild=True, log=print)
    print(f"corpus made and prepared in {time.perf_counter() - start:.0f} s", flush=True)
    samples, stop = [], threading.Event()
    threading.Thread(target=gpu_memory_sampler, args=(samples, stop), daemon=True).start()
    command = [sys.executable, str(ROOT / "train.py"), "--corpus-dir", str(prepared), "--preset", "base",
               "--device", "gpu", "--precision", args.precision, "--eval-every", "1000000",
               "--save-every", "1000000", "--bleu-sentences", "0", "--average", "0", "--no-progress", "--out", str(run)]
    command += ["--max-tokens", str(args.max_tokens)] if args.max_tokens else []
    print("$ " + " ".join(command), flush=True)
    process = subprocess.Popen(command)
    try:  # training only: after --minutes, SIGTERM (train.py saves and exits 143), no end-of-run decoding
        returncode = process.wait(timeout=60 * args.minutes)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        returncode = process.wait()
    stop.set()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] \
        if (run / "metrics.jsonl").is_file() else []
    train = [r for r in records if r.get("kind") == "train"]
    if returncode not in (0, 143) or len(train) < 2:
        print(f"train.py exited with {returncode} after {len(train)} steps; nothing measured")
        return 1
    later = train[len(train) // 2:]                               # after warm-up (the first half of the steps)
    seconds = later[-1]["elapsed"] - train[len(train) // 2 - 1]["elapsed"]
    tokens = sum(r["tokens"] for r in later)
    tokens_per_s = tokens / max(seconds, 1e-9)
    config = json.loads((run / "config.json").read_text())
    vocab = json.loads((prepared / "manifest.json").read_text())["vocab_size"]
    # FLOPs per target token at the corpus's mean lengths (token-count batches pad little)
    manifest = json.loads((prepared / "manifest.json").read_text())["splits"]["train"]
    mean_src, mean_tgt = (manifest[f"{s}_tokens"] / manifest["pairs"] + 1 for s in ("src", "tgt"))
    flops_per_tgt_token = train_flops(config["d_model"], config["d_ff"], config["num_encoder_layers"], vocab,
                                      mean_src / mean_tgt, 1.0, mean_src, mean_tgt)
    achieved = flops_per_tgt_token * tokens_per_s
    name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip()
    top = peak(name, args.precision)
    fraction = f"{achieved / top:.1%} of the {name} {args.precision} peak ({top / 1e12:.0f} TFLOP/s)" if top \
        else f"peak unknown for {name!r}"
    memory = f"{max(samples):.0f} MiB" if samples else "unknown (nvidia-smi gave no reading)"
    print(f"base preset, {len(train)} steps in {train[-1]['elapsed']:.0f} s: {tokens_per_s:,.0f} target tokens/s "
          f"(steps {len(train) // 2 + 1}-{len(train)}), {achieved / 1e12:.2f} model TFLOP/s = {fraction}; "
          f"most GPU memory in use: {memory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
