"""The numbers of the inspection page, from the model's own arrays: one forward with every
:class:`~minitf.attention.MultiHeadAttention` keeping its softmax weights ``P``, the loss of the
shown target, and one backward under a :class:`~minitf.study.tracer.Tracer` that records the gradient at
each step of the walk from dL/dlogits down to the embeddings: the walk of ``python -m minitf.trace --walk``
(:func:`minitf.study.walk.backward_walk`, the same steps for the trace's examples), for any number of layers,
post-LN or pre-LN.

Shapes: S source length, T target length (a GPT: L tokens), H heads, V vocabulary size.
"""
import contextlib
import dataclasses

import minitf
from minitf import backend
from minitf.backend import host as np  # every number here ends on the host, for the page
from minitf.gpt import GPT
from minitf.study.tracer import Tracer
from minitf.study.walk import backward_record, backward_walk

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
    walk, points = _walk(tracer, model)
    source_call = 1 if model.tgt_embed is model.src_embed else 0  # a shared embedding: the source's use is call 1
    source_dy = backward_record(tracer, "src_embed", source_call).inputs
    embedding_grad = np.linalg.norm(dict(source_dy)["dy"][0], axis=-1) * model.src_embed.scale        # (S,)
    return _inspection(logits, tgt_out, top, loss, loss_fn, smoothing, attention, walk, points, embedding_grad)


def language_model(model, ids, top=TOP):
    """The :class:`Inspection` of one text through a :class:`minitf.GPT`: ``ids`` (L,); position t is
    scored on token t + 1 (the next-token loss), the last position on nothing."""
    ids = np.asarray(ids, dtype=np.int64)
    targets = np.concatenate([ids[1:], [-1]])                            # (L,): the next token; -1 none
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    logits, loss, attention, tracer = _run(model, loss_fn, lambda: model(ids[None]), targets, top)
    walk, points = _walk(tracer, model)
    embedding_grad = np.linalg.norm(dict(backward_record(tracer, "embed").inputs)["dy"][0], axis=-1) * model.embed.scale
    return _inspection(logits, targets, top, loss, loss_fn, 0.0, attention, walk, points, embedding_grad)


def _inspection(logits, targets, top, loss, loss_fn, smoothing, attention, walk, points, embedding_grad):
    probability, top_ids, top_probs = _predictions(logits, targets, top)
    return Inspection(targets=targets, probability=probability, top_ids=top_ids, top_probs=top_probs,
                      loss=float(loss), num_tokens=int(loss_fn.num_tokens), smoothing=smoothing,
                      attention=attention, walk=walk, points=points, embedding_grad=embedding_grad)


def _walk(tracer, model):
    """(steps, points) of the page: :func:`minitf.study.walk.backward_walk`'s, each step's gradient as its norm and shape."""
    walk = backward_walk(tracer, model)
    steps = [step if isinstance(step, str) else
             Step(step.label, float(np.linalg.norm(step.array)), tuple(step.array.shape), step.kind)
             for step in walk.steps]
    return steps, walk.points
