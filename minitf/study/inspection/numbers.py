"""The numbers of the inspection page, from the model's own arrays: one forward with every
:class:`~minitf.attention.MultiHeadAttention` keeping its softmax weights ``P``, the loss of the
shown target, and one backward under a :class:`~minitf.study.tracer.Tracer` that records the gradient at
each step of the walk from dL/dlogits down to the embeddings: the walk of ``python -m minitf.trace --walk``
(the walk the model's kind names, :class:`Parts`: the same steps for the trace's examples), for any number of
layers, post-LN or pre-LN.

Shapes: S source length, T target length (a GPT: L tokens), H heads, V vocabulary size.
"""
import contextlib
import dataclasses

import minitf
from minitf import backend
from minitf.backend import host as np  # every number here ends on the host, for the page
from minitf.study.tracer import Tracer
from minitf.study.walk import backward_record, language_model_walk, translation_walk

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
    source position. ``head_labels``: {attention name: [a label per head]} where a head is more than its number
    (grouped-query attention: the key/value head it reads), else {}. ``experts``: a :class:`Routing` per sparse
    feed-forward, bottom first ([] for a dense model). ``position_bias``: {name: (distances (n,),
    values (H, n))} the learned bias each head adds to a score at each distance (key - query position) where the
    model has one (T5's relative position bias), else {}."""
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
    head_labels: dict = dataclasses.field(default_factory=dict)
    experts: list = dataclasses.field(default_factory=list)
    position_bias: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Routing:
    """What one sparse feed-forward's router chose for each position in the page's forward (host arrays):
    ``layer`` the block's number (0 nearest the input), ``idx`` (T, k) the chosen experts (its first choice
    first), ``weights`` (T, k) the weight each one's output was summed with, ``probs`` (T, E) the router's
    probabilities over all E experts, ``shared``: whether a shared expert also reads every position."""
    layer: int
    idx: object
    weights: object
    probs: object
    shared: bool = False


@dataclasses.dataclass
class Parts:
    """What the page reads of a model, named by its kind (``Kind.page_parts``; these tools import no kind):
    ``walk(tracer, model)`` its backward walk (:class:`minitf.study.walk.Walk`), ``attention`` {name of the
    attention: [its module in each layer, bottom first]} (each keeps its weights ``P`` when ``record_weights``),
    ``embedding`` the module whose backward's dy is the gradient of the embedding rows read (call
    ``embedding_call``; times ``embedding_scale``), ``walked(name)`` whether the walk reads the records of the
    module ``name`` (the rest runs unwrapped; None: every module is recorded), ``head_labels`` and
    ``position_bias`` as :class:`Inspection`'s, ``experts`` [(block number, its sparse feed-forward)] (a
    :class:`minitf.moe.SparseMoE`: its ``choices()`` after the forward; [] for a dense model)."""
    walk: object
    attention: dict
    embedding: str
    embedding_call: int = 0
    embedding_scale: float = 1.0
    walked: object = None
    head_labels: dict = dataclasses.field(default_factory=dict)
    experts: list = dataclasses.field(default_factory=list)
    position_bias: dict = dataclasses.field(default_factory=dict)


def translation_parts(model):
    """The :class:`Parts` of a :class:`minitf.Transformer` (the encoder-decoder; a Marian folder's too)."""
    return Parts(translation_walk,
                 {"encoder self-attention": [layer.self_attn for layer in model.encoder.layers],
                  "decoder masked self-attention": [layer.self_attn for layer in model.decoder.layers],
                  "cross-attention": [layer.cross_attn for layer in model.decoder.layers]},
                 "src_embed", 1 if model.tgt_embed is model.src_embed else 0,  # shared: the source's use is call 1
                 model.src_embed.scale, _walked)


def layout(model):
    """"pre-LN" or "post-LN": where a Transformer's or a GPT's LayerNorms sit."""
    return "pre-LN" if model.config.pre_norm else "post-LN"


def describe_translation(model):
    """(name, layout, shape line) of a :class:`minitf.Transformer` for the page's header."""
    c = model.config
    return ("translation", layout(model),
            f"Transformer (encoder-decoder), {layout(model)}, {c.num_encoder_layers} + "
            f"{c.num_decoder_layers} layers, d_model {c.d_model}, {c.num_heads} heads, d_ff {c.d_ff}")


def describe_language_model(model):
    """(name, layout, shape line) of a :class:`minitf.GPT` for the page's header."""
    c = model.config
    return ("GPT", layout(model),
            f"GPT, {layout(model)}, {c.num_layers} layers, d_model {c.d_model}, {c.num_heads} heads, "
            f"d_ff {c.d_ff}, {c.activation}, {c.positions} positions")


def language_model_parts(model):
    """The :class:`Parts` of a :class:`minitf.GPT`."""
    return Parts(language_model_walk, {"causal self-attention": [layer.self_attn for layer in model.decoder.layers]},
                 "embed", 0, model.embed.scale, _walked)


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


def _run(model, loss_fn, forward, targets, top, parts):
    """Forward (``forward()`` -> logits (1, T, V)), loss and backward with the attention weights kept and a
    Tracer on; returns (logits (T, V), loss, attention, tracer)."""
    modules = parts.attention
    tracer = Tracer(model, extra=[("loss", loss_fn)])
    if parts.walked is not None:
        tracer.targets = [(name, module) for name, module in tracer.targets if parts.walked(name)]
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


def translation(model, src_ids, tgt_in_ids, tgt_out_ids, smoothing=0.0, top=TOP, parts=None):
    """The :class:`Inspection` of one sentence pair through a :class:`minitf.Transformer`: ``src_ids``
    (S,), ``tgt_in_ids`` (T,) (BOS first) and ``tgt_out_ids`` (T,) (EOS last), host integer arrays; ``parts``
    (default :func:`translation_parts`) what the page reads of it. The model's mode and its parameters' gradients
    are left as the backward leaves them."""
    parts = parts or translation_parts(model)
    src, tgt_in, tgt_out = (np.asarray(a, dtype=np.int64) for a in (src_ids, tgt_in_ids, tgt_out_ids))
    loss_fn = minitf.LabelSmoothedCrossEntropy(smoothing, ignore_index=model.pad_id)
    logits, loss, attention, tracer = _run(model, loss_fn, lambda: model(src[None], tgt_in[None]), tgt_out, top,
                                           parts)
    return _inspection(logits, tgt_out, top, loss, loss_fn, smoothing, attention, tracer, model, parts)


def language_model(model, ids, top=TOP, parts=None):
    """The :class:`Inspection` of one text through a decoder-only model (a :class:`minitf.GPT`, or another whose
    ``parts`` its kind gives; default :func:`language_model_parts`): ``ids`` (L,); position t is scored on token
    t + 1 (the next-token loss), the last position on nothing."""
    parts = parts or language_model_parts(model)
    ids = np.asarray(ids, dtype=np.int64)
    targets = np.concatenate([ids[1:], [-1]])                            # (L,): the next token; -1 none
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    logits, loss, attention, tracer = _run(model, loss_fn, lambda: model(ids[None]), targets, top, parts)
    return _inspection(logits, targets, top, loss, loss_fn, 0.0, attention, tracer, model, parts)


def encoder(model, ids, targets, top=TOP, parts=None):
    """The :class:`Inspection` of one text through an encoder with a token-level head (a masked LM, whose ``parts``
    its kind gives): ``ids`` (L,), ``targets`` (L,) the token each scored position is scored on (-1: none, every
    position but the masks); every position reads every other (attention in both directions)."""
    ids, targets = np.asarray(ids, dtype=np.int64), np.asarray(targets, dtype=np.int64)
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    logits, loss, attention, tracer = _run(model, loss_fn, lambda: model(ids[None]), targets, top, parts)
    return _inspection(logits, targets, top, loss, loss_fn, 0.0, attention, tracer, model, parts)


def _inspection(logits, targets, top, loss, loss_fn, smoothing, attention, tracer, model, parts):
    probability, top_ids, top_probs = _predictions(logits, targets, top)
    walk, points = _walk(tracer, model, parts.walk)
    dy = dict(backward_record(tracer, parts.embedding, parts.embedding_call).inputs)["dy"][0]
    embedding_grad = np.linalg.norm(dy, axis=-1) * parts.embedding_scale           # (S,) or (L,)
    return Inspection(targets=targets, probability=probability, top_ids=top_ids, top_probs=top_probs,
                      loss=float(loss), num_tokens=int(loss_fn.num_tokens), smoothing=smoothing,
                      attention=attention, walk=walk, points=points, embedding_grad=embedding_grad,
                      head_labels=dict(parts.head_labels), position_bias=dict(parts.position_bias),
                      experts=[Routing(layer, *block.choices(), shared=block.shared_expert is not None)
                               for layer, block in parts.experts])


def _walk(tracer, model, backward_walk):
    """(steps, points) of the page: ``backward_walk``'s (the kind's), each step's gradient as its norm and shape."""
    walk = backward_walk(tracer, model)
    steps = [step if isinstance(step, str) else
             Step(step.label, float(np.linalg.norm(step.array)), tuple(step.array.shape), step.kind)
             for step in walk.steps]
    return steps, walk.points
