"""An opus-mt-sized Marian model in minitf and in transformers, each in a process of its own: translation (greedy
and beam 4, sentences per second) and the fine-tuning step (forward, loss, backward, Adam).

    pip install -e ".[bench]"      # torch, transformers, safetensors: only for the comparison
    python benchmarks/marian_opus.py --part all --rounds 5               # the opus-mt shape
    python benchmarks/marian_opus.py --part all --rounds 5 --in-process  # both frameworks in one process
    python benchmarks/marian_opus.py --shape small --sentences 8 --rounds 1 --step-batch 4 --step-len 8  # dry run

The model: a random ``transformers.MarianMTModel`` of opus-mt-de-en's shape (``--shape opus``: 6+6 layers,
d_model 512, 8 heads, d_ff 2048, vocabulary 58,101, swish, post-LN, scaled shared embeddings, sinusoidal
[sin | cos] positions, pad 58,100 as the decoder's start, eos 0; transformers' own initialisation, std 0.02),
saved with ``save_pretrained`` beside opus-mt's generation_config.json (num_beams 4, pad banned, forced eos,
renormalized log-probabilities) into a temporary folder. Both frameworks read that folder: transformers with
``MarianMTModel.from_pretrained``, minitf with ``minitf.nmt.marian.from_pretrained`` (float32) and the
settings of ``read_generation_config`` (:class:`minitf.nmt.decode.HuggingFaceRules`). ``--shape small`` is a
tiny model for dry runs.

Translation (``--part decode``): ``--sentences`` (100) random source sentences of 10 to 40 ids (the last one
eos), sorted by length into batches of ``--batch-size`` (64, as ``python -m minitf.translate``), the same
batches for both. A random model does not know when to stop, so its eos logit is lowered by 100
(``final_logits_bias``) and every sentence of a batch runs to the batch's length limit, where the folder's
forced eos ends it: each batch decodes as many tokens as its longest source sentence has (counting eos), in
both frameworks, so both do the same number of steps on the same rows, and the outputs are compared token for
token (printed; they are equal unless float32 rounding flips a near tie). No sentence ends early, so
minitf's dropping of finished sentences from its batch (transformers computes them to the end of the batch)
gains nothing here: the comparison is of equal work per step. (A bias that lets a random model stop on its own
is no better: its first step's logits hardly depend on the sentence, so it stops every sentence at once or
none.) minitf: ``greedy_decode`` / ``beam_search`` of minitf/nmt/decode.py (``max_len`` the batch's limit, the
folder's rules); transformers: ``generate(num_beams=1 or 4, max_length=limit + 1)`` (the start token counts
there) under ``torch.inference_mode``, the rest from the folder's generation_config.json. Neither tokenizes
(ids in, ids out). The ratio depends on the batch: per step, greedy multiplies ``batch`` rows by the
output matrix, beam 4 ``4 x batch`` rows, and the two libraries' matrix products do not scale alike
(``--batch-size 16`` for another point).

Fine-tuning step (``--part step``): a fixed batch of ``--step-batch`` (32) pairs of at most ``--step-len``
(30) tokens both sides (random lengths from half to all of it, ending in eos, padded), the decoder's input the
labels shifted right behind the start token (pad), as transformers' ``shift_tokens_right``. minitf: zero_grad,
``model(src, tgt_in)``, ``LabelSmoothedCrossEntropy(0.1)`` (pad ignored), backward, ``minitf.Adam``;
PyTorch: the folder's ``MarianMTModel`` in train mode, ``minitf.pytorch.loss`` (PyTorch's
``cross_entropy(label_smoothing=0.1, ignore_index=pad)``: the same number) on its logits, autograd,
``torch.optim.Adam`` (its default implementation) over the parameters that require a gradient, the position
tables frozen (transformers 5.25's ``from_pretrained`` makes them trainable; the model means them fixed, as
minitf's are). Same Adam settings (lr 2e-5, betas (0.9, 0.98), eps 1e-9),
the folder's dropout (0.1 as opus-mt's; ``--dropout`` changes it, and with 0 the first losses agree to
float32 rounding, printed). The step's model is the same random model with its eos bias left at 0 (saved
into a second folder). minitf also trains the output bias, which transformers keeps as a buffer (58,101
numbers of 74 million).

Method (as ``benchmarks/llama_step.py``): each part starts two fresh processes, one per framework (this script
with ``--worker``), both reading the part's folder; they take turns, the order flipping every round (minitf first,
then transformers first, ...), each round timing a whole translation of the sentences (or one step) inside each
process, after a warm-up (the first batch's first 8 sentences translated, per mode; ``--warmup`` steps); a short
pause between turns lets the idle process's threads stop spinning. The outputs come back to this process and
are compared here: the translations token for token, the first step's losses. Both processes keep freed memory
for reuse (``minitf.backend.keep_freed_memory``, as train.py's and minitf.translate's malloc; the same settings
for both frameworks); PyTorch gets as many threads (``torch.set_num_threads``) as NumPy's BLAS has. In one
process the never-trimmed heap is shared: it sped PyTorch's step up and slowed both decoders by 8-10%
(docs/benchmarks.md). ``--in-process`` keeps that method: both frameworks in this process, alternating in the
same order every round, no pause. Prints the machine, then per part each framework's process (its id, threads
and malloc), the median and spread of each framework, the ratio of the medians and the spread of the per-round
ratios.
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import minitf  # noqa: E402
from minitf.nmt import marian  # noqa: E402
from benchmarks.common import (MAX_SOURCE, MIN_SOURCE, Worker, blas_description, blas_threads, cpu_model,  # noqa: E402
                               matmul_peak_gflops, pair_batch, sentence_batches, serve, spread, take_turns)

np = minitf.backend.host

#: Model shapes: ``opus`` is opus-mt-de-en's (Helsinki-NLP's config.json), ``small`` is for dry runs and tests.
SHAPES = {
    "opus": dict(vocab=58101, d_model=512, heads=8, layers=6, d_ff=2048, positions=512),
    "small": dict(vocab=1000, d_model=64, heads=4, layers=2, d_ff=256, positions=128),
}
EOS = 0
NEVER = -100.0          # the eos logit's bias for decoding: no eos before the forced one (logits are O(1))
WARMUP_SENTENCES = 8
LR, BETAS, ADAM_EPS = 2e-5, (0.9, 0.98), 1e-9
MODES = {"greedy": 1, "beam 4": 4}
FRAMEWORKS = ("minitf", "PyTorch")   # the processes' names (transformers' model; "transformers" in the decoding table)
PAUSE = 0.3                          # seconds between turns of two processes: the idle one's threads stop spinning


def generation_config(pad):
    """opus-mt's generation_config.json (the Marian converter's template)."""
    return {"bad_words_ids": [[pad]], "bos_token_id": 0, "decoder_start_token_id": pad, "eos_token_id": EOS,
            "forced_eos_token_id": EOS, "max_length": 512, "num_beams": 4, "pad_token_id": pad,
            "renormalize_logits": True}


def make_folder(shape, folder, dropout, eos_bias, seed=0):
    """A random MarianMTModel of ``shape`` saved as a Marian folder (config, safetensors, generation config)."""
    import torch
    import transformers

    V = shape["vocab"]
    torch.manual_seed(seed)
    config = transformers.MarianConfig(
        vocab_size=V, decoder_vocab_size=V, d_model=shape["d_model"], encoder_layers=shape["layers"],
        decoder_layers=shape["layers"], encoder_attention_heads=shape["heads"], decoder_attention_heads=shape["heads"],
        encoder_ffn_dim=shape["d_ff"], decoder_ffn_dim=shape["d_ff"], max_position_embeddings=shape["positions"],
        activation_function="swish", scale_embedding=True, pad_token_id=V - 1, decoder_start_token_id=V - 1,
        eos_token_id=EOS, forced_eos_token_id=EOS, bos_token_id=0, dropout=dropout, attention_dropout=0.0,
        activation_dropout=0.0, share_encoder_decoder_embeddings=True)
    model = transformers.MarianMTModel(config)
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = eos_bias
    model.save_pretrained(folder)
    (pathlib.Path(folder) / "generation_config.json").write_text(json.dumps(generation_config(V - 1)))
    return folder


# --------------------------------------------------------------------------- #
# translation
# --------------------------------------------------------------------------- #
def source_batches(count, vocab, batch_size):
    """``count`` random sentences (benchmarks/common.py's ``sentence_batches``: MIN_SOURCE..MAX_SOURCE ids ending
    in eos, sorted by length into batches), ids 1..vocab-2: neither eos (0) nor pad (vocab - 1)."""
    return sentence_batches(count, batch_size, (1, vocab - 1), vocab - 1, EOS)


def minitf_translate(model, settings, batches, beam):
    """Every batch's outputs (id lists without the start token and eos), as minitf.translate decodes."""
    from minitf.nmt.decode import beam_search, greedy_decode

    outputs = []
    for src, limit in batches:
        options = dict(max_len=limit, min_len=settings.min_len, rules=settings.rules)
        if beam == 1:
            outputs += greedy_decode(model, src, **options)
        else:
            outputs += beam_search(model, src, beam_size=beam, **options)
    return outputs


def hf_translate(model, batches, beam):
    """Every batch's ``generate`` outputs as id lists without the start token, the eos and the padding."""
    import torch

    pad, outputs = model.config.pad_token_id, []
    with torch.inference_mode():
        for src, limit in batches:
            ids = torch.from_numpy(src)
            sequences = model.generate(input_ids=ids, attention_mask=ids != pad, num_beams=beam, max_length=limit + 1)
            for row in sequences.tolist():
                row = row[1:]
                outputs.append(row[:row.index(EOS)] if EOS in row else [t for t in row if t != pad])
    return outputs


class DecodeSide:
    """One framework's translation of the sentences (``--sentences`` in batches of ``--batch-size``), read from the
    folder: ``ask("warmup BEAM")`` translates the warm-up sentences, ``ask("run BEAM")`` all of them; each answers
    {"seconds", "outputs"} (the id lists; the time is the translation's alone)."""

    def __init__(self, framework, folder, args):
        if framework == "minitf":
            from minitf.nmt.marian_tokenizer import read_generation_config
            model, hf_config = marian.read(folder, dtype="float32")
            settings = read_generation_config(folder, hf_config)
            self.translate = lambda batches, beam: minitf_translate(model, settings, batches, beam)
            self.info = {"settings": str(settings)}
        else:
            import transformers
            hf = transformers.MarianMTModel.from_pretrained(folder).float().eval()
            self.translate = lambda batches, beam: hf_translate(hf, batches, beam)
            self.info = {"attention": hf.config._attn_implementation}
        self.batches = source_batches(args.sentences, SHAPES[args.shape]["vocab"], args.batch_size)
        self.warm = [(self.batches[0][0][:WARMUP_SENTENCES], self.batches[0][1])]

    def ask(self, command):
        what, beam = command.split()
        start = time.perf_counter()
        outputs = self.translate(self.warm if what == "warmup" else self.batches, int(beam))
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "outputs": [[int(t) for t in out] for out in outputs]}


def bench_decode(workers, args, pause, flip):
    """Both frameworks' translations, taking turns (``take_turns``), compared token for token."""
    V = SHAPES[args.shape]["vocab"]
    batches = source_batches(args.sentences, V, args.batch_size)
    sources = sum(int((src != V - 1).sum()) for src, _ in batches)
    print(f"\n## Translation: {args.sentences} sentences of {MIN_SOURCE}-{MAX_SOURCE} source tokens ({sources:,} in "
          f"all), batches of {args.batch_size} sorted by length; each batch decodes as many tokens as its longest "
          "source has")
    print(f"transformers' attention: {workers['PyTorch'].info['attention']}; generation settings (minitf's reading "
          f"of generation_config.json): {workers['minitf'].info['settings']}")
    print_workers(workers)
    rows = []
    for mode, beam in MODES.items():
        take_turns(workers, f"warmup {beam}", 1, pause, flip)
        answers = take_turns(workers, f"run {beam}", args.rounds, pause, flip)
        times, outputs = {}, {}
        for name, rounds in answers.items():
            label = "transformers" if name == "PyTorch" else name
            if any(r["outputs"] != rounds[0]["outputs"] for r in rounds):
                raise SystemExit(f"marian_opus.py: {label}'s {mode} outputs changed from one round to the next")
            times[label], outputs[label] = [r["seconds"] for r in rounds], rounds[0]["outputs"]
        equal = sum(a == b for a, b in zip(outputs["minitf"], outputs["transformers"]))
        tokens = {k: sum(len(o) + 1 for o in out) for k, out in outputs.items()}  # + 1: the eos
        rows.append((mode, times, tokens, equal))
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    print("| decoding | framework | median s (spread) | sentences/s | tokens/s | tokens generated |")
    print("|---|---|---:|---:|---:|---:|")
    for mode, times, tokens, equal in rows:
        for name, t in times.items():
            m = statistics.median(t)
            print(f"| {mode} | {name} | {m:.2f} ({spread(t, 1, 2)}) | {args.sentences / m:.1f} | "
                  f"{tokens[name] / m:,.0f} | {tokens[name]:,} |")
    print()
    for mode, times, tokens, equal in rows:
        ratio = statistics.median(times["minitf"]) / statistics.median(times["transformers"])
        ratios = [a / b for a, b in zip(times["minitf"], times["transformers"])]
        print(f"- {mode}: minitf / transformers time **{ratio:.2f}x** (medians; per-round ratios "
              f"{spread(ratios, 1, 2)}); outputs equal token for token: {equal}/{args.sentences} sentences")
    return rows


def print_workers(workers):
    """Where each framework ran: its process id, threads and malloc (equal settings for both)."""
    print("processes: " + ", ".join(
        f"{name} in process {w.info['pid']} ({w.info['threads']} threads, malloc keeps freed memory: "
        f"{'yes' if w.info['malloc'] else 'no'})" for name, w in workers.items()))


# --------------------------------------------------------------------------- #
# the fine-tuning step
# --------------------------------------------------------------------------- #
def step_batch(B, L, vocab):
    """src, labels, tgt_in (B, L) (benchmarks/common.py's ``pair_batch``), ids 1..vocab-2, pad vocab - 1."""
    return pair_batch(B, L, (1, vocab - 1), vocab - 1, EOS)


class MinitfMarianStep:
    """zero_grad, forward, label-smoothed loss (a Python float), backward, Adam: minitf's fine-tuning step."""

    def __init__(self, folder, batch):
        self.model = marian.from_pretrained(folder, dtype="float32")
        self.model.train()
        self.pad = self.model.config.pad_id
        self.loss_fn = minitf.LabelSmoothedCrossEntropy(0.1, ignore_index=self.pad)
        self.optimizer = minitf.Adam(self.model.parameters(), lr=LR, betas=BETAS, eps=ADAM_EPS)
        self.src, self.labels, self.tgt_in = (minitf.backend.asarray(a) for a in batch)
        self.num_parameters = self.model.num_parameters()

    def __call__(self):
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(self.src, self.tgt_in), self.labels)
        self.model.backward(self.loss_fn.backward())
        self.optimizer.step()
        minitf.backend.synchronize()
        return loss


class TorchMarianStep:
    """The same step in PyTorch: MarianMTModel (train mode), the same loss on its logits, autograd, Adam."""

    def __init__(self, folder, batch):
        import torch
        import transformers
        from minitf.pytorch import loss

        torch.manual_seed(0)
        self.model = transformers.MarianMTModel.from_pretrained(folder).float().train()
        for embedding in (self.model.model.encoder.embed_positions, self.model.model.decoder.embed_positions):
            embedding.weight.requires_grad_(False)  # fixed sinusoids (from_pretrained of transformers 5.25 unfreezes)
        self.pad = self.model.config.pad_token_id
        self.loss = loss
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(params, lr=LR, betas=BETAS, eps=ADAM_EPS)
        self.src, self.labels, self.tgt_in = (torch.from_numpy(a) for a in batch)
        self.num_parameters = sum(p.numel() for p in params)

    def __call__(self):
        self.optimizer.zero_grad()
        logits = self.model(input_ids=self.src, attention_mask=self.src != self.pad,
                            decoder_input_ids=self.tgt_in).logits
        loss = self.loss(logits, self.labels, smoothing=0.1, ignore_index=self.pad)
        value = loss.item()
        loss.backward()
        self.optimizer.step()
        return value


class StepSide:
    """One framework's fine-tuning step of the folder's model on the fixed batch: ``ask("run")`` -> {"seconds",
    "loss"}."""

    def __init__(self, framework, folder, args):
        batch = step_batch(args.step_batch, args.step_len, SHAPES[args.shape]["vocab"])
        self.step = (MinitfMarianStep if framework == "minitf" else TorchMarianStep)(folder, batch)
        self.info = {"parameters": self.step.num_parameters}

    def ask(self, command):
        start = time.perf_counter()
        loss = self.step()
        return {"seconds": time.perf_counter() - start, "loss": float(loss)}


def bench_step(workers, args, pause, flip):
    """Both frameworks' steps, taking turns (``take_turns``), from equal first losses with ``--dropout 0``."""
    first = {k: a[0]["loss"] for k, a in take_turns(workers, "run", 1, pause, flip).items()}  # equal weights
    take_turns(workers, "run", args.warmup - 1, pause, flip)
    times = {k: [a["seconds"] for a in answers] for k, answers in
             take_turns(workers, "run", args.rounds, pause, flip).items()}
    src, labels, _ = step_batch(args.step_batch, args.step_len, SHAPES[args.shape]["vocab"])
    pad = SHAPES[args.shape]["vocab"] - 1
    tokens = int((src != pad).sum() + (labels != pad).sum())
    print(f"\n## Fine-tuning step: batch {args.step_batch} x {args.step_len} tokens both sides ({tokens:,} non-pad "
          f"tokens), label smoothing 0.1, Adam; dropout {args.dropout:g}; trained parameters "
          + ", ".join(f"{k} {w.info['parameters']:,}" for k, w in workers.items()))
    print_workers(workers)
    print("first-step loss: " + ", ".join(f"{k} {v:.6f}" for k, v in first.items()))
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    print("| framework | median step ms (spread) | tokens/s |")
    print("|---|---:|---:|")
    for k, t in times.items():
        m = statistics.median(t)
        print(f"| {k} | {m * 1e3:.0f} ({spread(t)}) | {tokens / m:,.0f} |")
    ratio = statistics.median(times["minitf"]) / statistics.median(times["PyTorch"])
    ratios = [a / b for a, b in zip(times["minitf"], times["PyTorch"])]
    print(f"\nminitf / PyTorch: **{ratio:.2f}x** (medians; per-round ratios {spread(ratios, 1, 2)})")
    return times, first


PARTS = {"decode": (DecodeSide, bench_decode, NEVER), "step": (StepSide, bench_step, 0.0)}  # side, bench, eos bias


def side_info(framework, side, malloc):
    """A side's info with this process's id, threads (PyTorch's own, else NumPy's BLAS's) and malloc setting."""
    threads = sys.modules["torch"].get_num_threads() if framework == "PyTorch" else blas_threads()
    return side.info | {"pid": os.getpid(), "threads": threads, "malloc": malloc}


def worker(args):
    """--worker FRAMEWORK --part PART --folder F: that framework's side of the part in this process (``serve``)."""
    def start():
        malloc = minitf.backend.keep_freed_memory()   # as train.py and minitf.translate run: the same for both
        warnings.filterwarnings("ignore")            # transformers' notices about generation settings
        if args.worker == "PyTorch":
            import torch
            import transformers
            torch.set_num_threads(blas_threads())
            transformers.utils.logging.disable_progress_bar()
        side = PARTS[args.part][0](args.worker, args.folder, args)
        return side_info(args.worker, side, malloc), side.ask

    serve(start)


def bench_part(part, folder, args):
    """``part``'s two sides, in processes of their own (or in this one with ``--in-process``), and its bench."""
    Side, bench, _ = PARTS[part]
    if args.in_process:
        sides = {name: Side(name, folder, args) for name in FRAMEWORKS}
        for name, side in sides.items():
            side.info = side_info(name, side, args.malloc)
        return bench(sides, args, pause=0.0, flip=False)
    argv = ["--part", part, "--folder", str(folder)] + [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in
                                                        ("shape", "sentences", "batch_size", "step_batch", "step_len")]
    workers = {}
    try:
        for name in FRAMEWORKS:
            workers[name] = Worker(__file__, name, argv)
        return bench(workers, args, pause=PAUSE, flip=True)
    finally:
        for w in workers.values():
            w.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["decode", "step", "all"], default="all")
    parser.add_argument("--shape", choices=list(SHAPES), default="opus")
    parser.add_argument("--sentences", type=int, default=100, help="sentences to translate")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per decoding batch")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per framework, taking turns")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per framework first (at least 1)")
    parser.add_argument("--step-batch", type=int, default=32, help="sentence pairs of the training step")
    parser.add_argument("--step-len", type=int, default=30, help="most tokens of a step's sentence, both sides")
    parser.add_argument("--dropout", type=float, default=0.1, help="the model's dropout (opus-mt: 0.1)")
    parser.add_argument("--in-process", action="store_true",
                        help="both frameworks in this process, alternating (the method before each had its own)")
    parser.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("sentences", "batch_size", "rounds", "warmup", "step_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.step_len < 2:
        parser.error(f"--step-len must be at least 2, got {args.step_len}")
    if not 0 <= args.dropout < 1:
        parser.error(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.worker:
        return worker(args)
    try:
        import torch
        import transformers
        import safetensors  # noqa: F401  (minitf reads the folder's model.safetensors with it)
    except ImportError as error:
        parser.exit(2, f"marian_opus.py needs torch, transformers and safetensors ({error}): "
                       'pip install -e ".[bench]"\n')
    # as train.py and minitf.translate run; with --in-process the heap both frameworks share (each worker: its own)
    args.malloc = minitf.backend.keep_freed_memory() if args.in_process else None
    threads = blas_threads()
    torch.set_num_threads(threads)   # this process's (with --in-process, PyTorch's); each worker sets its own alike
    warnings.filterwarnings("ignore")  # transformers' notices about generation settings
    transformers.utils.logging.disable_progress_bar()
    shape = SHAPES[args.shape]
    print(f"- command: `python benchmarks/marian_opus.py {' '.join(sys.argv[1:] if argv is None else argv)}`")
    print(f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}; load average before: {os.getloadavg()[0]:.2f}")
    print(f"- CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; NumPy {np.__version__}, BLAS {blas_description()}, "
          f"{threads} threads; PyTorch {torch.__version__} ({torch.get_num_threads()} threads), transformers "
          f"{transformers.__version__}")
    print(f"- float32 matmul peak (2048^3, NumPy, best of 5): {matmul_peak_gflops('cpu'):.0f} GFLOP/s")
    print(f"- model ({args.shape}): random MarianMTModel, {shape['layers']}+{shape['layers']} layers, d_model "
          f"{shape['d_model']}, {shape['heads']} heads, d_ff {shape['d_ff']}, vocabulary {shape['vocab']:,}, swish, "
          "post-LN; both read the same saved folder, float32")
    print("- method: " + (f"one process, alternating, {args.rounds} timed rounds per framework after a warm-up"
                          if args.in_process else
                          f"a process per framework and part, taking turns (the order flipping every round), "
                          f"{args.rounds} timed rounds per framework after a warm-up"))
    with tempfile.TemporaryDirectory(prefix="marian_opus_") as tmp:
        results = {}
        for part, (_, _, eos_bias) in PARTS.items():
            if args.part in (part, "all"):
                folder = make_folder(shape, pathlib.Path(tmp) / part, args.dropout, eos_bias=eos_bias)
                results[part] = bench_part(part, folder, args)
    return results


if __name__ == "__main__":
    main()
