"""Parity of minitf.bert with transformers, in float64: a small model with random weights made there (no download)
for each of BertForMaskedLM, BertForSequenceClassification, BertModel, DistilBertForMaskedLM, RobertaForMaskedLM and
RobertaForSequenceClassification, saved with ``save_pretrained`` (one file or shards) and read by minitf, gives the
same outputs and the same gradient of every parameter as PyTorch's autograd, on a padded batch with two segments;
a folder minitf writes loads there with the same outputs; a classifier from a masked-LM folder reads its encoder;
bad folders are refused in one line naming the file and the key, and a refused save writes nothing.

Tolerance: relative 1e-10 (tests/test_gpt2_parity.py's: the same float64 sums in another order agree to ~1e-15; a
wrong layout, mask or activation is O(1) off). Skipped without the ``bench`` extra."""
import json

import pytest

from minitf import backend
from minitf.bert import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel, hf as bert_hf
from minitf.module import no_grad
from tests.helpers import np, randomize, relative_difference

RTOL = 1e-10
pytestmark = [pytest.mark.usefixtures("float64"), pytest.mark.extra("torch", "bench"),
              pytest.mark.extra("transformers", "bench"), pytest.mark.extra("safetensors", "bench")]

#: (architecture, its config class, config.json values) of each model compared
CASES = {
    "BertForMaskedLM": ("BertConfig", dict(hidden_act="gelu")),
    "BertForSequenceClassification": ("BertConfig", dict(num_labels=3, hidden_act="gelu_new")),
    "BertModel": ("BertConfig", dict(hidden_act="relu")),
    "DistilBertForMaskedLM": ("DistilBertConfig", dict(dim=8, n_heads=2, n_layers=2, hidden_dim=12, dropout=0.0,
                                                      attention_dropout=0.0)),
    "RobertaForMaskedLM": ("RobertaConfig", dict(type_vocab_size=1, pad_token_id=1)),
    "RobertaForSequenceClassification": ("RobertaConfig", dict(type_vocab_size=2, pad_token_id=1, num_labels=2)),
}
SIZES = dict(hidden_size=8, num_attention_heads=2, num_hidden_layers=2, intermediate_size=12,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def hf_model(architecture, seed, vocab_size=23, max_positions=12, **changes):
    """A randomly initialised transformers model of ``architecture`` in float64 (eval mode), with random LayerNorm
    gains and biases too (every term of the gradient counts)."""
    import torch
    import transformers
    config_class, values = CASES[architecture]
    sizes = {} if config_class == "DistilBertConfig" else SIZES
    config = getattr(transformers, config_class)(vocab_size=vocab_size, max_position_embeddings=max_positions,
                                                  **(sizes | values | changes))
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).to(torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
                p.normal_(0.0, 0.5)
    return model.eval()


def padded_batch(config, seed, B=3, L=7):
    """(ids, token_type_ids or None, key_padding_mask) of a padded batch with two segments where the model has
    two token types: real tokens first (never the pad id), then the pad id."""
    rng = np.random.default_rng(seed)
    real = [t for t in range(config.vocab_size) if t != config.pad_token_id]
    ids = np.asarray(real)[rng.integers(0, len(real), (B, L))]
    lengths = np.array([L, *rng.integers(2, L + 1, B - 1)])
    mask = np.arange(L)[None, :] >= lengths[:, None]
    ids[mask] = config.pad_token_id
    types = None
    if config.type_vocab_size > 1:
        types = (np.arange(L)[None, :] >= (lengths // 2)[:, None]).astype(np.int64)
    return ids, types, mask


def outputs_of(hf, architecture, ids, types, mask):
    import torch
    kwargs = dict(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(~mask).long())
    if types is not None:
        kwargs["token_type_ids"] = torch.from_numpy(types)
    out = hf(**kwargs)
    return out.last_hidden_state if architecture.endswith("Model") else out.logits


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("architecture", list(CASES))
def test_outputs_and_every_gradient_equal_transformers(architecture, seed, tmp_path):
    import torch
    hf = hf_model(architecture, seed)
    hf.save_pretrained(tmp_path, max_shard_size="2KB" if seed else "5GB")  # seed 1: sharded
    assert (tmp_path / ("model.safetensors.index.json" if seed else "model.safetensors")).is_file()
    model = bert_hf.from_pretrained(tmp_path)
    expected_class = {"MaskedLM": BertForMaskedLM, "SequenceClassification": BertForSequenceClassification,
                      "Model": BertModel}[architecture.split("For")[-1].replace("BertModel", "Model")
                                          .replace("DistilModel", "Model")]
    assert type(model) is expected_class and model.base.embeddings.word_embeddings.weight.data.dtype == np.float64
    config = model.config
    ids, types, mask = padded_batch(config, seed)
    model.eval().zero_grad()
    ours = model(ids, token_type_ids=types, key_padding_mask=mask)
    theirs = outputs_of(hf, architecture, ids, types, mask)
    assert relative_difference(backend.to_numpy(ours), theirs.detach().numpy()) < RTOL
    G = np.random.default_rng(seed + 7).normal(size=ours.shape)
    model.backward(backend.asarray(G))
    (theirs * torch.from_numpy(G)).sum().backward()
    head = bert_hf.HEAD_OF_CLASS[type(model)]
    grads = bert_hf.minitf_to_hf_state({n: backend.to_numpy(p.grad) for n, p in model.named_parameters()}, config,
                                       head)
    named = dict(hf.named_parameters(remove_duplicate=False))
    compared = 0
    largest = max(float(np.abs(g).max()) for g in grads.values())
    for name, ours_grad in grads.items():
        theirs_grad = named[name].grad
        if theirs_grad is None:                      # BertModel's pooler: not on the path to the states
            assert head == "base" and "pooler" in name and not ours_grad.any(), name
            continue
        # a floor of 1e-3 of the largest: the key bias's gradient is 0 in exact arithmetic (rounding noise)
        assert relative_difference(ours_grad, theirs_grad.numpy(), floor=1e-3 * largest) < RTOL, name
        compared += 1
    assert compared >= len(grads) - 2
    if head == "base" and config.flavour != "distilbert":
        with no_grad():
            pooled = backend.to_numpy(model.pooler(model(ids, token_type_ids=types, key_padding_mask=mask)))
        kwargs = dict(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(~mask).long(),
                      token_type_ids=torch.from_numpy(types))
        assert relative_difference(pooled, hf(**kwargs).pooler_output.detach().numpy()) < RTOL


@pytest.mark.parametrize("architecture", ["BertForMaskedLM", "BertForSequenceClassification", "DistilBertForMaskedLM",
                                          "RobertaForMaskedLM", "RobertaForSequenceClassification", "BertModel"])
def test_a_folder_minitf_writes_loads_in_transformers_with_the_same_outputs(architecture, tmp_path):
    import transformers
    source = hf_model(architecture, 5)
    source.save_pretrained(tmp_path / "in")
    model = bert_hf.from_pretrained(tmp_path / "in")
    model = randomize(model, 11, scale=0.3).eval()                    # new numbers: nothing copied by accident
    hf_config = json.loads((tmp_path / "in" / "config.json").read_text())
    bert_hf.save_pretrained(model, tmp_path / "out", hf_config=dict(hf_config, id2label={"0": "no", "1": "yes", "2": "maybe"})
                          if architecture == "BertForSequenceClassification" else hf_config)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == [architecture] and written["dtype"] == "float64"
    import torch
    back = getattr(transformers, architecture).from_pretrained(tmp_path / "out", dtype=torch.float64,
                                                               attn_implementation="eager").eval()
    ids, types, mask = padded_batch(model.config, 5)
    with no_grad():
        ours = backend.to_numpy(model(ids, token_type_ids=types, key_padding_mask=mask))
    with torch.no_grad():
        theirs = outputs_of(back, architecture, ids, types, mask).numpy()
    assert relative_difference(ours, theirs) < RTOL
    again = bert_hf.from_pretrained(tmp_path / "out")                  # and back: the same arrays, bit for bit
    assert all(np.array_equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert again.config == model.config


def test_float16_and_bfloat16_folders_widen_exactly(tmp_path):
    import torch
    hf = hf_model("BertForMaskedLM", 2)
    for dtype, name in ((torch.float16, "f16"), (torch.bfloat16, "bf16")):
        hf.to(dtype).save_pretrained(tmp_path / name)
        low = {n: p.detach().to(torch.float64).numpy() for n, p in hf.named_parameters()}
        model = bert_hf.from_pretrained(tmp_path / name, dtype="float32")
        assert model.bert.embeddings.word_embeddings.weight.data.dtype == np.float32
        ours = bert_hf.minitf_to_hf_state(model.state_dict(), model.config, "masked_lm")
        assert all(np.array_equal(ours[n].astype(np.float64), low[n]) for n in ours)
    with pytest.raises(ValueError, match="bfloat16"):
        bert_hf.from_pretrained(tmp_path / "bf16", dtype="bfloat16")


def test_a_classifier_reads_the_encoder_of_a_masked_lm_folder_and_keeps_its_new_head(tmp_path):
    import torch
    hf = hf_model("BertForMaskedLM", 3)
    hf.save_pretrained(tmp_path)
    backend.manual_seed(4)
    model = bert_hf.from_pretrained(tmp_path, model_class=BertForSequenceClassification)
    mlm = bert_hf.from_pretrained(tmp_path, model_class=BertForMaskedLM)
    theirs = dict(hf.named_parameters())
    assert np.array_equal(backend.to_numpy(model.bert.embeddings.word_embeddings.weight.data),
                          theirs["bert.embeddings.word_embeddings.weight"].detach().numpy())
    assert model.classifier.weight.shape == (8, 2) and np.abs(backend.to_numpy(model.classifier.weight.data)).max() < 0.2
    encoder = {n: v for n, v in model.state_dict().items() if n.startswith("bert.") and "pooler" not in n}
    assert all(np.array_equal(v, mlm.state_dict()[n]) for n, v in encoder.items())
    base = bert_hf.from_pretrained(tmp_path, model_class=BertModel)                         # the encoder alone, names without bert.
    assert np.array_equal(base.state_dict()["encoder.layers.1.self_attn.w_qkv"],
                          mlm.state_dict()["bert.encoder.layers.1.self_attn.w_qkv"])
    with torch.no_grad():
        assert theirs["cls.predictions.bias"].shape == (23,)


def test_a_masked_lm_file_with_the_pretraining_heads_reads_as_bert_base_uncased_does(tmp_path):
    """bert-base-uncased's model.safetensors (BertForPreTraining's) holds the pooler, cls.seq_relationship, the tied
    decoder again, the position_ids buffer and, in older files, LayerNorm.gamma/beta: read as transformers reads it."""
    import transformers
    from safetensors.numpy import load_file, save_file
    hf_model("BertForMaskedLM", 6).save_pretrained(tmp_path)
    plain = bert_hf.from_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    rng = np.random.default_rng(0)
    weights = {name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): a
               for name, a in weights.items()}
    weights.update({"bert.pooler.dense.weight": rng.normal(size=(8, 8)), "bert.pooler.dense.bias": np.zeros(8),
                    "cls.seq_relationship.weight": rng.normal(size=(2, 8)), "cls.seq_relationship.bias": np.zeros(2),
                    "cls.predictions.decoder.weight": weights["bert.embeddings.word_embeddings.weight"],
                    "bert.embeddings.position_ids": np.arange(12)[None]})
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    again = bert_hf.from_pretrained(tmp_path)
    assert all(np.array_equal(a, b) for a, b in zip(plain.state_dict().values(), again.state_dict().values()))
    assert transformers.BertForMaskedLM.from_pretrained(tmp_path) is not None   # transformers reads it too
    weights["cls.predictions.decoder.weight"] = weights["cls.predictions.decoder.weight"] + 1.0
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="cls.predictions.decoder.weight differs from "
                                         "bert.embeddings.word_embeddings.weight"):
        bert_hf.from_pretrained(tmp_path)


def edit_config(folder, **changes):
    path = folder / "config.json"
    values = json.loads(path.read_text())
    values.update(changes)
    for key, value in changes.items():
        if value is None:
            values.pop(key)
    path.write_text(json.dumps(values))


@pytest.mark.parametrize("architecture, changes, words", [
    ("BertForMaskedLM", dict(position_embedding_type="relative_key"), "position_embedding_type is 'relative_key'"),
    ("BertForMaskedLM", dict(hidden_act="quick_gelu"), "hidden_act is 'quick_gelu'"),
    ("BertForMaskedLM", dict(hidden_size=9), "hidden_size 9 is not a multiple of num_attention_heads 2"),
    ("DistilBertForMaskedLM", dict(n_heads=3), "dim 8 is not a multiple of n_heads 3"),
    ("BertForMaskedLM", dict(num_hidden_layers=9), "declares num_hidden_layers 9, but the weights hold 2"),
    ("BertForMaskedLM", dict(vocab_size=None), "has no 'vocab_size'"),
    ("BertForMaskedLM", dict(is_decoder=True), "is_decoder is true"),
    ("BertForMaskedLM", dict(architectures=["BertForQuestionAnswering"]), "architectures is"),
    ("BertForMaskedLM", dict(tie_word_embeddings=False), "tie_word_embeddings is false"),
    ("BertForSequenceClassification", dict(id2label={"0": "a", "2": "b"}), "id2label's ids are"),
    ("BertForSequenceClassification", dict(problem_type="multi_label_classification"), "problem_type is"),
    ("DistilBertForMaskedLM", dict(sinusoidal_pos_embds=True), "sinusoidal_pos_embds is true"),
    ("RobertaForMaskedLM", dict(max_position_embeddings=2), "max_position_embeddings is 2; it must be at least 3"),
    ("RobertaForMaskedLM", dict(type_vocab_size=2), r"roberta.embeddings.token_type_embeddings.weight \(1, 8\)"),
])
def test_bad_folders_are_refused_in_one_line_naming_the_file_and_the_key(architecture, changes, words, tmp_path):
    hf_model(architecture, 0).save_pretrained(tmp_path)
    edit_config(tmp_path, **changes)
    with pytest.raises(ValueError, match=words) as error:
        bert_hf.from_pretrained(tmp_path)
    assert "\n" not in str(error.value) and str(tmp_path) in str(error.value)


def test_a_refused_save_writes_nothing(tmp_path):
    config = BertConfig(20, d_model=4, num_heads=2, num_layers=1, d_ff=4, type_vocab_size=0, flavour="distilbert",
                        num_labels=2)
    with pytest.raises(ValueError, match="no Hugging Face folder holds this model"):
        bert_hf.save_pretrained(BertForSequenceClassification(config), tmp_path / "out")
    model = BertForMaskedLM(config.replace(flavour="bert", type_vocab_size=2))
    model.lm_head.decoder.bias.data[3] = np.nan
    with pytest.raises(ValueError, match="holds 1 NaN"):
        bert_hf.save_pretrained(model, tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
