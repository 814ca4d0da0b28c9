"""What the study tools read of a Llama-family model, from the shared machinery of :mod:`minitf.study` (which
imports no kind: the kind names these, :class:`minitf.llama.kind.LlamaKind`):

- :func:`llama_walk`: the backward walk from dL/dlogits down to the tied embedding, step by step, each step with
  the line of minitf that computes it: the final RMSNorm, then per block the SwiGLU feed-forward (down, the product
  rule, SiLU', the two paths into x), RMSNorm', the residual sum, grouped-query attention (the softmax's backward
  per query head, dK and dV summed over the query heads that share a key/value head, the transposed rotation of dk
  and dq), RMSNorm' and the residual sum again; no position table (rotary turned q and k inside each attention);
- :func:`trace_example`: ``python -m minitf.trace --model llama``'s example (a one-block Llama of the tiny
  preset's shape scaled down to D = 8, 4 query heads over 2 key/value heads, round-number weights, float64, the
  GPT example's ids) and its printed walk;
- :func:`page_parts`: the inspection page's parts (the walk, each block's attention, its heads labelled with the
  key/value head they read).
"""
from minitf import backend
from minitf.attention import GroupedQueryAttention
from minitf.layers import RMSNorm, SiLU, SwiGLU
from minitf.llama.config import LlamaConfig
from minitf.llama.model import Llama, LlamaBlock
from minitf.moe import Experts, SparseMoE
from minitf.rotary import RotaryEmbedding
from minitf.study.inspection.numbers import Parts
from minitf.study.tracer import GPT_IDS, GPT_NEXT, Example, round_numbers, run_next_token
from minitf.study.walk import EMBEDDING, LOSS, PROJECTION_DH, PROJECTION_DW, Walk, activation_line, print_steps

#: The traced example's shape: the tiny preset's (4 query heads per 2 key/value heads here as 6 per 2 there,
#: SwiGLU, RMSNorm, rotary, tied) scaled down to numbers a learner can follow: D = 8, head_dim 2, F = 8, V = 5.
TRACE_CONFIG = dict(vocab_size=5, d_model=8, num_layers=1, num_heads=4, num_kv_heads=2, d_ff=8,
                    max_position_embeddings=4, tie_word_embeddings=True, rms_norm_eps=1e-5)

# the lines that compute the steps: (function, a snippet of the one line)
RMS = (RMSNorm.backward_rows, "return rstd * (dxhat - xhat")
FINAL_NORM = (Llama.backward, "dx = self.norm.backward(")
MLP_SUM = (LlamaBlock.backward, "dh = dy + self.post_attention_layernorm")
ATTENTION_SUM = (LlamaBlock.backward, "return dh + self.input_layernorm")
DOWN = (SwiGLU.backward, "dh = self.down_proj.backward(dy)")
PRODUCT = (SwiGLU.backward, "da, du = backend.by_rows(")
TWO_PATHS = (SwiGLU.backward, "return self.up_proj.backward(du) + self.gate_proj.backward(")
OUT = (GroupedQueryAttention.backward, "do = self.o_proj.backward(dy)")
SOFTMAX = (GroupedQueryAttention.backward, "dQ, dK_rep, dU_rep = scaled_dot_product_attention_backward(")
SHARED_K = (GroupedQueryAttention.backward, "dK = dK_rep.reshape(")
SHARED_V = (GroupedQueryAttention.backward, "dU = dU_rep.reshape(")
TURN_BACK = (RotaryEmbedding.backward, "return dy * cos - rotate_half(dy) * sin")
THREE_PATHS = (GroupedQueryAttention.backward, "return self.q_proj.backward(dq) + self.k_proj.backward(dk)")
WEIGHTED = (SparseMoE.backward, "dxs = self.experts.backward(")
EXPERTS_DX = (Experts.backward, "dxs[a:b] = dg[a:b] @ self.gate_proj.data[e].T")
ROUTER_DLOGITS = (SparseMoE.backward, "dlogits = softmax_backward(s.probs, dprobs)")
ROUTER_DX = (SparseMoE.backward, "dx += self.gate.backward(dlogits)")


def feed_forward_steps(w, mlp, layer):
    """The walk's steps through block ``layer``'s feed-forward ``mlp`` (its name): the SwiGLU's, or a sparse
    one's (docs/moe.md): the weighted gradient into each chosen expert, the experts' backward on their own tokens,
    the router's logit gradient through the chosen weights into the softmax over all experts, the sum into x."""
    if not isinstance(layer.mlp, SparseMoE):
        w.section(f"block {mlp.split('.')[1]}, top half first: the SwiGLU feed-forward, "
                  "y = down(silu(gate(x)) * up(x))")
        w.step(f"{mlp}.down_proj: dh = dy W_down^T, for h = a * u", f"{mlp}.down_proj", "dx", "branch", DOWN)
        w.step(f"{mlp}: da = dh * u (the product rule's first term)", f"{mlp}.act", "dy", "branch", PRODUCT)
        w.step(f"{mlp}: du = dh * a (its second term)", f"{mlp}.up_proj", "dy", "branch", PRODUCT)
        w.step(f"{mlp}.act: dg = SiLU'(g) da, g = x W_gate", f"{mlp}.act", "dx", "branch", activation_line(SiLU()))
        w.step(f"{mlp}: dx = du W_up^T + dg W_gate^T (both read x)", mlp, "dx", "branch", TWO_PATHS)
        return
    E, k = layer.mlp.num_experts, layer.mlp.top_k
    w.section(f"block {mlp.split('.')[1]}, top half first: the sparse feed-forward, {E} SwiGLU experts, each token "
              f"through its top {k}, y = sum_j w_j expert_j(x)")
    w.step(f"{mlp}: each (token, slot)'s dy times its weight w, rows grouped by expert", f"{mlp}.experts", "dys",
           "branch", WEIGHTED)
    w.step(f"{mlp}.experts: each expert's backward on its own tokens' rows only", f"{mlp}.experts", "dxs", "branch",
           EXPERTS_DX)
    w.step(f"{mlp}.gate: dlogits = softmax'(p) of dw = dy . expert(x) at the chosen experts (0 elsewhere)",
           f"{mlp}.gate", "dy", "branch", ROUTER_DLOGITS)
    w.step(f"{mlp}: dx = the experts' paths summed over the slots + dlogits W_router^T", mlp, "dx", "branch",
           ROUTER_DX)


def llama_walk(tracer, model):
    """The :class:`minitf.study.walk.Walk` of a :class:`minitf.llama.Llama`'s backward, for every block from the
    top down (tied or untied output), from the records of ``tracer``."""
    w, config = Walk(tracer), model.config
    tied = config.tie_word_embeddings
    use = (lambda k: f"tied use {k} of 2") if tied else (lambda k: "its own matrix")
    H, Hkv = config.num_heads, config.num_kv_heads
    G = H // Hkv
    w.section("the next-token loss and the output projection (logits = h W^T, W the tied (V, D) matrix)" if tied
              else "the next-token loss and the output projection (logits = h W^T)")
    w.step("loss: dlogits = (softmax - onehot(next)) / N, 0 on the last position", "loss", "dlogits", "loss", LOSS)
    w.step("lm_head: dh = dlogits W", "lm_head", "dh", "stream", PROJECTION_DH)
    w.step(f"lm_head: W.grad += dlogits^T h ({use(1)})", "lm_head", "weight", "weight", PROJECTION_DW)
    w.point("norm out", "norm", "dy")
    w.section("the final RMSNorm")
    w.step("norm: dy of the last block = RMSNorm'(dh) (LayerNorm's backward less its mean term)", "norm", "dx",
           "stream", FINAL_NORM)
    for l in reversed(range(config.num_layers)):
        block, mlp, attn = f"layers.{l}", f"layers.{l}.mlp", f"layers.{l}.self_attn"
        feed_forward_steps(w, mlp, model.layers[l])
        w.step(f"{block}.post_attention_layernorm: RMSNorm'(dx)", f"{block}.post_attention_layernorm", "dx",
               "branch", RMS)
        w.step(f"{block}: dh = dy + RMSNorm'(...) (the residual passes dy on)", attn, "dy", "stream", MLP_SUM)
        w.section(f"block {l}: grouped-query attention, {H} query heads over {Hkv} key/value heads "
                  f"(G = {G} share each), rotary positions on q and k")
        w.step(f"{attn}.o_proj: do = dh W_O^T", f"{attn}.o_proj", "dx", "branch", OUT)
        w.step(f"{attn}: dQ = softmax attention's backward, each query head on its own", f"{attn}/attention", "dQ",
               "branch", SOFTMAX)
        # k is turned after q in the forward, so the rotary's backward turns dk first (its call 0), then dq
        # dK as its line makes it, (B, Hkv, T, dk): the rotary's first backward took it as (B, T, Hkv, dk)
        dK = w.array(f"{attn}.rotary", "dy").transpose(0, 2, 1, 3)
        w.add(f"{attn}: dK = dK_rep summed over the {G} query heads that read each key/value head", dK, "branch",
              SHARED_K)
        w.step(f"{attn}.rotary: dk = dK turned back by -angle (the transposed rotation)", f"{attn}.rotary", "dx",
               "branch", TURN_BACK)
        w.step(f"{attn}.rotary: dq = dQ turned back by -angle", f"{attn}.rotary", "dx", "branch", TURN_BACK, call=1)
        # dU as its line makes it, (B, Hkv, T, dk): v_proj's backward took it as dv, (B, T, Hkv*dk)
        dv = w.array(f"{attn}.v_proj", "dy")
        dU = dv.reshape(dv.shape[0], dv.shape[1], Hkv, -1).transpose(0, 2, 1, 3)
        w.add(f"{attn}: dU = dU_rep summed over the {G} query heads that read each value head (v_proj's dv)", dU,
              "branch", SHARED_V)
        w.step(f"{attn}: dx = dq W_q^T + dk W_k^T + dv W_v^T (all three read x)", attn, "dx", "branch", THREE_PATHS)
        w.step(f"{block}.input_layernorm: RMSNorm'(dx)", f"{block}.input_layernorm", "dx", "branch", RMS)
        w.step(f"{block}: dx = dh + RMSNorm'(...) (the residual passes dh on)", block, "dx", "stream", ATTENTION_SUM)
        w.point(f"layers.{l} in", block, "dx")
    w.section("the embedding" + (" and the tied matrix" if tied else "") + " (no position table: rotary turned q "
              "and k inside each attention)")
    w.step(f"embed_tokens: W.grad[ids] += dy, summed where an id repeats ({use(2)})", "embed_tokens", "weight",
           "weight", EMBEDDING)
    if tied:
        w.add("embed_tokens.weight.grad = use 1 + use 2 (the two += above, into one Parameter)",
              backend.to_numpy(model.embed_tokens.weight.grad), "weight")
    return w


def build_trace_model(**changes):
    """The traced Llama (TRACE_CONFIG with ``changes``), float64 under ``default_dtype``: every weight matrix
    round numbers (minitf.study.tracer's), RMSNorm gains 1."""
    backend.manual_seed(0)
    model = Llama(LlamaConfig(**(TRACE_CONFIG | changes)))
    for offset, (_, p) in enumerate(model.named_parameters()):
        data = backend.to_numpy(p.data)
        if data.ndim >= 2:
            p.data[...] = backend.asarray(round_numbers(data.size, offset).reshape(data.shape))
    return model


def header(loss):
    c = TRACE_CONFIG
    return [f"trace: Llama, B=1, L=4, D={c['d_model']}, {c['num_heads']} query heads over {c['num_kv_heads']} "
            f"key/value heads (dk=2), SwiGLU F={c['d_ff']}, V={c['vocab_size']}, one block, RMSNorm, rotary "
            "positions, tied, float64",
            f"ids {GPT_IDS}, next-token targets {GPT_NEXT} (-1: none, ignored); loss {loss:.6f}"]


def print_walk(tracer, model, loss):
    print("walk: the Llama example of python -m minitf.trace --model llama (pre-norm RMSNorm, SwiGLU,")
    print("grouped-query attention of 4 query heads over 2 key/value heads, rotary positions, one block,")
    print(f"B=1, L=4, D=8, V=5; ids {GPT_IDS}, targets {GPT_NEXT}; loss {loss:.6f}), from dL/dlogits down")
    print("to the tied embedding. each step: what it computes, shape, norm, one row ([0, 0] of an")
    print("activation gradient; [0, 1] of a per-head one: dQ, dK and dU as attention lays them out,")
    print("(B, H, T, dk) and (B, Hkv, T, dk), so head 1 at every position; dk and dq as the rotary turns them,")
    print("(B, T, heads, dk), so position 1, every head; row 3 of a (V, D) weight gradient), and the line of")
    print("minitf that computes it. Position 0 attends to itself alone: its dQ and dq are 0.")
    V, D = model.embed_tokens.weight.shape
    print_steps(llama_walk(tracer, model).steps,
                lambda a: a[3] if a.shape == (V, D) else a[0] if a.ndim == 2 else a[0, 1].reshape(-1) if a.ndim == 4
                else a[0, 0])


def trace_example():
    """``python -m minitf.trace --model llama``'s :class:`minitf.study.tracer.Example`."""
    return Example(lambda: run_next_token(build_trace_model()), header, print_walk)


def page_parts(model):
    """The inspection page's :class:`minitf.study.inspection.numbers.Parts` of a Llama: its walk, each block's
    grouped-query attention, its query heads labelled with the key/value head each reads, and each sparse
    feed-forward with its block's number (the experts each token chose; none in a dense model)."""
    H, G = model.config.num_heads, model.config.num_heads // model.config.num_kv_heads
    name = "causal self-attention"
    return Parts(llama_walk, {name: [layer.self_attn for layer in model.layers]}, "embed_tokens",
                 head_labels={name: [f"head {h} (key/value head {h // G})" for h in range(H)]} if G > 1 else {},
                 experts=[(l, layer.mlp) for l, layer in enumerate(model.layers) if isinstance(layer.mlp, SparseMoE)])


def describe(model):
    """(what the page calls the model, its layout, its shape in one line)."""
    c = model.config
    sparse = sum(map(c.is_sparse, range(c.num_layers)))
    feed_forward = f"SwiGLU d_ff {c.d_ff}" if not sparse else (
        f"{sparse} sparse feed-forwards of {c.num_experts} SwiGLU experts (d_ff {c.expert_d_ff}, top "
        f"{c.num_experts_per_tok}{', a shared expert' if c.shared_expert_d_ff else ''})"
        + (f" and {c.num_layers - sparse} dense (d_ff {c.d_ff})" if sparse < c.num_layers else ""))
    return ("Llama", "pre-norm RMSNorm",
            f"Llama, {c.num_layers} blocks, d_model {c.d_model}, {c.num_heads} query heads over {c.num_kv_heads} "
            f"key/value heads, {feed_forward}, rotary positions (theta {c.rope_theta:g}), "
            f"{'tied' if c.tie_word_embeddings else 'untied'} output")
