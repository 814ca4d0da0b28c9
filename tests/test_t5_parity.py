"""Parity of minitf.t5 with transformers' ``T5ForConditionalGeneration`` (and ``MT5ForConditionalGeneration``): a
tiny model with random weights made there (no download), saved with ``save_pretrained`` and read by
``T5.from_pretrained``, gives the same logits and the same gradient of every parameter (the two bias tables
included) as PyTorch's autograd in float64, for v1.0's layout (ReLU, tied, output scaled by d_model^-1/2) and
v1.1's (gated GELU, its own lm_head), on a padded batch whose distances reach the logarithmic buckets; a minitf
model written by ``save_pretrained`` loads there with the same logits; float16, bfloat16 and sharded folders read;
bad folders refused in one line naming the file and key.

transformers computes T5LayerNorm's variance in float32 whatever the model's dtype: the tests give it the exact
float64 form of the same lines first (as tests/test_llama.py does for the Llama's RMSNorm). Tolerance: relative
1e-10, as tests/test_llama.py. They skip without the ``bench`` extra."""
import contextlib
import json

import pytest

from minitf import backend
from minitf.attention import relative_position_bucket
from minitf.t5 import T5, T5Config
from minitf.t5 import hf as t5_hf
from tests.helpers import np, relative_difference

pytestmark = [pytest.mark.usefixtures("float64"), pytest.mark.extra("torch", "bench"),
              pytest.mark.extra("transformers", "bench"), pytest.mark.extra("safetensors", "bench")]
RTOL = 1e-10
#: the shape of the tiny models: distances up to 11 against max_distance 10 reach every kind of bucket
SHAPE = dict(vocab_size=40, d_model=12, d_kv=4, d_ff=10, num_layers=2, num_decoder_layers=3, num_heads=3,
             relative_attention_num_buckets=8, relative_attention_max_distance=10, dropout_rate=0.0,
             decoder_start_token_id=0)
LAYOUTS = {"v1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
           "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)}


@contextlib.contextmanager
def t5_norm_in_float64():
    """transformers' T5LayerNorm (and mT5's) without its cast to float32 (the same lines otherwise)."""
    import torch
    from transformers.models.mt5 import modeling_mt5
    from transformers.models.t5 import modeling_t5

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(modeling_t5.T5LayerNorm, "forward", forward)
        patch.setattr(modeling_mt5.MT5LayerNorm, "forward", forward)
        yield


def hf_model(layout, seed, model_type="t5", **changes):
    """A T5 (or mT5) ForConditionalGeneration of the tiny shape (with ``changes``) in float64, every weight random
    (the norms' gains too), in eval mode, eager attention."""
    import torch
    import transformers
    torch.manual_seed(seed)
    config_class, model_class = ((transformers.T5Config, transformers.T5ForConditionalGeneration) if model_type == "t5"
                                 else (transformers.MT5Config, transformers.MT5ForConditionalGeneration))
    config = config_class(**(SHAPE | changes), **LAYOUTS[layout])
    model = model_class(config).double().eval()
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.uniform_(0.5, 1.5)
        if layout == "v1.1" and model.lm_head.weight is model.shared.weight:  # transformers ties: give it its own
            model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.shared.weight))
    return model


def batch(seed):
    """input ids (3, 12) with an attention mask of lengths 12, 7, 3; decoder ids (3, 9) starting from 0."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, SHAPE["vocab_size"], (3, 12))
    mask = np.arange(12)[None, :] < np.array([12, 7, 3])[:, None]
    ids[~mask] = 0
    decoder_ids = rng.integers(0, SHAPE["vocab_size"], (3, 9))
    decoder_ids[:, 0] = 0
    return ids, mask, decoder_ids


def hf_logits(model, ids, mask, decoder_ids):
    import torch
    return model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                 decoder_input_ids=torch.from_numpy(decoder_ids)).logits


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_logits_and_every_gradient_equal_transformers(layout, tmp_path):
    import torch
    theirs = hf_model(layout, seed=3)
    theirs.save_pretrained(tmp_path)
    ours = T5.from_pretrained(tmp_path, dtype="float64")
    assert (ours.lm_head.weight is ours.shared.weight) == (layout == "v1.0")
    assert ours.config.scale_decoder_outputs == (layout == "v1.0")
    ids, mask, decoder_ids = batch(4)
    with t5_norm_in_float64():
        their_logits = hf_logits(theirs, ids, mask, decoder_ids)
        upstream = torch.randn_like(their_logits)
        (their_logits * upstream).sum().backward()
    our_logits = ours(ids, decoder_ids, key_padding_mask=backend.asarray(~mask))
    assert relative_difference(backend.to_numpy(our_logits), their_logits.detach().numpy()) < RTOL
    ours.backward(backend.asarray(upstream.numpy()))
    grads = {name: p.grad for name, p in ours.named_parameters()}
    their_params = dict(theirs.named_parameters())
    checked = 0
    for hf_name, our_name, transposed in t5_hf.name_map(ours.config):
        expected = their_params[hf_name].grad.numpy()
        got = backend.to_numpy(grads[our_name])
        assert relative_difference(got.T if transposed else got, expected) < RTOL, hf_name
        checked += 1
    assert checked == len(grads)
    for stack, length in (("encoder", 12), ("decoder", 9)):  # every bucket some pair falls in has a gradient
        relative = np.arange(length)[None, :] - np.arange(length)[:, None]
        used = np.bincount(relative_position_bucket(relative, stack == "encoder", 8, 10).ravel(), minlength=8) > 0
        table = np.abs(backend.to_numpy(grads[f"{stack}.relative_attention_bias.weight"]))
        assert np.array_equal(table.min(axis=1) > 0, used) and used.sum() >= 7


def test_mt5_folder_reads_with_the_same_logits(tmp_path):
    theirs = hf_model("v1.1", seed=5, model_type="mt5")
    theirs.save_pretrained(tmp_path)
    ours = T5.from_pretrained(tmp_path, dtype="float64")
    assert not ours.config.scale_decoder_outputs and ours.lm_head.weight is not ours.shared.weight
    ids, mask, decoder_ids = batch(6)
    with t5_norm_in_float64():
        expected = hf_logits(theirs, ids, mask, decoder_ids).detach().numpy()
    got = backend.to_numpy(ours(ids, decoder_ids, key_padding_mask=backend.asarray(~mask)))
    assert relative_difference(got, expected) < RTOL


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_folder_written_back_reads_in_transformers_with_the_same_logits(layout, tmp_path):
    import transformers
    ours = T5(T5Config(**SHAPE, **LAYOUTS[layout]))
    rng = np.random.default_rng(7)
    for p in ours.parameters():  # the norms' gains random too
        p.data[...] = backend.asarray(rng.normal(0, 0.5, p.shape))
    ours.save_pretrained(tmp_path / "out")
    theirs = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "out").double().eval()
    theirs.config._attn_implementation = "eager"
    ids, mask, decoder_ids = batch(8)
    with t5_norm_in_float64():
        expected = hf_logits(theirs, ids, mask, decoder_ids).detach().numpy()
    got = backend.to_numpy(ours(ids, decoder_ids, key_padding_mask=backend.asarray(~mask)))
    assert relative_difference(got, expected) < RTOL
    again = T5.from_pretrained(tmp_path / "out", dtype="float64")  # and back into minitf: the same model
    assert again.config == ours.config
    for (name, p), (_, q) in zip(ours.named_parameters(), again.named_parameters()):
        assert np.array_equal(backend.to_numpy(p.data), backend.to_numpy(q.data)), name


@pytest.mark.parametrize("torch_dtype", ["float32", "float16", "bfloat16"])
def test_half_precision_and_sharded_folders_read_their_values(torch_dtype, tmp_path):
    import torch
    theirs = hf_model("v1.1", seed=9).to(getattr(torch, torch_dtype))
    theirs.save_pretrained(tmp_path, max_shard_size="4KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ours = T5.from_pretrained(tmp_path, dtype="float32")
    assert ours.shared.weight.data.dtype == np.float32
    state = ours.state_dict()
    for hf_name, our_name, transposed in t5_hf.name_map(ours.config):
        expected = theirs.state_dict()[hf_name].float().numpy()
        assert np.array_equal(state[our_name].T if transposed else state[our_name], expected), hf_name


def write_folder(tmp_path, **changes):
    """A small v1.0 folder written by minitf, its config.json then changed (a value None removes the key)."""
    T5(T5Config(**SHAPE, **LAYOUTS["v1.0"])).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("changes, words", [
    (dict(feed_forward_proj="gated-swish"), "config.json: feed_forward_proj is 'gated-swish'; minitf computes"),
    (dict(relative_attention_num_buckets=2), "config.json: relative_attention_num_buckets is 2; it must be at least 4"),
    (dict(relative_attention_max_distance=4), "config.json: relative_attention_max_distance is 4; it must be above 4"),
    (dict(eos_token_id=40), "config.json: eos_token_id is 40; it must be at most 39"),
    (dict(model_type="bart"), "describes model_type 'bart', not 't5' or 'mt5'"),
    (dict(num_layers=5), "config.json declares num_layers 5, but the weights hold 2 such layers"),
    (dict(d_kv=5), "tensors of the wrong shape for its config.json"),
])
def test_a_bad_folder_is_refused_in_one_line_naming_file_and_key(tmp_path, changes, words):
    folder = write_folder(tmp_path, **changes)
    with pytest.raises(ValueError) as error:
        T5.from_pretrained(folder)
    assert words in str(error.value) and "\n" not in str(error.value)
