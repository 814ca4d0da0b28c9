"""T5 (t5-small's shape) in minitf and in transformers, each framework in a process of its own, taking turns:
translation (greedy and beam 4, sentences per second) and the fine-tuning step (forward, loss, backward, Adam).

    pip install -e ".[bench]"      # torch, transformers, safetensors: only for the comparison
    python benchmarks/t5_step.py --threads 2 --rounds 5 --json t5-2.json   # t5-small's shape
    python benchmarks/t5_step.py --dry-run                                    # tiny shape, 1 round

The model: a random ``transformers.T5ForConditionalGeneration`` of t5-small's shape (``--shape t5-small``: 60M
parameters, 6+6 blocks, d_model 512, 8 heads of d_kv 64, d_ff 2048, vocabulary 32,128, v1.0's layout: ReLU
feed-forward, the output tied to the shared embedding and scaled by d_model^-0.5; pad 0 the decoder's start, eos 1),
dropout 0 (the first step's losses must agree), saved with ``save_pretrained`` (config.json, model.safetensors and
the generation_config.json it writes: no generation setting but the ids) into a temporary folder in float32. Both
frameworks read that folder: transformers with ``T5ForConditionalGeneration.from_pretrained`` (its default
attention, named in the output), minitf with ``minitf.t5.T5.from_pretrained`` (float32) and the decoding settings
of T5's translator (``minitf.t5.kind.generate_settings``: generate()'s defaults for a folder without settings,
length_penalty 1.0, early_stopping False, pad, T5's decoder start, allowed). ``--shape tiny`` is a small model for
dry runs and tests.

What makes the outputs worth comparing: with transformers' own initialisation (``initializer_factor`` 1) a random
T5's greedy output is one token over and over, the same for every sentence (the residual stream carries the input
token's embedding to the tied output, which picks it again). Larger factors make the outputs differ from sentence
to sentence, but from about 3 up the random model is chaotic: attention without 1/sqrt(d_k) on weights this large
gives scores in the thousands, float32's rounding decides near-ties, and minitf's own float32 and float64 greedy
outputs of the same folder agree on 25/100 sentences at factor 3 and 46/100 at 8 (20/100 at 4), so no two float32
implementations could agree either. At factor 2 they agree on 98/100, and the outputs still differ from sentence
to sentence (93 of 100 distinct, about 3 distinct ids each): the t5-small shape's ``initializer_factor`` is 2
(tiny: 4). The number of distinct outputs, and of beam 4's that differ from greedy's, are printed. The weights'
values change no cost (the eos row is zeroed: every sentence runs to its limit). The step's folder is made
with transformers' own initialisation (a fine-tuning step from a sane loss).

Translation (``--part greedy``, ``--part beam4``): ``sentences`` (100) random source sentences of 10 to 40 ids (the
last one eos; ids 2 and up, so neither pad nor eos inside), sorted by length into batches of ``batch_size`` (64, as
``python -m minitf.translate``), the same batches for both (benchmarks/common.py's ``sentence_batches``, as
marian_opus.py). A random model does not know when to stop, so the decoding folder's eos row of the output (tied:
the shared embedding's) is zero: its logit is 0 while the largest of 32,128 random logits is far above, so no
sentence ends early and each batch decodes as many tokens as its longest source has (counting eos) in both
frameworks: the same number of steps on the same rows (minitf's dropping of finished sentences gains nothing here),
and the outputs are compared token for token (they are equal unless float32 rounding flips a near tie). minitf:
``greedy_decode`` / ``beam_search`` of minitf/nmt/decode.py (``max_len`` the batch's limit, the translator's
rules); transformers: ``generate(num_beams=1 or 4, max_new_tokens=limit, do_sample=False)`` under
``torch.inference_mode``, the rest from the folder's generation_config.json. Neither tokenizes (ids in, ids out).

Fine-tuning step (``--part step``): a fixed batch of ``step_batch`` (32) pairs of at most ``step_len`` (30)
tokens both sides (random lengths from half to all of it, ending in eos, padded with 0), the decoder's input the
labels shifted right behind the start token (pad), as transformers' ``_shift_right`` (benchmarks/common.py's
``pair_batch``), the labels' padding not scored. minitf: zero_grad, ``model(src, tgt_in, key_padding_mask=src ==
pad)``, ``LabelSmoothedCrossEntropy(0.0, ignore_index=-1)``, backward, ``minitf.Adam``; PyTorch:
``model(input_ids, attention_mask, decoder_input_ids).logits``, ``cross_entropy(..., ignore_index=-1)``, autograd,
``torch.optim.AdamW`` with ``weight_decay=0.0`` (minitf's Adam is AdamW without weight decay): benchmarks/common.py's
``MinitfLMStep`` and ``TorchLMStep`` with the source added, Adam's settings its ``GPT_LR``, ``GPT_BETAS``,
``GPT_EPS``. Memory: as benchmarks/llama_step.py measures it (each process's peak over its loaded model, after the
timed steps).

Method (benchmarks/common.py's ``run_pair``: its ``Worker`` and ``take_turns``, as llama_step.py and bert_step.py):
each part starts two fresh processes, one per framework (this script with ``--worker``), so that NumPy's OpenBLAS
threads and PyTorch's OpenMP threads never share a process; they take turns, a whole translation of the sentences
(or one step) at a time, timed inside each process, after a warm-up (one translation, or one step, whose outputs
and losses are the ones compared); a short pause between turns. ``--threads N`` sets both processes' threads; the
default is this machine's cores. Prints the machine, then per part the median and spread of each framework, the
ratio of the medians and the spread of the per-round ratios; ``--json OUT`` writes every number.
"""
import argparse
import gc
import json
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import minitf  # noqa: E402
from benchmarks.common import (MAX_SOURCE, MIN_SOURCE, MinitfLMStep, TorchLMStep, bench_arguments,  # noqa: E402
                               bench_header, pair_batch, run_pair, sentence_batches, serve_side, spread, step_report,
                               summary)

np = minitf.backend.host

#: Model shapes (transformers.T5Config's values) and the work of each part: ``t5-small`` is t5-small's (v1.0);
#: ``tiny`` is for dry runs and tests.
SHAPES = {
    "t5-small": dict(model=dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8),
                     init_factor=2.0, sentences=100, batch_size=64, step_batch=32, step_len=30),
    "tiny": dict(model=dict(vocab_size=1000, d_model=64, d_kv=16, d_ff=256, num_layers=2, num_heads=4),
                 init_factor=4.0, sentences=7, batch_size=3, step_batch=3, step_len=8),
}
PAD, EOS = 0, 1                 # T5's: pad is also the decoder's start
MODES = {"greedy": 1, "beam4": 4}
PARTS = tuple(MODES) + ("step",)


# --------------------------------------------------------------------------- #
# the folder, the sentences and the batch
# --------------------------------------------------------------------------- #
def make_folder(shape, folder, decoding, seed=0):
    """A random T5ForConditionalGeneration of ``shape`` (v1.0's layout, dropout 0) saved in float32; for
    ``decoding`` its weights drawn with the shape's ``init_factor`` and its eos row of the (tied) output zeroed,
    else transformers' initialisation."""
    import torch
    import transformers
    torch.manual_seed(seed)
    config = transformers.T5Config(**shape["model"], feed_forward_proj="relu", tie_word_embeddings=True,
                                   dropout_rate=0.0, pad_token_id=PAD, initializer_factor=shape["init_factor"] if decoding else 1.0,
                                   eos_token_id=EOS, decoder_start_token_id=PAD)
    model = transformers.T5ForConditionalGeneration(config).float()
    if decoding:
        with torch.no_grad():
            model.lm_head.weight[EOS] = 0.0     # its logit 0: far below the largest of the others
    model.save_pretrained(folder)
    return folder


def source_batches(shape):
    """The sentences of a shape (benchmarks/common.py's ``sentence_batches``): [(src (b, S), limit S)], ids 2 and
    up."""
    return sentence_batches(shape["sentences"], shape["batch_size"], (2, shape["model"]["vocab_size"]), PAD, EOS)


def step_batch(shape):
    """(src, tgt_in, targets) host int64 (step_batch, step_len): common.py's ``pair_batch``, the labels' padding -1
    (not scored)."""
    src, labels, tgt_in = pair_batch(shape["step_batch"], shape["step_len"], (2, shape["model"]["vocab_size"]),
                                     PAD, EOS)
    return src, tgt_in, np.where(labels == PAD, -1, labels)


# --------------------------------------------------------------------------- #
# the worker: one framework, one part, in a process of its own
# --------------------------------------------------------------------------- #
class MinitfT5Step(MinitfLMStep):
    """benchmarks/common.py's minitf step with T5's source: ``model(src, tgt_in, key_padding_mask=src == pad)``."""

    def __init__(self, model, batch):
        src, tgt_in, targets = batch
        super().__init__(model, (tgt_in, targets))
        self.src, self.src_padding = minitf.backend.asarray(src), minitf.backend.asarray(src == PAD)

    def logits(self):
        return self.model(self.src, self.inputs, key_padding_mask=self.src_padding)


class TorchT5Step(TorchLMStep):
    """The same step in PyTorch: ``model(input_ids=src, attention_mask=src != pad, decoder_input_ids=tgt_in)``."""

    def __init__(self, model, batch):
        src, tgt_in, targets = batch
        super().__init__(model, (tgt_in, targets))
        self.src = self.torch.from_numpy(src)

    def logits(self):
        return self.model(input_ids=self.src, attention_mask=self.src != PAD, decoder_input_ids=self.inputs).logits


def outputs_of(rows):
    """Id lists as plain ints (a JSON answer)."""
    return [[int(t) for t in row] for row in rows]


class MinitfSide:
    """minitf's T5 of the folder (float32) and one part's work: ``run()`` -> {"seconds", "loss" or "outputs"}."""

    def __init__(self, folder, shape, part):
        from minitf.t5 import T5
        from minitf.t5.kind import generate_settings
        self.model = T5.from_pretrained(folder, dtype="float32")
        self.parameters = self.model.num_parameters()
        self.part = part
        if part == "step":
            self.step = MinitfT5Step(self.model, step_batch(shape))
            self.baseline = self.step.baseline
        else:
            self.settings = generate_settings(folder, json.loads((pathlib.Path(folder) / "config.json").read_text()))
            self.batches = source_batches(shape)

    def run(self):
        if self.part == "step":
            return self.step.run()
        from minitf.nmt.decode import beam_search, greedy_decode
        beam, s = MODES[self.part], self.settings
        start, outputs = time.perf_counter(), []
        for src, limit in self.batches:
            if beam == 1:
                outputs += greedy_decode(self.model, src, max_len=limit, min_len=s.min_len, rules=s.rules)
            else:
                outputs += beam_search(self.model, src, beam_size=beam, alpha=s.alpha, max_len=limit,
                                       min_len=s.min_len, rules=s.rules)
        return {"seconds": time.perf_counter() - start, "outputs": outputs_of(outputs)}


class TorchSide:
    """transformers' T5ForConditionalGeneration of the folder (float32) and the same work."""

    def __init__(self, folder, shape, part):
        import torch
        import transformers
        self.torch = torch
        self.model = transformers.T5ForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
        self.parameters = sum(p.numel() for p in self.model.parameters())
        self.attention = self.model.config._attn_implementation
        self.part = part
        if part == "step":
            self.step = TorchT5Step(self.model, step_batch(shape))
            self.baseline = self.step.baseline
        else:
            self.model.eval()
            self.batches = source_batches(shape)

    def run(self):
        if self.part == "step":
            return self.step.run()
        torch, outputs = self.torch, []
        start = time.perf_counter()
        with torch.inference_mode():
            for src, limit in self.batches:
                ids = torch.from_numpy(src)
                sequences = self.model.generate(input_ids=ids, attention_mask=ids != PAD, num_beams=MODES[self.part],
                                                max_new_tokens=limit, do_sample=False)
                for row in sequences.tolist():
                    row = row[1:]                                  # the start token
                    outputs.append(row[:row.index(EOS)] if EOS in row else row)  # pad may be chosen: kept
        return {"seconds": time.perf_counter() - start, "outputs": outputs_of(outputs)}


# --------------------------------------------------------------------------- #
# the parts
# --------------------------------------------------------------------------- #
def bench_decode(folder, args, modes):
    """The decoding ``modes`` (greedy, beam4), each a :func:`run_pair` of its own; their table and the outputs
    compared."""
    shape = SHAPES[args.shape]
    batches = source_batches(shape)
    sources = sum(int((src != PAD).sum()) for src, _ in batches)
    steps = sum(len(src) * limit for src, limit in batches)
    n = shape["sentences"]
    results = {}
    for mode in modes:
        info, first, rounds, _ = run_pair(__file__, mode, folder, args)
        for name, answers in rounds.items():
            if any(a["outputs"] != first[name]["outputs"] for a in answers):
                raise SystemExit(f"t5_step.py: {name}'s {mode} outputs changed from one round to the next")
        ours, theirs = first["minitf"]["outputs"], first["PyTorch"]["outputs"]
        results[mode] = summary(rounds) | {
            "sentences": n, "outputs_equal": sum(a == b for a, b in zip(ours, theirs)),
            "tokens": {"minitf": sum(map(len, ours)), "transformers": sum(map(len, theirs))},
            "distinct_outputs": len({tuple(o) for o in theirs}),
            "outputs": {"minitf": ours, "transformers": theirs}, "workers": info}
    attention = results[modes[0]]["workers"]["PyTorch"]["attention"]
    print(f"\n## Translation: {n} sentences of {MIN_SOURCE}-{MAX_SOURCE} source tokens ({sources:,} in all), batches "
          f"of {shape['batch_size']} sorted by length; each batch decodes as many tokens as its longest source has "
          f"({steps:,} tokens in all); transformers' attention: {attention}")
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    print("| decoding | framework | median s (spread) | sentences/s | tokens/s | tokens generated |")
    print("|---|---|---:|---:|---:|---:|")
    for mode, r in results.items():
        for name, t in r["times"].items():
            label = "transformers" if name == "PyTorch" else name
            m = r["median"][name]
            print(f"| {mode} | {label} | {m:.2f} ({spread(t, 1, 2)}) | {n / m:.1f} | {r['tokens'][label] / m:,.0f} | "
                  f"{r['tokens'][label]:,} |")
    print()
    for mode, r in results.items():
        print(f"- {mode}: minitf / transformers time **{r['ratio']:.2f}x** (medians; per-round ratios "
              f"{spread(r['round_ratios'], 1, 2)}); outputs equal token for token: {r['outputs_equal']}/{n} "
              f"sentences; distinct outputs (transformers'): {r['distinct_outputs']}/{n}")
    if len(results) == 2:
        differ = sum(a != b for a, b in zip(results["greedy"]["outputs"]["transformers"],
                                            results["beam4"]["outputs"]["transformers"]))
        print(f"- beam 4's outputs other than greedy's (transformers'): {differ}/{n} sentences")
    return results


def bench_step(folder, args):
    shape = SHAPES[args.shape]
    src, _, targets = step_batch(shape)
    tokens = int((src != PAD).sum() + (targets >= 0).sum())
    return step_report(__file__, folder, args, tokens,
                       f"Fine-tuning step: batch {shape['step_batch']} x {shape['step_len']} tokens both sides "
                       f"({tokens:,} non-pad tokens), cross-entropy, Adam (minitf) / AdamW with weight_decay 0 "
                       "(PyTorch)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args = bench_arguments(parser, SHAPES, "t5-small", argv, parts=PARTS)
    if args.worker:
        side = MinitfSide if args.worker == "minitf" else TorchSide
        return serve_side(args, lambda: side(args.folder, SHAPES[args.shape], args.part))
    results = bench_header(parser, __file__, argv, args)
    shape = SHAPES[args.shape]
    m = shape["model"]
    print(f"- model ({args.shape}): random T5ForConditionalGeneration (v1.0), {m['num_layers']}+{m['num_layers']} "
          f"blocks, d_model {m['d_model']}, {m['num_heads']} heads of d_kv {m['d_kv']}, ReLU d_ff {m['d_ff']}, "
          f"vocabulary {m['vocab_size']:,}, tied output x d_model^-0.5, dropout 0, initializer_factor "
          f"{shape['init_factor']:g} for translation (1 for the step); both read the same saved folder, float32")
    print(f"- method: a process per framework and part, taking turns, {args.rounds} timed rounds each after a "
          "warm-up")
    decoding = [part for part in MODES if args.part in (part, "all")]
    with tempfile.TemporaryDirectory(prefix="t5_step_") as tmp:
        if decoding:
            folder = make_folder(shape, pathlib.Path(tmp) / "decode", decoding=True)
            gc.collect()
            results["decode"] = bench_decode(folder, args, decoding)
        if args.part in ("step", "all"):
            folder = make_folder(shape, pathlib.Path(tmp) / "step", decoding=False)
            gc.collect()
            results["step"] = bench_step(folder, args)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    if "step" in results and not results["step"]["losses_agree"]:
        print("t5_step.py: the first step's losses differ: the two models are not the same", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
