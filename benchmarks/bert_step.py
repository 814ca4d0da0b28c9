"""BERT's masked-LM training step (bert-base's shape) in minitf and in transformers, each framework in a process of
its own, taking turns.

    pip install -e ".[bench]"      # torch, transformers, safetensors: only for the comparison
    python benchmarks/bert_step.py --threads 2 --rounds 5 --json bert-2.json   # bert-base's shape
    python benchmarks/bert_step.py --dry-run                                      # tiny shape, 1 round

The model: a random ``transformers.BertForMaskedLM`` of bert-base-uncased's shape (``--shape base``: 12 layers,
d_model 768, 12 heads, d_ff 3072, exact GELU, vocabulary 30,522, 512 positions, two token types, tied decoder) with
transformers' own initialisation (std 0.02), dropout 0 (``hidden_dropout_prob`` and
``attention_probs_dropout_prob``: minitf computes no attention dropout, and the first step's losses must agree), saved
with ``save_pretrained`` into a temporary folder in float32. Both frameworks read that folder: transformers with
``BertForMaskedLM.from_pretrained`` (its default attention, named in the output), minitf with
``minitf.bert.hf.from_pretrained`` (float32): the same weights on both sides. ``--shape tiny`` is a small model for
dry runs and tests.

The step: a fixed batch of random ids, ``batch`` x ``block`` (8 x 128, no padding, one segment), 15% of the
positions (never the first or last) scored on their own id (the masked-LM loss's shape: the other positions carry
no loss; the inputs are left as they are, which changes no cost). minitf: zero_grad, ``model(inputs)``,
``LabelSmoothedCrossEntropy(0.0, ignore_index=-1)``, backward, ``minitf.Adam``; PyTorch: ``cross_entropy(...,
ignore_index=-1)`` on the logits, autograd, ``torch.optim.AdamW`` with ``weight_decay=0.0`` (minitf's Adam is AdamW
without weight decay): benchmarks/common.py's ``MinitfLMStep`` and ``TorchLMStep``, Adam's settings its ``GPT_LR``,
``GPT_BETAS``, ``GPT_EPS``. Memory: as benchmarks/llama_step.py measures it (each process's peak over its loaded
model, after the timed steps).

Method (benchmarks/common.py's ``run_pair``: its ``Worker`` and ``take_turns``): two fresh processes, one per
framework (this script with ``--worker``), so that NumPy's OpenBLAS threads and PyTorch's OpenMP threads never share
a process; they take turns, one step at a time, timed inside each process, after a warm-up step; a short pause
between turns. ``--threads N`` sets both processes' threads; the default is this machine's cores. Prints the
machine, the median and spread of each framework, the ratio of the medians and the spread of the per-round ratios;
``--json OUT`` writes every number.
"""
import argparse
import gc
import json
import os
import pathlib
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import minitf  # noqa: E402
from benchmarks.common import (MinitfLMStep, TorchLMStep, bench_arguments, bench_header, serve_side,  # noqa: E402
                               step_report)

np = minitf.backend.host

#: Model shapes (transformers.BertConfig's values) and the batch: ``base`` is bert-base-uncased's; ``tiny`` is for
#: dry runs and tests.
SHAPES = {
    "base": dict(model=dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                            intermediate_size=3072, max_position_embeddings=512), batch=8, block=128),
    "tiny": dict(model=dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=128, max_position_embeddings=64), batch=2, block=32),
}
MASK_SHARE = 0.15                               # the positions that carry the loss, as BERT's pre-training


def make_folder(shape, folder, seed=0):
    """A random BertForMaskedLM of ``shape``, dropout 0, saved in float32 (config.json, model.safetensors)."""
    import torch
    import transformers
    torch.manual_seed(seed)
    config = transformers.BertConfig(**shape["model"], hidden_act="gelu", hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, type_vocab_size=2, layer_norm_eps=1e-12)
    transformers.BertForMaskedLM(config).float().save_pretrained(folder)
    return folder


def step_batch(shape, seed=1):
    """Host int64 (inputs, targets), each (batch, block): random ids; the targets the ids at 15% of the positions
    (never the first or the last), -1 elsewhere."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, shape["model"]["vocab_size"], (shape["batch"], shape["block"]))
    chosen = rng.random(ids.shape) < MASK_SHARE
    chosen[:, [0, -1]] = False
    return ids, np.where(chosen, ids, -1)


def minitf_side(folder, shape):
    """minitf's masked LM of the folder (float32) and its step."""
    from minitf.bert import hf
    return MinitfLMStep(hf.from_pretrained(folder, dtype="float32"), step_batch(shape))


def torch_side(folder, shape):
    """transformers' BertForMaskedLM of the folder (float32) and the same step."""
    import torch
    import transformers
    return TorchLMStep(transformers.BertForMaskedLM.from_pretrained(folder, dtype=torch.float32), step_batch(shape))


def bench_step(folder, args):
    shape = SHAPES[args.shape]
    tokens = shape["batch"] * shape["block"]
    return step_report(__file__, folder, args, tokens,
                       f"Masked-LM training step: batch {shape['batch']} x block {shape['block']} ({tokens:,} tokens, "
                       f"{MASK_SHARE:.0%} scored), Adam (minitf) / AdamW with weight_decay 0 (PyTorch)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["step"], default="step", help=argparse.SUPPRESS)
    args = bench_arguments(parser, SHAPES, "base", argv)
    if args.worker:
        side = minitf_side if args.worker == "minitf" else torch_side
        return serve_side(args, lambda: side(args.folder, SHAPES[args.shape]))
    results = bench_header(parser, __file__, argv, args)
    shape = SHAPES[args.shape]
    m = shape["model"]
    print(f"- model ({args.shape}): random BertForMaskedLM, {m['num_hidden_layers']} layers, d_model "
          f"{m['hidden_size']}, {m['num_attention_heads']} heads, d_ff {m['intermediate_size']}, vocabulary "
          f"{m['vocab_size']:,}, dropout 0, tied decoder; both read the same saved folder, float32")
    print(f"- method: a process per framework, taking turns, {args.rounds} timed rounds each after a warm-up")
    with tempfile.TemporaryDirectory(prefix="bert_step_") as tmp:
        folder = make_folder(shape, pathlib.Path(tmp) / "model")
        gc.collect()
        results["step"] = bench_step(folder, args)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    if not results["step"]["losses_agree"]:
        print("bert_step.py: the first step's losses differ: the two models are not the same", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
