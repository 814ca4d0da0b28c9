"""Views of the trace that follow the gradient (``python -m minitf.trace --walk``,
``--norm-terms``, ``--grad-norms``):

- ``print_walk``: the example of ``minitf.tracer`` from dL/dlogits down to the tied
  embedding, one step per line of code, with the file and line computed from the source
  at run time (docs/walk.md); ``print_gpt_walk``: the same for the GPT example
  (``--model gpt --walk``: pre-LN, GELU, learned positions; docs/gpt.md);
- ``print_norm_terms``: the mean and variance terms of every LayerNorm backward, per row
  (docs/trace.md: where the variance term vanishes, and why);
- ``print_gradient_norms``: the gradient norm reaching each layer of a freshly
  initialised 6+6-layer model, post-LN and pre-LN (docs/layers/residual.md).
"""
import inspect
import os

import minitf
from minitf import backend
from minitf.attention import MultiHeadAttention
from minitf.backend import host as numpy  # host arrays for printing
from minitf.layers import GELU, Embedding, LayerNorm, LearnedPositionalEmbedding, OutputProjection
from minitf.transformer import Decoder, FeedForward, SublayerConnection, Transformer
from minitf.tracer import GPT_IDS, GPT_NEXT, SMOOTHING, Tracer, format_values

# --------------------------------------------------------------------------- #
# --norm-terms: the three terms of every LayerNorm backward, per row
# --------------------------------------------------------------------------- #
def norm_terms(tracer):
    """[(name, row, mean(dxhat), mean(dxhat * xhat))] for every LayerNorm call, in the
    order of the forward, per position of batch 0 (gamma = 1, so dxhat = dy, xhat = y)."""
    classes = {name: type(module).__name__ for name, module in tracer.targets}
    rows = []
    for record in tracer.records:
        if record.kind == "forward" and classes.get(record.name) == "LayerNorm":
            xhat = record.outputs[0][1][0]                                  # (L, D)
            dxhat = dict(tracer.records[record.partner].inputs)["dy"][0]    # (L, D)
            for row in range(xhat.shape[0]):
                rows.append((record.name, row, dxhat[row].mean(), (dxhat[row] * xhat[row]).mean()))
    return rows


def print_norm_terms(tracer):
    print("LayerNorm backward, dx = r (dxhat - mean(dxhat) - xhat mean(dxhat * xhat)), per row")
    print(f"{'norm':40s} {'row':>3s} {'mean(dxhat)':>12s} {'mean(dxhat*xhat)':>17s}")
    for name, row, mean, variance_term in norm_terms(tracer):
        print(f"{name:40s} {row:3d} {mean:12.4f} {variance_term:17.1e}")


# --------------------------------------------------------------------------- #
# --walk: the gradient from the loss down to the tied embedding, step by step
# --------------------------------------------------------------------------- #
def source_line(function, snippet):
    """("minitf/<file>.py:<line>", the line) for the one line of ``function``'s source
    that contains ``snippet``; numbers come from the source as it is now."""
    lines, start = inspect.getsourcelines(function)
    found = [i for i, line in enumerate(lines) if snippet in line]
    if len(found) != 1:
        raise LookupError(f"{function.__qualname__}: {len(found)} lines contain {snippet!r}, expected 1")
    path = inspect.getsourcefile(function)
    root = os.path.dirname(os.path.dirname(os.path.abspath(minitf.__file__)))
    code = lines[found[0]].split("  #")[0].strip()
    return f"{os.path.relpath(path, root).replace(os.sep, '/')}:{start + found[0]}", code


def walk_steps(tracer, model):
    """The steps of the walk: (section title, None, None, None) or (label, array, function,
    snippet), from the records of ``run()`` (post-LN, one layer per stack)."""
    def out(name, key, call=0):
        for r in tracer.records:
            if r.kind == "backward" and r.name == name and r.call == call:
                return dict(r.outputs + r.inputs)[key] if key in dict(r.outputs + r.inputs) else dict(r.grads)[key]
        raise LookupError(f"no backward call {call} of {name!r}")

    norm = (LayerNorm.backward_rows, "return rstd * (dxhat")
    block_sum = (SublayerConnection.backward, "dx = dx_skip +")
    ffn = (FeedForward.backward, "return self.linear1.backward")

    def block(prefix, sublayer, sublayer_code, extra=()):
        # the names of SublayerConnection.backward (post-LN, dropout 0: Dropout'(g) = g)
        return [(f"{prefix}.norm: dx_skip = LN'(dy)", out(f"{prefix}.norm", "dx")) + norm,
                (f"{sublayer}: dh = Sublayer'(dx_skip)", out(sublayer, "dx")) + sublayer_code,
                *extra,
                (f"{prefix}: dx = dx_skip + dh", out(prefix, "dx")) + block_sum]

    dec, enc = "decoder.layers.0", "encoder.layers.0"
    uses = [out("generator", "weight"), out("src_embed", "weight", 0), out("src_embed", "weight", 1)]
    return [
        ("the loss and the output projection (logits = h W^T, W the tied (V, D) matrix)",),
        ("loss: dlogits = (p - q) / N", out("loss", "dlogits"),
         minitf.LabelSmoothedCrossEntropy.dlogits_rows, "dlogits *= "),
        ("generator: dh = dlogits W, for the decoder output h (dy of the next step)", out("generator", "dh"),
         OutputProjection.backward, "return matmul_rows(dlogits, self.weight.data)"),
        ("generator: W.grad += dlogits^T h (tied use 1 of 3)", uses[0],
         OutputProjection.backward, "self.weight.grad +="),
        ("decoder layer 0, top block first: feed-forward",),
        *block(f"{dec}.ff_block", f"{dec}.feed_forward", ffn),
        ("decoder layer 0: cross-attention, queries from the decoder, keys and values from the memory",),
        *block(f"{dec}.cross_attn_block", f"{dec}.cross_attn",
               (MultiHeadAttention.backward, "dx = matmul_rows(dq"),
               [(f"{dec}.cross_attn: dmemory = [dk dv] W_kv^T", out(f"{dec}.cross_attn", "dmemory"),
                 MultiHeadAttention.backward, "dmemory = matmul_rows(dkv")]),
        ("decoder layer 0: masked self-attention",),
        *block(f"{dec}.self_attn_block", f"{dec}.self_attn",
               (MultiHeadAttention.backward, "return (dqkv @ W.T)")),
        ("decoder stack: the memory's gradient, summed over the decoder layers (one here)",),
        ("decoder: dmemory = sum over layers", out("decoder", "dmemory"), Decoder.backward, "dmemory = dmemory +"),
        ("target embedding (positional encoding and dropout pass dy through)",),
        ("tgt_embed: d(target embedding) = dx of decoder layer 0", out(dec, "dx"),
         Transformer.backward, "dtgt_embedded = self.positional.backward"),
        ("tgt_embed: W.grad[ids] += sqrt(D) dy (tied use 2 of 3)", uses[1], Embedding.backward, "backend.add_at_rows("),
        ("encoder layer 0, from the memory down: feed-forward",),
        ("encoder: dy = dmemory", out("encoder", "dy"), Transformer.backward, "dx = self.encoder.backward(dmemory)"),
        *block(f"{enc}.ff_block", f"{enc}.feed_forward", ffn),
        ("encoder layer 0: self-attention",),
        *block(f"{enc}.attn_block", f"{enc}.self_attn", (MultiHeadAttention.backward, "return (dqkv @ W.T)")),
        ("source embedding and the tied matrix",),
        ("src_embed: W.grad[ids] += sqrt(D) dy (tied use 3 of 3)", uses[2], Embedding.backward, "backend.add_at_rows("),
        ("src_embed.weight.grad = use 1 + use 2 + use 3 (the three += above, into one Parameter)",
         backend.to_numpy(model.src_embed.weight.grad), None, None),
    ]


def gpt_walk_steps(tracer, model):
    """The steps of the GPT walk (``--model gpt --walk``), as :func:`walk_steps`, from the
    records of ``run_gpt()`` (pre-LN, one layer, tied embedding)."""
    def out(name, key):
        for r in tracer.records:
            if r.kind == "backward" and r.name == name:
                found = dict(r.outputs + r.inputs + r.grads)
                return found[key]
        raise LookupError(f"no backward of {name!r}")

    norm = (LayerNorm.backward_rows, "return rstd * (dxhat")
    skip = (SublayerConnection.backward, "dx_skip = dy\n")  # the code line, not the comment above it
    block_sum = (SublayerConnection.backward, "dx = dx_skip +")
    layer = "decoder.layers.0"

    def block(prefix, sublayer, sublayer_code, inner=()):
        # pre-LN: y = x + s(LN(x)), so dx = dy (the skip) + LN'(s'(dy)) (dropout 0: Dropout'(g) = g)
        return [(f"{prefix}: dx_skip = dy (pre-LN: the skip passes dy on unchanged)", out(prefix, "dy")) + skip,
                *inner,
                (f"{sublayer}: dh = Sublayer'(dy)", out(sublayer, "dx")) + sublayer_code,
                (f"{prefix}.norm: LN'(dh)", out(f"{prefix}.norm", "dx")) + norm,
                (f"{prefix}: dx = dx_skip + LN'(dh)", out(prefix, "dx")) + block_sum]

    gelu = [(f"{layer}.feed_forward.activation: GELU'(x) dy, inside the feed-forward",
             out(f"{layer}.feed_forward.activation", "dx"), GELU.backward_rows, "return dy * (cdf + 0.5")]
    uses = [out("generator", "weight"), out("embed", "weight")]
    return [
        ("the next-token loss and the output projection (logits = h W^T, W the tied (V, D) matrix)",),
        ("loss: dlogits = (softmax - onehot(next)) / N, 0 on the last position", out("loss", "dlogits"),
         minitf.LabelSmoothedCrossEntropy.dlogits_rows, "dlogits *= "),
        ("generator: dh = dlogits W", out("generator", "dh"),
         OutputProjection.backward, "return matmul_rows(dlogits, self.weight.data)"),
        ("generator: W.grad += dlogits^T h (tied use 1 of 2)", uses[0], OutputProjection.backward,
         "self.weight.grad +="),
        ("the final LayerNorm (pre-LN)",),
        ("decoder.final_norm: dy of the last block = LN'(dh)", out("decoder.final_norm", "dx"),
         Decoder.backward, "dx = self.final_norm.backward(dy)"),
        ("layer 0, top block first: feed-forward (Linear, GELU, Linear)",),
        *block(f"{layer}.ff_block", f"{layer}.feed_forward",
               (FeedForward.backward, "return self.linear1.backward"), gelu),
        ("layer 0: masked self-attention (no cross-attention: no encoder)",),
        *block(f"{layer}.self_attn_block", f"{layer}.self_attn", (MultiHeadAttention.backward, "return (dqkv @ W.T)")),
        ("learned positions and the tied embedding",),
        ("positional: P.grad[0:L] += dy summed over the batch (a scatter-add onto the rows read)",
         out("positional", "weight"), LearnedPositionalEmbedding.backward, "self.weight.grad[start:start + L] +="),
        ("positional: dx = dy", out("positional", "dx"), LearnedPositionalEmbedding.backward, "return dy"),
        ("embed: W.grad[ids] += dy, summed where an id repeats (tied use 2 of 2)", uses[1], Embedding.backward,
         "backend.add_at_rows("),
        ("embed.weight.grad = use 1 + use 2 (the two += above, into one Parameter)",
         backend.to_numpy(model.embed.weight.grad), None, None),
    ]


def print_gpt_walk(tracer, model, loss):
    print("walk: the GPT example of python -m minitf.trace --model gpt (pre-LN, tanh GELU, learned")
    print(f"positions, one layer, B=1, L=4, D=4, V=5; ids {GPT_IDS}, targets {GPT_NEXT}; loss {loss:.6f}),")
    print("from dL/dlogits down to the tied embedding. each step: what it computes, shape, norm, one row")
    print("([0, 0] of an activation gradient; row 3 of a (V, D) weight gradient: token 3 is read at")
    print("positions 0 and 2 and predicted at 1; row 0 of the position table), and the line of minitf")
    print("that computes it. The last position's dlogits row is 0: it has no next token, and no earlier")
    print("position reads it (the causal mask), so its row is 0 in every gradient below the loss.")
    _print_steps(gpt_walk_steps(tracer, model), lambda array: array[3] if array.shape == model.embed.weight.shape
                 else array[0] if array.ndim == 2 else array[0, 0])
    last = backend.to_numpy(dict(_backward_arrays(tracer, "loss"))["dlogits"])[0, -1]
    print()
    print(f"dlogits at the last position: {format_values(last)}")


def _backward_arrays(tracer, name):
    return next(r.outputs for r in tracer.records if r.kind == "backward" and r.name == name)


def _print_steps(steps, row_of):
    number = 0
    for step in steps:
        if len(step) == 1:
            print()
            print(f"-- {step[0]}")
            continue
        label, array, function, snippet = step
        number += 1
        print(f"{number:2d} {label}")
        print(f"   {str(tuple(array.shape)):10s} norm {numpy.linalg.norm(array):.4f}  row {format_values(row_of(array))}")
        if function is not None:
            print("   {}  {}".format(*source_line(function, snippet)))


def print_walk(tracer, model, loss):
    print("walk: the example of python -m minitf.trace (post-LN, one encoder and one decoder layer,")
    print(f"B=1, S=T=2, D=4, V=5; loss {loss:.6f}), from dL/dlogits down to the tied embedding.")
    print("each step: what it computes, shape, norm, one row ([0, 0] of an activation gradient,")
    print("row 4 of a (V, D) weight gradient: token 4 is in the source, the target and the output),")
    print("and the line of minitf that computes it; in a residual block, dx_skip, dh and dx are")
    print("the names of SublayerConnection.backward (dropout 0, so Dropout'(g) = g)")
    _print_steps(walk_steps(tracer, model),
                 lambda array: array[4] if array.shape == model.src_embed.weight.shape else array[0, 0])


# --------------------------------------------------------------------------- #
# --grad-norms: how the gradient's size changes down the stacks, post-LN and pre-LN
# --------------------------------------------------------------------------- #
GRAD_NORMS_CONFIG = dict(src_vocab_size=1000, tgt_vocab_size=1000, d_model=256, num_heads=4,
                         num_encoder_layers=6, num_decoder_layers=6, d_ff=1024, dropout=0.0,
                         share_embeddings=True, pad_id=0)
GRAD_NORMS_BATCH = (4, 16)     # (B, S = T): random token ids


def gradient_norms(pre_norm, config=None, batch=GRAD_NORMS_BATCH, seed=0):
    """One forward and backward of a freshly initialised model (seed ``seed``, float64,
    dropout 0) on a random batch of ``batch`` = (B, S = T).

    Returns (points, blocks). ``points``: {point: |dL/d(point)|} from the top down, for
    "decoder out" (the stack's output, after the pre-LN final LayerNorm), "decoder.layers.l
    in" (a layer's input, the residual stream), "encoder out" (the memory: its gradient
    summed over the decoder layers) and "encoder.layers.l in". ``blocks``: {block name:
    (sigma, skip, sublayer, whole)} for every residual block of a post-LN model: sigma the
    mean standard deviation of the rows of z = x + Sublayer(x), skip = |LN'(dy)| / |dy|,
    sublayer = |Sublayer'(LN'(dy))| / |LN'(dy)|, whole = |dx| / |dy|; for pre-LN, {"STACK.final_norm":
    (sigma, |LN'(dy)| / |dy|)} of each stack's final LayerNorm alone."""
    config = dict(GRAD_NORMS_CONFIG if config is None else config, pre_norm=pre_norm)
    with backend.default_dtype("float64"):
        backend.manual_seed(seed)
        model = minitf.Transformer(**config)
        rng = numpy.random.default_rng(seed)
        B, L = batch
        src, tgt = (rng.integers(2, config["src_vocab_size"], (B, L + 1)) for _ in range(2))
        loss_fn = minitf.LabelSmoothedCrossEntropy(smoothing=SMOOTHING, ignore_index=config["pad_id"])
        tracer = Tracer(model)
        tracer.targets = [(n, m) for n, m in tracer.targets if n in ("encoder", "decoder")
                          or ".layers." in n and n.count(".") in (2, 3) or n.endswith("block.norm")
                          or n.endswith(".final_norm")]
        with tracer.active():
            loss_fn(model(src[:, 1:], tgt[:, :-1]), tgt[:, 1:])
            model.backward(loss_fn.backward())
    norm = numpy.linalg.norm
    calls = {(r.name, r.kind): r for r in tracer.records if "/" not in r.name}   # each runs once
    points = {}
    for stack in ("decoder", "encoder"):
        points[f"{stack} out"] = norm(dict(calls[stack, "backward"].inputs)["dy"])
        for layer in reversed(range(config[f"num_{stack}_layers"])):
            points[f"{stack}.layers.{layer} in"] = norm(dict(calls[f"{stack}.layers.{layer}", "backward"].outputs)["dx"])
    blocks = {}
    for (name, kind), record in calls.items():
        if pre_norm or kind != "backward" or not name.endswith("block"):
            continue
        dy, dx = dict(record.inputs)["dy"], dict(record.outputs)["dx"]
        dz = dict(calls[name + ".norm", "backward"].outputs)["dx"]
        z = dict(calls[name + ".norm", "forward"].inputs)["x"]
        blocks[name] = (z.std(axis=-1).mean(), norm(dz) / norm(dy), norm(dx - dz) / norm(dz), norm(dx) / norm(dy))
    for stack in ("decoder", "encoder"):
        if pre_norm:  # the first step down a pre-LN stack: its final LayerNorm, then the top layer
            record, forward = calls[f"{stack}.final_norm", "backward"], calls[f"{stack}.final_norm", "forward"]
            blocks[f"{stack}.final_norm"] = (dict(forward.inputs)["x"].std(axis=-1).mean(),
                                             norm(dict(record.outputs)["dx"]) / norm(dict(record.inputs)["dy"]))
    return points, blocks


def print_gradient_norms():
    c, (B, L) = GRAD_NORMS_CONFIG, GRAD_NORMS_BATCH
    print(f"gradient norms at initialisation: D={c['d_model']}, H={c['num_heads']}, F={c['d_ff']}, "
          f"{c['num_encoder_layers']}+{c['num_decoder_layers']} layers, V={c['src_vocab_size']}, "
          f"B={B}, S=T={L}, float64, dropout 0, seed 0")
    (post, blocks), (pre, finals) = gradient_norms(False), gradient_norms(True)
    print()
    print("|dL/d(point)| and its ratio to the stack's output gradient, from the top down")
    print(f"{'point':22s} {'post-LN':>9s} {'ratio':>7s} {'pre-LN':>9s} {'ratio':>7s}")
    for point in post:
        top = point.split(".")[0].split(" ")[0] + " out"
        print(f"{point:22s} {post[point]:9.4f} {post[point] / post[top]:7.3f} "
              f"{pre[point]:9.4f} {pre[point] / pre[top]:7.3f}")
    print("pre-LN final LayerNorm alone, |LN'(dy)|/|dy| (sigma of its input): " + ", ".join(
        f"{name.split('.')[0]} {skip:.3f} ({sigma:.2f})" for name, (sigma, skip) in finals.items()))
    print()
    print("post-LN blocks, y = LN(z), z = x + Sublayer(x), dx = LN'(dy) + Sublayer'(LN'(dy)):")
    print("geometric means over the layers of a stack")
    print(f"{'block':24s} {'sigma(z)':>8s} {'|LN_(dy)|/|dy|':>15s} {'|Sublayer_|/|LN_|':>18s} {'|dx|/|dy|':>10s}"
          .replace("_", "'"))
    kinds = {}
    for name, values in blocks.items():
        stack, _, _, block = name.split(".")
        kinds.setdefault(f"{stack} {block}", []).append(values)
    for kind, values in kinds.items():
        sigma, skip, sublayer, whole = numpy.exp(numpy.log(numpy.array(values)).mean(axis=0))
        print(f"{kind:24s} {sigma:8.2f} {skip:15.3f} {sublayer:18.3f} {whole:10.3f}")
