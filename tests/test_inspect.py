"""The inspection page (``python -m minitf.inspect``, minitf/study/inspection/, docs/inspect.md), without a browser:

1. the numbers in the page equal the model's own: the attention weights of every layer and head (against the
   weights the model's attention keeps, and, for the first encoder layer, softmax(Q K^T / sqrt(dk)) worked out
   here from the layer's weights), each token's probability and top five (against a softmax of the logits),
   the loss, and the gradient norms down the residual stream and at each source embedding (against the model's
   backward driven by hand, layer by layer, and against central differences), post-LN and pre-LN,
   encoder-decoder and GPT; a mixture of experts' chosen experts, weights and router probabilities against
   softmax(x W_router) worked out from each sparse block's input;
2. the walk on the page is the walk of ``python -m minitf.trace --walk`` (the same labels and norms for the
   trace's one-layer examples), with every layer of a deeper model in order;
3. the page is self-contained: a Content-Security-Policy of ``default-src 'none'`` with the hashes of its one
   script and style, and nothing fetched;
4. the command on a translation run, a GPT run, a mixture of experts' run (its experts and its load over
   training) and folder, and a checkpoint folder; each bad input is one line, a non-zero exit and no file
   (nothing half-written); unknown characters are said on stderr and in the page;
5. ``--serve``: localhost only, a bad request answered with an error in the page (400) and the server goes on.

The browser tests (the page as a person uses it) are in tests/test_inspect_browser.py.
"""
import base64
import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

import minitf
from minitf.training.kind import TRANSLATION_PAGE
from minitf import backend, kinds
from minitf.study import tracer, walk
from minitf.inspect import main as inspect_main, read_curves
from minitf.study.inspection import numbers, page, serve
from tests.runs import CPU_ENV, ROOT, copy_run, read_line, train
from tests.test_lm_train import TINY_GPT, make_text

SRC = np.array([5, 7, 9, 6, 3])           # (S,): the last token stands for EOS
TGT_IN = np.array([2, 8, 6, 10])          # (T,): BOS first
TGT_OUT = np.array([8, 6, 10, 3])
GPT_IDS = np.array([4, 9, 2, 9, 7, 5])


def transformer(pre_norm):
    minitf.manual_seed(1)
    return minitf.Transformer(12, 12, d_model=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=3, d_ff=24,
                              dropout=0.1, pre_norm=pre_norm).eval()


def gpt(preset):
    minitf.manual_seed(2)
    return minitf.GPT.preset(preset, 12, max_len=8, d_model=16, num_heads=4, num_layers=2, d_ff=24).eval()


def page_of(model, inspection, input_ids, source_ids=None):
    """The page of one example and the JSON read back from its HTML."""
    example = page.example_data(inspection, "a text", input_ids, lambda i: f"t{i}", source_ids=source_ids)
    html = page.render({"title": "test", "model": {"kind": "gpt" if source_ids is None else "translation",
                                                   "layout": "pre-LN", "facts": []},
                        "examples": [example], "warnings": [], "error": None, "serve": None, "curves": None})
    return html, page.read_data(html)["examples"][0]


def kept_weights(model, run, parts=None):
    """{(attention name, layer): P (H, Tq, Tk)} kept by the model's own attention in a forward of ``run()``
    (``parts``: its kind's page parts; default a GPT's or a Transformer's)."""
    found = {}
    with minitf.no_grad():
        parts = parts or (numbers.language_model_parts(model) if isinstance(model, minitf.GPT)
                          else numbers.translation_parts(model))
        modules = parts.attention
        with numbers.keeping_weights([m for layers in modules.values() for m in layers]):
            run()
            for name, layers in modules.items():
                for l, module in enumerate(layers):
                    found[name, l] = backend.to_numpy(module.weights)[0]
    return found


def first_encoder_attention(model, src):
    """softmax(Q K^T / sqrt(dk)) of encoder layer 0, (H, S, S), from its weights by hand (no mask: no padding)."""
    with minitf.no_grad():
        x = model.positional(model.src_embed(backend.asarray(src[None])))
        if model.config.pre_norm:
            x = model.encoder.layers[0].attn_block.norm(x)
    x = backend.to_numpy(x)[0]
    attention = model.encoder.layers[0].self_attn
    D, H = attention.d_model, attention.num_heads
    W, b = backend.to_numpy(attention.w_qkv.data), backend.to_numpy(attention.b_qkv.data)
    q, k = x @ W[:, :D] + b[:D], x @ W[:, D:2 * D] + b[D:2 * D]
    Q, K = (a.reshape(len(src), H, D // H).transpose(1, 0, 2) for a in (q, k))      # (H, S, dk)
    scores = Q @ K.transpose(0, 2, 1) / np.sqrt(D // H)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def by_hand_translation(model, src, tgt_in, tgt_out):
    """The loss, the softmax of the logits (T, V), and the gradient norms of the residual stream (the page's
    points) and of each source embedding, from the model's backward driven layer by layer here."""
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=model.pad_id)
    model.zero_grad()
    logits = model(src[None], tgt_in[None])
    loss = loss_fn(logits, tgt_out[None])
    norm = lambda a: float(np.linalg.norm(backend.to_numpy(a)))  # noqa: E731
    points = []
    dh = model.generator.backward(loss_fn.backward())
    points.append(("decoder out", norm(dh)))
    dx = model.decoder.final_norm.backward(dh) if model.decoder.final_norm is not None else dh
    dmemory = 0
    for l in reversed(range(len(model.decoder.layers))):
        dx, dm = model.decoder.layers[l].backward(dx)
        dmemory = dmemory + dm
        points.append((f"decoder.layers.{l} in", norm(dx)))
    model.tgt_embed.backward(model.positional.backward(model.tgt_dropout.backward(dx)))
    points.append(("encoder out", norm(dmemory)))
    dx = model.encoder.final_norm.backward(dmemory) if model.encoder.final_norm is not None else dmemory
    for l in reversed(range(len(model.encoder.layers))):
        dx = model.encoder.layers[l].backward(dx)
        points.append((f"encoder.layers.{l} in", norm(dx)))
    dsrc = backend.to_numpy(model.positional.backward(model.src_dropout.backward(dx)))[0]
    model.src_embed.backward(backend.asarray(dsrc[None]))
    z = backend.to_numpy(logits)[0]
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    return loss, p / p.sum(axis=-1, keepdims=True), points, np.linalg.norm(dsrc, axis=-1) * model.src_embed.scale


def numeric_source_gradient(model, src, tgt_in, tgt_out, position, h=1e-6):
    """dL/d(x[position]) by float64 central differences, x the encoder's input (the scaled embedding plus the
    position's sinusoid): what reaches the embedding row read at ``position``, before the scale."""
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=model.pad_id)
    with minitf.no_grad():
        x = backend.to_numpy(model.positional(model.src_embed(backend.asarray(src[None]))))
        mask = backend.asarray(src[None] == model.pad_id)
        grad = np.zeros(x.shape[-1])
        for d in range(x.shape[-1]):
            losses = []
            for sign in (1, -1):
                moved = x.copy()
                moved[0, position, d] += sign * h
                memory = model.encoder(backend.asarray(moved), mask)
                losses.append(loss_fn(model.decode(backend.asarray(tgt_in[None]), memory, mask), tgt_out[None]))
            grad[d] = (losses[0] - losses[1]) / (2 * h)
    return grad


# --------------------------------------------------------------------------- the numbers are the model's
@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-LN", "pre-LN"])
def test_the_translation_page_holds_the_models_own_numbers(pre_norm, float64):
    model = transformer(pre_norm)
    inspection = numbers.translation(model, SRC, TGT_IN, TGT_OUT)
    html, data = page_of(model, inspection, TGT_IN, SRC)
    # attention: every layer and head equals the weights the model's attention keeps (float32 in the page)
    kept = kept_weights(model, lambda: model(SRC[None], TGT_IN[None]))
    shown = {a["name"]: page.decode_array(a) for a in data["attention"]}
    assert sorted(shown) == ["cross-attention", "decoder masked self-attention", "encoder self-attention"]
    assert shown["encoder self-attention"].shape == (2, 2, 5, 5) and shown["cross-attention"].shape == (3, 2, 4, 5)
    for (name, l), weights in kept.items():
        np.testing.assert_array_equal(shown[name][l], weights.astype(np.float32), err_msg=f"{name} layer {l}")
    np.testing.assert_allclose(shown["encoder self-attention"][0], first_encoder_attention(model, SRC), rtol=1e-6,
                               atol=1e-7)
    assert np.all(np.triu(shown["decoder masked self-attention"], k=1) == 0)
    # predictions and the loss
    loss, probs, points, embedding = by_hand_translation(model, SRC, TGT_IN, TGT_OUT)
    assert data["loss"] == pytest.approx(loss, rel=1e-12) and data["num_tokens"] == 4
    np.testing.assert_allclose(data["probability"], probs[np.arange(4), TGT_OUT], rtol=1e-12)
    for t, top in enumerate(data["top"]):
        order = np.argsort(-probs[t], kind="stable")[:5]
        assert [piece for piece, _ in top] == [f"t{i}" for i in order]
        np.testing.assert_allclose([p for _, p in top], probs[t, order], rtol=1e-12)
    # the backward: the residual stream, layer by layer, and each source embedding's gradient
    assert [name for name, _ in data["points"]] == [name for name, _ in points]
    np.testing.assert_allclose([v for _, v in data["points"]], [v for _, v in points], rtol=1e-10)
    np.testing.assert_allclose(data["embedding_grad"]["norms"], embedding, rtol=1e-10)
    numeric = numeric_source_gradient(model, SRC, TGT_IN, TGT_OUT, position=2)
    assert data["embedding_grad"]["norms"][2] == pytest.approx(model.src_embed.scale * np.linalg.norm(numeric),
                                                               rel=1e-6)


def by_hand_gpt(model, ids):
    """(loss, softmax of the logits (L, V), the residual stream's gradient norms, each token's embedding
    gradient norm) from the GPT's backward driven layer by layer."""
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    model.zero_grad()
    logits = model(ids[None])
    loss = loss_fn(logits, np.concatenate([ids[1:], [-1]])[None])
    norm = lambda a: float(np.linalg.norm(backend.to_numpy(a)))  # noqa: E731
    dh = model.generator.backward(loss_fn.backward())
    points = [("decoder out", norm(dh))]
    dx = model.decoder.final_norm.backward(dh) if model.decoder.final_norm is not None else dh
    for l in reversed(range(len(model.decoder.layers))):
        dx, _ = model.decoder.layers[l].backward(dx)
        points.append((f"decoder.layers.{l} in", norm(dx)))
    dembedded = backend.to_numpy(model.positional.backward(model.dropout.backward(dx)))[0]
    model.embed.backward(backend.asarray(dembedded[None]))
    z = backend.to_numpy(logits)[0]
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    return loss, p / p.sum(axis=-1, keepdims=True), points, np.linalg.norm(dembedded, axis=-1) * model.embed.scale


@pytest.mark.parametrize("preset", ["gpt2", "gpt1"], ids=["pre-LN", "post-LN"])
def test_the_gpt_page_holds_the_models_own_numbers(preset, float64):
    model = gpt(preset)
    inspection = numbers.language_model(model, GPT_IDS)
    _, data = page_of(model, inspection, GPT_IDS)
    (attention,) = data["attention"]
    assert attention["name"] == "causal self-attention" and attention["causal"]
    kept = kept_weights(model, lambda: model(GPT_IDS[None]))
    for l in range(2):
        np.testing.assert_array_equal(page.decode_array(attention)[l], kept["causal self-attention", l].astype(np.float32))
    loss, probs, points, embedding = by_hand_gpt(model, GPT_IDS)
    assert data["loss"] == pytest.approx(loss, rel=1e-12) and data["num_tokens"] == len(GPT_IDS) - 1
    L = len(GPT_IDS)
    np.testing.assert_allclose(data["probability"][:-1], probs[np.arange(L - 1), GPT_IDS[1:]], rtol=1e-12)
    assert data["probability"][-1] is None and data["predicted"][-1] is None  # the last position predicts nothing
    assert [piece for piece, _ in data["top"][-1]] == [f"t{i}" for i in np.argsort(-probs[-1], kind="stable")[:5]]
    np.testing.assert_allclose([v for _, v in data["points"]], [v for _, v in points], rtol=1e-10)
    np.testing.assert_allclose(data["embedding_grad"]["norms"], embedding, rtol=1e-10)


def test_the_llama_page_holds_the_models_own_numbers_and_labels_the_shared_heads(float64):
    """A Llama (6 query heads over 2 key/value heads, 2 blocks) on the GPT-style page, its numbers asked of its kind
    (Kind.page_parts): every layer's attention is what its grouped-query attention keeps, each query head labelled
    with the key/value head it reads; the loss and probabilities are the model's own forward's; the embedding's
    gradient per position is what reaches its backward, and the page's walk is the kind's walk."""
    from minitf.llama import Llama, LlamaConfig
    minitf.manual_seed(3)
    model = Llama(LlamaConfig(vocab_size=12, d_model=24, num_layers=2, num_heads=6, num_kv_heads=2, d_ff=32,
                              max_position_embeddings=8)).eval()
    kind = kinds.get("llama")
    parts = kind.page_parts(model)
    inspection = numbers.language_model(model, GPT_IDS, parts=parts)
    _, data = page_of(model, inspection, GPT_IDS)
    (attention,) = data["attention"]
    assert attention["name"] == "causal self-attention" and attention["causal"] and attention["shape"] == [2, 6, 6, 6]
    assert attention["heads"] == [f"head {h} (key/value head {h // 3})" for h in range(6)]
    kept = kept_weights(model, lambda: model(GPT_IDS[None]), parts)
    for l in range(2):
        np.testing.assert_array_equal(page.decode_array(attention)[l], kept["causal self-attention", l].astype(np.float32))
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    targets = np.concatenate([GPT_IDS[1:], [-1]])
    captured = {}
    backward = model.embed_tokens.backward
    model.embed_tokens.backward = lambda dy: captured.setdefault("dy", backend.to_numpy(dy)) is None or backward(dy)
    try:
        model.zero_grad()
        logits = model(GPT_IDS[None])
        loss = loss_fn(logits, targets[None])
        model.backward(loss_fn.backward())
    finally:
        del model.embed_tokens.backward
    z = backend.to_numpy(logits)[0]
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    assert data["loss"] == pytest.approx(float(loss), rel=1e-12)
    L = len(GPT_IDS)
    np.testing.assert_allclose(data["probability"][:-1], p[np.arange(L - 1), GPT_IDS[1:]], rtol=1e-12)
    np.testing.assert_allclose(data["embedding_grad"]["norms"], np.linalg.norm(captured["dy"][0], axis=-1), rtol=1e-10)
    assert data["embedding_grad"]["norms"][-1] == 0
    labels = [s["label"] for s in data["walk"] if "label" in s]
    assert labels[-1].startswith("embed_tokens.weight.grad = use 1 + use 2")
    assert [name for name, _ in data["points"]] == ["norm out", "layers.1 in", "layers.0 in"]
    assert kind.describe_model(model)[0] == "Llama"
    assert data["experts"] is None and parts.experts == []  # a dense model: no expert section


@pytest.mark.parametrize("renormalise, shared", [(True, None), (False, 8)], ids=["mixtral", "qwen2-moe"])
def test_a_sparse_llama_page_holds_each_tokens_experts_as_its_router_chose_them(renormalise, shared, float64):
    """A Llama whose blocks 0 and 2 are sparse (4 experts, 2 per token; block 1 dense): the page's experts of each
    position in each sparse layer are the top 2 of softmax(x W_router), worked out here from the router's weights
    and the input that reached the block in a forward of its own, their weights p renormalised over the two (or p
    itself), and its probabilities the router's over all 4."""
    from minitf.llama import Llama, LlamaConfig
    minitf.manual_seed(4)
    model = Llama(LlamaConfig(vocab_size=12, d_model=16, num_layers=3, num_heads=4, num_kv_heads=2, d_ff=24,
                              max_position_embeddings=8, num_experts=4, num_experts_per_tok=2, moe_d_ff=8,
                              mlp_only_layers=(1,), norm_topk_prob=renormalise, shared_expert_d_ff=shared)).eval()
    for l in (0, 2):  # routers of std 1, not 0.02: probabilities far from uniform, choices away from ties
        model.layers[l].mlp.gate.weight.data[...] *= 50
    kind = kinds.get("llama")
    parts = kind.page_parts(model)
    assert [layer for layer, _ in parts.experts] == [0, 2]
    inspection = numbers.language_model(model, GPT_IDS, parts=parts)
    _, data = page_of(model, inspection, GPT_IDS)
    experts = data["experts"]
    assert (experts["layers"], experts["num_experts"], experts["top_k"], experts["shared"]) == \
        ([0, 2], 4, 2, shared is not None)
    inputs = {}
    for l in (0, 2):  # the input each sparse block reads, from a forward of the test's own
        mlp = model.layers[l].mlp
        mlp.forward = lambda x, mlp=mlp, l=l: inputs.setdefault(l, backend.to_numpy(x)[0]) is None or \
            type(mlp).forward(mlp, x)
    try:
        with minitf.no_grad():
            model(GPT_IDS[None])
    finally:
        for l in (0, 2):
            del model.layers[l].mlp.forward
    weights, probs = page.decode_array(experts["weights"]), page.decode_array(experts["probs"])
    assert weights.shape == (2, len(GPT_IDS), 2) and probs.shape == (2, len(GPT_IDS), 4)
    for i, l in enumerate((0, 2)):
        z = inputs[l] @ backend.to_numpy(model.layers[l].mlp.gate.weight.data)      # (L, E)
        p = np.exp(z - z.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        idx = np.argsort(-p, axis=-1)[:, :2]
        chosen = np.take_along_axis(p, idx, axis=-1)
        ranked = np.sort(p, axis=-1)
        assert (ranked[:, -2] - ranked[:, -3]).min() > 1e-6                         # no tie at the k-th place
        assert experts["idx"][i] == idx.tolist()
        w = chosen / chosen.sum(axis=-1, keepdims=True) if renormalise else chosen
        np.testing.assert_allclose(weights[i], w, rtol=1e-6)       # float32 on the page
        np.testing.assert_allclose(probs[i], p, rtol=1e-6, atol=1e-12)
    assert all(len({tuple(row) for row in layer}) > 1 for layer in experts["idx"])  # not one choice everywhere


# --------------------------------------------------------------------------- the page's words
def test_a_probability_shows_three_digits_and_below_one_never_shows_as_one():
    """0.998 was shown as "1" (two digits): three significant digits, more where those would round to 1."""
    shown = [page.probability_text(p) for p in (0.998, 0.9996, 0.99999994, 1.0, 0.5, 0.012345, 2.5e-5, 0.0,
                                                 float("nan"), None)]
    assert shown == ["0.998", "0.9996", "0.9999999", "1", "0.5", "0.0123", "2.5e-05", "0", None, None]


def test_the_page_gives_each_probability_its_text(float64):
    model = gpt("gpt2")
    _, data = page_of(model, numbers.language_model(model, GPT_IDS), GPT_IDS)
    assert data["probability_text"] == [page.probability_text(p) for p in data["probability"]]
    assert data["probability_text"][-1] is None  # the last position predicts nothing
    assert data["top_text"] == [[page.probability_text(p) for _, p in top] for top in data["top"]]
    script = (pathlib.Path(page.__file__).parent / page.SCRIPT).read_text(encoding="utf-8")
    assert "ex.probability_text[" in script and "ex.top_text[" in script  # what the chips and the panel show


def test_the_residual_chart_does_not_join_the_decoder_to_the_encoder(float64):
    """No gradient flows from the decoder's layer 0 to the encoder's output: the memory's gradient is the sum of
    the decoder layers' cross-attention. The page's lines break there, and the caption's note says why."""
    model = transformer(False)
    _, data = page_of(model, numbers.translation(model, SRC, TGT_IN, TGT_OUT), TGT_IN, SRC)
    names = [name for name, _ in data["points"]]
    assert [names[start:stop + 1] for start, stop in data["point_lines"]] == [
        ["decoder out", "decoder.layers.2 in", "decoder.layers.1 in", "decoder.layers.0 in"],
        ["encoder out", "encoder.layers.1 in", "encoder.layers.0 in"]]
    assert "not joined" in data["points_note"] and "sum" in data["points_note"] \
        and "cross-attention" in data["points_note"], data["points_note"]
    model = gpt("gpt2")
    _, data = page_of(model, numbers.language_model(model, GPT_IDS), GPT_IDS)
    assert data["point_lines"] == [[0, len(data["points"]) - 1]] and data["points_note"] is None


def test_a_gpt_page_says_why_its_last_embedding_gradient_is_zero(float64):
    model = gpt("gpt2")
    _, data = page_of(model, numbers.language_model(model, GPT_IDS), GPT_IDS)
    norms = data["embedding_grad"]["norms"]
    assert norms[-1] == 0 and min(norms[:-1]) > 0
    note = data["embedding_grad"]["note"]
    assert "predicts nothing" in note and "causal" in note and "no later position" in note, note
    model = transformer(False)
    _, data = page_of(model, numbers.translation(model, SRC, TGT_IN, TGT_OUT), TGT_IN, SRC)
    assert data["embedding_grad"]["note"] is None


# --------------------------------------------------------------------------- the walk is trace --walk's
def _steps(walk_of_trace):
    return [s if isinstance(s, str) else (s.label, float(np.linalg.norm(s.array))) for s in walk_of_trace.steps]


def _walk(inspection):
    return [s if isinstance(s, str) else (s.label, s.norm) for s in inspection.walk]


def test_the_walk_is_the_walk_of_trace_for_its_examples(float64):
    """For the trace's one-layer examples the page's walk is `trace --walk`'s, step for step (labels and norms,
    with its label smoothing), `trace --model gpt --walk`'s and `trace --model llama --walk`'s."""
    traced, model, _ = tracer.run()
    inspection = numbers.translation(tracer.build_model(), np.array(tracer.SRC[0]), np.array(tracer.TGT_IN[0]),
                                     np.array(tracer.TGT_OUT[0]), smoothing=tracer.SMOOTHING)
    assert _walk(inspection) == _steps(walk.translation_walk(traced, model))
    traced, model, _ = tracer.run_gpt()
    inspection = numbers.language_model(tracer.build_model(minitf.GPT, tracer.GPT_CONFIG), np.array(tracer.GPT_IDS[0]))
    assert _walk(inspection) == _steps(walk.language_model_walk(traced, model))
    llama = kinds.get("llama")
    traced, model, _ = llama.trace_example().run()
    from minitf.llama.study import build_trace_model
    fresh = build_trace_model()
    inspection = numbers.language_model(fresh, np.array(tracer.GPT_IDS[0]), parts=llama.page_parts(fresh))
    assert _walk(inspection) == _steps(llama.walk(traced, model))


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-LN", "pre-LN"])
def test_the_walk_visits_every_layer_top_down(pre_norm, float64):
    model = transformer(pre_norm)
    inspection = numbers.translation(model, SRC, TGT_IN, TGT_OUT)
    sections = [s for s in inspection.walk if isinstance(s, str)]
    layers = [int(m.group(1)) for s in sections for m in [re.match(r"decoder layer (\d): masked", s)] if m]
    assert layers == [2, 1, 0]
    layers = [int(m.group(1)) for s in sections for m in [re.match(r"encoder layer (\d): self", s)] if m]
    assert layers == [1, 0]
    labels = [s.label for s in inspection.walk if not isinstance(s, str)]
    assert ("decoder.final_norm: dy of the last block = LN'(dh)" in labels) == pre_norm
    assert ("decoder.layers.2.ff_block: dx_skip = dy (pre-LN: the skip passes dy on unchanged)" in labels) == pre_norm
    # each layer's input gradient in the walk is the point of the residual-stream chart
    points = dict(inspection.points)
    for name in ("decoder.layers.0", "encoder.layers.1"):
        block = "self_attn_block" if name.startswith("decoder") else "attn_block"
        step = next(s for s in inspection.walk if not isinstance(s, str) and s.label.startswith(f"{name}.{block}: dx ="))
        assert step.norm == points[f"{name} in"] and step.kind == "stream"
    # the tied matrix's three uses add up to its gradient
    weights = [s.norm for s in inspection.walk if not isinstance(s, str) and s.kind == "weight"]
    assert len(weights) == 4 and weights[-1] == pytest.approx(
        np.linalg.norm(backend.to_numpy(model.src_embed.weight.grad)), rel=1e-12)


# --------------------------------------------------------------------------- self-contained
def test_the_page_loads_nothing_and_allows_only_its_own_script_and_style(float64):
    model = transformer(False)
    html, _ = page_of(model, numbers.translation(model, SRC, TGT_IN, TGT_OUT), TGT_IN, SRC)
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1)
    rules = dict(rule.strip().split(" ", 1) for rule in csp.split(";"))
    assert rules["default-src"] == "'none'" and rules["form-action"] == "'none'"
    script = re.search(r"<script>(.*?)</script>", html, re.S).group(1)
    style = re.search(r"<style>(.*?)</style>", html, re.S).group(1)
    for rule, text in (("script-src", script), ("style-src", style)):
        digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
        assert rules[rule] == f"'sha256-{digest}'", rule
    assert html.count("<script") == 2  # the data (not run) and the one script
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html), "a reference to another site"


def test_the_users_text_cannot_end_the_data_script():
    example = {"text": "</script><script>alert(1)</script> __SCRIPT__ __DATA__ & <!--"}
    html = page.render({"title": "t", "model": {}, "examples": [example], "curves": None})
    assert html.count("</script>") == 2 and page.read_data(html)["examples"][0] == example


# --------------------------------------------------------------------------- the command
@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt")
    assert train(make_text(folder) + TINY_GPT + ["--max-steps", "4", "--eval-every", "2", "--out", folder / "run"]) == 0
    return folder / "run"


def run_inspect(argv, capsys, stdin=None, monkeypatch=None, tmp_path=None):
    if stdin is not None:
        (tmp_path / "stdin").write_bytes(stdin)
        monkeypatch.setattr(sys, "stdin", open(tmp_path / "stdin", "r"))
    try:
        code = inspect_main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines(), captured.out


def test_a_translation_run_gives_a_page_with_its_curves(world, tmp_path, capsys):
    out = tmp_path / "page.html"
    code, err, printed = run_inspect(["--checkpoint", world["ref"], "--text", "Der hund sieht ein haus.", "--beam", 1,
                                  "--out", out], capsys)
    assert code == 0 and err == [] and printed.strip() == str(out)
    data = page.read_data(out.read_text(encoding="utf-8"))
    (example,) = data["examples"]
    assert example["source"][-1] == "</s>" and example["input"][0] == "<s>" and example["predicted"][-1] == "</s>"
    assert "own translation (greedy)" in example["target_from"]
    assert data["model"]["layout"] == "post-LN" and data["curves"]["train"]["step"] == list(range(1, 7))
    assert data["curves"] == read_curves(world["ref"], TRANSLATION_PAGE)
    # a reference is scored as given; a checkpoint folder has no curves (and says why)
    checkpoint = world["ref"] / "checkpoints" / "step-00000004"
    code, err, _ = run_inspect(["--checkpoint", checkpoint, "--text", "Der hund.", "--reference", "The dog.",
                            "--out", out], capsys)
    data = page.read_data(out.read_text(encoding="utf-8"))
    assert code == 0 and data["examples"][0]["target_from"] == "the reference given"
    assert data["curves"] is not None  # its run folder, two levels up, has metrics.jsonl
    alone = shutil.copytree(checkpoint, tmp_path / "alone")
    code, err, _ = run_inspect(["--checkpoint", alone, "--text", "Der hund.", "--out", out], capsys)
    data = page.read_data(out.read_text(encoding="utf-8"))
    assert code == 0 and data["curves"] is None and "without its run folder" in data["curves_note"]


def test_the_page_says_which_checkpoint_and_what_its_context_is(world, tmp_path, capsys):
    """A run whose best.json chose the average of its last checkpoints is loaded from that average, not from
    the step in its meta.json; the context is the --max-len cap of its training, not its longest sentence."""
    from minitf.training import checkpoint as ckpt
    out = tmp_path / "page.html"
    code, err, _ = run_inspect(["--checkpoint", world["ref"], "--text", "Der hund.", "--beam", 1, "--out", out], capsys)
    facts = dict(page.read_data(out.read_text(encoding="utf-8"))["model"]["facts"])
    assert code == 0 and facts["loaded from"] == f"{world['ref']} (step 6)", facts
    assert facts["context"] == "100 tokens (its training's cap, --max-len: longer sentences were skipped)", facts
    run = copy_run(world["ref"], tmp_path / "run")
    ckpt.average_checkpoints(ckpt.list_checkpoints(run)[-2:], run / "checkpoints" / "averaged")
    (run / "best.json").write_text(json.dumps({"model": "average of last 2", "checkpoint": "checkpoints/averaged"}))
    code, err, _ = run_inspect(["--checkpoint", run, "--text", "Der hund.", "--beam", 1, "--out", out], capsys)
    facts = dict(page.read_data(out.read_text(encoding="utf-8"))["model"]["facts"])
    assert code == 0 and facts["loaded from"] == f"{run} (the average of 2 checkpoints: steps 4, 6)", facts


def test_inspect_help_shows_every_default():
    import argparse

    from minitf.inspect import build_parser
    parser = build_parser()
    defaults = [a for a in parser._actions if a.option_strings and a.default not in (None, False, argparse.SUPPRESS)]
    assert len(defaults) == 4  # --out, --max-input-tokens, --port, --max-chars
    for action in defaults:
        assert f"(default: {action.default})" in action.help, action.option_strings
    assert "(default: MINITF_DEVICE, else cpu)" in parser.format_help()
    beam = next(a for a in parser._actions if "--beam" in a.option_strings)  # the model's own, as translate decodes
    assert "(default: the model's" in beam.help and "4 for a run" in beam.help


def test_sentences_from_stdin_and_a_gpt_run(gpt_run, tmp_path, capsys, monkeypatch):
    out = tmp_path / "page.html"
    code, err, _ = run_inspect(["--checkpoint", gpt_run, "--out", out], capsys, b"the cat sees\na dog runs home.\n",
                           monkeypatch, tmp_path)
    assert code == 0, err
    data = page.read_data(out.read_text(encoding="utf-8"))
    assert [e["text"] for e in data["examples"]] == ["the cat sees", "a dog runs home."]
    assert data["model"]["kind"] == "gpt" and data["model"]["layout"] == "pre-LN"
    assert data["examples"][0]["input"] == list("the cat sees")  # a character tokenizer's pieces
    assert data["curves"]["score_name"].startswith("perplexity")


def test_a_sparse_run_draws_its_experts_and_its_load_over_training_and_a_dense_one_neither(gpt_run, tmp_path,
                                                                                           capsys):
    """A train.py --model llama --num-experts 4 --experts-per-token 2 run: the page holds each token's 2 experts in
    both sparse layers and, step by step, the expert_load of every training record of its metrics.jsonl; one of
    its checkpoints copied out of the run says in one line why it has no load; a GPT run (dense) has neither."""
    from tests.test_llama_moe_train import SPARSE, train_records
    run, out = tmp_path / "moe", tmp_path / "page.html"
    assert train(make_text(tmp_path) + SPARSE + ["--max-steps", "4", "--eval-every", "2", "--out", run]) == 0
    code, err, _ = run_inspect(["--checkpoint", run, "--text", "the cat sees", "--out", out], capsys)
    data = page.read_data(out.read_text(encoding="utf-8"))
    assert code == 0 and data["model"]["sparse"] is True, err
    experts = data["examples"][0]["experts"]
    assert (experts["layers"], experts["num_experts"], experts["top_k"]) == ([0, 1], 4, 2)
    assert [len(layer) for layer in experts["idx"]] == [len("the cat sees")] * 2
    assert all(len(set(choice)) == 2 and set(choice) <= {0, 1, 2, 3} for layer in experts["idx"] for choice in layer)
    records = train_records(run)
    load = data["expert_load"]
    assert load["step"] == [r["step"] for r in records] == [1, 2, 3, 4] and load["stride"] == 1
    assert load["counts"] == [[r["expert_load"][l] for r in records] for l in (0, 1)]
    assert data["expert_load_note"] is None
    alone = shutil.copytree(run / "checkpoints" / "step-00000004", tmp_path / "alone")
    code, err, _ = run_inspect(["--checkpoint", alone, "--text", "the cat sees", "--out", out], capsys)
    data = page.read_data(out.read_text(encoding="utf-8"))
    assert code == 0 and data["expert_load"] is None and data["examples"][0]["experts"]["layers"] == [0, 1]
    assert data["expert_load_note"] == ("No expert load over training: the checkpoint was given without its run "
                                        "folder's metrics.jsonl.")
    code, err, _ = run_inspect(["--checkpoint", gpt_run, "--text", "the cat sees", "--out", out], capsys)
    data = page.read_data(out.read_text(encoding="utf-8"))
    assert code == 0 and data["model"]["sparse"] is False and data["examples"][0]["experts"] is None
    assert data["expert_load"] is None and data["expert_load_note"] is None


def test_a_long_runs_load_is_summed_over_runs_of_steps(tmp_path, monkeypatch):
    """More load records than the page draws: consecutive steps summed in runs of equal length, each a point at its
    last step (no count lost); records without the load or of another shape are skipped."""
    from minitf import inspect as command
    monkeypatch.setattr(command, "MAX_LOAD_NUMBERS", 2 * 3 * 4)            # 4 points of 2 layers of 3 experts
    rng = np.random.default_rng(0)
    loads = rng.integers(0, 50, (10, 2, 3))
    lines = [{"kind": "train", "step": s + 1, "loss": 1.0, "expert_load": loads[s].tolist()} for s in range(10)]
    lines.insert(3, {"kind": "train", "step": 99, "loss": 1.0, "expert_load": [[1, 2], [3, 4]]})    # another shape
    lines.insert(5, {"kind": "train", "step": 98, "loss": 1.0})                                    # none
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    load = command.read_expert_load(command.read_records(tmp_path), [1, 3], 3)
    assert load["stride"] == 3 and load["step"] == [3, 6, 9, 10] and load["layers"] == [1, 3]
    for l in range(2):
        assert load["counts"][l] == [loads[a:a + 3, l].sum(axis=0).tolist() for a in (0, 3, 6, 9)]
    assert command.read_expert_load(command.read_records(tmp_path), [1], 3) is None   # no record of 1 layer


def test_unknown_characters_are_said_on_stderr_and_in_the_page(world, tmp_path, capsys):
    out = tmp_path / "page.html"
    code, err, _ = run_inspect(["--checkpoint", world["ref"], "--text", "Der hund ☃ sieht €.", "--beam", 1,
                            "--out", out], capsys)
    assert code == 0 and len(err) == 1 and err[0].startswith("warning: --text has characters the tokenizer does not "
                                                             "know: ☃ €"), err
    data = page.read_data(out.read_text(encoding="utf-8"))
    assert data["warnings"] == [err[0].removeprefix("warning: ")] and data["examples"][0]["notes"] == data["warnings"]
    assert "<unk>" in data["examples"][0]["source"]


def _not_a_run(tmp_path):
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def _damaged(world, tmp_path):
    run = copy_run(world["ref"], tmp_path / "damaged")
    for checkpoint in (run / "checkpoints").iterdir():
        (checkpoint / "model.npz").write_bytes(b"not an archive")
    return run


def _file_as_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    return tmp_path / "file" / "page.html"


# name: (argv after --checkpoint RUN (from world, tmp_path), stdin or None, exit status, words of the one line)
BAD_INPUTS = {
    "missing checkpoint": (lambda w, t: ["--checkpoint", t / "nope", "--text", "Der hund."], None, 1, "does not exist"),
    "not a run": (lambda w, t: ["--checkpoint", _not_a_run(t), "--text", "Der hund."], None, 1,
                  "neither a checkpoint folder"),
    "damaged checkpoints": (lambda w, t: ["--checkpoint", _damaged(w, t), "--text", "Der hund."], None, 1,
                            "is usable"),
    "empty --text": (lambda w, t: ["--checkpoint", w["ref"], "--text", " "], None, 2, "--text is empty"),
    "empty line on stdin": (lambda w, t: ["--checkpoint", w["ref"]], b"Der hund.\n\nDie katze.\n", 1,
                            "line 2 is empty"),
    "nothing on stdin": (lambda w, t: ["--checkpoint", w["ref"]], b"", 1, "standard input is empty"),
    "longer than the page": (lambda w, t: ["--checkpoint", w["ref"], "--text", "Der hund sieht ein haus.",
                                           "--max-input-tokens", "5"], None, 1, "at most --max-input-tokens 5"),
    "longer than the context": (lambda w, t: ["--checkpoint", w["ref"], "--text", "der hund " * 60], None, 1,
                                "longer than the model's context of 100"),
    "unwritable output": (lambda w, t: ["--checkpoint", w["ref"], "--text", "Der hund.", "--out", _file_as_folder(t)],
                          None, 2, "is a file, not a folder"),
    "output is a folder": (lambda w, t: ["--checkpoint", w["ref"], "--text", "Der hund.", "--out", t], None, 2,
                           "is a folder"),
    "reference without text": (lambda w, t: ["--checkpoint", w["ref"], "--reference", "The dog."], b"Der hund.\n", 2,
                               "--reference goes with --text"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_and_writes_nothing(case, world, tmp_path, capsys, monkeypatch):
    argv, stdin, status, words = BAD_INPUTS[case]
    out = tmp_path / "out" / "page.html"
    args = argv(world, tmp_path)
    args = args if "--out" in args else args + ["--out", out]
    code, err, printed = run_inspect(args, capsys, stdin, monkeypatch, tmp_path)
    assert code == status and len(err) == 1 and err[0].startswith("minitf.inspect: error: ") and words in err[0], err
    assert printed == "" and not out.exists()
    assert not [p for p in tmp_path.rglob("*.tmp")], "a temporary file was left"


def test_a_page_that_fails_mid_write_leaves_the_old_one(world, tmp_path, capsys, monkeypatch):
    out = tmp_path / "page.html"
    out.write_text("the old page")

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)  # the last step of the atomic write
    code, err, _ = run_inspect(["--checkpoint", world["ref"], "--text", "Der hund.", "--out", out], capsys)
    assert code == 1 and "cannot write the page to" in err[0] and "No space left" in err[0]
    assert out.read_text() == "the old page" and sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]


# --------------------------------------------------------------------------- --serve
def get(url):
    try:
        with urllib.request.urlopen(url, timeout=60) as answer:
            return answer.status, answer.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8")


def test_the_server_binds_localhost_and_survives_bad_requests():
    pages = []

    def respond(query):
        if query.get("text") == "boom":
            raise RuntimeError("deep trouble")
        pages.append(query)
        return 200, "page " + json.dumps(query)

    server = serve.make_server(respond, lambda message, query: "error " + message, max_chars=20)
    assert server.server_address[0] == "127.0.0.1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}/"
    try:
        assert get(base) == (200, "page {}")
        assert get(base + "?text=Der%20Hund") == (200, 'page {"text": "Der Hund"}')
        for query, words in [("?text=" + "a" * 21, "at most 20"), ("?text=%ff", "not valid UTF-8"),
                             ("?other=1", "unknown field"), ("?text=a&text=b", "comes twice"),
                             ("?a=1&b=2&c=3", "does not fit"), ("x?text=a", "no page")]:
            status, body = get(base + query)
            assert status == 400 and body.startswith("error ") and words in body, (query, body)
        status, body = get(base + "?text=boom")
        assert status == 500 and "RuntimeError: deep trouble" in body
        request = urllib.request.Request(base, headers={"Host": "evil.example:80"})
        try:
            urllib.request.urlopen(request, timeout=60)
            raise AssertionError("a foreign Host was answered")
        except urllib.error.HTTPError as error:
            assert error.code == 400 and "127.0.0.1 or localhost only" in error.read().decode()
        assert get(base + "?text=again") == (200, 'page {"text": "again"}')  # still serving
    finally:
        server.shutdown()
        server.server_close()


def test_serve_computes_each_sentence_and_answers_a_bad_one_in_the_page(world):
    child = subprocess.Popen([sys.executable, "-m", "minitf.inspect", "--checkpoint", str(world["ref"]), "--serve",
                              "--port", "0", "--max-chars", "40", "--beam", "1"], cwd=ROOT, env=CPU_ENV,
                             stderr=subprocess.PIPE, text=False)
    try:
        line = read_line(child.stderr.fileno())
        base = re.fullmatch(r"serving (http://127\.0\.0\.1:\d+/) \(Ctrl-C stops\)", line).group(1)
        status, html = get(base)
        assert status == 200 and page.read_data(html)["examples"] == [] and page.read_data(html)["serve"]
        assert "form-action 'self'" in html
        status, html = get(base + "?text=Der+hund+sieht.&reference=The+dog+sees.")
        data = page.read_data(html)
        assert status == 200 and data["examples"][0]["target_from"] == "the reference given"
        for query, words in [("?text=+", "the sentence is empty"), ("?text=" + "a" * 41, "at most 40"),
                             ("?text=%ff", "not valid UTF-8")]:
            status, html = get(base + query)
            assert status == 400 and words in page.read_data(html)["error"], (query, html[-300:])
        status, html = get(base + "?text=Die+katze.")  # the server goes on
        assert status == 200 and page.read_data(html)["examples"][0]["text"] == "Die katze."
    finally:
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=60) == 0
        child.stderr.close()


# --------------------------------------------------------------------------- a Hugging Face Marian folder
@pytest.mark.extra("safetensors", "hf")
def test_a_marian_folder_gives_a_page_in_its_own_ids(tmp_path, capsys, float64):
    """A Marian folder (made here: a random minitf model with Marian's options saved with save_pretrained, and
    tokenizer files trained here): the decoder starts from <pad>, the source ends with </s> = 0, the pieces come
    from vocab.json, and the page's numbers are the model's own."""
    from minitf.nmt import marian
    from tests.marian_files import minitf_marian_folder
    folder = tmp_path / "opus-mt"
    V = minitf_marian_folder(folder).config.src_vocab_size
    out = tmp_path / "page.html"
    code, err, _ = run_inspect(["--checkpoint", folder, "--text", "Der Hund läuft", "--reference", "The dog runs",
                                "--out", out], capsys)
    assert code == 0, err
    data = page.read_data(out.read_text(encoding="utf-8"))
    example = data["examples"][0]
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    assert example["input"][0] == "<pad>" and example["source"][-1] == "</s>" and example["predicted"][-1] == "</s>"
    assert all(piece in vocab for piece in example["source"] + example["input"])
    assert data["curves"] is None and "Hugging Face folder" in data["curves_note"]
    loaded = marian.from_pretrained(folder)
    from minitf.nmt.marian_tokenizer import MarianTokenizer
    tokenizer = MarianTokenizer.from_folder(folder)
    src = np.array(tokenizer.encode(["Der Hund läuft"])[0] + [0])
    target = tokenizer.encode_target(["The dog runs"])[0]
    tgt_in, tgt_out = np.array([V - 1] + target), np.array(target + [0])
    kept = kept_weights(loaded, lambda: loaded(src[None], tgt_in[None]))
    shown = {a["name"]: page.decode_array(a) for a in example["attention"]}
    np.testing.assert_allclose(shown["cross-attention"][1], kept["cross-attention", 1], rtol=1e-6, atol=1e-7)
    loss, probs, points, embedding = by_hand_translation(loaded, src, tgt_in, tgt_out)
    assert example["loss"] == pytest.approx(loss, rel=1e-6)
    np.testing.assert_allclose([v for _, v in example["points"]], [v for _, v in points], rtol=1e-6)
    np.testing.assert_allclose(example["embedding_grad"]["norms"], embedding, rtol=1e-6)


@pytest.mark.extra("tokenizers", "hf")
def test_a_mixtral_folder_shows_its_experts_and_says_it_has_no_load_over_training(tmp_path, capsys):
    """A Mixtral folder (a random minitf model of 8 experts, 2 per token, written by save_pretrained, a tokenizer.json
    trained here), read by minitf.load: the page holds the experts its router chose for each token in each of its
    2 sparse layers, the same as the folder's model chooses them read by minitf.load, and one line saying a folder
    has no run log for the load over training."""
    from minitf.llama import Llama, LlamaConfig, moe_hf
    from tests.test_llama import write_tokenizer
    folder = tmp_path / "mixtral"
    folder.mkdir()
    V = write_tokenizer(folder)
    minitf.manual_seed(5)
    model = Llama(LlamaConfig(vocab_size=V, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=24,
                              max_position_embeddings=32, num_experts=8, num_experts_per_tok=2, bos_token_id=0,
                              eos_token_id=1, tie_word_embeddings=False))
    for block in model.sparse_blocks():
        block.gate.weight.data[...] *= 50  # choices away from ties
    model.save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["model_type"] == moe_hf.model_type_of(model.config) \
        == "mixtral"
    out = tmp_path / "page.html"
    code, err, _ = run_inspect(["--checkpoint", folder, "--text", "the cat sees", "--out", out], capsys)
    assert code == 0, err
    data = page.read_data(out.read_text(encoding="utf-8"))
    experts = data["examples"][0]["experts"]
    assert data["model"]["sparse"] is True and (experts["layers"], experts["num_experts"], experts["top_k"]) == \
        ([0, 1], 8, 2)
    loaded = minitf.load(folder)
    ids = loaded.tokenizer.encode(["the cat sees"])[0]
    with minitf.no_grad():
        loaded.model(np.array([ids]))
    assert experts["idx"] == [block.choices()[0].tolist() for block in loaded.model.sparse_blocks()]
    np.testing.assert_allclose(page.decode_array(experts["probs"]),
                               [block.choices()[2] for block in loaded.model.sparse_blocks()], rtol=1e-5, atol=1e-7)
    assert data["expert_load"] is None
    assert data["expert_load_note"] == "No expert load over training: a Hugging Face folder has no metrics.jsonl."


def test_serve_on_a_port_in_use_is_one_line(world, capsys):
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err, _ = run_inspect(["--checkpoint", world["ref"], "--serve", "--port", port], capsys)
    assert code == 1 and len(err) == 1 and f"cannot serve on 127.0.0.1:{port}" in err[0] and "--port" in err[0], err


# --------------------------------------------------------------------------- unknown characters of a Marian folder
@pytest.mark.parametrize("separate", [False, True])
def test_unknown_characters_of_a_marian_folder_are_read_on_its_source_side(tmp_path, separate):
    """With separate vocabularies (target_vocab.json) the source's characters are looked up in vocab.json, not
    the target's (which lacks "ä": the target side was trained on English words); a language code (``>>fra<<``)
    and a special token written in the text (``<pad>``) are tokens of their own, not unknown "<" and ">"; a code
    the vocabulary lacks is named whole."""
    pytest.importorskip("sentencepiece")
    from minitf.inspect import unknown_characters
    from minitf.nmt.marian_tokenizer import MarianTokenizer
    from tests.marian_files import write_tokenizer_files
    write_tokenizer_files(tmp_path, separate=separate, drop=0)  # every piece of both sides in its vocabulary
    tokenizer = MarianTokenizer.from_folder(tmp_path)
    assert "ä" in "".join(tokenizer.vocab) and ("ä" not in "".join(tokenizer.target_vocab)) == separate
    assert unknown_characters(tokenizer, "Der Katze läuft über die Brücke") == []
    assert unknown_characters(tokenizer, "Die Katze ☃ schläft €") == ["☃", "€"]
    assert unknown_characters(tokenizer, ">>fra<< Die Katze schläft") == []
    assert unknown_characters(tokenizer, "Die <pad> Katze") == []
    assert unknown_characters(tokenizer, ">>xyz<< Die ☃ Katze") == [">>xyz<<", "☃"]


#: A source model trained on these words too makes "Die" and "Ärztin" pieces of their own ("▁Die", "▁Ärztin").
DOCTOR_WORDS = ["Die", "Ärztin"] * 4


@pytest.mark.extra("safetensors", "hf")
@pytest.mark.parametrize("separate", [False, True])
def test_unknown_text_is_read_from_the_sentences_ids_not_from_single_characters(tmp_path, capsys, separate):
    """A vocabulary without the standalone piece "i" (a character encoded alone: "▁", "i") that still encodes
    "Die Ärztin" without an <unk> id ("▁Die", "▁Ärztin"): nothing is said. It used to warn that "i" is unknown.
    A piece the vocabulary lacks is named as the text that produced it (a word, not its letters), and the
    reference is read on the target side."""
    pytest.importorskip("sentencepiece")
    from minitf.inspect import unknown_characters
    from minitf.nmt.marian_tokenizer import MarianTokenizer
    from tests.marian_files import SOURCE_WORDS, minitf_marian_folder, write_tokenizer_files

    words = SOURCE_WORDS + DOCTOR_WORDS
    write_tokenizer_files(tmp_path / "i", separate=separate, drop=0, source_words=words, missing=("i",))
    tokenizer = MarianTokenizer.from_folder(tmp_path / "i")
    assert tokenizer.pieces("Die Ärztin") == ["▁Die", "▁Ärztin"] and "i" not in tokenizer.vocab
    unk = tokenizer.unk_id
    assert unk not in tokenizer.encode(["Die Ärztin"])[0] and unk in tokenizer.encode(["i"])[0]
    assert unknown_characters(tokenizer, "Die Ärztin") == []
    assert unknown_characters(tokenizer, "Die Ärztin ☃") == ["☃"]
    write_tokenizer_files(tmp_path / "word", separate=separate, drop=0, source_words=words, missing=("▁Ärztin",))
    tokenizer = MarianTokenizer.from_folder(tmp_path / "word")
    assert unknown_characters(tokenizer, "Die Ärztin") == ["Ärztin"]
    folder = tmp_path / "opus"
    minitf_marian_folder(folder, source_words=words, missing=("i",), drop=0, separate=separate)
    code, err, _ = run_inspect(["--checkpoint", folder, "--text", "Die Ärztin", "--beam", 1, "--out",
                                tmp_path / "page.html"], capsys)
    assert code == 0 and err == [], err
    code, err, _ = run_inspect(["--checkpoint", folder, "--text", "Die Ärztin ☃", "--reference", "The dog.",
                                "--out", tmp_path / "page.html"], capsys)
    assert code == 0 and len(err) == 1 and err[0].startswith("warning: --text has characters the tokenizer does "
                                                             "not know: ☃ ("), err
