"""The BERT family (minitf.bert): every parameter's gradient of the whole models (BertModel, BertForMaskedLM,
BertForSequenceClassification; BERT's, DistilBERT's and RoBERTa's options) against float64 central differences,
on padded batches with two segments; what the embeddings compute (RoBERTa's positions, the padding rows left
without gradient, the pooler reading [CLS] only); bad input refused in one line.

Tolerance: LN_RTOL (1e-5 relative, minitf.testing): every model holds LayerNorms, steep at small d_model."""
import pytest
from hypothesis import given, settings, strategies as st

from minitf import backend
from minitf.bert import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel
from minitf.module import no_grad
from tests.helpers import LN_RTOL, assert_gradients_match, np, randomize, seeds

pytestmark = pytest.mark.usefixtures("float64")


@st.composite
def bert_configs(draw):
    """A small random BertConfig of one of the three flavours (every option drawn)."""
    flavour = draw(st.sampled_from(["bert", "distilbert", "roberta"]))
    H = draw(st.integers(1, 2))
    pad = draw(st.integers(0, 2))
    roberta = flavour == "roberta"
    return BertConfig(vocab_size=draw(st.integers(4, 9)), d_model=H * draw(st.integers(1, 3)), num_heads=H,
                      num_layers=draw(st.integers(1, 2)), d_ff=draw(st.integers(1, 5)), max_position_embeddings=12,
                      type_vocab_size={"bert": 2, "distilbert": 0, "roberta": draw(st.integers(1, 2))}[flavour],
                      activation=draw(st.sampled_from(["gelu", "gelu_tanh", "relu"])) if flavour != "roberta"
                      else "gelu", head_activation="gelu" if roberta else None, dropout=0.0, pad_token_id=pad,
                      position_offset=pad + 1 if roberta else 0, num_labels=draw(st.integers(1, 3)), flavour=flavour)


def batch(config, seed, B, L, two_segments=True):
    """(ids, token_type_ids, key_padding_mask) of B rows of at most L tokens: the real tokens first (never the pad
    id), then padding (the pad id, True in the mask; every row keeps its first token); segment 1 from a random
    split on (where the model has two segment types)."""
    rng = np.random.default_rng(seed)
    real = [t for t in range(config.vocab_size) if t != config.pad_token_id]
    ids = np.asarray(real)[rng.integers(0, len(real), (B, L))]
    lengths = rng.integers(1, L + 1, B)
    mask = np.arange(L)[None, :] >= lengths[:, None]                           # True = padding
    ids[mask] = config.pad_token_id
    split = rng.integers(0, L + 1, B)
    types = (np.arange(L)[None, :] >= split[:, None]).astype(np.int64) if two_segments else np.zeros_like(ids)
    types *= config.type_vocab_size > 1
    return ids, (types if config.type_vocab_size else None), mask


def check_whole_model(model, ids, types, mask, seed, params=None, reseed=None):
    """Every parameter's gradient (those of ``params``, default all) of the model's output against central
    differences; the inputs are not changed. Per-position outputs (B, L, ...) count at the real tokens only, as a
    loss reads them: a padding token's lookup then has no effect on the loss, the padding rows' true gradient is
    zero, which is what the tables' ``padding_idx`` gives them (Hugging Face's rule, not the derivative of the
    padded positions' own outputs)."""
    before = [None if a is None else a.copy() for a in (ids, types, mask)]
    keep = backend.asarray(~mask)

    def real(y):
        return y * keep.reshape(keep.shape + (1,) * (y.ndim - 2)) if y.ndim > 2 else y

    assert_gradients_match(lambda: real(model(ids, token_type_ids=types, key_padding_mask=backend.asarray(mask))),
                           lambda g: model.backward(real(g)), {}, dict(params or model.named_parameters()),
                           seed=seed, rtol=LN_RTOL, reseed=reseed)
    assert all(b is None and a is None or np.array_equal(a, b) for a, b in zip((ids, types, mask), before))


@settings(max_examples=12, deadline=None)
@given(config=bert_configs(), seed=seeds, B=st.integers(1, 3), L=st.integers(1, 5))
def test_masked_lm_gradient_of_every_parameter(config, seed, B, L):
    model = randomize(BertForMaskedLM(config), seed)     # random gains and biases: every term counts
    assert model.lm_head.decoder.weight is model.bert.embeddings.word_embeddings.weight   # tied
    check_whole_model(model, *batch(config, seed, B, L), seed)


@settings(max_examples=12, deadline=None)
@given(config=bert_configs(), seed=seeds, B=st.integers(1, 3), L=st.integers(1, 6), share=st.floats(0.0, 1.0))
def test_the_head_at_the_scored_positions_only_gives_the_full_heads_loss_and_every_gradient(config, seed, B, L,
                                                                                            share):
    """``model(ids, scored=...)`` (the head at the N scored positions, logits (1, N, V), as train.py trains) against
    the head at every position with -1 elsewhere: the same loss and every parameter's gradient, float64, to 1e-12
    relative (the sums run in another order); no scored position at all gives a zero gradient, not an error."""
    import minitf
    model = randomize(BertForMaskedLM(config), seed)
    ids, types, mask = batch(config, seed, B, L)
    rng = np.random.default_rng(seed + 1)
    scored = (rng.random(ids.shape) < share) & ~mask                                    # (B, L)
    targets = np.where(scored, rng.integers(0, config.vocab_size, ids.shape), -1)       # (B, L)
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    grads, losses = [], []
    for kwargs, wanted in ((dict(), targets), (dict(scored=scored), targets[scored][None])):
        model.zero_grad()
        logits = model(ids, token_type_ids=types, key_padding_mask=mask, **kwargs)
        assert logits.shape[:2] == wanted.shape
        losses.append(loss_fn(logits, wanted))
        model.backward(loss_fn.backward())
        grads.append({name: backend.to_numpy(p.grad).copy() for name, p in model.named_parameters()})
    assert np.isclose(losses[0], losses[1], rtol=1e-12, atol=0)
    for name, full in grads[0].items():
        assert np.allclose(grads[1][name], full, rtol=1e-12, atol=1e-15), name
    with pytest.raises(ValueError, match="scored must be"):
        model(ids, scored=scored[:, :-1] if L > 1 else np.ones((B, 2), dtype=bool))


@settings(max_examples=12, deadline=None)
@given(config=bert_configs(), seed=seeds, B=st.integers(1, 3), L=st.integers(1, 5))
def test_sequence_classification_gradient_of_every_parameter(config, seed, B, L):
    model = randomize(BertForSequenceClassification(config), seed)
    check_whole_model(model, *batch(config, seed, B, L), seed)


@settings(max_examples=8, deadline=None)
@given(config=bert_configs(), seed=seeds, B=st.integers(1, 3), L=st.integers(1, 5))
def test_encoder_states_gradient_of_every_parameter_but_the_unused_pooler(config, seed, B, L):
    model = randomize(BertModel(config), seed)
    params = {n: p for n, p in model.named_parameters() if not n.startswith("pooler.")}
    check_whole_model(model, *batch(config, seed, B, L), seed, params)


@pytest.mark.parametrize("model_class", [BertForMaskedLM, BertForSequenceClassification])
def test_gradients_with_dropout_in_training_mode(model_class):
    """Dropout on the embeddings, every residual branch, the attention weights (attention_dropout None: dropout's
    0.3) and before the classifier: the same masks each forward (reseeded), every parameter's gradient through
    them."""
    config = BertConfig(9, d_model=4, num_heads=2, num_layers=2, d_ff=6, max_position_embeddings=8, dropout=0.3,
                        classifier_dropout=0.5, num_labels=3)
    model = randomize(model_class(config), 5).train()
    ids, types, mask = batch(config, 5, 3, 5)
    with no_grad():
        backend.manual_seed(5)
        dropped = backend.to_numpy(model(ids, token_type_ids=types))
        assert not np.allclose(dropped, backend.to_numpy(model.eval()(ids, token_type_ids=types)))  # it drops
    check_whole_model(model.train(), ids, types, mask, 5, reseed=5)


def test_the_masked_lm_loss_reaches_every_position_through_attention_but_no_padding_row():
    """The masked-LM loss on one masked position: the pad rows of the token table (and RoBERTa's position table)
    get no gradient from their lookups; the pooler of a classifier reads position 0 only."""
    import minitf
    config = BertConfig(12, d_model=4, num_heads=2, num_layers=1, d_ff=6, max_position_embeddings=10,
                        type_vocab_size=1, pad_token_id=1, position_offset=2, flavour="roberta", dropout=0.0)
    model = randomize(BertForMaskedLM(config), 3)
    ids = np.array([[0, 5, 6, 2, 1, 1]])
    targets = np.full(ids.shape, -1)
    targets[0, 2] = 7                                                  # one masked position carries the loss
    targets[0, 4] = 3                                                  # and (carelessly) a padding position
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    model.zero_grad()
    loss_fn(model(ids, key_padding_mask=ids == 1), targets)
    model.backward(loss_fn.backward())
    tables = model.bert.embeddings
    assert not tables.position_embeddings.weight.grad[1].any()        # the padding tokens' position row
    assert tables.position_embeddings.weight.grad[2:6].any() and not tables.position_embeddings.weight.grad[6:].any()
    # the pad row's gradient is the tied decoder's only (its logits), not its lookups', even where a loss reads a
    # padding position: the same model with the lookups counted gives the row more
    word = backend.to_numpy(tables.word_embeddings.weight.grad).copy()
    tables.word_embeddings.padding_idx = None
    model.zero_grad()
    loss_fn(model(ids, key_padding_mask=ids == 1), targets)
    model.backward(loss_fn.backward())
    counted = backend.to_numpy(tables.word_embeddings.weight.grad)
    assert word[1].any() and not np.allclose(word[1], counted[1]) and np.allclose(word[2:], counted[2:])
    classifier = randomize(BertForSequenceClassification(config), 4)
    classifier.zero_grad()
    with no_grad():
        a = backend.to_numpy(classifier(ids))
        changed = ids.copy()
        changed[0, 3] = 9                                              # a later token changes position 0's state
        b = backend.to_numpy(classifier(changed))
    assert not np.allclose(a, b)


def test_roberta_positions_count_the_real_tokens_from_the_offset():
    config = BertConfig(10, d_model=2, num_heads=1, num_layers=1, d_ff=2, max_position_embeddings=8,
                        type_vocab_size=1, pad_token_id=1, position_offset=2, flavour="roberta")
    model = BertModel(config)
    _, positions, types, _ = model.inputs(np.array([[0, 4, 2, 1, 1], [0, 4, 5, 6, 2]]))
    assert backend.to_numpy(positions).tolist() == [[2, 3, 4, 1, 1], [2, 3, 4, 5, 6]]
    assert model.position_limit == 6 and backend.to_numpy(types).tolist() == [[0] * 5] * 2
    with pytest.raises(ValueError, match="ids has 7 tokens a row; the model has 6 positions"):
        model(np.zeros((1, 7), dtype=np.int64))


@pytest.mark.parametrize("call, words", [
    (lambda m: m(np.zeros((2, 9), dtype=np.int64)), "ids has 9 tokens a row; the model has 8 positions"),
    (lambda m: m(np.array([[3, 20]])), r"ids must hold ids in \[0, 20\), got values from 3 to 20"),
    (lambda m: m(np.array([[3, -1]])), r"ids must hold ids in \[0, 20\)"),
    (lambda m: m(np.array([3, 4])), r"ids must have shape \(B, L\)"),
    (lambda m: m(np.array([[3, 4]]), key_padding_mask=np.array([[False, False, True]])),
     r"key_padding_mask must be a bool array of the shape of ids \(1, 2\) \(True = padding\), got shape \(1, 3\)"),
    (lambda m: m(np.array([[3, 4]]), key_padding_mask=np.array([[0, 1]])), "key_padding_mask must be a bool array"),
    (lambda m: m(np.array([[3, 4]]), token_type_ids=np.array([[0, 2]])), r"token_type_ids must hold ids in \[0, 2\)"),
    (lambda m: m(np.array([[3, 4]]), token_type_ids=np.array([[0, 1, 1]])),
     r"token_type_ids must have the shape of ids \(1, 2\), got \(1, 3\)"),
])
def test_bad_input_is_one_clear_line(call, words):
    model = BertForMaskedLM(BertConfig(20, d_model=4, num_heads=2, num_layers=1, d_ff=4, max_position_embeddings=8))
    with pytest.raises(ValueError, match=words) as error:
        call(model)
    assert "\n" not in str(error.value)


def test_distilbert_has_no_token_types_and_refuses_nonzero_ones():
    model = BertForMaskedLM(BertConfig(20, d_model=4, num_heads=2, num_layers=1, d_ff=4, type_vocab_size=0,
                                       flavour="distilbert")).eval()
    assert model.bert.embeddings.token_type_embeddings is None
    with no_grad():
        same = model(np.array([[3, 4]]), token_type_ids=np.zeros((1, 2), dtype=np.int64))
        assert np.array_equal(backend.to_numpy(same), backend.to_numpy(model(np.array([[3, 4]]))))
    with pytest.raises(ValueError, match="this model has no token types"):
        model(np.array([[3, 4]]), token_type_ids=np.array([[0, 1]]))


@pytest.mark.parametrize("fields, words", [
    (dict(d_model=10, num_heads=4), "d_model 10 is not a multiple of num_heads 4"),
    (dict(activation="swish"), "activation must be one of"),
    (dict(pad_token_id=20), "pad_token_id 20 is not an id below vocab_size 20"),
    (dict(position_offset=1, pad_token_id=1), "position_offset 1 must lie above pad_token_id 1"),
    (dict(num_labels=2, id2label=("a",)), "id2label must name each of the 2 labels once"),
    (dict(dropout=1.0), r"dropout must be a number in \[0, 1\)"),
    (dict(attention_dropout=1.0), r"attention_dropout must be a number in \[0, 1\)"),
    (dict(flavour="albert"), "flavour must be one of bert, distilbert, roberta"),
])
def test_bad_configs_are_refused_naming_the_field(fields, words):
    with pytest.raises(ValueError, match=words):
        BertConfig(20, **(dict(d_model=8, num_heads=2) | fields))


@pytest.mark.parametrize("flavour, key", [("bert", "attention_probs_dropout_prob"), ("distilbert", "attention_dropout")])
def test_the_attention_weights_dropout_comes_from_the_folder_and_goes_back_to_it(flavour, key):
    """BERT's attention_probs_dropout_prob (DistilBERT's attention_dropout) is every layer's dropout on the
    attention weights, read from config.json and written back; not given, a BertConfig takes its dropout's."""
    from minitf.bert import hf
    assert BertConfig(20, dropout=0.2).attention_dropout == 0.2
    shape = dict(d_model=8, num_heads=2, num_layers=2, d_ff=8, dropout=0.1, flavour=flavour)
    shape |= dict(type_vocab_size=0) if flavour == "distilbert" else {}
    written = hf.hf_config_of(BertForMaskedLM(BertConfig(20, attention_dropout=0.25, **shape)), {}, "float32")
    assert written[key] == 0.25
    model = BertForMaskedLM(hf.config_from_hf(written | {key: 0.05}))
    assert model.config.attention_dropout == 0.05 and model.config.dropout == 0.1
    assert {layer.self_attn.weights_dropout.p for layer in model.bert.encoder.layers} == {0.05}


def test_a_config_goes_to_json_values_and_back():
    import json
    config = BertConfig(20, d_model=8, num_heads=2, num_labels=3, id2label=("no", "yes", "maybe"), flavour="roberta",
                        pad_token_id=1, position_offset=2, type_vocab_size=1, head_activation="gelu")
    assert BertConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ValueError, match="the BERT config must hold the fields"):
        BertConfig.from_dict(dict(config.to_dict(), extra=1))
    with pytest.raises(ValueError, match="the BERT config: id2label must name each of the 3 labels once"):
        BertConfig.from_dict(dict(config.to_dict(), id2label=["no", "no", "maybe"]))


def test_a_runs_attention_dropout_is_its_dropouts_unless_given_and_none_in_a_run_written_before_it():
    """``--model bert``: --attention-dropout not given is --dropout's (BERT's two are equal), from scratch and over
    a folder's config.json (whose own values the run's dropouts replace); a run's config.json without it (written
    before the option existed: that run computed none) reads as 0."""
    import dataclasses
    import json

    from minitf.bert import hf
    from minitf.bert.config import run_model_config
    from minitf.training.config import RunConfig
    scratch = RunConfig.from_preset("tiny", model="bert")
    folder = dataclasses.replace(scratch, bert=hf.hf_config_of(BertForMaskedLM(BertConfig(
        50, d_model=8, num_heads=2, num_layers=1, d_ff=8, dropout=0.3, attention_dropout=0.4)), {}, "float32"))
    for config in (scratch, folder):
        assert scratch.attention_dropout is None and run_model_config(config, 50).attention_dropout == config.dropout
        config = dataclasses.replace(config, attention_dropout=0.05)
        assert (run_model_config(config, 50).attention_dropout, run_model_config(config, 50).dropout) == (0.05, 0.1)
    older = {k: v for k, v in scratch.to_dict().items() if k != "attention_dropout"}
    assert RunConfig.from_dict(json.loads(json.dumps(older))).attention_dropout == 0.0
