"""What the study tools read of a BERT-family encoder, from the shared machinery of :mod:`minitf.study` (which
imports no kind: the kind names these, :class:`minitf.bert.kind.BertKind`):

- :func:`bert_walk`: the masked LM's backward walk from dL/dlogits down to the three embedding tables, step by
  step, each step with the line of minitf that computes it: the loss (non-zero rows at the masked positions only),
  the tied decoder, the head's LayerNorm, activation and dense layer, then per layer the post-LN blocks
  (feed-forward, then self-attention in both directions: no causal mask), then the embeddings' LayerNorm and the
  word, position and token-type tables (the word table's gradient the sum of its two tied uses);
- :func:`trace_example`: ``python -m minitf.trace --model bert``'s example (a one-layer masked LM, D = 4, two
  heads, V = 6, round-number weights, float64; a sequence of two segments with one [MASK]) and its printed walk;
- :func:`trace_loaded`: ``python -m minitf.trace --checkpoint BERTFOLDER --text "... [MASK] ..."``: each mask
  scored on the model's own most probable token (a classifier: the text scored on its most probable label);
- :func:`page_parts` and :func:`describe`: the inspection page's parts (the walk, each layer's self-attention,
  the word embedding) and header.
"""
from minitf import backend
from minitf.backend import host as np
from minitf.bert.model import BertConfig, BertForMaskedLM, BertForSequenceClassification
from minitf.layers import Linear
from minitf.loss import LabelSmoothedCrossEntropy
from minitf.study.inspection.numbers import Parts
from minitf.study.tracer import MAX_TOKENS, Example, Tracer, loaded_header, with_round_numbers
from minitf.study.walk import (EMBEDDING, FEED_FORWARD, LOSS, NORM, PROJECTION_DH, PROJECTION_DW, SELF_ATTENTION,
                               Walk, activation_line, print_steps)
from minitf.training.errors import UsageError

#: The traced example: a one-layer masked LM of D = 4, two heads (dk = 2), F = 8, V = 6, four positions, two
#: segments; 0 [PAD], 1 [CLS], 2 [SEP], 3 [MASK].
TRACE_CONFIG = dict(vocab_size=6, d_model=4, num_heads=2, num_layers=1, d_ff=8, max_position_embeddings=4,
                    type_vocab_size=2, dropout=0.0, layer_norm_eps=1e-5)
IDS = [[1, 3, 2, 5]]          # [CLS] [MASK] [SEP] 5: position 1 is masked
TYPES = [[0, 0, 0, 1]]        # two segments: the last token is the second's
TARGETS = [[-1, 4, -1, -1]]   # the masked position's original token (4); -1: no loss there

DENSE = (Linear.backward, "return matmul_rows(dy, self.weight.data.T)")


def bert_walk(tracer, model):
    """The :class:`minitf.study.walk.Walk` of a :class:`minitf.bert.model.BertForMaskedLM`'s backward, every layer
    from the top down, from the records of ``tracer``."""
    w, config = Walk(tracer), model.config
    w.section("the masked-LM loss and the tied decoder (logits = LN(act(h W + b)) E^T + bias, E the (V, D) word "
              "embedding)")
    w.step("loss: dlogits = (softmax - onehot) / N at the masked positions, 0 at every other", "loss", "dlogits",
           "loss", LOSS)
    w.step("lm_head.decoder: dz = dlogits E", "lm_head.decoder", "dh", "branch", PROJECTION_DH)
    w.step("lm_head.decoder: E.grad += dlogits^T z (tied use 1 of 2)", "lm_head.decoder", "weight", "weight",
           PROJECTION_DW)
    w.step("lm_head.norm: LN'(dz)", "lm_head.norm", "dx", "branch", NORM)
    activation = model.lm_head.activation
    w.step(f"lm_head.activation: {type(activation).__name__}'(x) dy", "lm_head.activation", "dx", "branch",
           activation_line(activation))
    w.step("lm_head.dense: dh = dy W^T, for the encoder's output h", "lm_head.dense", "dx", "stream", DENSE)
    w.point("encoder out", "bert.encoder", "dy")
    for l in reversed(range(config.num_layers)):
        layer = f"bert.encoder.layers.{l}"
        ff = model.bert.encoder.layers[l].feed_forward.activation
        name = type(ff).__name__
        w.section(f"layer {l}, top block first: feed-forward (Linear, {name}, Linear), post-LN")
        w.block(f"{layer}.ff_block", f"{layer}.feed_forward", FEED_FORWARD, False,
                inner=[(f"{layer}.feed_forward.activation: {name}'(x) dy, inside the feed-forward",
                        f"{layer}.feed_forward.activation", "dx", "branch", activation_line(ff))])
        w.section(f"layer {l}: self-attention in both directions (no causal mask: every position reads every "
                  "other, so every position's gradient reaches every token)")
        w.block(f"{layer}.attn_block", f"{layer}.self_attn", SELF_ATTENTION, False)
        w.point(f"bert.encoder.layers.{l} in", layer, "dx")
    e = "bert.embeddings"
    w.section("the embeddings: y = LN(W_tok[ids] + W_pos[positions] + W_type[segments]); each table gets the same "
              "dx at the rows it gave")
    w.step(f"{e}.norm: dx = LN'(dy)", f"{e}.norm", "dx", "stream", NORM)
    if model.bert.embeddings.token_type_embeddings is not None:
        w.step(f"{e}.token_type_embeddings: W_type.grad[segments] += dx", f"{e}.token_type_embeddings", "weight",
               "weight", EMBEDDING)
    w.step(f"{e}.position_embeddings: W_pos.grad[positions] += dx", f"{e}.position_embeddings", "weight", "weight",
           EMBEDDING)
    w.step(f"{e}.word_embeddings: E.grad[ids] += dx, summed where an id repeats (tied use 2 of 2)",
           f"{e}.word_embeddings", "weight", "weight", EMBEDDING)
    w.add(f"{e}.word_embeddings.weight.grad = use 1 + use 2 (the two += above, into one Parameter)",
          backend.to_numpy(model.bert.embeddings.word_embeddings.weight.grad), "weight")
    return w


def run_masked(model, ids, targets, types=None, loss_fn=None):
    """``model`` (a masked LM, or a classifier with its ``loss_fn``) on (B, L) ``ids`` (and segment ``types``)
    against ``targets`` (-1: no loss there): forward, the loss (no smoothing) and backward under a Tracer. Returns
    (tracer, model, loss)."""
    loss_fn = loss_fn or LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    tracer = Tracer(model, extra=[("loss", loss_fn)])
    model.zero_grad()
    with tracer.active():
        logits = model(np.asarray(ids), token_type_ids=None if types is None else np.asarray(types))
        loss = loss_fn(logits, np.asarray(targets))
        model.backward(loss_fn.backward())
    return tracer, model, loss


def build_trace_model():
    """The traced masked LM (:data:`TRACE_CONFIG`), float64 under ``default_dtype``: every weight matrix and table
    round numbers (minitf.study.tracer's), biases 0, LayerNorm gains 1."""
    backend.manual_seed(0)
    return with_round_numbers(BertForMaskedLM(BertConfig(**TRACE_CONFIG)))


def header(loss):
    c = TRACE_CONFIG
    return [f"trace: BERT masked LM, B=1, L=4, D={c['d_model']}, H={c['num_heads']} (dk=2), F={c['d_ff']}, "
            f"V={c['vocab_size']}, one layer, post-LN, exact GELU, learned positions, two segments, tied decoder, "
            "float64, dropout 0",
            f"ids {IDS} ([CLS] [MASK] [SEP] 5), token types {TYPES}, targets {TARGETS} (-1: not masked, no loss); "
            f"loss {loss:.6f}"]


def print_walk(tracer, model, loss):
    print("walk: the BERT example of python -m minitf.trace --model bert (post-LN, exact GELU, learned")
    print(f"positions and two token types, one layer, B=1, L=4, D=4, V=6; ids {IDS}, token types {TYPES},")
    print(f"targets {TARGETS}; loss {loss:.6f}), from dL/dlogits down to the three embedding tables. each step:")
    print("what it computes, shape, norm, one row ([0, 0] of an activation gradient: the [CLS] position, whose")
    print("dlogits row is 0 but whose gradient below the head is not: attention reads every position from every")
    print("other; row 3 of a (V, D) weight gradient: [MASK]'s), and the line of minitf that computes it.")
    V, D = model.bert.embeddings.word_embeddings.weight.shape
    print_steps(bert_walk(tracer, model).steps,
                lambda a: a[3] if a.shape == (V, D) else a[0] if a.ndim == 2 else a[0, 0])


def trace_example():
    """``python -m minitf.trace --model bert``'s :class:`minitf.study.tracer.Example`."""
    return Example(lambda: run_masked(build_trace_model(), IDS, TARGETS, TYPES), header, print_walk)


def masked_example(loaded, text, max_tokens=MAX_TOKENS):
    """(ids, targets) of a masked LM's trace: ``text`` tokenized with its special tokens, cut to ``max_tokens``
    (and the model's positions), each mask scored on the model's own most probable token there (the candidate
    fill_mask prints first); a UsageError for a text without a mask."""
    from minitf.module import no_grad
    tokenizer, model = loaded.tokenizer, loaded.model
    ids = list(tokenizer.encode(text)[0])[:min(max_tokens, model.position_limit)]
    masks = [i for i, token in enumerate(ids) if token == tokenizer.mask_id]
    if not masks:
        raise UsageError(f"--text {text!r} has no {tokenizer.mask_token} in its first {len(ids)} tokens; a masked LM "
                         f"is traced on its masks: put {tokenizer.mask_token} where a word is to be filled")
    with no_grad():
        logits = backend.to_numpy(model(np.asarray([ids])))[0]
    targets = [int(logits[i].argmax()) if i in masks else -1 for i in range(len(ids))]
    return ids, targets


def trace_loaded(loaded, text):
    """``python -m minitf.trace --checkpoint PATH``'s example of a BERT-family model: a masked LM on ``text``'s
    masks (:func:`masked_example`), a classifier on ``text``'s most probable label."""
    model, tokenizer = loaded.model, loaded.tokenizer
    if isinstance(model, BertForSequenceClassification):
        from minitf.bert.trainer import SequenceCrossEntropy
        from minitf.module import no_grad
        ids = list(tokenizer.encode(text)[0])[:min(MAX_TOKENS, model.position_limit)]
        with no_grad():
            label = int(backend.to_numpy(model(np.asarray([ids])))[0].argmax())
        name = model.config.labels[label]
        return Example(lambda: run_masked(model, [ids], [label], loss_fn=SequenceCrossEntropy()),
                       lambda loss: loaded_header(loaded, [f"ids {[ids]}, scored on its most probable label {label} "
                                                           f"({name!r}); loss {loss:.6f}"]), None)
    if not isinstance(model, BertForMaskedLM):
        raise UsageError(f"{loaded.source} holds a BERT encoder without a head (BertModel): it has no loss to trace; "
                         "give a masked-LM or classifier folder")
    ids, targets = masked_example(loaded, text)
    return Example(lambda: run_masked(model, [ids], [targets]),
                   lambda loss: loaded_header(loaded, [f"ids {[ids]}, targets {[targets]} (each mask scored on the "
                                                       f"model's own most probable token; -1: no loss); loss "
                                                       f"{loss:.6f}"]), None)


def page_parts(model):
    """The inspection page's :class:`minitf.study.inspection.numbers.Parts` of a masked LM: its walk, each layer's
    self-attention (both directions), the word embedding (whose backward's dy is each input token's gradient)."""
    if not isinstance(model, BertForMaskedLM):
        raise UsageError("the inspection page draws a BERT-family masked LM (a text with [MASK]); this model is a "
                         f"{type(model).__name__}: use python -m minitf.classify or python -m minitf.trace")
    return Parts(bert_walk, {"self-attention (both directions)": [layer.self_attn for layer in
                                                                   model.bert.encoder.layers]},
                 "bert.embeddings.word_embeddings")


def describe(model):
    """(what the page calls the model, its layout, its shape in one line)."""
    c = model.config
    head = {BertForMaskedLM: "masked LM", BertForSequenceClassification: f"classifier of {c.num_labels} labels"}.get(
        type(model), "encoder")
    name = {"bert": "BERT", "distilbert": "DistilBERT", "roberta": "RoBERTa"}[c.flavour]
    return (name, "post-LN",
            f"{name} {head}, post-LN, {c.num_layers} layers, d_model {c.d_model}, {c.num_heads} heads, d_ff {c.d_ff}, "
            f"{c.activation}, {c.positions} positions" + (f", {c.type_vocab_size} token types" if c.type_vocab_size
                                                          else ""))
