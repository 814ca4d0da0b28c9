"""What the inspection page reads of a T5 model, from the shared machinery of :mod:`minitf.study` (which imports no
kind: the kind names these, :class:`minitf.t5.kind.T5Kind`):

- :func:`t5_walk`: the backward walk from dL/dlogits down to the shared embedding, step by step, each with the line
  of minitf that computes it: the output projection (and v1.0's d_model^-1/2), the decoder's final RMSNorm, per
  block the feed-forward, the cross-attention (its dmemory), the self-attention with the stack's position bias,
  each sublayer's RMSNorm' and the residual sums; the memory's gradient summed over the decoder blocks; each stack's
  bias table, whose gradient is every block's, summed; the shared embedding's two uses (the decoder's, the
  encoder's);
- :func:`bias_by_distance`: a stack's relative position bias read through its bucket function for each distance
  (key position - query position) -D..D (the encoder: both directions) or -D..0 (the decoder: the past), D the
  table's max_distance, one line per head;
- :func:`page_parts`: the inspection page's parts (the walk, each attention of every block by the translation page's
  names, the shared embedding, the position biases).
"""
from minitf.attention import RelativePositionBias, T5Attention, relative_position_bucket
from minitf.backend import host as np
from minitf.backend import to_numpy
from minitf.layers import RMSNorm
from minitf.study.inspection.numbers import Parts
from minitf.study.walk import EMBEDDING, LOSS, PROJECTION_DH, PROJECTION_DW, Walk
from minitf.t5.model import T5, T5Block, T5Stack

# the lines that compute the steps: (function, a snippet of the one line)
RMS = (RMSNorm.backward_rows, "return rstd * (dxhat - xhat")
OUTPUT_SCALE = (T5.backward, "dh = dh * self.output_scale")
FINAL_NORM = (T5Stack.backward, "dh = self.final_layer_norm.backward(")
FEED_FORWARD = (T5Block.backward, "dh = dy + self.ff_norm.backward(")
CROSS = (T5Block.backward, "dq, dmemory, _ = self.cross_attn.backward(")
CROSS_SUM = (T5Block.backward, "dh = dh + self.cross_attn_norm.backward(dq)")
SELF = (T5Block.backward, "dn, _, dbias = self.self_attn.backward(")
SELF_SUM = (T5Block.backward, "return dh + self.self_attn_norm.backward(dn)")
ATTENTION_DX = (T5Attention.backward, "return dx + dk + dv, None, dA.sum(axis=0)")
MEMORY_SUM = (T5Stack.backward, "dmemory = dmemory_block if dmemory is None")
BIAS_DW = (RelativePositionBias.backward, "backend.add_at_rows(self.weight.grad")
ENCODER = (T5.backward, "dx, _ = self.encoder.backward(dmemory)")

#: The page's names of a T5's attentions: the translation page's (its axes and masks: minitf.study.inspection.page).
ATTENTIONS = {"encoder self-attention": ("encoder", "self_attn"),
              "decoder masked self-attention": ("decoder", "self_attn"),
              "cross-attention": ("decoder", "cross_attn")}


def _block(w, stack, l, decoder):
    """The walk's steps through block ``l`` of ``stack`` (its name), from its output down to its input."""
    b = f"{stack}.block.{l}"
    w.section(f"{stack} block {l}, top sublayer first: the feed-forward, y = h + FF(RMSNorm(h))")
    w.step(f"{b}.ff: dn = FF'(dy)", f"{b}.ff", "dx", "branch", FEED_FORWARD)
    w.step(f"{b}.ff_norm: RMSNorm'(dn)", f"{b}.ff_norm", "dx", "branch", RMS)
    below = f"{b}.cross_attn_dropout" if decoder else f"{b}.self_attn_dropout"
    w.step(f"{b}: dh = dy + RMSNorm'(dn) (the residual and the feed-forward's path)", below, "dy", "stream",
           FEED_FORWARD)
    if decoder:
        w.section(f"{stack} block {l}: cross-attention, queries from the decoder, keys and values from the memory")
        w.step(f"{b}.cross_attn: dq = Attention'(dh)", f"{b}.cross_attn", "dx", "branch", CROSS)
        w.step(f"{b}.cross_attn: dmemory = dk + dv (its keys and values read the memory)", f"{b}.cross_attn",
               "dmemory", "branch", CROSS)
        w.step(f"{b}.cross_attn_norm: RMSNorm'(dq)", f"{b}.cross_attn_norm", "dx", "branch", RMS)
        w.step(f"{b}: dh0 = dh + RMSNorm'(dq)", f"{b}.self_attn_dropout", "dy", "stream", CROSS_SUM)
    kind = "masked self-attention (the past)" if decoder else "self-attention (both directions)"
    w.section(f"{stack} block {l}: {kind}, scores Q K^T + the stack's position bias (no 1/sqrt(d_k))")
    w.step(f"{b}.self_attn: dn = dq + dk + dv (all three read RMSNorm(x)); dbias = the scores' gradient",
           f"{b}.self_attn", "dx", "branch", ATTENTION_DX)
    w.step(f"{b}.self_attn_norm: RMSNorm'(dn)", f"{b}.self_attn_norm", "dx", "branch", RMS)
    w.step(f"{b}: dx = dh + RMSNorm'(dn)", b, "dx", "stream", SELF_SUM)
    w.point(f"{stack}.block.{l} in", b, "dx")


def _bias(w, stack, blocks):
    w.section(f"{stack}: the position bias table, added by every block ({blocks} here)")
    w.step(f"{stack}.relative_attention_bias: W.grad[bucket, h] += the sum of dbias over the blocks and over every "
           "query-key pair in the bucket", f"{stack}.relative_attention_bias", "weight", "weight", BIAS_DW)


def t5_walk(tracer, model):
    """The :class:`minitf.study.walk.Walk` of a :class:`minitf.t5.T5`'s backward, every block from the top down."""
    w, c = Walk(tracer), model.config
    tied = c.tie_word_embeddings
    w.section("the loss and the output projection (logits = h W^T" + (", W the shared (V, D) embedding)" if tied
                                                                         else ", W lm_head's own)"))
    w.step("loss: dlogits = (p - q) / N", "loss", "dlogits", "loss", LOSS)
    w.step("lm_head: dh = dlogits W", "lm_head", "dh", "stream", PROJECTION_DH)
    w.step(f"lm_head: W.grad += dlogits^T h{' (the shared matrix: use 1 of 3)' if tied else ''}", "lm_head", "weight",
           "weight", PROJECTION_DW)
    if model.output_scale != 1.0:
        w.step("decoder: dy = dh d_model^-1/2 (v1.0: the tied matrix reads h d_model^-1/2)", "decoder", "dy", "stream",
               OUTPUT_SCALE)
    w.point("decoder out", "decoder", "dy")
    w.section("the decoder's final RMSNorm")
    w.step("decoder.final_layer_norm: dy of the last block = RMSNorm'(dh)", "decoder.final_layer_norm", "dx",
           "stream", FINAL_NORM)
    for l in reversed(range(c.num_decoder_layers)):
        _block(w, "decoder", l, decoder=True)
    w.section(f"the decoder stack: the memory's gradient, summed over its blocks ({c.num_decoder_layers})")
    w.step("decoder: dmemory = the sum over blocks", "decoder", "dmemory", "stream", MEMORY_SUM)
    _bias(w, "decoder", c.num_decoder_layers)
    w.section("the decoder's input embedding (dropout passes dy through)")
    w.step(f"shared: W.grad[ids] += dy (the decoder's lookups{', use 2 of 3' if tied else ''})", "shared", "weight",
           "weight", EMBEDDING)
    w.point("encoder out", "encoder", "dy")
    w.section("the encoder, from the memory down: its final RMSNorm")
    w.step("encoder: dy = dmemory", "encoder", "dy", "stream", ENCODER)
    w.step("encoder.final_layer_norm: dy of the last block = RMSNorm'(dmemory)", "encoder.final_layer_norm", "dx",
           "stream", FINAL_NORM)
    for l in reversed(range(c.num_layers)):
        _block(w, "encoder", l, decoder=False)
    _bias(w, "encoder", c.num_layers)
    w.section("the encoder's input embedding")
    # the shared embedding runs backward twice, the decoder's lookups first (T5.backward): the encoder's is call 1
    w.step(f"shared: W.grad[ids] += dy (the encoder's lookups{', use 3 of 3' if tied else ''})", "shared", "weight",
           "weight", EMBEDDING, call=1)
    return w


def _walked(name):
    """Whether the walk reads the records of the module named ``name``: the stacks, their norms and bias tables,
    each block and its sublayers (not the projections inside them)."""
    parts = name.split(".")
    return len(parts) <= 2 or parts[1] == "block" and len(parts) <= 4


def bias_by_distance(bias):
    """(distances (n,), values (H, n)) host arrays of a :class:`minitf.attention.RelativePositionBias`: the bias
    each head adds to a query-key score at each distance (key position - query position), read through the bucket
    function: -D..D for a bidirectional table (the encoder's), -D..0 for the decoder's (it attends to the past),
    D its ``max_distance`` (every longer distance shares the last bucket)."""
    D = bias.max_distance
    distances = np.arange(-D, D + 1 if bias.bidirectional else 1)
    buckets = relative_position_bucket(distances, bias.bidirectional, bias.num_buckets, D)  # (n,)
    return distances, to_numpy(bias.weight.data)[buckets].T                # W[bucket(d), h]  (H, n)


def page_parts(model):
    """The inspection page's :class:`minitf.study.inspection.numbers.Parts` of a T5: its walk, each block's
    attentions by the translation page's names, the shared embedding (the encoder's lookups are its second backward
    call), and each stack's position bias by distance (:func:`bias_by_distance`)."""
    attention = {title: [getattr(block, sublayer) for block in getattr(model, stack).block]
                 for title, (stack, sublayer) in ATTENTIONS.items()}
    position_bias = {"encoder (both directions)": bias_by_distance(model.encoder.relative_attention_bias),
                     "decoder (the past)": bias_by_distance(model.decoder.relative_attention_bias)}
    return Parts(t5_walk, attention, "shared", 1, 1.0, _walked, position_bias=position_bias)
