#!/usr/bin/env python3
"""Regenerate the pictures of docs/ from a real run: ``python scripts/make_figures.py --run runs/tiny``.

Needs the ``plot`` extra (``pip install -e .[plot]``). Writes into docs/figures/:
- lr_schedule.png     the paper's learning-rate schedule for a few warmup settings
- training_curves.png training and validation loss, and validation BLEU, over steps (metrics.jsonl)
- attention_*.png     encoder self-, decoder self- and cross-attention of a few heads on test sentences,
                      from the run's chosen checkpoint (best.json), teacher-forced on the model's own output

``--moe-runs SPARSE DENSE`` draws instead, from two ``train.py --model llama`` runs of equal wall minutes
(scripts/moe_vs_dense.sh makes them):
- moe_vs_dense.png    validation loss against minutes for both; the sparse run's expert load against step
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
    records = read_records(run)
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


def read_records(run):
    """A run's metrics.jsonl records, in order."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def validation_minutes(records):
    """(minutes, loss) of each periodic validation: the wall minutes of the run (its earlier validations included)
    at the end of the training step it follows (that step's ``elapsed``)."""
    elapsed = {r["step"]: r["elapsed"] for r in records if r["kind"] == "train"}
    valid = [r for r in records if r["kind"] == "valid" and "model" not in r and r["step"] in elapsed]
    return [elapsed[r["step"]] / 60 for r in valid], [r["loss"] for r in valid]


def expert_shares(records):
    """(steps, shares (steps, layers, experts)): each train record's ``expert_load`` over its layer's routed
    tokens (a uniform router gives 1 / experts everywhere)."""
    train = [r for r in records if r["kind"] == "train" and "expert_load" in r]
    if not train:
        raise SystemExit("make_figures.py: the sparse run's metrics.jsonl has no expert_load: give a run of "
                         "train.py --model llama --num-experts E first")
    load = backend.host.asarray([r["expert_load"] for r in train], dtype=float)   # (steps, layers, experts)
    return [r["step"] for r in train], load / load.sum(axis=-1, keepdims=True)


def describe(run):
    """A label for a Llama run: its feed-forward (the experts or the dense width) from config.json."""
    c = json.loads((run / "config.json").read_text())
    if c.get("num_experts"):
        return (f"sparse: {c['num_experts']} experts of d_ff {c.get('moe_d_ff') or c['d_ff']}, "
                f"{c['experts_per_token']} per token")
    return f"dense: d_ff {c['d_ff']}"


def moe_vs_dense(sparse, dense, out):
    """moe_vs_dense.png: validation loss against wall minutes of both runs; the sparse run's expert load against
    step (each expert's share of its layer's routed tokens, averaged over the layers, and the least and most share
    of any expert in any layer)."""
    runs = {"sparse": (sparse, "C3"), "dense": (dense, "C0")}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13.5, 4.2))
    for name, (run, color) in runs.items():
        records = read_records(run)
        minutes, loss = validation_minutes(records)
        done = [r for r in records if r["kind"] == "done"]
        steps = f", {done[-1]['step']} steps" if done else ""
        ax1.plot(minutes, loss, "o-", color=color, markersize=3, label=f"{describe(run)}{steps}")
    ax1.set(xlabel="wall minutes of the command (validations included)", xlim=(0, None),
            ylabel="validation loss (next-token cross-entropy)",
            title="equal minutes: sparse against dense of equal active parameters")
    ax1.legend(fontsize=8)
    steps, shares = expert_shares(read_records(sparse))
    layers, experts = shares.shape[1:]
    for e in range(experts):
        ax2.plot(steps, shares[:, :, e].mean(axis=1), lw=0.8, alpha=0.6, label=f"expert {e}" if experts <= 8 else None)
    ax2.plot(steps, shares.min(axis=(1, 2)), color="k", lw=1.5, ls=":", label="least, any layer")
    ax2.plot(steps, shares.max(axis=(1, 2)), color="k", lw=1.5, label="most, any layer")
    ax2.axhline(1 / experts, color="grey", ls="--", lw=1, label=f"uniform 1/{experts}")
    ax2.set(xlabel="step", ylabel="share of the layer's routed tokens",
            title=f"sparse run's expert load ({layers} layers, mean over layers)", ylim=(0, None))
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out / "moe_vs_dense.png", dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=pathlib.Path, default=ROOT / "runs" / "tiny", help="a train.py run folder")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "figures")
    parser.add_argument("--moe-runs", type=pathlib.Path, nargs=2, metavar=("SPARSE", "DENSE"),
                        help="draw moe_vs_dense.png from these two train.py --model llama runs instead")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.moe_runs:
        for run in args.moe_runs:
            if not (run / "metrics.jsonl").is_file():
                parser.error(f"--moe-runs: {run} has no metrics.jsonl; give two train.py run folders")
        moe_vs_dense(*args.moe_runs, args.out)
        print(f"wrote moe_vs_dense.png to {args.out}")
        return
    lr_schedule(args.out)
    training_curves(args.run, args.out)
    attention_maps(args.run, args.out)
    print(f"wrote {sorted(p.name for p in args.out.glob('*.png'))} to {args.out}")


if __name__ == "__main__":
    main()
