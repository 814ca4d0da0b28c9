"""Draw the study guide's explanatory pictures into docs/figures/ (needs matplotlib,
the ``plot`` extra: ``pip install -e ".[plot]"``).

    python scripts/draw_diagrams.py                 # all three, about 20 s
    python scripts/draw_diagrams.py --only shapes   # shapes | backward | attention

- multihead_shapes.png  (B,T,D) -> (B,T,H,dk) -> (B,H,T,dk), and the columns of w_qkv
- backward_graph.png    one encoder and one decoder layer, backward, every place gradients add
- attention_maps.png    attention of a small model trained on the reversal task
                        (docs/reversal.md), with colour bars and token labels on both axes
"""
import argparse
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
BLOCK_COLOURS = {"Q": "#4e79a7", "K": "#f28e2b", "V": "#59a14f"}


# --------------------------------------------------------------------------- #
# 1. multi-head shapes and the column layout of w_qkv
# --------------------------------------------------------------------------- #
def grid(ax, x, y, rows, cols, colours, labels=None, cell=0.32, title=None, fontsize=7):
    """Draw a rows x cols grid of cells whose lower-left corner is (x, y)."""
    for r in range(rows):
        for c in range(cols):
            ax.add_patch(Rectangle((x + c * cell, y + (rows - 1 - r) * cell), cell, cell,
                                   facecolor=colours(r, c), edgecolor="white", linewidth=0.8))
            if labels is not None:
                ax.text(x + (c + 0.5) * cell, y + (rows - 1 - r + 0.5) * cell, labels(r, c),
                        ha="center", va="center", fontsize=fontsize, color="white")
    if title:
        ax.text(x + cols * cell / 2, y + rows * cell + 0.12, title, ha="center", va="bottom", fontsize=8.5)
    return x + cols * cell, y + rows * cell


def head_shade(colour, head, heads):
    rgb = np.array(matplotlib.colors.to_rgb(colour))
    return tuple(rgb * (1 - 0.45 * head / max(heads - 1, 1)) + 0.0)


def multihead_shapes(out, T=3, D=8, H=2):
    dk = D // H
    fig, ax = plt.subplots(figsize=(13, 5.2))
    cell = 0.32
    # w_qkv (D, 3D): three blocks, each split into H heads of dk columns
    def wcol(r, c):
        block, within = divmod(c, D)
        return head_shade(BLOCK_COLOURS["QKV"[block]], within // dk, H)
    x_end, _ = grid(ax, 0.0, 2.2, D, 3 * D, wcol, cell=cell,
                    labels=lambda r, c: f"{c % D // dk}" if r == 0 else "",
                    title="w_qkv  (D, 3D) = [ W^Q | W^K | W^V ];  digit = head h;  column of head h in block b: b*D + h*dk + i")
    for b, name in enumerate("QKV"):
        ax.text((b * D + D / 2) * cell, 2.2 - 0.2, f"W^{name}: columns {b * D}..{(b + 1) * D - 1}",
                ha="center", va="top", fontsize=8, color=BLOCK_COLOURS[name])
    ax.text(-0.15, 2.2 + D * cell / 2, "D rows\n(input\nfeatures)", ha="right", va="center", fontsize=8)

    # the path of q: (B,T,D) -> (B,T,H,dk) -> (B,H,T,dk)
    y0 = -2.2
    def qcol(r, c):
        return head_shade(BLOCK_COLOURS["Q"], c // dk, H)
    lab = lambda r, c: f"t{r}"  # noqa: E731
    x1, _ = grid(ax, 0.0, y0, T, D, qcol, labels=lab, cell=cell,
                 title="q = x W^Q + b^Q   (B, T, D)")
    ax.text(x1 + 0.35, y0 + T * cell / 2, "reshape\n->", ha="left", va="center", fontsize=8)
    xs = x1 + 1.3
    for h in range(H):   # (T, H, dk): for each position, H rows of dk
        grid(ax, xs + h * (dk * cell + 0.15), y0, T, dk, lambda r, c, h=h: head_shade(BLOCK_COLOURS["Q"], h, H),
             labels=lab, cell=cell, title=f"[:, :, {h}, :]" if True else None)
    ax.text(xs + H * (dk * cell + 0.15) / 2, y0 + T * cell + 0.45, "(B, T, H, dk): the last axis D viewed as (H, dk)",
            ha="center", fontsize=8.5)
    x2 = xs + H * (dk * cell + 0.15)
    ax.text(x2 + 0.2, y0 + T * cell / 2, "transpose(0, 2, 1, 3)\n->", ha="left", va="center", fontsize=8)
    xh = x2 + 2.4
    for h in range(H):   # (H, T, dk): one T x dk matrix per head
        grid(ax, xh, y0 - h * (T * cell + 0.75) + 0.9, T, dk,
             lambda r, c, h=h: head_shade(BLOCK_COLOURS["Q"], h, H), labels=lab, cell=cell,
             title=f"Q[:, {h}] = Q_{h}  (T, dk)")
    ax.text(xh + dk * cell + 1.6, y0 + 0.4, "(B, H, T, dk):\neach head is one\nmatrix, attention runs\nper (b, h)",
            ha="left", va="center", fontsize=8.5)
    ax.text(0, y0 - 1.6, "Q_h is columns h*dk .. (h+1)*dk-1 of q: the projection x W^Q + b^Q is applied once, then split.\n"
            "k and v (columns D..2D-1 and 2D..3D-1 of x w_qkv) are split the same way; merge_heads is the inverse "
            "(transpose back, reshape to D).", fontsize=8.5, va="top")
    ax.set_xlim(-1.2, xh + dk * cell + 3.2)
    ax.set_ylim(y0 - 2.3, 2.2 + D * cell + 0.6)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"Multi-head attention shapes (B = 1, T = {T}, D = {D}, H = {H}, dk = {dk})", fontsize=11)
    fig.tight_layout()
    fig.savefig(out / "multihead_shapes.png", dpi=90)
    plt.close(fig)


# --------------------------------------------------------------------------- #
# 2. the backward graph of one encoder and one decoder layer
# --------------------------------------------------------------------------- #
def box(ax, x, y, text, w=2.6, h=0.55, colour="#dde6f0"):
    ax.add_patch(Rectangle((x - w / 2, y - h / 2), w, h, facecolor=colour, edgecolor="#555", linewidth=0.8))
    ax.text(x, y, text, ha="center", va="center", fontsize=8)


def plus(ax, x, y, note, side="right"):
    ax.add_patch(matplotlib.patches.Circle((x, y), 0.2, facecolor="#e15759", edgecolor="none"))
    ax.text(x, y, "+", ha="center", va="center", fontsize=11, color="white", fontweight="bold")
    ax.text(x + (0.35 if side == "right" else -0.35), y, note, ha="left" if side == "right" else "right",
            va="center", fontsize=7.5, color="#b0272a")


def arrow(ax, a, b, **kw):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=10, linewidth=1.0,
                                 color=kw.get("color", "#333"), connectionstyle=kw.get("style", "arc3")))


def backward_graph(out):
    fig, ax = plt.subplots(figsize=(13, 9))
    # encoder layer (left), gradients flow downwards (from the layer output to its input)
    ex = 2.5
    ax.text(ex, 10.1, "Encoder layer, backward (post-LN)", ha="center", fontsize=10, fontweight="bold")
    box(ax, ex, 9.4, "dy  (B, S, D)  from the layer above", colour="#f3f3f3")
    box(ax, ex, 8.5, "LayerNorm' (ff_block.norm)")
    box(ax, ex + 1.9, 7.6, "FFN': linear2', ReLU', linear1'", w=2.9)
    plus(ax, ex, 6.7, "skip path + FFN path", side="left")
    box(ax, ex, 5.8, "LayerNorm' (attn_block.norm)")
    box(ax, ex + 1.9, 4.9, "W^O', split, attention core'", w=2.9)
    box(ax, ex + 1.9, 4.1, "dq W^Q^T | dk W^K^T | dv W^V^T", w=2.9, colour="#fbe3d6")
    plus(ax, ex + 1.9, 3.3, "x was used 3 times\n(query, key, value):\none product sums them")
    plus(ax, ex, 2.5, "skip path + attention path", side="left")
    box(ax, ex, 1.6, "dx (B, S, D): to the layer below\n(the last one: the source embedding)", w=3.2, colour="#f3f3f3")
    for a, b in [((ex, 9.1), (ex, 8.8)), ((ex, 8.2), (ex, 6.9)), ((ex, 8.2), (ex + 1.9, 7.9)),
                 ((ex + 1.9, 7.3), (ex + 0.2, 6.75)), ((ex, 6.5), (ex, 6.1)), ((ex, 5.5), (ex, 2.7)),
                 ((ex, 5.5), (ex + 1.9, 5.2)), ((ex + 1.9, 4.6), (ex + 1.9, 4.4)), ((ex + 1.9, 3.8), (ex + 1.9, 3.5)),
                 ((ex + 1.7, 3.2), (ex + 0.2, 2.55)), ((ex, 2.3), (ex, 1.95))]:
        arrow(ax, a, b)
    # decoder layer (right)
    dx = 9.0
    ax.text(dx, 10.1, "Decoder layer, backward (post-LN)", ha="center", fontsize=10, fontweight="bold")
    box(ax, dx, 9.4, "dy  (B, T, D)  from the layer above", colour="#f3f3f3")
    box(ax, dx, 8.6, "LayerNorm' (ff_block.norm)")
    box(ax, dx + 1.9, 7.9, "FFN'", w=1.6)
    plus(ax, dx, 7.3, "skip + FFN", side="left")
    box(ax, dx, 6.6, "LayerNorm' (cross_attn_block.norm)", w=3.0)
    box(ax, dx + 1.9, 5.8, "cross-attention'", w=2.0)
    plus(ax, dx, 5.0, "skip + cross-attention", side="left")
    box(ax, dx, 4.3, "LayerNorm' (self_attn_block.norm)", w=3.0)
    box(ax, dx + 1.9, 3.5, "masked self-attention'\n(x used 3 times: +)", w=2.4, h=0.7)
    plus(ax, dx, 2.6, "skip + self-attention", side="left")
    box(ax, dx, 1.7, "dx (B, T, D): to the layer below\n(the last one: the target embedding)", w=3.2, colour="#f3f3f3")
    for a, b in [((dx, 9.1), (dx, 8.9)), ((dx, 8.3), (dx, 7.5)), ((dx, 8.3), (dx + 1.9, 8.15)),
                 ((dx + 1.9, 7.65), (dx + 0.2, 7.35)), ((dx, 7.1), (dx, 6.9)), ((dx, 6.3), (dx, 5.2)),
                 ((dx, 6.3), (dx + 1.9, 6.1)), ((dx + 1.9, 5.5), (dx + 0.2, 5.05)), ((dx, 4.8), (dx, 4.6)),
                 ((dx, 4.0), (dx, 2.8)), ((dx, 4.0), (dx + 1.9, 3.85)), ((dx + 1.9, 3.15), (dx + 0.2, 2.65)),
                 ((dx, 2.4), (dx, 2.05))]:
        arrow(ax, a, b)
    # dmemory: from every decoder layer's cross-attention into one sum, then into the encoder
    plus(ax, dx + 3.6, 5.8, "dmemory (B, S, D):\nsummed over all N\ndecoder layers\n(+ from the others)")
    arrow(ax, (dx + 2.9, 5.8), (dx + 3.4, 5.8), color="#b0272a")
    ax.plot([dx + 3.6, dx + 3.6, ex - 1.6, ex - 1.6], [6.0, 10.45, 10.45, 9.4], color="#b0272a", linewidth=1.0)
    arrow(ax, (ex - 1.6, 9.4), (ex - 1.3, 9.4), color="#b0272a")
    ax.text(6.3, 10.55, "dmemory becomes the dy of the encoder's top layer", fontsize=7.5, color="#b0272a",
            ha="center")
    # the tied matrix
    plus(ax, 6.0, 0.6, "the tied (V, D) matrix: dW = source embedding + target embedding + output "
         "projection\n(three backward calls add into one p.grad)")
    ax.text(6.5, 0.1, "red +: where gradients add (the multivariable chain rule); "
            "X': the backward of X; arrows point the way gradients flow", ha="center", fontsize=8)
    ax.set_xlim(-0.5, 14.5)
    ax.set_ylim(-0.1, 10.8)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(out / "backward_graph.png", dpi=80)
    plt.close(fig)


# --------------------------------------------------------------------------- #
# 3. attention maps of a small model trained on the reversal task
# --------------------------------------------------------------------------- #
def attention_maps(out, steps=300):
    import minitf
    from minitf import backend, trace
    PAD, BOS, EOS, FIRST, V = 0, 1, 2, 3, 10
    rng = np.random.default_rng(0)

    def batch(size, length):
        src = rng.integers(FIRST, V, (size, length))
        tgt_in = np.concatenate([np.full((size, 1), BOS), src[:, ::-1]], axis=1)
        tgt_out = np.concatenate([src[:, ::-1], np.full((size, 1), EOS)], axis=1)
        return src, tgt_in, tgt_out

    minitf.manual_seed(0)
    model = minitf.Transformer(V, V, d_model=32, num_heads=4, num_encoder_layers=1, num_decoder_layers=1,
                               d_ff=64, dropout=0.0, pad_id=PAD)
    loss_fn = minitf.LabelSmoothedCrossEntropy(smoothing=0.0, ignore_index=PAD)
    opt = minitf.Adam(model.parameters(), lr=minitf.WarmupSchedule(32, warmup=100, scale=2.0))
    for _ in range(steps):
        src, tgt_in, tgt_out = batch(32, 5)
        opt.zero_grad()
        loss_fn(model(src, tgt_in), tgt_out)
        model.backward(loss_fn.backward())
        opt.step()
    model.eval()
    src = np.array([[3, 5, 7, 9, 4]])                  # distinct symbols: easier to read
    tgt_in = np.concatenate([[[BOS]], src[:, ::-1]], axis=1)
    tracer = trace.Tracer(model)                      # records P of every attention by module name
    with tracer.active(), minitf.no_grad():
        model(src, tgt_in)
    P = {r.name.split("/")[0]: dict(r.outputs)["P"][0] for r in tracer.records if r.name.endswith("/attention")}
    names = {0: "PAD", 1: "BOS", 2: "EOS"}                # symbols 3..9 shown as a..g
    s_tok = [names.get(int(i), "abcdefg"[int(i) - FIRST]) for i in src[0]]
    t_tok = [names.get(int(i), "abcdefg"[int(i) - FIRST]) for i in tgt_in[0]]
    kinds = [(n, title, rows, cols) for n, title, rows, cols in [
        ("encoder", "encoder self-attention", s_tok, s_tok),
        ("decoder.layers.0.self_attn", "decoder masked self-attention", t_tok, t_tok),
        ("decoder.layers.0.cross_attn", "cross-attention (queries: target, keys: source)", t_tok, s_tok)]]
    enc_name = next(k for k in P if k.startswith("encoder"))
    heads = (0, 1)
    fig, axes = plt.subplots(len(heads), 3, figsize=(13, 8))
    for col, (name, title, rows, cols) in enumerate(kinds):
        weights = P[enc_name if name == "encoder" else name]
        for row, head in enumerate(heads):
            ax = axes[row, col]
            image = ax.imshow(weights[head], cmap="viridis", vmin=0, vmax=1)
            ax.set_xticks(range(len(cols)), cols, fontsize=8)
            ax.set_yticks(range(len(rows)), rows, fontsize=8)
            ax.set_xlabel("key (attended position)", fontsize=8)
            ax.set_ylabel("query (attending position)", fontsize=8)
            ax.set_title(f"{title}\nhead {head}", fontsize=8.5)
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="weight P (row sums to 1)")
    fig.suptitle(f"Reversal task after {steps} steps: source {' '.join(s_tok)} -> target {' '.join(t_tok[1:])} EOS",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "attention_maps.png", dpi=75)
    plt.close(fig)
    backend.manual_seed(0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "figures")
    parser.add_argument("--only", choices=["shapes", "backward", "attention"])
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "shapes"):
        multihead_shapes(args.out)
    if args.only in (None, "backward"):
        backward_graph(args.out)
    if args.only in (None, "attention"):
        attention_maps(args.out)
    for name in ("multihead_shapes.png", "backward_graph.png", "attention_maps.png"):
        path = args.out / name
        if path.exists():
            print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {path.stat().st_size // 1024} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
