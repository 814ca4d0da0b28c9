"""Bad Marian folders given to ``marian.from_pretrained`` (and models Marian cannot hold given to
``marian.save_pretrained``): each is one ValueError line naming the file (and the key or tensor) and what to do,
and nothing is written. Folders whose config is refused need no weights package (the weights file is not
read); those that need a real model.safetensors carry the hf extra (safetensors)."""
import json

import pytest

import minitf
from minitf import backend
from minitf.nmt import marian
from tests.runs import snapshot

np = backend.host

#: an opus-mt-shaped config.json at a test's size
GOOD = {"architectures": ["MarianMTModel"], "model_type": "marian", "d_model": 8, "encoder_layers": 1,
        "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 16,
        "decoder_ffn_dim": 16, "activation_function": "swish", "scale_embedding": True, "vocab_size": 20,
        "decoder_vocab_size": 20, "pad_token_id": 19, "decoder_start_token_id": 19, "eos_token_id": 0,
        "forced_eos_token_id": 0, "max_position_embeddings": 64, "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True, "dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0,
        "normalize_before": False, "static_position_embeddings": True}


def folder_with(tmp_path, config, weights=b"not read: the config is refused first"):
    folder = tmp_path / "marian"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(weights)
    return folder


def refused(folder, *words):
    """from_pretrained's one-line ValueError, holding every one of ``words``; nothing written in ``folder``."""
    before = snapshot(folder) if folder.is_dir() else None
    with pytest.raises(ValueError) as error:
        marian.from_pretrained(folder)
    message = str(error.value)
    assert "\n" not in message and all(word in message for word in words), message
    assert (snapshot(folder) if folder.is_dir() else None) == before
    return message


@pytest.mark.parametrize("change, words", [
    (lambda c: c.pop("d_model"), ["config.json has no 'd_model'", "add it (an int)"]),
    (lambda c: c.pop("activation_function"), ["no 'activation_function'"]),
    (lambda c: c.update(d_model="8"), ["config.json: d_model is '8'; it must be an int"]),
    (lambda c: c.update(scale_embedding="yes"), ["scale_embedding is 'yes'; it must be a bool"]),
    (lambda c: c.update(encoder_layers=0), ["encoder_layers is 0; it must be at least 1"]),
    (lambda c: c.update(pad_token_id=20), ["pad_token_id is 20; it must be at most 19"]),
    (lambda c: c.update(activation_function="tanh"), ["activation_function is 'tanh'", "'swish'"]),
    (lambda c: c.update(decoder_attention_heads=4), ["encoder_attention_heads 2 and decoder_attention_heads 4"]),
    (lambda c: c.update(decoder_ffn_dim=32), ["encoder_ffn_dim 16 and decoder_ffn_dim 32 differ"]),
    (lambda c: c.update(normalize_before=True), ["normalize_before is True", "only normalize_before false"]),
    (lambda c: c.update(add_final_layer_norm=True), ["add_final_layer_norm is True"]),
    (lambda c: c.update(normalize_embedding=True), ["normalize_embedding is True"]),
    (lambda c: c.update(static_position_embeddings=False), ["static_position_embeddings is False"]),
    (lambda c: c.update(attention_dropout=-0.1), ["attention_dropout is -0.1", "at least 0"]),
    (lambda c: c.update(tie_word_embeddings=False), ["tie_word_embeddings is false"]),
    (lambda c: c.update(decoder_vocab_size=30), ["decoder_vocab_size 30 differs from vocab_size 20"]),
])
def test_a_config_with_a_missing_mistyped_or_unsupported_value_is_one_line(change, words, tmp_path):
    config = dict(GOOD)
    change(config)
    refused(folder_with(tmp_path, config), "config.json", *words)


def test_a_gpt2_folder_is_one_line(tmp_path):
    refused(folder_with(tmp_path, {"model_type": "gpt2", "n_embd": 8}), "config.json describes model_type 'gpt2'",
            "give a Hugging Face Marian folder")


def test_a_run_folder_or_a_checkpoint_is_one_line(world):
    refused(world["ref"], "is a minitf run (or checkpoint) folder", "--checkpoint", "python -m minitf.export")
    checkpoint = sorted((world["ref"] / "checkpoints").iterdir())[-1]
    refused(checkpoint, "is a minitf run (or checkpoint) folder")


def test_a_missing_folder_or_weights_file_is_one_line(tmp_path):
    refused(tmp_path / "nowhere", "is not a folder", "Hugging Face Marian folder")
    folder = folder_with(tmp_path, GOOD)
    (folder / "model.safetensors").unlink()
    refused(folder, "has no model.safetensors")


def test_pytorch_model_bin_without_torch_says_how_to_convert_it(tmp_path, monkeypatch):
    folder = folder_with(tmp_path, GOOD)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # import torch raises ImportError
    refused(folder, "has only pytorch_model.bin", "torch is not installed",
            "MarianMTModel.from_pretrained", ".save_pretrained(", "or pip install torch")


def test_save_pretrained_refuses_what_marian_cannot_hold_and_writes_nothing(tmp_path):
    model = minitf.Transformer(12, 12, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=16,
                               pre_norm=True)
    with pytest.raises(ValueError, match=r"cannot hold this model: it has pre-LN .*, no decoder start token "
                                         r"\(give decoder_start_id\), no end token \(give eos_id\)$"):
        marian.save_pretrained(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- #
# Damaged weights: a real model.safetensors (written by minitf) then changed
# --------------------------------------------------------------------------- #
def good_folder(tmp_path):
    folder = tmp_path / "marian"
    backend.manual_seed(0)
    model = minitf.Transformer.from_config(marian.transformer_config(GOOD))
    marian.save_pretrained(model, folder)
    assert marian.from_pretrained(folder).config == model.config  # it reads back
    return folder


def rewrite(folder, change):
    import safetensors.numpy
    path = folder / "model.safetensors"
    tensors = safetensors.numpy.load_file(str(path))
    change(tensors)
    path.write_bytes(safetensors.numpy.save(tensors, metadata={"format": "pt"}))


@pytest.mark.extra("safetensors", "hf")
def test_a_truncated_model_safetensors_is_one_line(tmp_path):
    folder = good_folder(tmp_path)
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    refused(folder, "model.safetensors is not a readable safetensors file", "download or write it again")


@pytest.mark.extra("safetensors", "hf")
@pytest.mark.parametrize("change, words", [
    (lambda t: t.update({"model.encoder.layers.0.fc1.weight": np.zeros((16, 9), np.float32)}),
     ["tensors of the wrong shape", "model.encoder.layers.0.fc1.weight (16, 9) (expected (16, 8))"]),
    (lambda t: t.pop("model.decoder.layers.0.encoder_attn.k_proj.bias"),
     ["missing 1 (model.decoder.layers.0.encoder_attn.k_proj.bias)", "use the folder's own model file"]),
    (lambda t: t.update({"model.encoder.layernorm_embedding.weight": np.ones(8, np.float32)}),
     ["not Marian tensors 1 (model.encoder.layernorm_embedding.weight)"]),
    (lambda t: t["model.shared.weight"].__setitem__((3, 4), np.nan),
     ["tensor model.shared.weight holds 1 NaN or infinite value(s)"]),
    (lambda t: t.update({"lm_head.weight": t["model.shared.weight"] + 1}),
     ["lm_head.weight differs from model.shared.weight, which it must repeat"]),
    (lambda t: t.update({"model.encoder.embed_positions.weight": np.zeros((64, 8), np.float32)}),
     ["model.encoder.embed_positions.weight is not the sinusoid table transformers computes (off by up to 1)"]),
])
def test_a_tensor_missing_unknown_misshapen_or_damaged_is_one_line_naming_it(change, words, tmp_path):
    folder = good_folder(tmp_path)
    rewrite(folder, change)
    refused(folder, "model.safetensors", *words)


@pytest.mark.extra("safetensors", "hf")
@pytest.mark.parametrize("key", ["encoder_layers", "decoder_layers"])
def test_a_config_declaring_more_layers_than_its_weights_hold_is_one_line_before_any_layer_is_made(key, tmp_path):
    """Before: config.json's 10**7 layers built layer after layer (minutes, then the machine's memory) before a
    tensor was found missing, and the out-of-memory line blamed --batch-size; now one line naming the key."""
    import time
    folder = good_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, **{key: 10 ** 7})))
    start = time.perf_counter()
    refused(folder, f"config.json declares {key} 10000000, but the weights hold 1 such layers")
    assert time.perf_counter() - start < 20  # refused from the file's names, not after building anything


@pytest.mark.extra("safetensors", "hf")
def test_a_gpt2_config_declaring_more_layers_than_its_weights_hold_is_one_line(tmp_path):
    from minitf.gpt import GPT
    from minitf.lm import gpt2
    backend.manual_seed(0)
    gpt2.save_pretrained(GPT.preset("gpt2", 11, max_len=6, d_model=4, num_heads=2, num_layers=1, d_ff=8), tmp_path / "g")
    config = json.loads((tmp_path / "g" / "config.json").read_text())
    (tmp_path / "g" / "config.json").write_text(json.dumps(dict(config, n_layer=10 ** 7)))
    with pytest.raises(ValueError, match="config.json declares n_layer 10000000, but the weights hold 1 such layers"):
        gpt2.from_pretrained(tmp_path / "g")


@pytest.mark.extra("safetensors", "hf")
def test_a_tied_alias_equal_to_the_embedding_and_the_sinusoid_table_are_accepted(tmp_path):
    """What an older file holds besides the 86 tensors: the aliases of the shared matrix and the position
    tables, as transformers computes them (float32)."""
    folder = good_folder(tmp_path)
    table = backend.to_numpy(minitf.layers.sinusoidal_table(64, 8, dtype=np.float32, layout="halves"))
    rewrite(folder, lambda t: t.update({"lm_head.weight": t["model.shared.weight"].copy(),
                                        "model.decoder.embed_positions.weight": table}))
    marian.from_pretrained(folder)


# --------------------------------------------------------------------------- #
# Weights in bfloat16, float16 and shards (written here byte by byte: tests/test_pretrained.py's writer)
# --------------------------------------------------------------------------- #
def _logits(folder, dtype=None):
    model = marian.from_pretrained(folder, dtype=dtype)
    with minitf.no_grad():
        return backend.to_numpy(model(np.array([[3, 5, 7, 0]]), np.array([[19, 4, 6]])))


def _rewritten(tmp_path, name, tensors, shards=1):
    """A copy of a good folder's config.json beside ``tensors`` ({name: (dtype, array)}), in ``shards`` files."""
    from tests.test_pretrained import safetensors_bytes, write_sharded
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_bytes((tmp_path / "marian" / "config.json").read_bytes())
    if shards == 1:
        (folder / "model.safetensors").write_bytes(safetensors_bytes(tensors))
    else:
        write_sharded(folder, tensors, shards)
    return folder


@pytest.mark.extra("safetensors", "hf")
def test_a_bfloat16_float16_or_sharded_folder_reads_as_its_weights_rounded(tmp_path):
    """Before: bfloat16 weights were "not a readable safetensors file" and a sharded folder "has no
    model.safetensors"."""
    from minitf import pretrained
    from tests.test_pretrained import bf16_round
    weights = pretrained.read_weights(good_folder(tmp_path) / "model.safetensors")
    original = _logits(tmp_path / "marian")
    for dtype, rounded in [("BF16", bf16_round), ("F16", lambda a: a.astype(np.float16).astype(np.float32))]:
        low = _rewritten(tmp_path, dtype, {name: (dtype, a) for name, a in weights.items()})
        expected = _rewritten(tmp_path, f"{dtype} as F32", {name: ("F32", rounded(a)) for name, a in weights.items()})
        assert np.array_equal(_logits(low), _logits(expected)) and not np.array_equal(_logits(low), original)
        sharded = _rewritten(tmp_path, f"{dtype} in 4 shards", {name: (dtype, a) for name, a in weights.items()}, 4)
        assert _logits(sharded).tobytes() == _logits(low).tobytes()


@pytest.mark.extra("safetensors", "hf")
def test_damaged_shards_and_values_beyond_the_models_dtype_are_one_line(tmp_path):
    """Before: a float64 file's 1e39 became infinity in a float32 Marian model, silently (GPT's reader checked)."""
    from minitf import pretrained
    weights = pretrained.read_weights(good_folder(tmp_path) / "model.safetensors")
    tensors = {name: ("F32", a) for name, a in weights.items()}
    sharded = _rewritten(tmp_path, "sharded", tensors, shards=2)
    shard = sharded / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-7])
    refused(sharded, "model-00002-of-00002.safetensors is not a readable safetensors file", "truncated",
            "download or write it again")
    index = sharded / "model.safetensors.index.json"
    hf = json.loads(index.read_text())
    hf["weight_map"]["model.shared.weight"] = "../model.safetensors"
    index.write_text(json.dumps(hf))
    refused(sharded, "model.safetensors.index.json: tensor model.shared.weight is placed in '../model.safetensors'")
    huge = dict(tensors, **{"model.encoder.layers.0.fc1.weight": ("F64", np.full((16, 8), 1e39))})
    refused(_rewritten(tmp_path, "huge", huge), "tensor model.encoder.layers.0.fc1.weight holds values beyond "
                                                "float32's range")
    assert np.isfinite(_logits(tmp_path / "huge", "float64")).all()
    big = dict(tensors, **{"model.encoder.layers.0.fc1.weight": ("BF16", np.full((16, 8), 1e5))})
    with pytest.raises(ValueError, match="model.encoder.layers.0.fc1.weight holds values beyond float16's range"):
        marian.from_pretrained(_rewritten(tmp_path, "big", big), dtype="float16")


@pytest.mark.extra("torch", "bench")
@pytest.mark.extra("safetensors", "hf")
def test_a_bfloat16_pytorch_model_bin_reads_as_the_same_weights_in_bfloat16_safetensors(tmp_path):
    """torch's weights-only loader widens bfloat16 as minitf's safetensors reader does: the two folders agree."""
    import torch

    from minitf import pretrained
    weights = pretrained.read_weights(good_folder(tmp_path) / "model.safetensors")
    low = _rewritten(tmp_path, "BF16", {name: ("BF16", a) for name, a in weights.items()})
    pickled = _rewritten(tmp_path, "bin", {})
    (pickled / "model.safetensors").unlink()
    torch.save({name: torch.from_numpy(a).to(torch.bfloat16) for name, a in weights.items()},
               pickled / "pytorch_model.bin")
    assert _logits(pickled).tobytes() == _logits(low).tobytes()
