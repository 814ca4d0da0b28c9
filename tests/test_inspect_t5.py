"""The inspection page of a T5 (``Kind.page``: the translation page's source and target; ``Kind.page_parts``:
minitf/t5/study.py): every attention of every block is what minitf's T5 attention keeps, the loss and probabilities
are the model's own forward's, the walk visits every block top down and names lines of minitf that exist, the
embedding gradient is what reaches the shared embedding's second (the encoder's) backward, and each stack's
relative position bias by distance is what the stack adds to a score at that distance (its own forward), one line
per head: -D..D for the encoder, -D..0 for the decoder. ``python -m minitf.inspect`` draws a T5 folder written by
minitf (the text is the encoder's whole input, no task prefix) and a ``train.py --model t5`` run with its curves;
the page opens in headless Chromium with its bias charts and no console error."""
import json

import pytest

import minitf
from minitf import backend, kinds
from minitf.backend import host as np
from minitf.inspect import main as inspect_main
from minitf.study import walk
from minitf.study.inspection import numbers, page
from minitf.t5 import T5, T5Config
from tests.runs import train
from tests.test_inspect import kept_weights, page_of
from tests.test_inspect_browser import browser  # noqa: F401 (the fixture: headless Chromium)
from tests.test_inspect_browser import console_errors, fetched, needs_chromium, open_page, screenshot
from tests.test_lm_train import make_text
from tests.test_t5_train import SCRATCH

SRC = np.array([5, 7, 9, 6, 1])           # (S,): 1 is T5's eos
TGT_IN = np.array([0, 8, 6, 10])          # (T,): T5's decoder starts from pad, 0
TGT_OUT = np.array([8, 6, 10, 1])


def t5(**changes):
    minitf.manual_seed(4)
    return T5(T5Config(**dict(dict(vocab_size=14, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_decoder_layers=3,
                                   num_heads=3, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                                   relative_attention_num_buckets=8, relative_attention_max_distance=12,
                                   dropout_rate=0.0), **changes))).eval()


@pytest.mark.parametrize("changes", [{}, {"feed_forward_proj": "relu", "tie_word_embeddings": True}],
                         ids=["v1.1", "v1.0"])
def test_the_t5_page_holds_the_models_own_numbers(changes, float64):
    model = t5(**changes)
    kind = kinds.get("t5")
    parts = kind.page_parts(model)
    inspection = numbers.translation(model, SRC, TGT_IN, TGT_OUT, parts=parts)
    _, data = page_of(model, inspection, TGT_IN, source_ids=SRC)
    S, T, H = len(SRC), len(TGT_IN), 3
    shapes = {a["name"]: a["shape"] for a in data["attention"]}
    assert shapes == {"encoder self-attention": [2, H, S, S], "decoder masked self-attention": [3, H, T, T],
                      "cross-attention": [3, H, T, S]}
    kept = kept_weights(model, lambda: model(SRC[None], TGT_IN[None]), parts)
    for a in data["attention"]:
        for l in range(a["shape"][0]):
            np.testing.assert_array_equal(page.decode_array(a)[l], kept[a["name"], l].astype(np.float32))
    causal = page.decode_array(data["attention"][1])
    assert np.all(np.triu(causal, 1) == 0)                          # the decoder reads the past only
    # the loss and probabilities of the model's own forward
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=model.pad_id)
    with minitf.no_grad():
        logits = model(SRC[None], TGT_IN[None])
        loss = loss_fn(logits, TGT_OUT[None])
    z = backend.to_numpy(logits)[0]
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    assert data["loss"] == pytest.approx(float(loss), rel=1e-12)
    np.testing.assert_allclose(data["probability"], p[np.arange(T), TGT_OUT], rtol=1e-12)
    # the embedding's gradient: what the shared embedding's second backward (the encoder's lookups) receives
    captured = []
    backward = model.shared.backward
    model.shared.backward = lambda dy: captured.append(backend.to_numpy(dy)) or backward(dy)
    try:
        model.zero_grad()
        model.backward(_dlogits(model, loss_fn))
    finally:
        del model.shared.backward
    np.testing.assert_allclose(data["embedding_grad"]["norms"], np.linalg.norm(captured[1][0], axis=-1), rtol=1e-10)
    # the walk: every block, top down, each step on a line of minitf that exists
    assert [name for name, _ in data["points"]] == ["decoder out", "decoder.block.2 in", "decoder.block.1 in",
                                                    "decoder.block.0 in", "encoder out", "encoder.block.1 in",
                                                    "encoder.block.0 in"]
    steps = [s for s in parts.walk(_traced(model, parts), model).steps if not isinstance(s, str)]
    assert all(walk.source_line(*s.code) for s in steps if s.code)
    labels = [s["label"] for s in data["walk"] if "label" in s]
    assert labels[-1].startswith("shared: W.grad[ids] += dy (the encoder's lookups")
    bias_steps = [s for s in data["walk"] if "label" in s and "relative_attention_bias" in s["label"]]
    for s, stack in zip(bias_steps, ("decoder", "encoder")):
        grad = backend.to_numpy(getattr(model, stack).relative_attention_bias.weight.grad)
        assert s["norm"] == pytest.approx(float(np.linalg.norm(grad)), rel=1e-6) and s["norm"] > 0
    # the position bias: each head's bias at each distance is what the stack's own forward adds there
    biases = {b["name"]: b for b in data["position_bias"]}
    assert list(biases) == ["encoder (both directions)", "decoder (the past)"]
    D = 12
    for name, stack, keys in (("encoder (both directions)", model.encoder, 2 * D + 1),
                              ("decoder (the past)", model.decoder, D + 1)):
        bias = biases[name]
        assert bias["distances"] == list(range(-D, keys - D))
        with minitf.no_grad():
            added = backend.to_numpy(stack.relative_attention_bias(1, keys, D))[0, :, 0, :]   # query at D  (H, keys)
        np.testing.assert_array_equal(np.array(bias["values"]), added)
        assert len(bias["values"]) == H and len(set(np.array(bias["values"]).ravel())) > H


def _dlogits(model, loss_fn):
    """dL/dlogits of the example after a forward with gradients on."""
    logits = model(SRC[None], TGT_IN[None])
    loss_fn(logits, TGT_OUT[None])
    return loss_fn.backward()


def _traced(model, parts):
    """A tracer that recorded one forward and backward of the example (the page's own run)."""
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=model.pad_id)
    return numbers._run(model, loss_fn, lambda: model(SRC[None], TGT_IN[None]), TGT_OUT, numbers.TOP, parts)[3]


def read_page(path):
    return page.read_data(path.read_text(encoding="utf-8"))


@pytest.mark.extra("safetensors", "hf")  # the folder is written by minitf's writer
def test_python_m_minitf_inspect_draws_a_t5_folder_reading_the_text_whole(tmp_path, capsys):
    from tests.test_t5_folder import t5_folder
    folder = t5_folder(tmp_path / "t5")
    out = tmp_path / "page.html"
    assert inspect_main(["--checkpoint", str(folder), "--text", "the house", "--out", str(out)]) == 0
    loaded = minitf.load(folder)
    data = read_page(out)
    (example,) = data["examples"]
    ids = loaded.tokenizer.encode(["the house"])[0] + [1]           # no task prefix, though the folder names one
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=str(folder / "spiece.model"))
    assert example["source"] == [sp.id_to_piece(i) for i in ids] and example["source"][-1] == "</s>"
    assert example["input"][0] == "<pad>" and "greedy" in example["target_from"]
    assert [b["name"] for b in example["position_bias"]] == ["encoder (both directions)", "decoder (the past)"]
    assert data["model"]["walk_command"] is None and data["title"].startswith("minitf inspect: T5")
    assert dict(data["model"]["facts"])["context"].startswith("no limit of its own")
    assert inspect_main(["--checkpoint", str(folder), "--text", "the house", "--reference", "das haus", "--out",
                         str(out)]) == 0
    assert read_page(out)["examples"][0]["target_from"] == "the reference given"


@pytest.fixture(scope="module")
def t5_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("t5run")
    run = folder / "run"
    assert train(make_text(folder) + SCRATCH + ["--max-steps", "6", "--out", run]) == 0
    return run


def test_python_m_minitf_inspect_draws_a_t5_run_with_its_curves(t5_run, tmp_path):
    out = tmp_path / "page.html"
    assert inspect_main(["--checkpoint", str(t5_run), "--text", "the cat sees a dog.", "--out", str(out)]) == 0
    data = read_page(out)
    steps = [json.loads(line)["step"] for line in (t5_run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line).get("kind") == "train"]
    assert data["curves"]["train"]["step"] == steps and data["curves"]["loss_name"] == "cross-entropy"
    (example,) = data["examples"]
    loaded = minitf.load(t5_run)
    D = loaded.model.config.relative_attention_max_distance
    assert [len(b["distances"]) for b in example["position_bias"]] == [2 * D + 1, D + 1]
    assert {a["name"]: a["shape"][:2] for a in example["attention"]} == {
        "encoder self-attention": [1, 2], "decoder masked self-attention": [1, 2], "cross-attention": [1, 2]}


@needs_chromium
@pytest.mark.extra("selenium", "browser")
def test_the_t5_page_opens_in_a_browser_with_its_bias_charts(browser, t5_run, tmp_path):
    out = tmp_path / "t5.html"
    assert inspect_main(["--checkpoint", str(t5_run), "--text", "the cat sees a dog.", "--out", str(out)]) == 0
    data = open_page(browser, out)
    assert console_errors(browser) == [] and fetched(browser) == []
    example = data["examples"][0]
    charts = browser.find_elements("css selector", "#attention figure")
    assert [c.get_attribute("data-chart") for c in charts] == ["position-bias-0", "position-bias-1"]
    for chart, bias in zip(charts, example["position_bias"]):
        assert len(chart.find_elements("css selector", "polyline")) == len(bias["values"])  # one line per head
        assert "Position bias: " + bias["name"] in chart.text
    assert "P = softmax(Q Kᵀ + B)" in browser.find_element("css selector", "#attention p.caption").text
    steps = [s for s in example["walk"] if "label" in s]
    assert len(browser.find_elements("css selector", "#walk-chart rect")) == len(steps)
    caption = browser.find_element("css selector", "#backward figure[data-chart='walk'] p.caption").text
    assert "python -m minitf.trace --checkpoint PATH" in caption
    for section in ("tokens", "attention", "backward", "training"):
        screenshot(browser, section, tmp_path / f"t5-{section}.png")
    assert console_errors(browser) == []


@pytest.mark.extra("safetensors", "hf")
def test_a_kind_without_a_page_is_refused_in_one_line_writing_nothing(tmp_path, capsys, monkeypatch):
    """Every kind has a page now; the refusal of one without (``Kind.page`` None) stays one line naming its commands."""
    from tests.test_t5_folder import t5_folder
    folder = t5_folder(tmp_path / "t5")
    monkeypatch.setattr(kinds.get("t5"), "page", None)
    assert inspect_main(["--checkpoint", str(folder), "--text", "the house", "--out", str(tmp_path / "page")]) == 2
    err = capsys.readouterr().err
    assert "which the inspection page does not draw yet" in err and "python -m minitf.generate" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "page").exists()
