"""The decoder-only GPT (minitf/gpt.py) and its new layers: GELU (exact and tanh), the learned
positional embedding, erf, the whole model's gradient with the next-token loss, causality,
GPT-2's initialisation, and sampling with the key/value cache against full recomputation.

Tolerances as in tests/test_transformer.py: rtol 1e-6 for a layer without LayerNorm, 1e-5
(LN_RTOL) with one inside; a wrong backward is off by O(1)."""
import json
import math
import re

import pytest
from hypothesis import given, settings, strategies as st

import minitf
from minitf import backend
from minitf.backend import xp
from minitf.gpt import GPT
from minitf.lm import gpt2
from minitf.sampling import choose_tokens, generate
from minitf.layers import GELU, LearnedPositionalEmbedding
from minitf.transformer import FeedForward
from tests.helpers import assert_gradients_match, np, random_array, randomize, seeds, small

pytestmark = pytest.mark.usefixtures("float64")
LN_RTOL = 1e-5


# --------------------------------------------------------------------------- #
# erf and GELU
# --------------------------------------------------------------------------- #
def test_erf_equals_math_erf_to_float64_rounding():
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-9, 9, 20001), rng.normal(0, 2, 20000), [0.0, 1.0, -1.0, 8.0, 5e-324, -27.5]])
    ours = backend.to_numpy(backend.erf(backend.asarray(x)))
    exact = np.array([math.erf(v) for v in x])
    # relative error within 4 units in the last place: the rational approximations' own error
    assert (np.abs(ours - exact) <= 4 * np.finfo(np.float64).eps * np.abs(exact) + 1e-300).all()
    edges = backend.to_numpy(backend.erf(backend.asarray(np.array([1e300, -np.inf, np.inf, np.nan]))))
    assert edges[:3].tolist() == [1.0, -1.0, 1.0] and np.isnan(edges[3])
    for dtype in (np.float32, np.float16):  # the input's dtype is kept, and stays accurate to its own rounding
        low = backend.to_numpy(backend.erf(backend.asarray(x[:20001].astype(dtype))))
        assert low.dtype == dtype
        assert np.abs(low - np.array([math.erf(v) for v in x[:20001].astype(dtype)])).max() <= 2 * np.finfo(dtype).eps


@given(B=small, L=small, D=small, seed=seeds, scale=st.floats(0.1, 5), approximate=st.sampled_from(["none", "tanh"]))
def test_gelu_gradients(B, L, D, seed, scale, approximate):
    layer = GELU(approximate)
    assert_gradients_match(layer, random_array(seed, (B, L, D), scale), seed=seed)


def test_gelu_is_x_times_the_normal_cdf_and_tanh_is_gpt2s_approximation():
    x = np.linspace(-6, 6, 1201)
    exact = backend.to_numpy(GELU().forward(backend.asarray(x)))
    tanh = backend.to_numpy(GELU("tanh").forward(backend.asarray(x)))
    # atol: for x << 0, 1 + erf(x / sqrt 2) cancels, in this formula as in the layer
    assert np.allclose(exact, [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x], rtol=1e-14, atol=1e-15)
    gpt2 = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))  # Hugging Face's gelu_new
    assert np.allclose(tanh, gpt2, rtol=1e-14, atol=1e-15)
    assert 1e-4 < np.abs(exact - tanh).max() < 1e-3  # close, but two functions
    with pytest.raises(ValueError, match="'none' or 'tanh'"):
        GELU("fast")


@given(B=small, L=small, D=small, F=small, seed=seeds, activation=st.sampled_from(["gelu", "gelu_tanh"]))
def test_feed_forward_with_gelu_gradients(B, L, D, F, seed, activation):
    ff = randomize(FeedForward(D, F, activation), seed)
    assert isinstance(ff.activation, GELU)
    assert_gradients_match(ff, random_array(seed, (B, L, D)), seed=seed)


# --------------------------------------------------------------------------- #
# learned positions
# --------------------------------------------------------------------------- #
@given(B=small, L=small, D=small, extra=st.integers(0, 3), data=st.data(), seed=seeds)
def test_learned_positional_embedding_gradients(B, L, D, extra, data, seed):
    layer = randomize(LearnedPositionalEmbedding(L + extra, D), seed)
    start = data.draw(st.integers(0, extra))  # a slice anywhere in the table (the cache's later steps)
    assert_gradients_match(layer, random_array(seed, (B, L, D)), seed=seed, start=start)


def test_learned_positions_add_their_rows_and_refuse_positions_beyond_the_table():
    layer = LearnedPositionalEmbedding(5, 3)
    table = backend.to_numpy(layer.weight.data)
    x = random_array(1, (2, 2, 3))
    assert np.array_equal(backend.to_numpy(layer.forward(x, start=3)), backend.to_numpy(x) + table[3:5])
    layer.backward(random_array(2, (2, 2, 3)))
    assert not backend.to_numpy(layer.weight.grad)[:3].any()  # rows not read get no gradient
    with pytest.raises(ValueError, match=r"positions 4\.\.5 asked of a learned table of 5 positions"):
        layer.forward(x, start=4)


# --------------------------------------------------------------------------- #
# the whole GPT
# --------------------------------------------------------------------------- #
@st.composite
def gpt_and_ids(draw, max_layers=2):
    """A randomly configured GPT (every option drawn) and a batch of token ids (B, L + 1)."""
    H = draw(st.integers(1, 2))
    D = H * draw(st.integers(2 if H == 1 else 1, 3))
    L = draw(st.integers(1, 4))
    config = dict(vocab_size=draw(st.integers(2, 7)), max_len=L + draw(st.integers(0, 2)), d_model=D, num_heads=H,
                  num_layers=draw(st.integers(1, max_layers)), d_ff=draw(st.integers(1, 5)),
                  dropout=draw(st.sampled_from([0.0, 0.3])), attention_dropout=draw(st.sampled_from([0.0, 0.3])),
                  pre_norm=draw(st.booleans()),
                  activation=draw(st.sampled_from(["relu", "gelu", "gelu_tanh"])),
                  positions=draw(st.sampled_from(["learned", "sinusoidal"])), scale_embedding=draw(st.booleans()),
                  init=draw(st.sampled_from(["gpt2", "normal", "xavier"])), tie_embeddings=draw(st.booleans()))
    seed = draw(seeds)
    ids = np.random.default_rng(seed).integers(0, config["vocab_size"], (draw(st.integers(1, 3)), L + 1))
    return config, ids, seed


def next_token_loss():
    """The causal language-model loss: the target of position t is token t + 1 (no smoothing, no
    padding: ignore_index -1 is no token id)."""
    return minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)


@settings(max_examples=15)
@given(case=gpt_and_ids())
def test_whole_gpt_gradient_of_the_next_token_loss(case):
    """Every entry of every parameter's gradient against central differences of the loss, through
    a random upstream gradient of the scalar loss; the token ids are not changed."""
    config, ids, seed = case
    backend.manual_seed(seed)
    model = randomize(GPT(**config), seed)  # random gains, biases: every term counts, no ReLU kink at 0
    loss_fn, before = next_token_loss(), ids.copy()
    inputs, targets = ids[:, :-1], ids[:, 1:]  # the shift: position t predicts token t + 1
    assert_gradients_match(lambda: backend.asarray(loss_fn(model(inputs), targets)),
                           lambda g: model.backward(loss_fn.backward(float(g))), {},
                           dict(model.named_parameters()), seed=seed, reseed=seed, rtol=LN_RTOL)
    assert np.array_equal(ids, before)


@given(case=gpt_and_ids())
def test_gpt_causality_changing_token_t_changes_no_earlier_output(case):
    config, ids, seed = case
    backend.manual_seed(seed)
    model = randomize(GPT(**config), seed).eval()
    t = int(np.random.default_rng(seed).integers(0, ids.shape[1]))
    changed = ids.copy()
    changed[:, t] = (changed[:, t] + 1) % config["vocab_size"]  # another token at t
    ids, changed = ids[:, :config["max_len"]], changed[:, :config["max_len"]]
    with minitf.no_grad():
        a, b = backend.to_numpy(model(ids)), backend.to_numpy(model(changed))
    assert np.array_equal(a[:, :t], b[:, :t])  # bit for bit: nothing before t reads token t


def test_gpt2_initialisation_scales_the_residual_projections():
    """normal(0, 0.02) everywhere, 0.02 / sqrt(2 x layers) for attention's W^O and the second
    feed-forward linear (GPT-2 section 2.3); biases 0, gains 1. 'normal' (GPT-1) does not scale."""
    N, D = 3, 64
    model = GPT(100, max_len=64, d_model=D, num_heads=4, num_layers=N, d_ff=4 * D)
    std = {name: float(backend.to_numpy(p.data).std()) for name, p in model.named_parameters()}
    for name, value in std.items():
        if name.endswith(("self_attn.w_o", "feed_forward.linear2.weight")):
            assert abs(value / (0.02 / math.sqrt(2 * N)) - 1) < 0.05, (name, value)
        elif name.endswith(("bias", "beta", "b_qkv", "b_o")):
            assert value == 0 and not backend.to_numpy(dict(model.named_parameters())[name].data).any(), name
        elif name.endswith("gamma"):
            assert value == 0 and (backend.to_numpy(dict(model.named_parameters())[name].data) == 1).all(), name
        else:
            assert abs(value / 0.02 - 1) < 0.05, (name, value)
    gpt1 = GPT.preset("gpt1", 100, max_len=64, d_model=D, num_heads=4, num_layers=N, d_ff=4 * D)
    assert abs(float(backend.to_numpy(gpt1.decoder.layers[0].self_attn.w_o.data).std()) / 0.02 - 1) < 0.05
    assert gpt1.decoder.final_norm is None and model.decoder.final_norm is not None  # post-LN vs pre-LN
    assert model.generator.weight is model.embed.weight  # tied


def test_config_dataclass_and_presets_build_the_models_they_describe():
    config = minitf.GPTConfig(vocab_size=9, max_len=5, d_model=4, num_heads=2, num_layers=1, d_ff=6)
    assert GPT.from_config(config).config == config  # GPTConfig's defaults are GPT's
    paper = GPT.preset("paper", 9, max_len=5, d_model=4, num_heads=2, num_layers=1, d_ff=6)
    assert isinstance(paper.positional, minitf.PositionalEncoding) and paper.embed.scale == 2.0
    assert isinstance(paper.decoder.layers[0].feed_forward.activation, minitf.ReLU)
    assert paper.decoder.layers[0].cross_attn is None and paper.decoder.final_norm is None
    with pytest.raises(ValueError, match="preset must be one of paper, gpt1, gpt2"):
        GPT.preset("gpt3", 9)


@pytest.mark.parametrize("kwargs, message", [
    (dict(vocab_size=0), "vocab_size must be a positive integer"),
    (dict(vocab_size=5, d_model=6, num_heads=4), "divisible by num_heads"),
    (dict(vocab_size=5, activation="swish"), "activation must be one of relu, gelu, gelu_tanh"),
    (dict(vocab_size=5, positions="rotary"), "positions must be one of learned, sinusoidal"),
    (dict(vocab_size=5, init="he"), "init must be one of gpt2, normal, xavier"),
])
def test_bad_gpt_config_gives_clear_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GPT(**({"max_len": 4, "d_model": 4, "num_heads": 2, "num_layers": 1, "d_ff": 4} | kwargs))


def test_an_unknown_option_is_one_line_naming_the_options():
    with pytest.raises(TypeError, match=r"GPT has no option 'eps'; give GPTConfig's fields only: max_len, d_model"):
        GPT(5, max_len=4, d_model=4, num_heads=2, num_layers=1, d_ff=4, eps=1e-6)


def test_bad_ids_give_clear_value_errors():
    model = GPT(5, max_len=4, d_model=4, num_heads=2, num_layers=1, d_ff=4)
    with pytest.raises(ValueError, match=r"ids must hold ids in \[0, 5\)"):
        model(np.array([[1, 5]]))
    with pytest.raises(ValueError, match=r"positions 0\.\.4 asked of a learned table of 4 positions"):
        model(np.array([[1, 2, 3, 4, 0]]))


# --------------------------------------------------------------------------- #
# sampling with the key/value cache
# --------------------------------------------------------------------------- #
@settings(max_examples=20)
@given(case=gpt_and_ids(), new=st.integers(1, 6), temperature=st.sampled_from([0.0, 0.7, 1.0, 2.0]),
       top_k=st.none() | st.integers(1, 4), top_p=st.none() | st.floats(0.05, 1.0))
def test_cached_generation_logits_equal_a_full_recomputation_at_every_step(case, new, temperature, top_k, top_p):
    config, ids, seed = case
    config = config | {"max_len": ids.shape[1] + new}
    backend.manual_seed(seed)
    model = randomize(GPT(**config), seed)  # left in training mode: generate must switch dropout off
    prompt = ids
    out, step_logits = generate(model, prompt, new, temperature, top_k, top_p, seed=seed, return_logits=True)
    assert out.shape == (ids.shape[0], ids.shape[1] + new) and np.array_equal(out[:, :ids.shape[1]], prompt)
    assert model.training  # the mode is restored
    with minitf.no_grad():
        full = backend.to_numpy(model.eval()(out[:, :-1]))  # every position at once, no cache
    # step s chose token L + s from the logits at position L - 1 + s
    assert np.allclose(step_logits, full[:, ids.shape[1] - 1:], rtol=1e-12, atol=1e-12)
    again = generate(model, prompt, new, temperature, top_k, top_p, seed=seed)
    assert np.array_equal(out, again)  # the seed fixes the draws


def test_choose_tokens_respects_greedy_top_k_and_top_p():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, (500, 8))
    greedy = logits.argmax(axis=-1)
    assert np.array_equal(choose_tokens(logits, 0.0), greedy)
    assert np.array_equal(choose_tokens(logits, 1.0, top_k=1, rng=rng), greedy)
    assert np.array_equal(choose_tokens(logits, 1.0, top_p=1e-9, rng=rng), greedy)  # the nucleus keeps the top token
    top3 = np.argsort(-logits, axis=-1)[:, :3]
    drawn = choose_tokens(logits, 1.5, top_k=3, rng=rng)
    assert (top3 == drawn[:, None]).any(axis=-1).all() and len(set(drawn.tolist())) > 3
    # one row drawn many times: the frequencies follow softmax(z / T) (10,000 draws: std < 0.005)
    row = np.repeat(np.array([[2.0, 1.0, 0.0, -1.0]]), 10000, axis=0)
    counts = np.bincount(choose_tokens(row, 2.0, rng=rng), minlength=4) / 10000
    expected = np.exp(row[0] / 2) / np.exp(row[0] / 2).sum()
    assert np.abs(counts - expected).max() < 0.025, (counts, expected)
    # top_p 0.5 keeps the smallest most-likely set whose mass reaches 0.5: tokens 0 (0.475) and 1 (0.288)
    nucleus = choose_tokens(row, 2.0, top_p=0.5, rng=rng)
    assert set(nucleus.tolist()) == {0, 1}


def test_generation_stops_at_eos_and_refuses_more_positions_than_the_table_has():
    backend.manual_seed(0)
    model = GPT(6, max_len=8, d_model=4, num_heads=2, num_layers=1, d_ff=4)
    prompt = np.array([[1, 2], [3, 4]])
    greedy = generate(model, prompt, 4, temperature=0)
    eos = int(greedy[0, 2])  # the first row's first new token
    stopped = generate(model, prompt, 4, temperature=0, eos_id=eos)
    assert (stopped[0, 2:] == eos).all()  # a finished row repeats eos
    assert stopped.shape[1] == 6 or (stopped[1, 2:] == eos).any()
    assert generate(model, prompt, 7, temperature=0).shape == (2, 9)  # 8 positions fed: the table's all
    with pytest.raises(ValueError, match="ask for at most 7 new tokens"):
        generate(model, prompt, 8, temperature=0)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        generate(model, prompt, 2, temperature=-1)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        generate(model, prompt, 2, top_p=0)


def test_non_finite_logits_reach_no_sampler_in_generation_or_translation():
    """Logits holding NaN or infinity (damaged weights, an overflow) stop sampling, greedy decoding and beam
    search with a FloatingPointError naming the step (before: the sampler chose id 0 from NaN, over and over)."""
    from minitf.nmt.decode import beam_search, greedy_decode
    backend.manual_seed(0)
    model = GPT(6, max_len=8, d_model=4, num_heads=2, num_layers=1, d_ff=4)
    for bad in (np.nan, np.inf):
        model.decoder.final_norm.gamma.data[0] = bad
        for temperature in (0, 1.0):
            with pytest.raises(FloatingPointError, match="generation: the model's logits for new token 1 hold NaN "
                                                         "or infinity"):
                generate(model, np.array([[1, 2]]), 3, temperature=temperature, seed=0)
    translation = minitf.Transformer(7, 7, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                                     d_ff=16)
    dict(translation.named_parameters())["decoder.layers.0.feed_forward.linear2.bias"].data[0] = np.nan
    for decode in (greedy_decode, beam_search):
        with pytest.raises(FloatingPointError, match="translation: the model's logits for new token 1 hold NaN"):
            decode(translation, np.array([[4, 5, 3]]), max_len=4)


# --------------------------------------------------------------------------- #
# Hugging Face GPT-2 folders (safetensors only; tests/test_gpt2_parity.py compares with transformers)
# --------------------------------------------------------------------------- #
def small_gpt2(seed=0, **options):
    backend.manual_seed(seed)
    return randomize(GPT.preset("gpt2", 11, **({"max_len": 6, "d_model": 4, "num_heads": 2, "num_layers": 2,
                                                "d_ff": 8} | options)), seed)


@pytest.mark.extra("safetensors", "hf")
@pytest.mark.parametrize("options", [{}, {"tie_embeddings": False, "activation": "relu"}])
def test_save_pretrained_then_from_pretrained_gives_the_same_model(tmp_path, options):
    model = small_gpt2(**options)
    gpt2.save_pretrained(model, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors"]  # no temp files
    back = gpt2.from_pretrained(tmp_path / "out")
    assert back.config == model.config
    before, after = model.state_dict(), back.state_dict()
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
    ids = np.array([[1, 2, 3, 10]])
    with minitf.no_grad():
        assert np.array_equal(backend.to_numpy(model.eval()(ids)), backend.to_numpy(back.eval()(ids)))
    with backend.default_dtype("float32"):  # a dtype of the caller's choice
        assert gpt2.from_pretrained(tmp_path / "out").embed.weight.data.dtype == np.float32


@pytest.mark.extra("safetensors", "hf")
def test_save_pretrained_refuses_a_model_gpt2_cannot_describe(tmp_path, monkeypatch):
    for preset in ("paper", "gpt1"):
        model = GPT.preset(preset, 11, max_len=6, d_model=4, num_heads=2, num_layers=1, d_ff=8)
        with pytest.raises(ValueError, match="a Hugging Face GPT-2 folder cannot hold this model: it has post-LN"):
            gpt2.save_pretrained(model, tmp_path / preset)
        assert not (tmp_path / preset).exists()
    model = GPT.preset("gpt2", 11, max_len=6, d_model=4, num_heads=2, num_layers=1, d_ff=8, activation="silu")
    gpt2.save_pretrained(model, tmp_path / "silu")  # one table of Hugging Face names for every format: "swish"
    assert json.loads((tmp_path / "silu" / "config.json").read_text())["activation_function"] == "swish"
    assert gpt2.from_pretrained(tmp_path / "silu").config.activation == "silu"
    monkeypatch.delitem(gpt2.HF_NAME_OF_ACTIVATION, "silu")  # an activation the table has no name for
    with pytest.raises(ValueError, match="cannot hold this model: it has the 'silu' activation"):
        gpt2.save_pretrained(model, tmp_path / "unnamed")
    assert not (tmp_path / "unnamed").exists()


@pytest.mark.extra("safetensors", "hf")
def test_from_pretrained_names_what_does_not_fit(tmp_path):
    import json

    import safetensors.numpy as safetensors_numpy
    folder = tmp_path / "gpt2"
    gpt2.save_pretrained(small_gpt2(), folder)
    config = json.loads((folder / "config.json").read_text())
    with pytest.raises(ValueError, match="is not a folder"):
        gpt2.from_pretrained(tmp_path / "nowhere")
    for change, message in [({"model_type": "bert"}, "model_type 'bert', not 'gpt2'"),
                            ({"activation_function": "quick_gelu"}, "activation_function 'quick_gelu'"),
                            ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True"),
                            ({"n_embd": 6}, r"wrong shape for its config.json: transformer.wte.weight \(11, 4\) "
                                            r"\(expected \(11, 6\)\)")]:
        (folder / "config.json").write_text(json.dumps(config | change))
        with pytest.raises(ValueError, match=message):
            gpt2.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config))
    weights = safetensors_numpy.load_file(str(folder / "model.safetensors"))
    weights["transformer.h.0.attn.bias"] = np.tril(np.ones((1, 1, 6, 6)))  # older files' mask buffer: left out
    weights["transformer.h.0.mlp.extra"] = weights.pop("transformer.h.0.mlp.c_fc.bias")
    safetensors_numpy.save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing \['h.0.mlp.c_fc.bias'\]; not GPT-2 parameters \['h.0.mlp.extra'\]"):
        gpt2.from_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"\x08" + bytes(20))  # damaged: a header cut short
    with pytest.raises(ValueError, match="model.safetensors is not a readable safetensors file"):
        gpt2.from_pretrained(folder)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="has no model.safetensors.*not read.*: it is a pickle"):
        gpt2.from_pretrained(folder)


def _gpt2_folder(tmp_path, change=None, drop=(), weights=None):
    """A small GPT-2 folder with ``change`` merged into its config.json, keys ``drop`` left out and
    ``weights(dict)`` applied to its tensors."""
    import json

    import safetensors.numpy as safetensors_numpy
    folder = tmp_path / "gpt2"
    gpt2.save_pretrained(small_gpt2(), folder)
    config = json.loads((folder / "config.json").read_text()) | (change or {})
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k not in drop}))
    if weights is not None:
        tensors = safetensors_numpy.load_file(str(folder / "model.safetensors"))
        weights(tensors)
        safetensors_numpy.save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.extra("safetensors", "hf")
@pytest.mark.parametrize("key", ["vocab_size", "n_positions", "n_embd", "n_head", "n_layer"])
def test_from_pretrained_names_a_missing_key_the_model_needs(tmp_path, key):
    """Before: GPT-2 small's default filled it in and the weights were blamed with a list of shapes."""
    with pytest.raises(ValueError, match=f"config.json has no '{key}', which the model needs; add it"):
        gpt2.from_pretrained(_gpt2_folder(tmp_path, drop=[key]))


@pytest.mark.extra("safetensors", "hf")
def test_a_folders_attn_pdrop_drops_attention_weights_and_is_written_back(tmp_path):
    """attn_pdrop is the dropout on every layer's attention weights (resid_pdrop the other one); saving writes
    each back where it was read. A GPT from scratch has none (attention_dropout 0: no run changes)."""
    import json
    model = gpt2.from_pretrained(_gpt2_folder(tmp_path, {"attn_pdrop": 0.25, "resid_pdrop": 0.05}))
    assert (model.config.attention_dropout, model.config.dropout) == (0.25, 0.05)
    assert {layer.self_attn.weights_dropout.p for layer in model.decoder.layers} == {0.25}
    gpt2.save_pretrained(model, tmp_path / "again")
    written = json.loads((tmp_path / "again" / "config.json").read_text())
    assert (written["attn_pdrop"], written["resid_pdrop"]) == (0.25, 0.05)
    assert GPT(5).config.attention_dropout == 0.0


#: a change to config.json -> what the error says (before: a TypeError deep in a forward pass or in Dropout,
#: NaN logits, a shape list, or a model built on a value nobody checked)
BAD_CONFIG_VALUES = {
    "layer_norm_epsilon null": ({"layer_norm_epsilon": None}, "layer_norm_epsilon is None; it must be a float"),
    "layer_norm_epsilon a string": ({"layer_norm_epsilon": "1e-5"}, "layer_norm_epsilon is '1e-5'; it must be a float"),
    "layer_norm_epsilon zero": ({"layer_norm_epsilon": 0}, "layer_norm_epsilon is 0; it must be above 0"),
    "layer_norm_epsilon negative": ({"layer_norm_epsilon": -1.0}, "layer_norm_epsilon is -1.0; it must be above 0"),
    "resid_pdrop a string": ({"resid_pdrop": "0.1"}, "resid_pdrop is '0.1'; it must be a float"),
    "embd_pdrop a string": ({"embd_pdrop": "0.1"}, "embd_pdrop is '0.1'; it must be a float"),
    "attn_pdrop a string": ({"attn_pdrop": "0.1"}, "attn_pdrop is '0.1'; it must be a float"),
    "resid_pdrop 1": ({"resid_pdrop": 1.0}, "resid_pdrop is 1.0; it must be below 1"),
    "n_layer a float": ({"n_layer": 2.0}, "n_layer is 2.0; it must be an int"),
    "vocab_size a bool": ({"vocab_size": True}, "vocab_size is True; it must be an int"),
    "n_inner zero": ({"n_inner": 0}, "n_inner is 0; it must be at least 1"),
    "n_head not dividing n_embd": ({"n_head": 3}, "n_embd 4 is not a multiple of n_head 3"),
    "tie_word_embeddings a string": ({"tie_word_embeddings": "no"}, "tie_word_embeddings is 'no'; it must be a bool"),
    "eos_token_id beyond the vocabulary": ({"eos_token_id": 11}, "eos_token_id is 11; it must be at most 10"),
    "activation_function a list": ({"activation_function": ["gelu"]}, "activation_function is ['gelu']; it must"),
}


@pytest.mark.extra("safetensors", "hf")
@pytest.mark.parametrize("case", sorted(BAD_CONFIG_VALUES))
def test_from_pretrained_checks_every_value_naming_the_key(tmp_path, case):
    change, message = BAD_CONFIG_VALUES[case]
    with pytest.raises(ValueError, match=re.escape(message)):
        gpt2.from_pretrained(_gpt2_folder(tmp_path, change))


@pytest.mark.extra("safetensors", "hf")
def test_from_pretrained_refuses_non_finite_weights_naming_the_tensor(tmp_path):
    """Before: a NaN tensor loaded, and sampling chose id 0 from NaN logits over and over."""
    def poison(name, value):
        def change(tensors):
            tensors[name] = tensors[name].copy()
            tensors[name].flat[1] = value
        return change

    for name, value in [("transformer.h.1.mlp.c_fc.weight", np.nan), ("transformer.wte.weight", -np.inf)]:
        folder = _gpt2_folder(tmp_path, weights=poison(name, value))
        with pytest.raises(ValueError, match=f"model.safetensors: tensor {re.escape(name)} holds 1 NaN or infinite"):
            gpt2.from_pretrained(folder)
    huge = _gpt2_folder(tmp_path, weights=poison("transformer.h.0.attn.c_proj.weight", 1e300))  # finite in float64
    with backend.default_dtype("float32"), pytest.raises(ValueError, match="transformer.h.0.attn.c_proj.weight "
                                                                           "holds values beyond float32"):
        gpt2.from_pretrained(huge)
    ints = _gpt2_folder(tmp_path, weights=lambda t: t.update({"transformer.ln_f.bias": np.zeros(4, dtype=np.int64)}))
    with pytest.raises(ValueError, match="tensor transformer.ln_f.bias is I64, not floating-point weights"):
        gpt2.from_pretrained(ints)


@pytest.mark.extra("safetensors", "hf")
def test_a_bfloat16_float16_or_sharded_folder_reads_as_its_weights_rounded(tmp_path):
    """Before: a bfloat16 model.safetensors was "not a readable safetensors file" (NumPy has no bfloat16) and a
    sharded folder (model.safetensors.index.json and its shards) had "no model.safetensors"."""
    from minitf import pretrained
    from tests.test_pretrained import bf16_round, safetensors_bytes, write_sharded
    gpt2.save_pretrained(small_gpt2(), tmp_path / "float32")
    weights = pretrained.read_weights(tmp_path / "float32" / "model.safetensors")
    ids = np.array([[1, 2, 3, 10]])

    def folder(name, tensors, shards=1):
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_bytes((tmp_path / "float32" / "config.json").read_bytes())
        if shards == 1:
            (path / "model.safetensors").write_bytes(safetensors_bytes(tensors))
        else:
            write_sharded(path, tensors, shards)
        return path

    def logits(path, dtype=None):
        with minitf.no_grad():
            return backend.to_numpy(gpt2.from_pretrained(path, dtype=dtype).eval()(ids))

    original = logits(tmp_path / "float32")
    for dtype, rounded in [("BF16", bf16_round), ("F16", lambda a: a.astype(np.float16).astype(np.float32))]:
        low = folder(dtype, {name: (dtype, a) for name, a in weights.items()})
        expected = folder(f"{dtype} as F32", {name: ("F32", rounded(a)) for name, a in weights.items()})
        assert np.array_equal(logits(low), logits(expected)) and not np.array_equal(logits(low), original)
        assert np.array_equal(logits(low, "float64"), logits(expected, "float64"))
        sharded = folder(f"{dtype} in 3 shards", {name: (dtype, a) for name, a in weights.items()}, shards=3)
        assert not (sharded / "model.safetensors").exists()
        assert logits(sharded).tobytes() == logits(low).tobytes()
