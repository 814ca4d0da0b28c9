"""The study tools on a BERT-family encoder: ``python -m minitf.trace --model bert [--walk]`` (a one-layer masked LM,
its walk made of the real gradients, each step naming its line), ``--checkpoint BERTFOLDER --text "... [MASK] ..."``
(each mask scored on the model's own most probable token), the refusals."""
import re

import pytest

from minitf import backend, kinds, trace
from minitf.backend import default_dtype
from minitf.backend import host as np
from minitf.study import walk
from tests.test_trace import analytic_and_numeric, printed_places, upstream_gradients_checked, walk_output


def bert_loss(model):
    """The BERT example's masked-LM loss, recomputed from scratch (no tracer)."""
    import minitf
    from minitf.bert import study
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    with minitf.no_grad():
        return loss_fn(model(np.array(study.IDS), token_type_ids=np.array(study.TYPES)), np.array(study.TARGETS))


@pytest.fixture(scope="module")
def traced_bert():
    with default_dtype("float64"):
        return kinds.get("bert").trace_example().run()


def test_the_bert_walk_is_made_of_the_real_gradients(traced_bert):
    """Every upstream gradient the example records and every parameter's gradient agree with central differences;
    dlogits is zero but at the masked position; below the attention the [CLS] position's gradient is not (both
    directions); the word table's two tied uses add up to its gradient."""
    tracer, model, _ = traced_bert
    assert upstream_gradients_checked(tracer, model, bert_loss) >= 15
    analytic, numeric = analytic_and_numeric(model, bert_loss)
    assert np.abs(analytic).max() > 1e-3 and np.abs(analytic - numeric).max() <= 1e-6 * np.abs(numeric).max() + 1e-8
    steps = [s for s in kinds.get("bert").walk(tracer, model).steps if not isinstance(s, str)]

    def by(start):
        found = [s for s in steps if s.label.startswith(start)]
        assert len(found) == 1, start
        return found[0]

    dlogits = steps[0].array
    assert np.abs(dlogits[0, [0, 2, 3]]).max() == 0 and np.abs(dlogits[0, 1]).max() > 0
    ff_out = by("bert.encoder.layers.0.ff_block: dx = dx_").array
    attention_in = by("bert.encoder.layers.0.attn_block: dx = dx_").array
    assert np.abs(ff_out[0, 0]).max() == 0 and np.abs(attention_in[0, 0]).max() > 1e-4
    word = backend.to_numpy(model.bert.embeddings.word_embeddings.weight.grad)
    np.testing.assert_allclose(steps[-1].array, word, rtol=1e-12)
    np.testing.assert_allclose(by("lm_head.decoder: E.grad +").array
                               + by("bert.embeddings.word_embeddings: E.grad[id").array, word, rtol=1e-12)


def test_trace_prints_the_bert_walk_with_its_lines():
    text = walk_output("--model", "bert")
    assert len(printed_places(text)) == 17
    assert "both directions" in text and "token_type_embeddings" in text


def test_every_step_of_a_two_layer_bert_walk_names_its_line():
    from minitf.bert import study
    from minitf.bert.model import BertConfig, BertForMaskedLM
    with default_dtype("float64"):
        model = BertForMaskedLM(BertConfig(**dict(study.TRACE_CONFIG, num_layers=2)))
        tracer, model, _ = study.run_masked(model, study.IDS, study.TARGETS, study.TYPES)
    steps = [s for s in kinds.get("bert").walk(tracer, model).steps if not isinstance(s, str)]
    assert len(steps) == 6 + 7 * 2 + 5
    for step in steps[:-1]:
        assert step.code is not None and walk.source_line(*step.code)
    assert steps[-1].code is None


@pytest.mark.extra("torch", "bench")
@pytest.mark.extra("transformers", "bench")
@pytest.mark.extra("safetensors", "bench")
def test_trace_of_a_bert_folder_scores_each_mask_on_its_own_top_candidate(tmp_path, capsys):
    """trace --checkpoint FOLDER --text: the ids are the text's with [CLS] and [SEP]; the one mask is scored on the
    token fill_mask puts there first, the other positions on nothing; the loss and every gradient are a plain
    float64 forward and backward's; a text without [MASK] is one line."""
    import minitf
    from minitf.bert.fill_mask import main as fill_mask
    from tests.test_bert_classify_train import make_folder
    folder = make_folder(tmp_path / "folder")
    text = "the [MASK] sees a dog"
    capsys.readouterr()
    assert trace.main(["--checkpoint", str(folder), "--text", text]) == 0
    out = capsys.readouterr().out
    assert out.startswith("trace: BERT masked LM") and "forward bert.encoder.layers.1.self_attn" in out
    header = out.splitlines()[2]
    ids = eval(re.search(r"ids (\[\[.*?\]\])", header).group(1))[0]
    targets = eval(re.search(r"targets (\[\[.*?\]\])", header).group(1))[0]
    loaded = minitf.load(folder)
    assert ids == list(loaded.tokenizer.encode(text)[0])
    assert targets[2] != -1 and targets.count(-1) == len(targets) - 1
    assert fill_mask(["--checkpoint", str(folder), "--text", text, "--top-k", "1"]) == 0
    assert loaded.tokenizer.tokens([targets[2]])[0] == capsys.readouterr().out.splitlines()[0].split()[1]
    model = loaded.model
    with default_dtype("float64"):
        for p in model.parameters():
            p.data, p.grad = p.data.astype(np.float64), np.zeros(p.data.shape)
        loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
        loss = loss_fn(model(np.array([ids])), np.array([targets]))
        model.backward(loss_fn.backward())
        tracer, traced, traced_loss = trace.loaded_example(folder, text).run()
    assert float(re.search(r"; loss (\S+)$", header).group(1)) == pytest.approx(loss, abs=1e-6)
    assert traced_loss == pytest.approx(loss, rel=1e-12)
    theirs = dict(traced.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(backend.to_numpy(theirs[name].grad), backend.to_numpy(p.grad), rtol=1e-10,
                                   atol=1e-14, err_msg=name)
    assert trace.main(["--checkpoint", str(folder), "--text", "the cat sees a dog"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "has no [MASK]" in err[0] and captured.out == ""


def test_the_encoder_page_numbers_are_the_models_own():
    """numbers.encoder on a two-layer masked LM (its kind's parts): each layer's attention is what its attention keeps,
    in both directions (no zero above the diagonal); the loss is the masks' cross-entropy alone; the gradient per
    input token is what reaches the word embedding's backward, non-zero at every position."""
    import minitf
    from minitf.bert.model import BertConfig, BertForMaskedLM
    from minitf.study.inspection import numbers, page
    with default_dtype("float64"):
        minitf.manual_seed(4)
        model = BertForMaskedLM(BertConfig(vocab_size=12, d_model=16, num_heads=2, num_layers=2, d_ff=24,
                                           max_position_embeddings=8)).eval()
        ids, targets = np.array([1, 5, 3, 7, 2]), np.array([-1, -1, 9, -1, -1])
        inspection = numbers.encoder(model, ids, targets, parts=kinds.get("bert").page_parts(model))
        with minitf.no_grad():
            logits = backend.to_numpy(model(ids[None]))[0]
    (name, weights), = inspection.attention.items()
    assert name == "self-attention (both directions)" and weights.shape == (2, 2, 5, 5)
    above = np.triu_indices(5, 1)  # the keys after each query: a causal mask would zero them
    assert weights[..., above[0], above[1]].min() > 0 and np.allclose(weights.sum(-1), 1)
    z = logits[2] - logits[2].max()
    assert inspection.loss == pytest.approx(np.log(np.exp(z).sum()) - z[9], rel=1e-10) and inspection.num_tokens == 1
    assert np.isnan(inspection.probability[[0, 1, 3, 4]]).all()
    assert inspection.embedding_grad.shape == (5,) and inspection.embedding_grad.min() > 0
    data = page.example_data(inspection, "t", ids, lambda i: f"t{i}", masked=True)
    assert data["masked"] and data["embedding_grad"]["note"] is None and data["attention"][0]["causal"] is False
    assert [s["label"] for s in data["walk"] if "label" in s][0].startswith("loss: dlogits")


@pytest.mark.extra("torch", "bench")
@pytest.mark.extra("transformers", "bench")
@pytest.mark.extra("safetensors", "bench")
def test_inspect_draws_a_bert_folder_on_a_text_with_a_mask(tmp_path, capsys):
    """python -m minitf.inspect --checkpoint BERTFOLDER --text '... [MASK] ...': the page's example is the encoder's
    (its pieces, the mask's top candidates, the walk from the loss to the tables); a text without [MASK] is one line
    and writes no page."""
    from minitf.inspect import main as inspect_main
    from minitf.study.inspection import page
    from tests.test_bert_classify_train import make_folder
    folder = make_folder(tmp_path / "folder")
    out = tmp_path / "page.html"
    capsys.readouterr()
    assert inspect_main(["--checkpoint", str(folder), "--text", "the [MASK] sees a dog", "--out", str(out)]) == 0
    data = page.read_data(out.read_text(encoding="utf-8"))
    assert data["model"]["kind"] == "encoder" and data["title"].startswith("minitf inspect: BERT")
    (example,) = data["examples"]
    assert example["masked"] and example["input"] == ["[CLS]", "the", "[MASK]", "sees", "a", "dog", "[SEP]"]
    scored = [i for i, p in enumerate(example["predicted"]) if p is not None]
    assert scored == [2] and example["top"][2][0][0] == example["predicted"][2]
    assert example["probability"][2] == pytest.approx(example["top"][2][0][1], rel=1e-6)
    assert len(example["embedding_grad"]["norms"]) == 7
    bad = tmp_path / "bad.html"
    assert inspect_main(["--checkpoint", str(folder), "--text", "the cat sees a dog", "--out", str(bad)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no [MASK]" in err[0] and not bad.exists()
