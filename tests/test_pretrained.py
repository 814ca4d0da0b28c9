"""minitf.pretrained, the reader and writer of Hugging Face folders every model uses: config values checked for
presence, type and range naming the key (every branch of config_value), config.json's messages, safetensors
files read with every tensor checked finite (a truncated file, a NaN, an infinity), shapes, the dtype's range,
and the atomic writers. Tests that read or write safetensors need the ``hf`` extra."""
import math
import os
import sys

import pytest

from minitf import backend
from minitf.pretrained import (REQUIRED, check_dtype_range, check_shapes, config_value, read_config, read_weights,
                               safetensors_numpy, write_json, write_weights)

np = backend.host
needs_safetensors = pytest.mark.extra("safetensors", "hf")
WHERE = "/models/x/config.json"


# --------------------------------------------------------------------------- config_value
def value(hf, key, kind, default=REQUIRED, **checks):
    return config_value(hf, key, kind, default, where=WHERE, **checks)


def test_an_absent_key_gives_its_default_and_a_required_one_is_named():
    assert value({}, "n_inner", "int", default=None) is None
    assert value({}, "layer_norm_epsilon", "float", default=1e-5) == 1e-5
    assert value({"n_inner": None}, "n_inner", "int", default=None, low=1) is None  # null means absent here
    for kind, article in [("int", "an int"), ("float", "a float"), ("bool", "a bool"), ("str", "a str")]:
        with pytest.raises(ValueError, match=f"^{WHERE} has no 'n_embd', which the model needs; "
                                             f"add it \\({article}\\)$"):
            value({"n_head": 2}, "n_embd", kind)


@pytest.mark.parametrize("kind, good, bad", [
    ("int", [0, -3, 10 ** 30], [True, 2.0, "2", None, [2]]),
    ("float", [0, 1e-5, -2.5, 10 ** 400], [False, "1e-5", None, math.nan, math.inf, -math.inf, {}]),
    ("bool", [True, False], [0, 1, "true", None]),
    ("str", ["gelu", ""], [1, None, True, ["gelu"]]),
])
def test_each_kind_takes_its_values_and_names_the_key_for_others(kind, good, bad):
    for v in good:
        assert value({"k": v}, "k", kind) == v
    article = "an" if kind == "int" else "a"
    for v in bad:
        with pytest.raises(ValueError, match=f"^{WHERE}: k is .*; it must be {article} {kind}"
                                             f"{' [(]a finite number[)]' if kind == 'float' else ''}$"):
            value({"k": v}, "k", kind, default=1)  # null is a wrong value where the default is not None


def test_ranges_and_choices_name_the_key_the_value_and_what_fits():
    assert value({"p": 0.0}, "p", "float", low=0.0, high=1.0, high_open=True) == 0.0
    assert value({"p": 1.0}, "p", "float", low=0.0, high=1.0) == 1.0  # high is inclusive unless high_open
    cases = [(dict(low=0.0), -0.1, "it must be at least 0.0"),
             (dict(low=0.0, low_open=True), 0, "it must be above 0.0"),
             (dict(high=1.0), 1.5, "it must be at most 1.0"),
             (dict(high=1.0, high_open=True), 1.0, "it must be below 1.0"),
             (dict(choices=("gelu", "relu")), "silu", "minitf computes 'gelu', 'relu'")]
    for checks, v, says in cases:
        kind = "str" if "choices" in checks else "float"
        with pytest.raises(ValueError, match=f"^{WHERE}: k is {v!r}; {says}$"):
            value({"k": v}, "k", kind, **checks)
    assert value({"k": "relu"}, "k", "str", choices=("gelu", "relu")) == "relu"


# --------------------------------------------------------------------------- read_config
def test_read_config_names_what_is_wrong_with_the_folder(tmp_path):
    what = "Hugging Face GPT-2 folder"
    with pytest.raises(ValueError, match=f"nowhere is not a folder; give a {what} "
                                         "\\(config.json, model.safetensors\\)"):
        read_config(tmp_path / "nowhere", ("gpt2",), what)
    (tmp_path / "meta.json").write_text("{}")
    with pytest.raises(ValueError, match="has no config.json; .* \\(it looks like a minitf run folder: give it as "
                                         "--checkpoint/--resume"):
        read_config(tmp_path, ("gpt2",), what)
    for text, says in [("{bad", "config.json is not readable JSON"), ("[1, 2]", "holds a JSON list, not an object"),
                       ('{"model_type": "bert"}',
                        f"describes model_type 'bert', not 'gpt2' or 'marian'; give a {what}"),
                       ('{"vocab_size": 3}', "describes model_type None")]:
        (tmp_path / "config.json").write_text(text)
        with pytest.raises(ValueError, match=says):
            read_config(tmp_path, ("gpt2", "marian"), what)
    (tmp_path / "config.json").write_bytes(b'{"model_type": "gpt2", "x": "\xff"}')
    with pytest.raises(ValueError, match="is not readable JSON"):
        read_config(tmp_path, ("gpt2",), what)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_embd": 4}')
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="has no model.safetensors; .*pytorch_model.bin is not read here: "
                                         "it is a pickle"):
        read_config(tmp_path, ("gpt2",), what)
    (tmp_path / "model.safetensors").write_bytes(b"")  # read_config reads config.json only
    assert read_config(tmp_path, ("gpt2",), what) == {"model_type": "gpt2", "n_embd": 4}


# --------------------------------------------------------------------------- weights
@needs_safetensors
def test_write_weights_then_read_weights_gives_the_arrays_back_and_writes_atomically(tmp_path):
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, dtype=np.float64),
               "steps": np.arange(3, dtype=np.int64), "t": np.arange(4.0)[::2]}  # a strided view: made contiguous
    write_weights(tmp_path / "model.safetensors", tensors)
    back = read_weights(tmp_path / "model.safetensors")
    assert back.keys() == tensors.keys()
    assert all(back[k].dtype == tensors[k].dtype and np.array_equal(back[k], tensors[k]) for k in tensors)
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]  # no temp file left
    write_json(tmp_path / "config.json", {"b": 1, "a": [1, 2]})
    assert (tmp_path / "config.json").read_text() == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'


@needs_safetensors
def test_read_weights_refuses_a_truncated_file_and_names_a_non_finite_tensor(tmp_path):
    path = tmp_path / "model.safetensors"
    write_weights(path, {"w": np.ones((4, 4), dtype=np.float32)})
    data = path.read_bytes()
    for damaged in (data[:-10], data[:12], b""):
        path.write_bytes(damaged)
        with pytest.raises(ValueError, match="model.safetensors is not a readable safetensors file .*; download or "
                                             "write it again"):
            read_weights(path)
    for bad, count in [(np.nan, 1), (np.inf, 2), (-np.inf, 1)]:
        w = np.ones((4, 4), dtype=np.float32)
        w.flat[:count] = bad
        tensors = {"fine": np.ones(2), "h.0.w": w, "ids": np.arange(3)}
        path.write_bytes(safetensors_numpy().save(tensors))  # as another writer would: write_weights refuses it
        with pytest.raises(ValueError, match=f"model.safetensors: tensor h.0.w holds {count} NaN or infinite "
                                             "value\\(s\\) of 16; the weights are damaged"):
            read_weights(path)


def test_check_shapes_names_every_tensor_of_the_wrong_shape():
    weights = {"a": np.zeros((2, 3)), "b": np.zeros(4), "c": np.zeros(1)}
    check_shapes(weights, {"a": (2, 3), "b": [4], "absent": (9,)}, "m.safetensors")  # absent names: not its job
    with pytest.raises(ValueError, match=r"^m.safetensors: tensors of the wrong shape for its config.json: "
                                         r"a \(2, 3\) \(expected \(3, 2\)\); c \(1,\) \(expected \(\)\)$"):
        check_shapes(weights, {"a": (3, 2), "b": (4,), "c": ()}, "m.safetensors")


def test_check_dtype_range_names_a_tensor_that_would_turn_infinite():
    weights = {"small": np.array([1e30, -3.0]), "ids": np.array([10 ** 12]), "big": np.array([1.0, -1e39])}
    check_dtype_range(weights, np.float64, "m")
    check_dtype_range({"half": np.array([7e4], dtype=np.float32)}, np.float32, "m")  # same width: nothing to check
    with pytest.raises(ValueError, match="m: tensor big holds values beyond float32's range \\(up to 1e\\+39"):
        check_dtype_range(weights, np.float32, "m")
    with pytest.raises(ValueError, match="tensor half holds values beyond float16's range"):
        check_dtype_range({"half": np.array([7e4], dtype=np.float32)}, "float16", "m")


def test_without_safetensors_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    with pytest.raises(ImportError, match=r'needs the safetensors package: pip install -e "\.\[hf\]"'):
        safetensors_numpy()


# --------------------------------------------------------------------------- save_pretrained's refusals
def gpt2_and_marian_models():
    """A small model of each kind save_pretrained writes, with the Hugging Face name of one of its tensors
    (``poison(model)`` puts a NaN and an infinity there)."""
    import minitf
    from minitf import marian
    from minitf.gpt import GPT
    backend.manual_seed(0)
    gpt = GPT.preset("gpt2", 11, max_len=6, d_model=4, num_heads=2, num_layers=1, d_ff=8)
    translation = minitf.Transformer(**marian.transformer_config(
        {"model_type": "marian", "d_model": 8, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
         "decoder_attention_heads": 2, "encoder_ffn_dim": 16, "decoder_ffn_dim": 16, "activation_function": "swish",
         "scale_embedding": True, "vocab_size": 20, "decoder_vocab_size": 20, "pad_token_id": 19,
         "decoder_start_token_id": 19, "eos_token_id": 0, "max_position_embeddings": 64,
         "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True, "dropout": 0.1}))
    return [(gpt, lambda m: m.decoder.layers[0].feed_forward.linear1.weight.data, "transformer.h.0.mlp.c_fc.weight"),
            (translation, lambda m: m.decoder.layers[0].feed_forward.linear1.weight.data,
             "model.decoder.layers.0.fc1.weight")]


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@needs_safetensors
def test_save_pretrained_to_a_file_or_below_one_is_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "file").write_text("mine")
    os.mkfifo(tmp_path / "pipe")
    for model, _, _ in gpt2_and_marian_models():
        for where, what, blocker in [("file", "a regular file", "file"), ("file/model", "a regular file", "file"),
                                     ("pipe", "a FIFO (named pipe)", "pipe")]:
            with pytest.raises(ValueError) as error:
                model.save_pretrained(tmp_path / where)
            assert str(error.value) == (f"cannot save the model into {tmp_path / where}: {tmp_path / blocker} is "
                                        f"{what}, not a folder; give a folder (it is made if missing)")
            assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "pipe"]
            assert (tmp_path / "file").read_text() == "mine"


@needs_safetensors
def test_save_pretrained_refuses_non_finite_weights_naming_the_tensor_before_writing(tmp_path):
    for number, (model, weight, name) in enumerate(gpt2_and_marian_models()):
        folder = tmp_path / str(number)
        model.save_pretrained(folder / "earlier")
        earlier = snapshot(folder / "earlier")
        weight(model)[0, :2] = [np.nan, np.inf]
        size = weight(model).size
        for out in (folder / "new", folder / "earlier"):
            with pytest.raises(ValueError) as error:
                model.save_pretrained(out)
            assert str(error.value) == (f"cannot write {out / 'model.safetensors'}: tensor {name} holds 2 NaN or "
                                        f"infinite value(s) of {size}, which from_pretrained would refuse; nothing was "
                                        "written (save the weights of an earlier checkpoint)"), str(error.value)
        assert not (folder / "new").exists() and snapshot(folder / "earlier") == earlier
    with pytest.raises(ValueError, match=r"tensor b holds 1 NaN or infinite value\(s\) of 3"):
        write_weights(tmp_path / "w.safetensors", {"a": np.ones(2), "b": np.array([1.0, -np.inf, 2.0])})
    assert not (tmp_path / "w.safetensors").exists()


# --------------------------------------------------------------------------- quoted messages
def test_a_quoted_message_loses_its_terminal_escape_sequences():
    from minitf.pretrained import quoted_message
    coloured = ("Weights only load failed. \x1b[1mdo those steps only if you trust\x1b[0m it. \x1b[31;1mred\x1b[m "
                "\x1b[2Kcleared \x1b]8;;https://x.org\x1b\\link\x1b]8;;\x1b\\ \x9b1mend\x1b(B\nsecond line")
    assert quoted_message(UnicodeError(coloured)) == ("UnicodeError: Weights only load failed. do those steps only if "
                                                     "you trust it. red cleared link end")
    assert quoted_message(KeyError()) == "KeyError"


@pytest.mark.extra("torch", "bench")
def test_a_refused_pytorch_pickle_is_quoted_without_escape_sequences(tmp_path):
    import torch

    from minitf.marian import read_torch_weights
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.ones(2), "odd": Odd()}, path)  # a class torch's weights-only unpickler refuses
    with pytest.raises(ValueError) as error:
        read_torch_weights(path)
    message = str(error.value)
    assert message.startswith(f"{path} is not a readable PyTorch state dict (UnpicklingError: Weights only load "
                              "failed.") and message.endswith("; download or write it again"), message
    assert "\x1b" not in message and "\n" not in message


class Odd:
    """A class no weights-only loader knows."""
