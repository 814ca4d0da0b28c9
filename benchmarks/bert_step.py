"""BERT (bert-base's shape) in minitf and in transformers, each framework in a process of its own, taking turns:
the masked-LM training step (``--part step``), and the throughput of fill-mask (``--part fill-mask``) and of
text classification (``--part classify``) against transformers' pipelines.

    pip install -e ".[bench]"      # torch, transformers, safetensors: only for the comparison
    python benchmarks/bert_step.py --threads 2 --rounds 5 --json bert-2.json   # bert-base's shape, every part
    python benchmarks/bert_step.py --part fill-mask --threads 2 --rounds 5      # one part
    python benchmarks/bert_step.py --dry-run                                      # tiny shape, 1 round, every part

The model: a random ``transformers.BertForMaskedLM`` of bert-base-uncased's shape (``--shape base``: 12 layers,
d_model 768, 12 heads, d_ff 3072, exact GELU, vocabulary 30,522, 512 positions, two token types, tied decoder) with
transformers' own initialisation (std 0.02), dropout 0 (``hidden_dropout_prob`` and
``attention_probs_dropout_prob``, which both frameworks read from the folder: the first step's losses must agree), saved
with ``save_pretrained`` into a temporary folder in float32. Both frameworks read that folder: transformers with
``BertForMaskedLM.from_pretrained`` (its default attention, named in the output), minitf with
``minitf.bert.hf.from_pretrained`` (float32): the same weights on both sides. ``--shape tiny`` is a small model for
dry runs and tests.

The step: a fixed batch of random ids, ``batch`` x ``block`` (8 x 128, no padding, one segment), 15% of the
positions (never the first or last) scored on their own id (the masked-LM loss's shape: the other positions carry
no loss; the inputs are left as they are, which changes no cost). minitf, in two processes: as ``train.py --model
bert`` trains, the head at the scored positions only (``model(inputs, scored=...)``, logits (1, N, V); the same loss
and gradients), and with the head at every position (``model(inputs)``: transformers' work, whose BertForMaskedLM
has no such choice); both zero_grad, forward, ``LabelSmoothedCrossEntropy(0.0, ignore_index=-1)``, backward,
``minitf.Adam``; PyTorch: ``cross_entropy(...,
ignore_index=-1)`` on the logits, autograd, ``torch.optim.AdamW`` with ``weight_decay=0.0`` (minitf's Adam is AdamW
without weight decay): benchmarks/common.py's ``MinitfLMStep`` and ``TorchLMStep``, Adam's settings its ``GPT_LR``,
``GPT_BETAS``, ``GPT_EPS``. Memory: as benchmarks/llama_step.py measures it (each process's peak over its loaded
model, after the timed steps).

Fill-mask and classify (``--part fill-mask``, ``--part classify``; ``texts`` a round, ``batch_size`` a forward:
64 texts of 8 to 64 words, 8 a forward at bert-base's shape): the folders hold a WordPiece vocab.txt this script
writes (the specials [PAD] [UNK] [CLS] [SEP] [MASK], then made-up lowercase words of one to four letters to the
vocabulary's size) with transformers' tokenizer files beside it, as the tests build them. The texts: random words of
that vocabulary (one token each), seeded, the same in both processes; the fill-mask texts have one word replaced by
[MASK], the classify texts none. minitf: ``minitf.bert.fill_mask.fill_masks_batch`` (what ``python -m
minitf.fill_mask`` runs) and ``minitf.bert.classify.classify`` (``python -m minitf.classify``'s) on the folder as
their commands load it (``minitf.bert.kind.load_bert``); transformers: ``pipeline("fill-mask")`` (``top_k`` 5) and
``pipeline("text-classification")`` (``top_k=None``: every label, ranked) of ``BertForMaskedLM`` /
``BertForSequenceClassification.from_pretrained`` (float32) and ``AutoTokenizer`` (its fast tokenizer), on the
CPU. Both take the texts in the same order, ``batch_size`` a forward, each batch padded to its longest text with the
padding masked out; a round is every text, from the strings to the answers (tokenizing, the forwards, the
probabilities, the candidates' text). minitf's fill-mask runs its masked-LM head at the masks only (the pipeline's
model computes it at every position and reads the masks'). The outputs must be equal: every mask's top-k token ids
in order, every text's labels in order (else the exit status is 1). So that float32's rounding cannot swap two
near-tied candidates, these folders' predictions are spread: the token embedding, and so the tied decoder, drawn
N(0, 1) (nn.Embedding's own default: logits of std about 28 at bert-base's width), the classifier's matrix N(0, 1)
(logits of std about 14); every other weight as transformers initialises it. Reported: texts/second of each, the
medians, the spread, the ratio, and the largest relative difference of the probabilities.

Method (benchmarks/common.py's ``run_pair``: its ``Worker`` and ``take_turns``): two fresh processes, one per
framework (this script with ``--worker``), so that NumPy's OpenBLAS threads and PyTorch's OpenMP threads never share
a process; they take turns, one step at a time, timed inside each process, after a warm-up step; a short pause
between turns. ``--threads N`` sets both processes' threads; the default is this machine's cores. Prints the
machine, the median and spread of each framework, the ratio of the medians and the spread of the per-round ratios;
``--json OUT`` writes every number.
"""
import argparse
import gc
import os
import pathlib
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import minitf  # noqa: E402
from benchmarks.common import (MinitfLMStep, TorchLMStep, bench_arguments, bench_header, finish_step, rate_table,  # noqa: E402,E501
                               run_pair, serve_side, spread, step_report, summary)

np = minitf.backend.host

#: Model shapes (transformers.BertConfig's values) and the batch: ``base`` is bert-base-uncased's; ``tiny`` is for
#: dry runs and tests.
SHAPES = {
    "base": dict(model=dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                            intermediate_size=3072, max_position_embeddings=512), batch=8, block=128,
                 texts=64, words=(8, 64), batch_size=8),
    "tiny": dict(model=dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=128, max_position_embeddings=64), batch=2, block=32,
                 texts=10, words=(3, 20), batch_size=4),
}
#: The step's workers: minitf as train.py trains (the head at the scored positions), PyTorch, and minitf with the
#: head at every position (transformers' BertForMaskedLM's work)
STEP_WORKERS = ("minitf", "PyTorch", "minitf-all")
MASK_SHARE = 0.15                               # the positions that carry the loss, as BERT's pre-training
PARTS = ("step", "fill-mask", "classify")
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LABELS = ("negative", "positive", "neutral")   # the classifier's id2label
TOP_K = 5                                       # the candidates per mask (the pipeline's default)


def vocabulary(size):
    """``size`` WordPiece entries: the specials, then lowercase words of one to four letters, shortest first."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = list(letters)
    while len(SPECIALS) + len(words) < size:
        words += [w + c for w in words if len(w) == len(words[-1]) for c in letters]
    return SPECIALS + words[:size - len(SPECIALS)]


def make_folder(shape, folder, seed=0, part="step"):
    """A random BertForMaskedLM (part step, fill-mask) or BertForSequenceClassification (classify) of ``shape``,
    dropout 0, saved in float32 (config.json, model.safetensors), with vocab.txt and transformers' tokenizer files;
    the pipelines' parts with spread predictions (the module doc)."""
    import torch
    import transformers
    torch.manual_seed(seed)
    folder.mkdir(parents=True)
    (folder / "vocab.txt").write_text("\n".join(vocabulary(shape["model"]["vocab_size"])) + "\n")
    transformers.BertTokenizer.from_pretrained(folder).save_pretrained(folder)     # its files beside vocab.txt
    labels = dict(id2label=dict(enumerate(LABELS)), label2id={v: k for k, v in enumerate(LABELS)})
    config = transformers.BertConfig(**shape["model"], hidden_act="gelu", hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, type_vocab_size=2, layer_norm_eps=1e-12,
                                     **(labels if part == "classify" else {}))
    model = (transformers.BertForSequenceClassification if part == "classify" else transformers.BertForMaskedLM)(config)
    with torch.no_grad():
        if part == "fill-mask":
            model.bert.embeddings.word_embeddings.weight.normal_(0.0, 1.0)
        if part == "classify":
            model.classifier.weight.normal_(0.0, 1.0)
    model.float().save_pretrained(folder)
    return folder


def texts_of(shape, part, seed=2):
    """The texts of a round: ``texts`` of ``words`` random vocabulary words each; fill-mask's with one word [MASK]."""
    rng = np.random.default_rng(seed)
    words = vocabulary(shape["model"]["vocab_size"])[len(SPECIALS):]
    low, high = shape["words"]
    texts = []
    for _ in range(shape["texts"]):
        chosen = [words[i] for i in rng.integers(0, len(words), rng.integers(low, high + 1))]
        if part == "fill-mask":
            chosen[rng.integers(0, len(chosen))] = "[MASK]"
        texts.append(" ".join(chosen))
    return texts


def step_batch(shape, seed=1):
    """Host int64 (inputs, targets), each (batch, block): random ids; the targets the ids at 15% of the positions
    (never the first or the last), -1 elsewhere."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, shape["model"]["vocab_size"], (shape["batch"], shape["block"]))
    chosen = rng.random(ids.shape) < MASK_SHARE
    chosen[:, [0, -1]] = False
    return ids, np.where(chosen, ids, -1)


class MinitfMaskedLMStep(MinitfLMStep):
    """minitf's step as train.py's masked LM takes it: the head at the scored positions only (``scored``)."""

    def __init__(self, model, batch):
        super().__init__(model, batch)
        self.scored = self.targets != -1                                   # (batch, block)
        self.scored_targets = self.targets[self.scored][None]             # (1, N)

    def logits(self):
        return self.model(self.inputs, scored=self.scored)                # (1, N, V)

    def loss_targets(self):
        return self.scored_targets


def minitf_side(folder, shape, step=MinitfMaskedLMStep):
    """minitf's masked LM of the folder (float32) and its step (``MinitfLMStep``: the head at every position)."""
    from minitf.bert import hf
    return step(hf.from_pretrained(folder, dtype="float32"), step_batch(shape))


def torch_side(folder, shape):
    """transformers' BertForMaskedLM of the folder (float32) and the same step."""
    import torch
    import transformers
    return TorchLMStep(transformers.BertForMaskedLM.from_pretrained(folder, dtype=torch.float32), step_batch(shape))


class MinitfPipeline:
    """minitf's fill-mask or classify of the folder, loaded as their commands load it; ``run()`` -> {"seconds",
    "outputs" (each mask's top-k ids, or each text's labels ranked), "scores" (their probabilities)}."""
    baseline = None

    def __init__(self, folder, shape, part):
        from minitf.bert.kind import load_bert
        from minitf.bert.model import BertForMaskedLM, BertForSequenceClassification
        model_class = BertForMaskedLM if part == "fill-mask" else BertForSequenceClassification
        loaded = load_bert(folder, model_class, "bert_step.py")
        self.model, self.tokenizer, self.part = loaded.model, loaded.tokenizer, part
        self.parameters = self.model.num_parameters()
        self.texts, self.batch_size = texts_of(shape, part), shape["batch_size"]

    def run(self):
        start = time.perf_counter()
        if self.part == "fill-mask":
            from minitf.bert.fill_mask import fill_masks_batch
            found = fill_masks_batch(self.model, self.tokenizer, self.texts, TOP_K, self.batch_size)
            seconds = time.perf_counter() - start
            masks = [mask for _, candidates in found for mask in candidates]
            return {"seconds": seconds, "outputs": [[t for t, _, _ in mask] for mask in masks],
                    "scores": [[p for _, _, p in mask] for mask in masks]}
        from minitf.bert.classify import classify
        probabilities = classify(self.model, self.tokenizer, self.texts, batch_size=self.batch_size)
        order = np.argsort(-probabilities, axis=-1, kind="stable")                          # (N, C)
        labels = self.model.config.labels
        outputs = [[labels[i] for i in row] for row in order]
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "outputs": outputs,
                "scores": np.take_along_axis(probabilities, order, axis=-1).tolist()}


class TorchPipeline:
    """transformers' pipeline of the folder (float32, on the CPU) doing the same; ``run()`` as minitf's."""
    baseline = None

    def __init__(self, folder, shape, part):
        import torch
        import transformers
        model_class = transformers.BertForMaskedLM if part == "fill-mask" else transformers.BertForSequenceClassification
        model = model_class.from_pretrained(folder, dtype=torch.float32)
        self.parameters = sum(p.numel() for p in model.parameters())
        self.attention = model.config._attn_implementation
        self.pipe = transformers.pipeline("fill-mask" if part == "fill-mask" else "text-classification", model=model,
                                          tokenizer=transformers.AutoTokenizer.from_pretrained(folder), device="cpu")
        self.part, self.texts, self.batch_size = part, texts_of(shape, part), shape["batch_size"]

    def run(self):
        start = time.perf_counter()
        if self.part == "fill-mask":
            found = self.pipe(self.texts, top_k=TOP_K, batch_size=self.batch_size)
            seconds = time.perf_counter() - start
            masks = [mask for text in found for mask in ([text] if isinstance(text[0], dict) else text)]
            return {"seconds": seconds, "outputs": [[f["token"] for f in mask] for mask in masks],
                    "scores": [[f["score"] for f in mask] for mask in masks]}
        found = self.pipe(self.texts, top_k=None, batch_size=self.batch_size)
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "outputs": [[f["label"] for f in text] for text in found],
                "scores": [[f["score"] for f in text] for text in found]}


def bench_pipeline(folder, args, part):
    """Time ``part`` (fill-mask or classify) in both processes (:func:`run_pair`); print its table; return every
    number, with whether the outputs are equal."""
    shape = SHAPES[args.shape]
    info, first, rounds, _ = run_pair(__file__, part, folder, args)
    result = summary(rounds)
    for name, answers in rounds.items():
        if any(a["outputs"] != first[name]["outputs"] for a in answers):
            raise SystemExit(f"bert_step.py: {name}'s {part} outputs changed from one round to the next")
    ours, theirs = first["minitf"]["outputs"], first["PyTorch"]["outputs"]
    equal = sum(a == b for a, b in zip(ours, theirs)) if len(ours) == len(theirs) else 0
    a, b = np.asarray(first["minitf"]["scores"]), np.asarray(first["PyTorch"]["scores"])
    relative = float(np.max(np.abs(a - b) / np.abs(b))) if a.shape == b.shape else float("inf")
    n = shape["texts"]
    what = "masks' top-5 ids" if part == "fill-mask" else "texts' ranked labels"
    result |= {"outputs_equal": equal, "outputs": len(theirs), "all_equal": equal == len(theirs) == len(ours),
               "score_relative_difference": relative, "texts": n, "batch_size": shape["batch_size"],
               "workers": info}
    title = ("Fill-mask: minitf's fill_masks_batch against pipeline(\"fill-mask\"), top_k 5" if part == "fill-mask"
             else "Classify: minitf's classify against pipeline(\"text-classification\"), top_k=None")
    print(f"\n## {title}; {n} texts of {shape['words'][0]} to {shape['words'][1]} words a round, batch size "
          f"{shape['batch_size']} on both sides; transformers' attention: {info['PyTorch']['attention']}")
    rate_table(result, n, "texts", digits=3, rate_digits=1)
    print(f"\nminitf / transformers throughput: **{1 / result['ratio']:.2f}x** (medians; time ratio "
          f"{result['ratio']:.2f}x, per-round time ratios {spread(result['round_ratios'], 1, 2)}); outputs equal: "
          f"{equal}/{len(theirs)} {what}; probabilities' largest relative difference {relative:.1e}")
    return result


def bench_step(folder, args):
    shape = SHAPES[args.shape]
    tokens = shape["batch"] * shape["block"]
    labels = {"minitf": "minitf (head at the scored positions, as train.py)",
              "minitf-all": "minitf (head at every position, as transformers)", "PyTorch": "PyTorch"}
    result = step_report(__file__, folder, args, tokens,
                         f"Masked-LM training step: batch {shape['batch']} x block {shape['block']} ({tokens:,} "
                         f"tokens, {MASK_SHARE:.0%} scored), Adam (minitf) / AdamW with weight_decay 0 (PyTorch)",
                         names=STEP_WORKERS, labels=labels)
    times, medians = result["times"], result["median"]
    rounds = [a / b for a, b in zip(times["minitf-all"], times["PyTorch"])]
    result["all_positions_ratio"] = {"ratio": medians["minitf-all"] / medians["PyTorch"], "round_ratios": rounds}
    print(f"minitf with the head at every position / PyTorch: **{result['all_positions_ratio']['ratio']:.2f}x** "
          f"(medians; per-round ratios {spread(rounds, 1, 2)}): the same work on both sides")
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args = bench_arguments(parser, SHAPES, "base", argv, workers=STEP_WORKERS, parts=PARTS)
    if args.worker:
        if args.part == "step":
            side = {"minitf": minitf_side, "PyTorch": torch_side,
                    "minitf-all": lambda folder, shape: minitf_side(folder, shape, MinitfLMStep)}[args.worker]
            return serve_side(args, lambda: side(args.folder, SHAPES[args.shape]))
        pipeline = MinitfPipeline if args.worker == "minitf" else TorchPipeline
        return serve_side(args, lambda: pipeline(args.folder, SHAPES[args.shape], args.part))
    results = bench_header(parser, __file__, argv, args)
    shape = SHAPES[args.shape]
    m = shape["model"]
    print(f"- model ({args.shape}): random BertForMaskedLM, {m['num_hidden_layers']} layers, d_model "
          f"{m['hidden_size']}, {m['num_attention_heads']} heads, d_ff {m['intermediate_size']}, vocabulary "
          f"{m['vocab_size']:,}, dropout 0, tied decoder; both read the same saved folder, float32")
    print(f"- method: a process per framework and part, taking turns, {args.rounds} timed rounds each after a "
          "warm-up")
    with tempfile.TemporaryDirectory(prefix="bert_step_") as tmp:
        for part in (PARTS if args.part == "all" else (args.part,)):
            folder = make_folder(shape, pathlib.Path(tmp) / part, part=part)
            gc.collect()
            results[part] = bench_step(folder, args) if part == "step" else bench_pipeline(folder, args, part)
            shutil.rmtree(folder)
    return finish_step(__file__, args, results, "the two models")


if __name__ == "__main__":
    raise SystemExit(main())
