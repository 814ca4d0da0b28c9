"""The Llama-family model (minitf.llama): the whole model's gradient against float64 central differences, its
key/value cache against the full forward, and parity with transformers' ``LlamaForCausalLM`` and
``Qwen2ForCausalLM``: a small model with random weights made there (no download), saved with ``save_pretrained``
and read by ``Llama.from_pretrained``, gives the same logits, next-token loss and gradient of every parameter as
PyTorch's autograd in float64 (grouped and ungrouped heads, llama3 frequencies, tied and untied, with and without
q/k/v biases, a batch with padding), greedy generation equals ``generate`` token for token, and a minitf model
written by ``save_pretrained`` loads there with the same logits.

transformers computes the rotary angles and RMSNorm in float32 whatever the model's dtype (about 1e-7 relative
off an exact float64 computation): the parity tests give its modules exact float64 forms of the same lines
first (as tests/test_llama_layers.py does for the layers) and use SDPA attention (float64 throughout on the CPU).
Tolerance: relative 1e-10, as tests/test_gpt2_parity.py. Parity tests skip without the ``bench`` extra."""
import contextlib
import json

import pytest
from hypothesis import given, settings, strategies as st

import minitf
from minitf import backend
from minitf.sampling import generate
from minitf.llama import Llama, LlamaConfig
from minitf.llama import hf as llama_hf
from minitf.llama.config import preset
from minitf.module import no_grad
from tests.helpers import LN_RTOL, assert_gradients_match, np, randomize, relative_difference, seeds

pytestmark = pytest.mark.usefixtures("float64")
RTOL = 1e-10
hugging_face = [pytest.mark.extra("torch", "bench"), pytest.mark.extra("transformers", "bench"),
                pytest.mark.extra("safetensors", "bench")]


def parity(test):
    for mark in hugging_face:
        test = mark(test)
    return test


def next_token_loss():
    return minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)


# --------------------------------------------------------------------------- #
# The whole model's gradient, its cache
# --------------------------------------------------------------------------- #
@st.composite
def llama_and_ids(draw):
    """A small random LlamaConfig (every option drawn) and a batch of token ids (B, L + 1)."""
    Hkv = draw(st.integers(1, 2))
    H = Hkv * draw(st.integers(1, 2))
    E = 2 * draw(st.integers(1, 2))
    scaling = draw(st.sampled_from([None, dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_position_embeddings=4)]))
    config = LlamaConfig(vocab_size=draw(st.integers(2, 7)), d_model=draw(st.integers(1, 4)),
                         num_layers=draw(st.integers(1, 2)), num_heads=H, num_kv_heads=Hkv, head_dim=E,
                         d_ff=draw(st.integers(1, 4)), rope_theta=draw(st.sampled_from([10.0, 10000.0])),
                         rope_scaling=scaling, tie_word_embeddings=draw(st.booleans()),
                         attention_bias=draw(st.booleans()), mlp_bias=draw(st.booleans()), max_position_embeddings=16)
    seed = draw(seeds)
    ids = np.random.default_rng(seed).integers(0, config.vocab_size, (draw(st.integers(1, 3)), draw(st.integers(1, 4))
                                                                      + 1))
    return config, ids, seed


@settings(max_examples=15)
@given(case=llama_and_ids(), pad=st.booleans())
def test_whole_llama_gradient_of_the_next_token_loss(case, pad):
    """Every entry of every parameter's gradient against central differences of the next-token loss (through a
    random upstream gradient of the scalar), with a key padding mask or without; the ids are not changed."""
    config, ids, seed = case
    model = randomize(Llama(config), seed)  # random gains and biases: every term counts
    loss_fn, before = next_token_loss(), ids.copy()
    inputs, targets = ids[:, :-1], ids[:, 1:]
    mask = None
    if pad:  # position 0 stays a token: every query sees at least one key
        mask = np.random.default_rng(seed + 1).random(inputs.shape) < 0.4
        mask[:, 0] = False
        mask = backend.asarray(mask)
    assert_gradients_match(lambda: backend.asarray(loss_fn(model(inputs, key_padding_mask=mask), targets)),
                           lambda g: model.backward(loss_fn.backward(float(g))), {},
                           dict(model.named_parameters()), seed=seed, rtol=LN_RTOL)
    assert np.array_equal(ids, before)


@settings(max_examples=10)
@given(case=llama_and_ids(), steps=st.lists(st.integers(1, 3), min_size=1, max_size=4))
def test_decoding_through_the_cache_equals_the_full_forward(case, steps):
    config, _, seed = case
    model = randomize(Llama(config), seed).eval()
    ids = np.random.default_rng(seed).integers(0, config.vocab_size, (2, sum(steps)))
    full, decoded, cache = decoded_in_steps(model, ids, steps)
    with no_grad(), pytest.raises(ValueError, match=f"start 0 is not the cache's length {sum(steps)}"):
        model(ids[:, :1], cache=cache, start=0)
    assert np.allclose(decoded, full, rtol=1e-12, atol=1e-13)


def decoded_in_steps(model, ids, steps):
    """(the full forward's logits, those of ``ids`` fed through a cache ``steps`` tokens at a time, concatenated,
    the cache), host arrays, without gradients."""
    with no_grad():
        full = backend.to_numpy(model(ids))
        cache, rows, done = {}, [], 0
        for n in steps:
            rows.append(backend.to_numpy(model(ids[:, done:done + n], cache=cache, start=done)))
            done += n
    return full, np.concatenate(rows, axis=1), cache


#: SmolLM2-135M's config.json as published on the Hub (HuggingFaceTB/SmolLM2-135M): the older rotary keys
SMOLLM2_CONFIG = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
                  "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
                  "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": True,
                  "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9,
                  "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
                  "rope_interleaved": False, "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": True,
                  "torch_dtype": "bfloat16", "transformers_version": "4.42.3", "use_cache": True,
                  "vocab_size": 49152}


def test_smollm2_config_json_reads_as_its_preset_and_llama3_scaling_in_the_older_keys():
    assert llama_hf.config_from_hf(SMOLLM2_CONFIG) == preset("smollm2-135m")
    older = dict(SMOLLM2_CONFIG, rope_theta=500000.0, eos_token_id=[1, 2], rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192})
    config = llama_hf.config_from_hf(older)
    assert config.rope_scaling["factor"] == 8.0 and config.rope_theta == 500000.0 and config.eos_ids == (1, 2)
    assert Llama(config.replace(num_layers=1)).layers[0].self_attn.rotary.rope_type == "llama3"
    with pytest.raises(ValueError, match="config.json: rope_interleaved is true"):
        llama_hf.config_from_hf(dict(SMOLLM2_CONFIG, rope_interleaved=True))


def test_presets_have_the_shapes_they_name():
    smol = Llama(preset("smollm2-135m"))
    assert smol.num_parameters() == 134_515_008 == smol.num_parameters_of_shape()  # SmolLM2-135M's count
    assert smol.lm_head.weight is smol.embed_tokens.weight and len(smol.layers) == 30
    attn = smol.layers[0].self_attn
    assert (attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.rotary.theta) == (9, 3, 64, 100000.0)
    tiny = Llama(preset("tiny"))
    assert tiny.num_parameters() == tiny.num_parameters_of_shape() < 3_000_000
    assert isinstance(tiny.config, LlamaConfig)


@pytest.mark.parametrize("fields, words", [
    (dict(num_heads=6, num_kv_heads=4, head_dim=2), "num_heads 6 is not a multiple of num_kv_heads 4"),
    (dict(d_model=10, num_heads=4), "d_model 10 is not a multiple of num_heads 4"),
    (dict(head_dim=3), "head dimension 3 is odd"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}), "rope_scaling must be None, "),
    (dict(rms_norm_eps=0.0), "rms_norm_eps must be a positive number"),
    (dict(eos_token_id=(2, 99)), r"eos_token_id\[1\] must be None or an id in \[0, 50\)"),
    (dict(vocab_size=True), "vocab_size must be a positive integer"),
])
def test_a_config_that_does_not_fit_is_refused_naming_the_field(fields, words):
    with pytest.raises(ValueError, match=words):
        LlamaConfig(**(dict(vocab_size=50, d_model=8, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=8) | fields))


# --------------------------------------------------------------------------- #
# Parity with transformers (float64, PyTorch autograd on their side)
# --------------------------------------------------------------------------- #
def _hf():
    import torch
    import transformers
    return torch, transformers


class _Float64Torch:
    """``torch`` with ``torch.float`` and ``torch.float32`` meaning float64: transformers' own float32 steps (the
    inverse frequencies, the mixtures of experts' routers' softmax and load-balancing sums) run with it are their
    exact float64 form."""

    def __init__(self, torch):
        self._torch, self.float, self.float32 = torch, torch.float64, torch.float64

    def __getattr__(self, name):
        return getattr(self._torch, name)


def float64_patches(patch, modules):
    """With ``patch`` (a pytest.MonkeyPatch): each ``(modeling module, class prefix)`` of ``modules`` with its
    float32 steps made float64: its torch and transformers' rotary utilities' (:class:`_Float64Torch`), its
    RotaryEmbedding's angles and RMSNorm's statistics computed without the casts to float32 (the same lines
    otherwise)."""
    torch, _ = _hf()
    from transformers import modeling_rope_utils

    def rotary_forward(self, x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * self.inv_freq.to(torch.float64)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    def rmsnorm_forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    patch.setattr(modeling_rope_utils, "torch", _Float64Torch(torch))
    for module, prefix in modules:
        patch.setattr(module, "torch", _Float64Torch(torch))
        patch.setattr(getattr(module, prefix + "RotaryEmbedding"), "forward", rotary_forward)
        patch.setattr(getattr(module, prefix + "RMSNorm"), "forward", rmsnorm_forward)


@contextlib.contextmanager
def hugging_face_in_float64():
    """transformers' Llama, Qwen2 and Mistral modules with their float32 steps made float64
    (:func:`float64_patches`)."""
    from transformers.models.llama import modeling_llama
    from transformers.models.mistral import modeling_mistral
    from transformers.models.qwen2 import modeling_qwen2
    with pytest.MonkeyPatch.context() as patch:
        float64_patches(patch, [(modeling_llama, "Llama"), (modeling_qwen2, "Qwen2"), (modeling_mistral, "Mistral")])
        yield



def hf_model(family, seed, scale=None, **config):
    """A random ``LlamaForCausalLM`` or ``Qwen2ForCausalLM`` (``family``) in float64, eval mode, SDPA attention,
    built inside :func:`hugging_face_in_float64` (its rotary frequencies in float64). Every parameter ~ N(0, 0.5^2)
    around its init (RMSNorm gains around 1, biases around 0), or with ``scale`` every matrix ~ N(0, scale^2),
    gains 1 and biases 0 (greedy decoding then varies its tokens)."""
    torch, transformers = _hf()
    torch.manual_seed(seed)
    Config = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
              "mistral": transformers.MistralConfig}[family]
    extra = dict(sliding_window=None) if family == "mistral" else {}
    model = getattr(transformers, Config.__name__.replace("Config", "ForCausalLM"))(
        Config(attn_implementation="sdpa", bos_token_id=0, eos_token_id=0, pad_token_id=None, **extra, **config))
    model = model.to(torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if scale is not None:
                p.normal_(0.0, scale) if p.ndim == 2 else p.fill_(1.0 if "norm" in name else 0.0)
            else:
                p.add_(torch.randn_like(p) * 0.5)
    return model.eval()


@st.composite
def hf_configs(draw):
    Hkv = draw(st.integers(1, 2))
    H = Hkv * draw(st.integers(1, 3))
    rope = draw(st.sampled_from([
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "default", "rope_theta": 100000.0},
        {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8}]))
    return dict(vocab_size=draw(st.integers(5, 40)), hidden_size=H * draw(st.integers(1, 3)) * 2,
                num_hidden_layers=draw(st.integers(1, 2)), num_attention_heads=H, num_key_value_heads=Hkv,
                head_dim=2 * draw(st.integers(1, 3)), intermediate_size=draw(st.integers(1, 12)),
                rms_norm_eps=draw(st.sampled_from([1e-6, 1e-5])), max_position_embeddings=64,
                tie_word_embeddings=draw(st.booleans()), rope_parameters=rope)


@parity
@settings(max_examples=12, deadline=None)
@given(config=hf_configs(), family=st.sampled_from(["llama", "qwen2", "mistral"]), seed=seeds, data=st.data())
def test_logits_loss_and_every_gradient_match_transformers(config, family, seed, data, tmp_path_factory):
    """Logits, the mean next-token loss over the real tokens, and every parameter's gradient, with some keys of
    the batch padding (the attention mask; position 0 stays a token so that no query sees none, position 1 so
    that some target is real)."""
    torch, _ = _hf()
    folder = tmp_path_factory.mktemp(family)
    with hugging_face_in_float64():
        theirs = hf_model(family, seed % 2**31, **config)
        theirs.save_pretrained(folder)
        model = Llama.from_pretrained(folder)
        assert model.embed_tokens.weight.data.dtype == np.float64
        assert model.config.attention_bias == (family == "qwen2") and llama_hf.pretrained_config(folder)[1]["model_type"] == family
        assert model.config.tie_word_embeddings == config["tie_word_embeddings"]
        B, L = data.draw(st.integers(1, 3)), data.draw(st.integers(2, 8))
        rng = np.random.default_rng(seed)
        ids = rng.integers(0, config["vocab_size"], (B, L))
        pad = rng.random((B, L)) < data.draw(st.sampled_from([0.0, 0.3]))
        pad[:, :2] = False  # position 0 a key for every query, position 1 a target: a mean over some tokens
        targets = np.where(pad, -1, ids)[:, 1:]                       # padding is no target
        loss_fn = next_token_loss()
        model.zero_grad()
        logits = model(ids[:, :-1], key_padding_mask=backend.asarray(pad[:, :-1]))
        loss = loss_fn(logits, targets)
        model.backward(loss_fn.backward())
        out = theirs(torch.from_numpy(ids[:, :-1]), attention_mask=torch.from_numpy((~pad[:, :-1]).astype(np.int64)))
        V = config["vocab_size"]
        their_targets = torch.from_numpy(np.where(targets < 0, -100, targets)).reshape(-1)  # their ignore_index
        their_loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), their_targets)
        their_loss.backward()
    assert relative_difference(backend.to_numpy(logits), out.logits.detach().numpy()) < RTOL
    assert abs(loss - their_loss.item()) <= RTOL * abs(their_loss.item())
    ours, hf_params = dict(model.named_parameters()), dict(theirs.named_parameters())
    pairs = [(name, backend.to_numpy(ours[name].grad), hf_params[hf].grad.numpy().T if t else
              hf_params[hf].grad.numpy()) for hf, name, t in llama_hf.name_map(model.config)]
    assert len(pairs) == len(ours) == len(hf_params)
    largest = max(float(np.abs(b).max()) for _, _, b in pairs)
    for name, a, b in pairs:
        # a floor of 1e-4 of the largest gradient: one that is 0 in exact arithmetic (q_proj's where each query sees
        # one key) is rounding noise, 1e-17 against gradients of 0.5 (measured: 1e-15 relative on every gradient)
        assert relative_difference(a, b, floor=1e-4 * largest) < RTOL, name


@parity
def greedy_both(model, theirs, prompt, n):
    """(minitf's greedy ``generate`` of ``n`` tokens after ``prompt``, transformers' of ``theirs``), no end id."""
    torch, _ = _hf()
    ours = generate(model, prompt, n, temperature=0)
    with torch.no_grad():
        expected = theirs.generate(torch.from_numpy(prompt), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                   pad_token_id=0, eos_token_id=None)
    return ours, expected


@pytest.mark.extra("torch", "bench")
@pytest.mark.extra("transformers", "bench")
@pytest.mark.parametrize("family, heads, tied", [("llama", (4, 2), True), ("qwen2", (2, 2), False)])
def test_greedy_generation_equals_transformers_generate(family, heads, tied, tmp_path):
    with hugging_face_in_float64():
        theirs = hf_model(family, 3, scale=0.5, vocab_size=40, hidden_size=16, num_hidden_layers=2,
                          num_attention_heads=heads[0], num_key_value_heads=heads[1], intermediate_size=24,
                          max_position_embeddings=64, tie_word_embeddings=tied)
        theirs.save_pretrained(tmp_path)
        model = Llama.from_pretrained(tmp_path)
        ours, expected = greedy_both(model, theirs, np.random.default_rng(3).integers(1, 40, (2, 7)), 40)
    assert ours.shape == (2, 47)
    assert np.array_equal(ours, expected.numpy())
    assert len(set(ours[:, 7:].ravel().tolist())) > 2  # not a trivial run of one token


@parity
@pytest.mark.parametrize("bias", [False, True])
def test_save_pretrained_loads_in_transformers_with_the_same_logits(bias, tmp_path):
    torch, transformers = _hf()
    backend.manual_seed(5)
    config = LlamaConfig(vocab_size=30, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=20,
                         rope_theta=500.0, attention_bias=bias, tie_word_embeddings=not bias,
                         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=8), eos_token_id=(1, 2))
    model = randomize(Llama(config), 5, scale=0.3).eval()
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == ("qwen2" if bias else "llama") and written["eos_token_id"] == [1, 2]
    ids = np.random.default_rng(5).integers(0, 30, (3, 10))
    with hugging_face_in_float64():
        theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64,
                                                                   attn_implementation="sdpa").eval()
        with torch.no_grad():
            expected = theirs(torch.from_numpy(ids)).logits.numpy()
    with no_grad():
        assert relative_difference(backend.to_numpy(model(ids)), expected) < RTOL
    back = Llama.from_pretrained(tmp_path)  # and back: the same arrays, bit for bit, the same config
    assert all(np.array_equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))
    assert back.config == config.replace(head_dim=4)  # written out, as transformers does


# --------------------------------------------------------------------------- #
# Hugging Face folders: the tokenizer, python -m minitf.generate, bad folders
# --------------------------------------------------------------------------- #
TEXT = ["the cat sees a dog and the dog likes the cat", "a small house with a tree and a bird",
        "once upon a time there was a bird in the house"] * 4
SPECIAL = ["<s>", "</s>", "<|eot_id|>"]  # ids 0, 1, 2
needs_folder = [pytest.mark.extra("tokenizers", "hf"), *hugging_face]


def with_folder(test):
    for mark in needs_folder:
        test = mark(test)
    return test


def write_tokenizer(folder):
    """A byte-level BPE trained on TEXT (every byte in its alphabet, as Llama 3's and SmolLM2's) whose
    post-processor puts <s> first, as Llama's tokenizer.json does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL, show_progress=False,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                             special_tokens=[("<s>", 0)])
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer.get_vocab_size()


def make_folder(folder, family="llama", eos=(1, 2), **config):
    """A random float32 ``family`` model saved by transformers (config.json, model.safetensors,
    generation_config.json) with write_tokenizer's tokenizer.json; end-of-text ids ``eos``."""
    torch, transformers = _hf()
    folder.mkdir(parents=True, exist_ok=True)
    V = write_tokenizer(folder)
    torch.manual_seed(7)
    Config = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
              "qwen3_moe": transformers.Qwen3MoeConfig}[family]
    model = getattr(transformers, Config.__name__.replace("Config", "ForCausalLM"))(Config(**(dict(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, max_position_embeddings=64, tie_word_embeddings=True, bos_token_id=0,
        eos_token_id=list(eos)) | config)))
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.5)  # greedy choices that vary
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("llama") / "folder")


def command(*args, stdin=""):
    import subprocess
    import sys
    from tests.runs import CPU_ENV, ROOT
    return subprocess.run([sys.executable, "-m", "minitf.generate", *map(str, args)], input=stdin,
                          capture_output=True, text=True, cwd=ROOT, env=CPU_ENV, timeout=120)


@with_folder
def test_a_folders_config_json_travels_in_loaded_and_is_written_back_by_the_writer(folder, tmp_path):
    """The folder's config.json rides in ``Loaded.hf_config``, not on the model; given to the writer, its entries
    minitf does not compute (transformers_version here) are written back."""
    loaded = minitf.load(folder)
    assert loaded.hf_config == json.loads((folder / "config.json").read_text())
    assert not hasattr(loaded.model, "hf_config") and "transformers_version" in loaded.hf_config
    llama_hf.save_pretrained(loaded.model, tmp_path / "kept", loaded.hf_config)
    kept = json.loads((tmp_path / "kept" / "config.json").read_text())
    assert kept["transformers_version"] == loaded.hf_config["transformers_version"]
    loaded.model.save_pretrained(tmp_path / "bare")  # without it: only what minitf computes
    assert "transformers_version" not in json.loads((tmp_path / "bare" / "config.json").read_text())


@with_folder
def test_the_tokenizer_encodes_and_decodes_as_transformers_does(folder):
    """<s> first (the post-processor's), the same ids as transformers' tokenizer of the same file, and text back
    without the special tokens; the end-of-text ids are generation_config.json's list."""
    _, transformers = _hf()
    loaded = minitf.load(folder)
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    texts = ["the cat sees a bird", "Émile's café: 3 €", "a\ttree"]
    ours = loaded.tokenizer.encode(texts)
    assert ours == [theirs.encode(text) for text in texts] and all(ids[0] == 0 for ids in ours)
    assert loaded.tokenizer.decode(ours) == [theirs.decode(ids, skip_special_tokens=True) for ids in ours] == texts
    assert loaded.tokenizer.eos_ids == (1, 2) and loaded.tokenizer.unknown_characters("Émile €") == []
    assert loaded.kind.name == "llama" and loaded.context == 64 and isinstance(loaded.model, Llama)


@with_folder
def test_generate_samples_a_llama_folder_as_minitf_and_transformers_do(folder):
    """--checkpoint FOLDER: greedy text equals minitf.sampling.generate's on the folder's model and transformers'
    generate decoded; a seed makes sampling reproducible."""
    torch, transformers = _hf()
    prompts = ["the cat", "a small house"]
    done = command("--checkpoint", folder, "--temperature", 0, "--max-new-tokens", 10,
                   stdin="".join(p + "\n" for p in prompts))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    loaded = minitf.load(folder)
    with backend.default_dtype("float32"):
        model = Llama.from_pretrained(folder)
    theirs = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    expected = []
    for prompt in prompts:
        ids = loaded.tokenizer.encode([prompt])[0]
        out = generate(model, np.array([ids]), 10, temperature=0, eos_id=[1, 2])[0].tolist()
        with torch.no_grad():
            hf_out = theirs.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False, pad_token_id=1)[0]
        cut = next((i for i, t in enumerate(out) if i >= len(ids) and t in (1, 2)), len(out))
        assert out[:cut] == hf_out.tolist()[:cut]
        expected.append(loaded.tokenizer.decode([out[:cut]])[0])
    assert done.stdout == "".join(e + "\n" for e in expected)
    assert all(e.startswith(p) and len(e) > len(p) for e, p in zip(expected, prompts)), expected
    sampled = [command("--checkpoint", folder, "--prompt", "the cat", "--max-new-tokens", 8, "--seed", s)
               for s in (3, 3)]
    assert sampled[0].returncode == 0 and sampled[0].stdout == sampled[1].stdout


@with_folder
def test_generation_stops_at_any_of_the_end_of_text_ids(folder, tmp_path):
    """generation_config.json's eos_token_id list: the first of them that greedy decoding produces ends the
    text (not written); with that id removed from the list, the text runs on past it."""
    loaded = minitf.load(folder)
    ids = loaded.tokenizer.encode(["the cat"])[0]
    free = generate(loaded.model, np.array([ids]), 30, temperature=0)[0, len(ids):].tolist()
    stop = next(t for t in free if t not in (0,))  # the first new token: made an end-of-text id below
    other = tmp_path / "other"
    make_folder(other, eos=(1, stop))
    answer = command("--checkpoint", other, "--prompt", "the cat", "--temperature", 0, "--max-new-tokens", 30)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout == "the cat\n"  # the first new token is an end: nothing after the prompt
    stopped = generate(minitf.load(other).model, np.array([ids]), 30, temperature=0, eos_id=[1, stop])
    assert stopped.shape[1] == len(ids) + 1 and stopped[0, -1] == stop


@with_folder
@pytest.mark.parametrize("change, words", [
    ({"model_type": "mamba"}, "model_type 'mamba'; minitf reads marian, gpt2, llama, qwen2, mistral"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}},
     "rope_parameters.rope_type is 'yarn'; minitf computes 'default', 'linear', 'llama3'"),
    ({"rope_parameters": None, "rope_theta": 10000.0, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
     "rope_scaling.rope_type is 'dynamic'"),
    ({"model_type": "mistral", "sliding_window": 0}, "sliding_window is 0; it must be at least 1"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "use_sliding_window is true"),
    ({"attention_bias": True}, "attention_bias is true"),
    ({"hidden_act": "gelu"}, "hidden_act is 'gelu'; minitf computes 'silu'"),
    ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ({"eos_token_id": [1, 9999]}, r"eos_token_id\[1\] is 9999; it must be at most"),
    ({"intermediate_size": None}, "has no 'intermediate_size'"),
])
def test_a_folder_minitf_does_not_compute_is_refused_naming_the_key(folder, tmp_path, change, words):
    """Through the command: one line naming the key, exit 1, no model built (the weights are not read)."""
    import shutil
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    values = json.loads((bad / "config.json").read_text())
    values.update(change)
    values = {k: v for k, v in values.items() if not (k == "intermediate_size" and v is None)}
    (bad / "config.json").write_text(json.dumps(values))
    (bad / "model.safetensors").write_bytes(b"not read")  # the config is refused before the weights are read
    answer = command("--checkpoint", bad, "--prompt", "the cat")
    from tests.runs import one_error_line
    line = one_error_line(answer.stderr.splitlines(), "minitf.generate")
    assert answer.returncode == 1 and answer.stdout == "" and str(bad) in line
    assert pytest.importorskip("re").search(words, line), line


@with_folder
def test_damaged_weights_and_a_missing_tokenizer_are_named(folder, tmp_path):
    import shutil
    from tests.runs import one_error_line
    from minitf.pretrained import read_weights, write_weights
    truncated, nan, untokenized = (tmp_path / name for name in ("truncated", "nan", "untokenized"))
    for path in (truncated, nan, untokenized):
        shutil.copytree(folder, path)
    data = (folder / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[:len(data) - 100])
    weights = read_weights(folder / "model.safetensors")
    weights["model.norm.weight"] = weights["model.norm.weight"].copy()
    weights["model.norm.weight"][3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        write_weights(nan / "model.safetensors", weights)  # minitf's writer refuses; write it as a foreign one would
    import safetensors.numpy
    (nan / "model.safetensors").write_bytes(safetensors.numpy.save(weights))
    (untokenized / "tokenizer.json").unlink()
    for path, words in [(truncated, "model.safetensors"), (nan, "model.norm.weight"),
                        (untokenized, "has no tokenizer.json")]:
        answer = command("--checkpoint", path, "--prompt", "the cat")
        line = one_error_line(answer.stderr.splitlines(), "minitf.generate")
        assert answer.returncode == 1 and words in line, line


@with_folder
def test_a_prompt_beyond_max_position_embeddings_is_refused(folder):
    """minitf refuses (transformers would run on past the positions the model was trained for, silently)."""
    from tests.runs import one_error_line
    answer = command("--checkpoint", folder, "--prompt", "the cat " * 40, "--max-new-tokens", 5)
    line = one_error_line(answer.stderr.splitlines(), "minitf.generate")
    assert answer.returncode == 1 and "the model has 64" in line, line


@with_folder
def test_a_bfloat16_sharded_qwen2_folder_reads_as_its_weights_rounded(tmp_path):
    """transformers' bfloat16 weights in shards (model.safetensors.index.json) read widened exactly: the same
    logits as the float32 folder's model with every weight rounded to bfloat16."""
    torch, transformers = _hf()
    full = make_folder(tmp_path / "full", family="qwen2")
    theirs = transformers.Qwen2ForCausalLM.from_pretrained(full).to(torch.bfloat16)
    theirs.save_pretrained(tmp_path / "bf16", max_shard_size="20KB")
    assert (tmp_path / "bf16" / "model.safetensors.index.json").is_file()
    rounded = Llama.from_pretrained(full)
    for p in rounded.parameters():
        p.data[...] = backend.asarray(torch.from_numpy(backend.to_numpy(p.data)).to(torch.bfloat16).double().numpy())
    model = Llama.from_pretrained(tmp_path / "bf16")
    ids = np.random.default_rng(0).integers(0, 300, (2, 9))
    with no_grad():
        assert np.array_equal(backend.to_numpy(model.eval()(ids)), backend.to_numpy(rounded.eval()(ids)))


@with_folder
def test_inspect_draws_a_llama_folders_page_with_its_shared_heads_labelled(folder):
    """python -m minitf.inspect on a Llama folder: the GPT-style page (one text, each next token: <s> first, as the
    folder's tokenizer puts it), its shape in the header, each query head named with the key/value head it reads
    (before: refused in one line, no page drew grouped heads)."""
    import subprocess
    import sys
    from minitf.study.inspection import page
    from tests.runs import CPU_ENV, ROOT
    out = folder.parent / "page.html"
    answer = subprocess.run([sys.executable, "-m", "minitf.inspect", "--checkpoint", str(folder), "--text", "the cat",
                             "--out", str(out)], capture_output=True, text=True, cwd=ROOT, env=CPU_ENV, timeout=120)
    assert answer.returncode == 0 and answer.stdout == f"{out}\n", answer.stderr
    data = page.read_data(out.read_text(encoding="utf-8"))
    assert data["title"] == "minitf inspect: Llama (pre-norm RMSNorm)"
    assert "4 query heads over 2 key/value heads" in dict(data["model"]["facts"])["model"]
    (example,) = data["examples"]
    assert example["input"][0] == "<s>"
    (attention,) = example["attention"]
    assert attention["heads"] == ["head 0 (key/value head 0)", "head 1 (key/value head 0)",
                                  "head 2 (key/value head 1)", "head 3 (key/value head 1)"]


@with_folder
def test_translate_refuses_a_llama_folder_naming_generate(folder):
    import subprocess
    import sys
    from tests.runs import CPU_ENV, ROOT, one_error_line
    answer = subprocess.run([sys.executable, "-m", "minitf.translate", "--checkpoint", str(folder)], input="Hallo\n",
                            capture_output=True, text=True, cwd=ROOT, env=CPU_ENV, timeout=120)
    line = one_error_line(answer.stderr.splitlines(), "minitf.translate")
    assert answer.returncode == 2 and "Hugging Face Llama-family folder (a language model), not a translation" in line
    assert f"python -m minitf.generate --checkpoint {folder}" in line
