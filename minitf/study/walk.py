"""The backward walk, and the views of the trace that follow the gradient (``python -m minitf.trace --walk``,
``--norm-terms``, ``--grad-norms``):

- the backward walk: the gradient of one backward from dL/dlogits down to the embeddings, step by
  step (:class:`Walk`), for any number of layers, post-LN or pre-LN; one walk per model shape
  (:func:`translation_walk`, :func:`language_model_walk`; a kind's package may build its own from
  :class:`Walk`), which the model's kind names (``Kind.walk``: these tools import no kind). ``trace --walk``
  prints it, the inspection page draws its norms (:mod:`minitf.study.inspection.numbers`);
- ``print_walk``: the walk of the example of ``minitf.study.tracer``, one step per line of code, with the
  file and line computed from the source at run time (docs/walk.md); ``print_gpt_walk``: the same for
  the GPT example (``--model gpt --walk``: pre-LN, GELU, learned positions; docs/gpt.md);
- ``print_norm_terms``: the mean and variance terms of every LayerNorm backward, per row
  (docs/trace.md: where the variance term vanishes, and why);
- ``print_gradient_norms``: the gradient norm reaching each layer of a freshly
  initialised 6+6-layer model, post-LN and pre-LN (docs/layers/residual.md).
"""
import dataclasses
import inspect
import os

import minitf
from minitf import backend
from minitf.attention import MultiHeadAttention
from minitf.backend import host as numpy  # host arrays for printing
from minitf.layers import (GELU, Embedding, LayerNorm, LearnedPositionalEmbedding, OutputProjection, ReLU,
                           SiLU)
from minitf.loss import LabelSmoothedCrossEntropy
from minitf.transformer import Decoder, Encoder, FeedForward, SublayerConnection, Transformer
from minitf.study.tracer import GPT_IDS, GPT_NEXT, SMOOTHING, Tracer, format_values

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
    rows = norm_terms(tracer)
    for name, row, mean, variance_term in rows:
        print(f"{name:40s} {row:3d} {mean:12.4f} {variance_term:17.1e}")
    if not rows:
        print("(no LayerNorm ran in this model)")


# --------------------------------------------------------------------------- #
# --walk: the gradient from the loss down to the embeddings, step by step
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


@dataclasses.dataclass
class Step:
    """One step of the walk: ``label`` what it computes, ``array`` the gradient (a host array), ``kind``:
    "loss" (dL/dlogits), "stream" (the residual stream between blocks: dL/d(a block's input), the decoder's
    output, the memory), "branch" (inside a block: LayerNorm', a sublayer's backward) or "weight" (what a
    backward adds to a weight matrix's ``.grad``), and ``code``: (function, snippet), the line of minitf that
    computes it (:func:`source_line`), or None (a sum of the steps above)."""
    label: str
    array: object
    kind: str
    code: tuple = None


def backward_record(tracer, name, call=0):
    """The record of backward call ``call`` of the module named ``name``."""
    for record in tracer.records:
        if record.kind == "backward" and record.name == name and record.call == call:
            return record
    raise LookupError(f"no backward call {call} of {name!r}")


# the lines that compute the steps: (function, a snippet of the one line)
LOSS = (LabelSmoothedCrossEntropy.dlogits_rows, "dlogits *= ")
PROJECTION_DH = (OutputProjection.backward, "return matmul_rows(dlogits, self.weight.data)")
PROJECTION_DW = (OutputProjection.backward, "self.weight.grad +=")
NORM = (LayerNorm.backward_rows, "return rstd * (dxhat")
SKIP = (SublayerConnection.backward, "dx_skip = dy\n")  # the pre-LN code line, not the comment above it
BLOCK_SUM = (SublayerConnection.backward, "dx = dx_skip +")
FEED_FORWARD = (FeedForward.backward, "return self.linear1.backward")
SELF_ATTENTION = (MultiHeadAttention.backward, "return (dqkv @ W.T)")
CROSS_ATTENTION = (MultiHeadAttention.backward, "dx = matmul_rows(dq")
EMBEDDING = (Embedding.backward, "backend.add_at_rows(")


def activation_line(activation):
    """(function, snippet) of the line of ``activation``'s backward that computes dx, None for an unknown one."""
    snippets = {ReLU: "dy * (y > 0)", SiLU: "return dy * (s + x * ds_dx)",
                GELU: "return dy * dy_dx" if getattr(activation, "approximate", None) == "tanh"
                else "return dy * slope"}
    snippet = snippets.get(type(activation))
    # the line lives in the per-row function the backward runs on threads (minitf.backend.by_rows), if it has one
    where = getattr(type(activation), "backward_rows", type(activation).backward)
    return None if snippet is None else (where, snippet)


class Walk:
    """The walk of one backward, read from the records of a :class:`minitf.study.tracer.Tracer`: ``steps``
    ([section title (str) or :class:`Step`], from dL/dlogits down) and ``points`` ([(name, |dL/d(point)|)]
    down the residual stream: the stacks' outputs and each layer's input, from the top down)."""

    def __init__(self, tracer):
        self.tracer, self.steps, self.points = tracer, [], []

    def array(self, name, key, call=0):
        """The array ``key`` (an input, an output or a parameter's added gradient) of backward call ``call``
        of the module named ``name``."""
        record = backward_record(self.tracer, name, call)
        return dict(record.outputs + record.inputs + record.grads)[key]

    def section(self, title):
        self.steps.append(title)

    def step(self, label, name, key, kind, code=None, call=0):
        self.add(label, self.array(name, key, call), kind, code)

    def add(self, label, array, kind, code=None):
        self.steps.append(Step(label, array, kind, code))

    def point(self, point, name, key):
        self.points.append((point, float(numpy.linalg.norm(self.array(name, key)))))

    def block(self, prefix, sublayer, sublayer_code, pre_norm, inner=(), extra=()):
        """One residual block, in the names of SublayerConnection.backward (dropout 0: Dropout'(g) = g);
        ``inner`` and ``extra``: the arguments of more steps, before and after the sublayer's."""
        if pre_norm:  # y = x + s(LN(x)): dx = dy (the skip) + LN'(s'(dy))
            self.step(f"{prefix}: dx_skip = dy (pre-LN: the skip passes dy on unchanged)", prefix, "dy", "branch",
                      SKIP)
            for args in inner:
                self.step(*args)
            self.step(f"{sublayer}: dh = Sublayer'(dy)", sublayer, "dx", "branch", sublayer_code)
            for args in extra:
                self.step(*args)
            self.step(f"{prefix}.norm: LN'(dh)", f"{prefix}.norm", "dx", "branch", NORM)
            self.step(f"{prefix}: dx = dx_skip + LN'(dh)", prefix, "dx", "stream", BLOCK_SUM)
            return
        # y = LN(x + s(x)): dx = LN'(dy) (the skip) + s'(LN'(dy))
        self.step(f"{prefix}.norm: dx_skip = LN'(dy)", f"{prefix}.norm", "dx", "branch", NORM)
        for args in inner:
            self.step(*args)
        self.step(f"{sublayer}: dh = Sublayer'(dx_skip)", sublayer, "dx", "branch", sublayer_code)
        for args in extra:
            self.step(*args)
        self.step(f"{prefix}: dx = dx_skip + dh", prefix, "dx", "stream", BLOCK_SUM)


def _uses(count, tied):
    return (lambda k: f"tied use {k} of {count}") if tied else (lambda k: "its own matrix")


def _count(n):
    return "one here" if n == 1 else f"{n} here"


def translation_walk(tracer, model):
    """The :class:`Walk` of a :class:`minitf.Transformer`'s backward (the encoder-decoder), for every layer
    from the top down, post-LN or pre-LN (with each stack's final LayerNorm)."""
    w, config = Walk(tracer), model.config
    pre_norm = config.pre_norm
    tied = model.generator.weight is model.src_embed.weight and model.tgt_embed is model.src_embed
    use = _uses(3, tied)
    scale = " sqrt(D)" if model.src_embed.scale != 1.0 else ""
    target_embed = "src_embed" if model.tgt_embed is model.src_embed else "tgt_embed"
    w.section("the loss and the output projection (logits = h W^T, W the tied (V, D) matrix)" if tied
              else "the loss and the output projection (logits = h W^T)")
    w.step("loss: dlogits = (p - q) / N", "loss", "dlogits", "loss", LOSS)
    w.step("generator: dh = dlogits W, for the decoder output h (dy of the next step)", "generator", "dh", "stream",
           PROJECTION_DH)
    w.step(f"generator: W.grad += dlogits^T h ({use(1)})", "generator", "weight", "weight", PROJECTION_DW)
    w.point("decoder out", "decoder", "dy")
    if pre_norm:
        w.section("the decoder's final LayerNorm (pre-LN)")
        w.step("decoder.final_norm: dy of the last block = LN'(dh)", "decoder.final_norm", "dx", "stream",
               (Decoder.backward, "dx = self.final_norm.backward(dy)"))
    layers = config.num_decoder_layers
    for l in reversed(range(layers)):
        dec = f"decoder.layers.{l}"
        w.section(f"decoder layer {l}, top block first: feed-forward")
        w.block(f"{dec}.ff_block", f"{dec}.feed_forward", FEED_FORWARD, pre_norm)
        w.section(f"decoder layer {l}: cross-attention, queries from the decoder, keys and values from the memory")
        w.block(f"{dec}.cross_attn_block", f"{dec}.cross_attn", CROSS_ATTENTION, pre_norm,
                extra=[(f"{dec}.cross_attn: dmemory = [dk dv] W_kv^T", f"{dec}.cross_attn", "dmemory", "branch",
                        (MultiHeadAttention.backward, "dmemory = matmul_rows(dkv"))])
        w.section(f"decoder layer {l}: masked self-attention")
        w.block(f"{dec}.self_attn_block", f"{dec}.self_attn", SELF_ATTENTION, pre_norm)
        w.point(f"decoder.layers.{l} in", dec, "dx")
    w.section(f"decoder stack: the memory's gradient, summed over the decoder layers ({_count(layers)})")
    w.step("decoder: dmemory = sum over layers", "decoder", "dmemory", "stream",
           (Decoder.backward, "dmemory = dmemory +"))
    w.section("target embedding (positional encoding and dropout pass dy through)")
    w.step("tgt_embed: d(target embedding) = dx of decoder layer 0", "decoder.layers.0", "dx", "stream",
           (Transformer.backward, "dtgt_embedded = self.positional.backward"))
    w.step(f"tgt_embed: W.grad[ids] +={scale} dy ({use(2)})", target_embed, "weight", "weight", EMBEDDING)
    w.point("encoder out", "encoder", "dy")
    top = config.num_encoder_layers - 1
    w.section(f"encoder layer {top}, from the memory down: feed-forward")
    w.step("encoder: dy = dmemory", "encoder", "dy", "stream",
           (Transformer.backward, "dx = self.encoder.backward(dmemory)"))
    if pre_norm:
        w.step("encoder.final_norm: dy of the last block = LN'(dmemory)", "encoder.final_norm", "dx", "stream",
               (Encoder.backward, "dx = self.final_norm.backward(dy)"))
    for l in reversed(range(top + 1)):
        enc = f"encoder.layers.{l}"
        if l != top:
            w.section(f"encoder layer {l}: feed-forward")
        w.block(f"{enc}.ff_block", f"{enc}.feed_forward", FEED_FORWARD, pre_norm)
        w.section(f"encoder layer {l}: self-attention")
        w.block(f"{enc}.attn_block", f"{enc}.self_attn", SELF_ATTENTION, pre_norm)
        w.point(f"encoder.layers.{l} in", enc, "dx")
    w.section("source embedding and the tied matrix" if tied else "source embedding")
    # a shared embedding runs backward twice, the target's first (Transformer.backward): the source's is call 1
    w.step(f"src_embed: W.grad[ids] +={scale} dy ({use(3)})", "src_embed", "weight", "weight", EMBEDDING,
           call=1 if target_embed == "src_embed" else 0)
    if tied:
        w.add("src_embed.weight.grad = use 1 + use 2 + use 3 (the three += above, into one Parameter)",
              backend.to_numpy(model.src_embed.weight.grad), "weight")
    return w


def language_model_walk(tracer, model):
    """The :class:`Walk` of a :class:`minitf.GPT`'s backward (decoder-only), for every layer from the top
    down, post-LN or pre-LN, learned or sinusoidal positions."""
    w, config = Walk(tracer), model.config
    pre_norm, tied = config.pre_norm, model.generator.weight is model.embed.weight
    use = _uses(2, tied)
    w.section("the next-token loss and the output projection (logits = h W^T, W the tied (V, D) matrix)" if tied
              else "the next-token loss and the output projection (logits = h W^T)")
    w.step("loss: dlogits = (softmax - onehot(next)) / N, 0 on the last position", "loss", "dlogits", "loss", LOSS)
    w.step("generator: dh = dlogits W", "generator", "dh", "stream", PROJECTION_DH)
    w.step(f"generator: W.grad += dlogits^T h ({use(1)})", "generator", "weight", "weight", PROJECTION_DW)
    w.point("decoder out", "decoder", "dy")
    if pre_norm:
        w.section("the final LayerNorm (pre-LN)")
        w.step("decoder.final_norm: dy of the last block = LN'(dh)", "decoder.final_norm", "dx", "stream",
               (Decoder.backward, "dx = self.final_norm.backward(dy)"))
    for l in reversed(range(config.num_layers)):
        layer = f"decoder.layers.{l}"
        activation = model.decoder.layers[l].feed_forward.activation
        name = type(activation).__name__
        w.section(f"layer {l}, top block first: feed-forward (Linear, {name}, Linear)")
        w.block(f"{layer}.ff_block", f"{layer}.feed_forward", FEED_FORWARD, pre_norm,
                inner=[(f"{layer}.feed_forward.activation: {name}'(x) dy, inside the feed-forward",
                        f"{layer}.feed_forward.activation", "dx", "branch", activation_line(activation))])
        w.section(f"layer {l}: masked self-attention (no cross-attention: no encoder)")
        w.block(f"{layer}.self_attn_block", f"{layer}.self_attn", SELF_ATTENTION, pre_norm)
        w.point(f"decoder.layers.{l} in", layer, "dx")
    learned = config.positions == "learned"
    w.section(("learned positions" if learned else "sinusoidal positions") + (" and the tied embedding" if tied
                                                                              else " and the embedding"))
    if learned:
        w.step("positional: P.grad[0:L] += dy summed over the batch (a scatter-add onto the rows read)",
               "positional", "weight", "weight",
               (LearnedPositionalEmbedding.backward, "self.weight.grad[start:start + L] +="))
    w.step("positional: dx = dy", "positional", "dx", "stream", (type(model.positional).backward, "return dy"))
    scale = " sqrt(D)" if model.embed.scale != 1.0 else ""
    w.step(f"embed: W.grad[ids] +={scale} dy, summed where an id repeats ({use(2)})", "embed", "weight", "weight",
           EMBEDDING)
    if tied:
        w.add("embed.weight.grad = use 1 + use 2 (the two += above, into one Parameter)",
              backend.to_numpy(model.embed.weight.grad), "weight")
    return w


# --------------------------------------------------------------------------- #
# Printing the walk of the trace's examples
# --------------------------------------------------------------------------- #
def print_gpt_walk(tracer, model, loss):
    print("walk: the GPT example of python -m minitf.trace --model gpt (pre-LN, tanh GELU, learned")
    print(f"positions, one layer, B=1, L=4, D=4, V=5; ids {GPT_IDS}, targets {GPT_NEXT}; loss {loss:.6f}),")
    print("from dL/dlogits down to the tied embedding. each step: what it computes, shape, norm, one row")
    print("([0, 0] of an activation gradient; row 3 of a (V, D) weight gradient: token 3 is read at")
    print("positions 0 and 2 and predicted at 1; row 0 of the position table), and the line of minitf")
    print("that computes it. The last position's dlogits row is 0: it has no next token, and no earlier")
    print("position reads it (the causal mask), so its row is 0 in every gradient below the loss.")
    print_steps(language_model_walk(tracer, model).steps, lambda array: array[3] if array.shape == model.embed.weight.shape
                else array[0] if array.ndim == 2 else array[0, 0])
    last = backend.to_numpy(dict(backward_record(tracer, "loss").outputs)["dlogits"])[0, -1]
    print()
    print(f"dlogits at the last position: {format_values(last)}")


def print_steps(steps, row_of):
    """Print a walk's ``steps``, numbered: each with its shape, norm, one row (``row_of(array)``) and its line."""
    number = 0
    for step in steps:
        if isinstance(step, str):
            print()
            print(f"-- {step}")
            continue
        number += 1
        print(f"{number:2d} {step.label}")
        print(f"   {str(tuple(step.array.shape)):10s} norm {numpy.linalg.norm(step.array):.4f}  "
              f"row {format_values(row_of(step.array))}")
        if step.code is not None:
            print("   {}  {}".format(*source_line(*step.code)))


def print_walk(tracer, model, loss):
    print("walk: the example of python -m minitf.trace (post-LN, one encoder and one decoder layer,")
    print(f"B=1, S=T=2, D=4, V=5; loss {loss:.6f}), from dL/dlogits down to the tied embedding.")
    print("each step: what it computes, shape, norm, one row ([0, 0] of an activation gradient,")
    print("row 4 of a (V, D) weight gradient: token 4 is in the source, the target and the output),")
    print("and the line of minitf that computes it; in a residual block, dx_skip, dh and dx are")
    print("the names of SublayerConnection.backward (dropout 0, so Dropout'(g) = g)")
    print_steps(translation_walk(tracer, model).steps,
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
