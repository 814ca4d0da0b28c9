"""The numbers of the inspection page, from the model's own arrays: one forward with every
:class:`~minitf.attention.MultiHeadAttention` keeping its softmax weights ``P``, the loss of the
shown target, and one backward under a :class:`~minitf.tracer.Tracer` that records the gradient at
each step of the walk from dL/dlogits down to the embeddings, in the order of ``python -m
minitf.trace --walk`` (:func:`minitf.walk.walk_steps`; for a GPT, ``--model gpt --walk``), for any
number of layers, post-LN or pre-LN.

Shapes: S source length, T target length (a GPT: L tokens), H heads, V vocabulary size.
"""
import contextlib
import dataclasses

import minitf
from minitf import backend
from minitf.backend import host as np  # every number here ends on the host, for the page
from minitf.gpt import GPT
from minitf.tracer import Tracer

#: Alternatives shown for each predicted token.
TOP = 5


@dataclasses.dataclass
class Step:
    """One line of the walk: ``label`` as ``trace --walk`` words it, the gradient's ``norm`` and
    ``shape``, and its ``kind``: "loss" (dL/dlogits), "stream" (the residual stream between blocks:
    dL/d(a block's input), the decoder's output, the memory), "branch" (inside a block: LayerNorm',
    a sublayer's backward) or "weight" (what a backward adds to a weight matrix's ``.grad``)."""
    label: str
    norm: float
    shape: tuple
    kind: str


@dataclasses.dataclass
class Inspection:
    """What the page shows of one example (host arrays).

    ``targets`` (T,): the token predicted at each position (-1: none, a GPT's last position);
    ``probability`` (T,): the model's probability of it; ``top_ids``, ``top_probs`` (T, TOP): the
    most likely tokens there, most likely first. ``loss``: cross-entropy of the targets (label
    smoothing ``smoothing``), mean over ``num_tokens``. ``attention``: {name: P (layers, H, Tq, Tk)}.
    ``walk``: [section title (str) or :class:`Step`]; ``points``: [(name, |dL/d(point)|)] down the
    residual stream (the stacks' outputs and each layer's input, from the top down).
    ``embedding_grad`` (S,) (a GPT: (L,)): |dL/d(the embedding row read at that position)|, per
    source position."""
    targets: object
    probability: object
    top_ids: object
    top_probs: object
    loss: float
    num_tokens: int
    smoothing: float
    attention: dict
    walk: list
    points: list
    embedding_grad: object


def attention_modules(model):
    """{name of the attention: [its MultiHeadAttention in each layer, bottom first]}."""
    if isinstance(model, GPT):
        return {"causal self-attention": [layer.self_attn for layer in model.decoder.layers]}
    return {"encoder self-attention": [layer.self_attn for layer in model.encoder.layers],
            "decoder masked self-attention": [layer.self_attn for layer in model.decoder.layers],
            "cross-attention": [layer.cross_attn for layer in model.decoder.layers]}


@contextlib.contextmanager
def keeping_weights(modules):
    """Every attention of ``modules`` keeps its last weights in ``.weights`` (MultiHeadAttention's
    ``record_weights``) for the block; afterwards the flag and the arrays go."""
    for module in modules:
        module.record_weights = True
    try:
        yield
    finally:
        for module in modules:
            vars(module).pop("record_weights", None)
            vars(module).pop("weights", None)


def _predictions(logits, targets, top):
    """(probability of each target (T,), top ids (T, top), their probabilities (T, top)) from logits (T, V)."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)                                   # softmax  (T, V)
    top = min(top, p.shape[-1])
    top_ids = np.argsort(-p, axis=-1, kind="stable")[:, :top]            # most likely first  (T, top)
    chosen = np.take_along_axis(p, np.maximum(targets, 0)[:, None], axis=-1)[:, 0]
    return np.where(targets >= 0, chosen, np.nan), top_ids, np.take_along_axis(p, top_ids, axis=-1)


def _run(model, loss_fn, forward, targets, top):
    """Forward (``forward()`` -> logits (1, T, V)), loss and backward with the attention weights kept and a
    Tracer on; returns (logits (T, V), loss, attention, tracer)."""
    modules = attention_modules(model)
    tracer = Tracer(model, extra=[("loss", loss_fn)])
    tracer.targets = [(name, module) for name, module in tracer.targets if _walked(name)]
    model.zero_grad()
    with keeping_weights([m for layers in modules.values() for m in layers]), tracer.active():
        logits = forward()
        loss = loss_fn(logits, targets[None])
        model.backward(loss_fn.backward())
        attention = {name: np.stack([backend.to_numpy(m.weights)[0] for m in layers])   # (layers, H, Tq, Tk)
                     for name, layers in modules.items()}
    return backend.to_numpy(logits)[0], loss, attention, tracer


_SUBLAYERS = {"attn_block": "self_attn", "self_attn_block": "self_attn", "cross_attn_block": "cross_attn",
              "ff_block": "feed_forward"}


def _walked(name):
    """Whether the walk reads the records of the module named ``name`` (the rest runs unwrapped)."""
    parts = name.split(".")
    if len(parts) <= 2:                      # loss, generator, the embeddings, positional, the stacks, final norms
        return True
    if parts[1] != "layers":
        return False
    rest = parts[3:]                         # after "<stack>.layers.<l>"
    return (len(rest) <= 1 or rest[-1] == "norm" and rest[0] in _SUBLAYERS
            or rest == ["feed_forward", "activation"])


def translation(model, src_ids, tgt_in_ids, tgt_out_ids, smoothing=0.0, top=TOP):
    """The :class:`Inspection` of one sentence pair through a :class:`minitf.Transformer`: ``src_ids``
    (S,), ``tgt_in_ids`` (T,) (BOS first) and ``tgt_out_ids`` (T,) (EOS last), host integer arrays.
    The model's mode and its parameters' gradients are left as the backward leaves them."""
    src, tgt_in, tgt_out = (np.asarray(a, dtype=np.int64) for a in (src_ids, tgt_in_ids, tgt_out_ids))
    loss_fn = minitf.LabelSmoothedCrossEntropy(smoothing, ignore_index=model.pad_id)
    logits, loss, attention, tracer = _run(model, loss_fn, lambda: model(src[None], tgt_in[None]), tgt_out, top)
    walk, points = transformer_walk(tracer, model)
    embed = "src_embed"
    source_dy = _record(tracer, embed, 1 if model.tgt_embed is model.src_embed else 0).inputs  # the source's use
    embedding_grad = np.linalg.norm(dict(source_dy)["dy"][0], axis=-1) * model.src_embed.scale        # (S,)
    return _inspection(logits, tgt_out, top, loss, loss_fn, smoothing, attention, walk, points, embedding_grad)


def language_model(model, ids, top=TOP):
    """The :class:`Inspection` of one text through a :class:`minitf.GPT`: ``ids`` (L,); position t is
    scored on token t + 1 (the next-token loss), the last position on nothing."""
    ids = np.asarray(ids, dtype=np.int64)
    targets = np.concatenate([ids[1:], [-1]])                            # (L,): the next token; -1 none
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    logits, loss, attention, tracer = _run(model, loss_fn, lambda: model(ids[None]), targets, top)
    walk, points = gpt_walk(tracer, model)
    embedding_grad = np.linalg.norm(dict(_record(tracer, "embed").inputs)["dy"][0], axis=-1) * model.embed.scale
    return _inspection(logits, targets, top, loss, loss_fn, 0.0, attention, walk, points, embedding_grad)


def _inspection(logits, targets, top, loss, loss_fn, smoothing, attention, walk, points, embedding_grad):
    probability, top_ids, top_probs = _predictions(logits, targets, top)
    return Inspection(targets=targets, probability=probability, top_ids=top_ids, top_probs=top_probs,
                      loss=float(loss), num_tokens=int(loss_fn.num_tokens), smoothing=smoothing,
                      attention=attention, walk=walk, points=points, embedding_grad=embedding_grad)


# --------------------------------------------------------------------------- #
# The walk, for any number of layers and either layout
# --------------------------------------------------------------------------- #
def _record(tracer, name, call=0):
    for record in tracer.records:
        if record.kind == "backward" and record.name == name and record.call == call:
            return record
    raise LookupError(f"no backward call {call} of {name!r}")


class _Walk:
    """Collects the steps: ``step(label, name, key, kind, call)`` reads the array ``key`` (an input,
    an output or a parameter's added gradient) of backward call ``call`` of module ``name``."""

    def __init__(self, tracer):
        self.tracer, self.steps = tracer, []

    def section(self, title):
        self.steps.append(title)

    def array(self, name, key, call=0):
        record = _record(self.tracer, name, call)
        found = dict(record.outputs + record.inputs + record.grads)
        return found[key]

    def step(self, label, name, key, kind, call=0):
        self.add(label, self.array(name, key, call), kind)

    def add(self, label, array, kind):
        self.steps.append(Step(label, float(np.linalg.norm(array)), tuple(array.shape), kind))

    def norm(self, name, key, call=0):
        return float(np.linalg.norm(self.array(name, key, call)))

    def block(self, prefix, sublayer, pre_norm, inner=(), extra=()):
        """One residual block, in the names of SublayerConnection.backward (dropout is the identity here)."""
        if pre_norm:  # y = x + s(LN(x)): dx = dy (the skip) + LN'(s'(dy))
            self.step(f"{prefix}: dx_skip = dy (pre-LN: the skip passes dy on unchanged)", prefix, "dy", "branch")
            for args in inner:
                self.step(*args)
            self.step(f"{sublayer}: dh = Sublayer'(dy)", sublayer, "dx", "branch")
            for args in extra:
                self.step(*args)
            self.step(f"{prefix}.norm: LN'(dh)", f"{prefix}.norm", "dx", "branch")
            self.step(f"{prefix}: dx = dx_skip + LN'(dh)", prefix, "dx", "stream")
            return
        # y = LN(x + s(x)): dx = LN'(dy) (the skip) + s'(LN'(dy))
        self.step(f"{prefix}.norm: dx_skip = LN'(dy)", f"{prefix}.norm", "dx", "branch")
        for args in inner:
            self.step(*args)
        self.step(f"{sublayer}: dh = Sublayer'(dx_skip)", sublayer, "dx", "branch")
        for args in extra:
            self.step(*args)
        self.step(f"{prefix}: dx = dx_skip + dh", prefix, "dx", "stream")


def _uses(count, tied):
    return (lambda k: f"tied use {k} of {count}") if tied else (lambda k: "its own matrix")


def transformer_walk(tracer, model):
    """(steps, points) of the encoder-decoder's backward from the records of ``tracer``: the steps of
    :func:`minitf.walk.walk_steps` (the same labels, and for one post-LN layer per stack the same steps),
    repeated for every layer from the top down, with each stack's final LayerNorm when pre-LN."""
    w, pre_norm = _Walk(tracer), model.config["pre_norm"]
    tied = model.generator.weight is model.src_embed.weight and model.tgt_embed is model.src_embed
    use = _uses(3, tied)
    scale = " sqrt(D)" if model.src_embed.scale != 1.0 else ""
    target_embed = "src_embed" if model.tgt_embed is model.src_embed else "tgt_embed"
    points = []
    w.section("the loss and the output projection (logits = h W^T, W the tied (V, D) matrix)" if tied
              else "the loss and the output projection (logits = h W^T)")
    w.step("loss: dlogits = (p - q) / N", "loss", "dlogits", "loss")
    w.step("generator: dh = dlogits W, for the decoder output h (dy of the next step)", "generator", "dh", "stream")
    w.step(f"generator: W.grad += dlogits^T h ({use(1)})", "generator", "weight", "weight")
    points.append(("decoder out", w.norm("decoder", "dy")))
    if pre_norm:
        w.section("the decoder's final LayerNorm (pre-LN)")
        w.step("decoder.final_norm: dy of the last block = LN'(dh)", "decoder.final_norm", "dx", "stream")
    layers = model.config["num_decoder_layers"]
    for l in reversed(range(layers)):
        dec = f"decoder.layers.{l}"
        w.section(f"decoder layer {l}, top block first: feed-forward")
        w.block(f"{dec}.ff_block", f"{dec}.feed_forward", pre_norm)
        w.section(f"decoder layer {l}: cross-attention, queries from the decoder, keys and values from the memory")
        w.block(f"{dec}.cross_attn_block", f"{dec}.cross_attn", pre_norm,
                extra=[(f"{dec}.cross_attn: dmemory = [dk dv] W_kv^T", f"{dec}.cross_attn", "dmemory", "branch")])
        w.section(f"decoder layer {l}: masked self-attention")
        w.block(f"{dec}.self_attn_block", f"{dec}.self_attn", pre_norm)
        points.append((f"decoder.layers.{l} in", w.norm(dec, "dx")))
    w.section(f"decoder stack: the memory's gradient, summed over the decoder layers ({_count(layers)})")
    w.step("decoder: dmemory = sum over layers", "decoder", "dmemory", "stream")
    w.section("target embedding (positional encoding and dropout pass dy through)")
    w.step("tgt_embed: d(target embedding) = dx of decoder layer 0", "decoder.layers.0", "dx", "stream")
    w.step(f"tgt_embed: W.grad[ids] +={scale} dy ({use(2)})", target_embed, "weight", "weight")
    points.append(("encoder out", w.norm("encoder", "dy")))
    w.section(f"encoder layer {model.config['num_encoder_layers'] - 1}, from the memory down: feed-forward")
    w.step("encoder: dy = dmemory", "encoder", "dy", "stream")
    if pre_norm:
        w.step("encoder.final_norm: dy of the last block = LN'(dmemory)", "encoder.final_norm", "dx", "stream")
    for l in reversed(range(model.config["num_encoder_layers"])):
        enc = f"encoder.layers.{l}"
        if l != model.config["num_encoder_layers"] - 1:
            w.section(f"encoder layer {l}: feed-forward")
        w.block(f"{enc}.ff_block", f"{enc}.feed_forward", pre_norm)
        w.section(f"encoder layer {l}: self-attention")
        w.block(f"{enc}.attn_block", f"{enc}.self_attn", pre_norm)
        points.append((f"encoder.layers.{l} in", w.norm(enc, "dx")))
    w.section("source embedding and the tied matrix" if tied else "source embedding")
    w.step(f"src_embed: W.grad[ids] +={scale} dy ({use(3)})", "src_embed", "weight", "weight",
           call=1 if target_embed == "src_embed" else 0)
    if tied:
        w.add("src_embed.weight.grad = use 1 + use 2 + use 3 (the three += above, into one Parameter)",
              backend.to_numpy(model.src_embed.weight.grad), "weight")
    return w.steps, points


def gpt_walk(tracer, model):
    """(steps, points) of a GPT's backward: the steps of :func:`minitf.walk.gpt_walk_steps` (the same labels,
    and for one pre-LN layer the same steps), for every layer from the top down, post-LN or pre-LN."""
    w, config = _Walk(tracer), model.config
    pre_norm, tied = config["pre_norm"], model.generator.weight is model.embed.weight
    use = _uses(2, tied)
    points = []
    w.section("the next-token loss and the output projection (logits = h W^T, W the tied (V, D) matrix)" if tied
              else "the next-token loss and the output projection (logits = h W^T)")
    w.step("loss: dlogits = (softmax - onehot(next)) / N, 0 on the last position", "loss", "dlogits", "loss")
    w.step("generator: dh = dlogits W", "generator", "dh", "stream")
    w.step(f"generator: W.grad += dlogits^T h ({use(1)})", "generator", "weight", "weight")
    points.append(("decoder out", w.norm("decoder", "dy")))
    if pre_norm:
        w.section("the final LayerNorm (pre-LN)")
        w.step("decoder.final_norm: dy of the last block = LN'(dh)", "decoder.final_norm", "dx", "stream")
    for l in reversed(range(config["num_layers"])):
        layer = f"decoder.layers.{l}"
        activation = f"{layer}.feed_forward.activation"
        name = type(model.decoder.layers[l].feed_forward.activation).__name__
        w.section(f"layer {l}, top block first: feed-forward (Linear, {name}, Linear)")
        w.block(f"{layer}.ff_block", f"{layer}.feed_forward", pre_norm,
                inner=[(f"{activation}: {name}'(x) dy, inside the feed-forward", activation, "dx", "branch")])
        w.section(f"layer {l}: masked self-attention (no cross-attention: no encoder)")
        w.block(f"{layer}.self_attn_block", f"{layer}.self_attn", pre_norm)
        points.append((f"decoder.layers.{l} in", w.norm(layer, "dx")))
    learned = config["positions"] == "learned"
    w.section(("learned positions" if learned else "sinusoidal positions") + (" and the tied embedding" if tied
                                                                              else " and the embedding"))
    if learned:
        w.step("positional: P.grad[0:L] += dy summed over the batch (a scatter-add onto the rows read)",
               "positional", "weight", "weight")
    w.step("positional: dx = dy", "positional", "dx", "stream")
    scale = " sqrt(D)" if model.embed.scale != 1.0 else ""
    w.step(f"embed: W.grad[ids] +={scale} dy, summed where an id repeats ({use(2)})", "embed", "weight", "weight")
    if tied:
        w.add("embed.weight.grad = use 1 + use 2 (the two += above, into one Parameter)",
              backend.to_numpy(model.embed.weight.grad), "weight")
    return w.steps, points


def _count(n):
    return "one here" if n == 1 else f"{n} here"
