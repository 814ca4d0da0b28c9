#!/usr/bin/env python3
"""Regenerate the pictures of docs/ from a real run: ``python scripts/make_figures.py --run runs/tiny``.

Needs the ``plot`` extra (``pip install -e .[plot]``). Writes into docs/figures/:
- lr_schedule.png     the paper's learning-rate schedule for a few warmup settings
- training_curves.png training and validation loss, and validation BLEU, over steps (metrics.jsonl)
- attention_*.png     encoder self-, decoder self- and cross-attention of a few heads on test sentences,
                      from the run's chosen checkpoint (best.json), teacher-forced on the model's own output
"""
import argparse
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import minitf  # noqa: E402
from minitf import backend  # noqa: E402
from minitf.nmt.data import pad_batch  # noqa: E402
from minitf.training.text import read_lines  # noqa: E402
from minitf.nmt.decode import beam_search  # noqa: E402
from minitf.training.tokenizer import BOS_ID, EOS_ID, PAD_ID  # noqa: E402
from minitf.training.checkpoint import load_model  # noqa: E402


def lr_schedule(out):
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = backend.host.arange(1, 40001)
    for d_model, warmup in [(512, 4000), (512, 8000), (512, 2000), (128, 800)]:
        schedule = minitf.WarmupSchedule(d_model, warmup)
        ax.plot(steps, [schedule(s) for s in steps], label=f"d_model {d_model}, warmup {warmup}")
    ax.set(xlabel="step", ylabel="learning rate", title="lrate = d_model^-0.5 min(step^-0.5, step warmup^-1.5)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "lr_schedule.png", dpi=110)
    plt.close(fig)


def training_curves(run, out):
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in records if r["kind"] == "train"]
    valid = [r for r in records if r["kind"] == "valid" and "bleu" in r and "model" not in r]
    final = [r for r in records if r["kind"] == "valid" and "bleu" in r and "model" in r]
    steps = [r["step"] for r in train]
    window = max(1, min(50, len(train) // 10))
    smooth = backend.host.convolve([r["loss"] for r in train], backend.host.ones(window) / window, mode="valid")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(steps, [r["loss"] for r in train], alpha=0.25, color="C0", label="train loss (per step)")
    ax1.plot(steps[window - 1:], smooth, color="C0", label=f"train loss ({window}-step mean)")
    ax1.plot([r["step"] for r in valid], [r["loss"] for r in valid], "o-", color="C1", label="validation loss")
    for i, r in enumerate(final):
        ax1.plot(r["step"], r["loss"], "s^"[i % 2], color="C3", label=f"validation loss, {r['model']}")
        ax2.plot(r["step"], r["bleu"], "s^"[i % 2], color="C3", label=f"{r['model']}")
    ax1.set(xlabel="step", ylabel="label-smoothed cross-entropy", title="loss")
    ax1.legend()
    ax2.plot([r["step"] for r in valid], [r["bleu"] for r in valid], "o-", color="C2", label="during training")
    ax2.set(xlabel="step", ylabel="BLEU (sacrebleu)", title="validation BLEU (greedy)")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(out / "training_curves.png", dpi=110)
    plt.close(fig)


def attention_maps(run, out, sentences=2, heads=(0, 1)):
    model, tokenizer, meta = load_model(run)
    test_src = read_lines(meta["config"]["data"]["test_src"], "test source")
    sources = sorted((s for s in test_src if 5 <= len(s.split()) <= 9), key=len)[:sentences]
    src_ids = tokenizer.encode(sources)
    outputs = beam_search(model, pad_batch(src_ids, PAD_ID, eos_id=EOS_ID), beam_size=4, alpha=0.6, min_len=1)
    for module in model.modules():
        if isinstance(module, minitf.MultiHeadAttention):
            module.record_weights = True
    pieces = lambda ids: [tokenizer._processor.id_to_piece(i) for i in ids]  # noqa: E731
    for n, (source, ids, output) in enumerate(zip(sources, src_ids, outputs)):
        src = pad_batch([ids], PAD_ID, eos_id=EOS_ID)
        tgt_in = pad_batch([output], PAD_ID, bos_id=BOS_ID)
        with minitf.no_grad():
            model(src, tgt_in)
        src_tokens, tgt_tokens = pieces(list(ids) + [EOS_ID]), pieces([BOS_ID] + list(output))
        last_enc, last_dec = model.encoder.layers[len(model.encoder.layers) - 1], model.decoder.layers[len(model.decoder.layers) - 1]
        kinds = [("encoder self-attention", last_enc.self_attn, src_tokens, src_tokens),
                 ("decoder self-attention", last_dec.self_attn, tgt_tokens, tgt_tokens),
                 ("cross-attention", last_dec.cross_attn, tgt_tokens, src_tokens)]
        fig, axes = plt.subplots(len(heads), 3, figsize=(15, 4.6 * len(heads)))
        for col, (title, module, rows, cols) in enumerate(kinds):
            weights = backend.to_numpy(module.weights)[0]
            for row, head in enumerate(heads):
                ax = axes[row, col]
                image = ax.imshow(weights[head], cmap="viridis", vmin=0, vmax=1)
                ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=8)
                ax.set_yticks(range(len(rows)), rows, fontsize=8)
                ax.set_xlabel("key (attended piece)", fontsize=8)       # columns: the keys
                ax.set_ylabel("query (attending piece)", fontsize=8)    # rows: the queries, each sums to 1
                ax.set_title(f"{title}, last layer, head {head}", fontsize=9)
                fig.colorbar(image, ax=ax, fraction=0.046, pad=0.03, label="attention weight")
        fig.suptitle(f"{source}  ->  {tokenizer.decode([output])[0]}", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / f"attention_{n}.png", dpi=100)
        plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=pathlib.Path, default=ROOT / "runs" / "tiny", help="a train.py run folder")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "figures")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    lr_schedule(args.out)
    training_curves(args.run, args.out)
    attention_maps(args.run, args.out)
    print(f"wrote {sorted(p.name for p in args.out.glob('*.png'))} to {args.out}")


if __name__ == "__main__":
    main()
