"""minitf.pretrained, the reader and writer of Hugging Face folders every model uses: config values checked for
presence, type and range naming the key (every branch of config_value), config.json's messages, minitf's own
safetensors reader (F64, F32, F16, BF16 widened exactly, sharded folders; every damaged header, shard and
non-finite tensor one line naming the file and tensor; files written here byte by byte), shapes, the dtype's
range, the model dtype's check, and the atomic writers. Tests that write with the safetensors package need the
``hf`` extra; those comparing with folders transformers writes need torch and transformers."""
import json
import math
import os
import re
import sys

import pytest

import minitf
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
               "half": np.arange(3, dtype=np.float16), "t": np.arange(4.0)[::2]}  # a strided view: made contiguous
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
        tensors = {"fine": np.ones(2), "h.0.w": w, "half": np.arange(3, dtype=np.float16)}
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
    (``poison(model)`` puts a NaN and an infinity there) and its format's writer ``save(model, folder)``."""
    import minitf
    from minitf.gpt import GPT
    from minitf.lm import gpt2
    from minitf.nmt import marian
    backend.manual_seed(0)
    gpt = GPT.preset("gpt2", 11, max_len=6, d_model=4, num_heads=2, num_layers=1, d_ff=8)
    translation = minitf.Transformer.from_config(marian.transformer_config(
        {"model_type": "marian", "d_model": 8, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
         "decoder_attention_heads": 2, "encoder_ffn_dim": 16, "decoder_ffn_dim": 16, "activation_function": "swish",
         "scale_embedding": True, "vocab_size": 20, "decoder_vocab_size": 20, "pad_token_id": 19,
         "decoder_start_token_id": 19, "eos_token_id": 0, "max_position_embeddings": 64,
         "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True, "dropout": 0.1}))
    return [(gpt, lambda m: m.decoder.layers[0].feed_forward.linear1.weight.data, "transformer.h.0.mlp.c_fc.weight",
             gpt2.save_pretrained),
            (translation, lambda m: m.decoder.layers[0].feed_forward.linear1.weight.data,
             "model.decoder.layers.0.fc1.weight", marian.save_pretrained)]


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@needs_safetensors
def test_save_pretrained_to_a_file_or_below_one_is_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "file").write_text("mine")
    os.mkfifo(tmp_path / "pipe")
    for model, _, _, save in gpt2_and_marian_models():
        for where, what, blocker in [("file", "a regular file", "file"), ("file/model", "a regular file", "file"),
                                     ("pipe", "a FIFO (named pipe)", "pipe")]:
            with pytest.raises(ValueError) as error:
                save(model, tmp_path / where)
            assert str(error.value) == (f"cannot save the model into {tmp_path / where}: {tmp_path / blocker} is "
                                        f"{what}, not a folder; give a folder (it is made if missing)")
            assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "pipe"]
            assert (tmp_path / "file").read_text() == "mine"


@needs_safetensors
def test_save_pretrained_refuses_non_finite_weights_naming_the_tensor_before_writing(tmp_path):
    for number, (model, weight, name, save) in enumerate(gpt2_and_marian_models()):
        folder = tmp_path / str(number)
        save(model, folder / "earlier")
        earlier = snapshot(folder / "earlier")
        weight(model)[0, :2] = [np.nan, np.inf]
        size = weight(model).size
        for out in (folder / "new", folder / "earlier"):
            with pytest.raises(ValueError) as error:
                save(model, out)
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

    from minitf.nmt.marian import read_torch_weights
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


# --------------------------------------------------------------------------- minitf's own safetensors reader
#: safetensors dtype -> NumPy dtype of the values a test writes (BF16: float32 rounded to its upper half)
TEST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<f4", "I64": "<i8"}


def bf16_bits(values):
    """float32 values rounded to bfloat16 (to nearest, ties to even, as torch rounds): their 16 upper bits."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def bf16_round(values):
    """float32 values rounded to bfloat16, as float32 (exact)."""
    return (bf16_bits(values).astype(np.uint32) << 16).view(np.float32)


def safetensors_bytes(tensors, metadata=None, change=None):
    """A safetensors file of ``{name: (dtype, array)}`` written here, byte by byte as the format says (8-byte
    little-endian header length, the JSON header padded with spaces to 8 bytes, the data in order);
    ``change(header)`` edits the header dict first (damaged variants)."""
    header, data = {}, b""
    for name, (dtype, array) in tensors.items():
        raw = bf16_bits(array).tobytes() if dtype == "BF16" else np.asarray(array, TEST_DTYPES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(np.shape(array)),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    if change is not None:
        change(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data


def write_sharded(folder, tensors, shards=2, index_name="model.safetensors.index.json", change=None):
    """``{name: (dtype, array)}`` as ``shards`` files model-0000i-of-0000n.safetensors and their index (as
    transformers' save_pretrained(max_shard_size=...) lays them out); ``change(weight_map)`` edits the index."""
    names = list(tensors)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i * len(names) // shards:(i + 1) * len(names) // shards]
        (folder / shard).write_bytes(safetensors_bytes({n: tensors[n] for n in part}, {"format": "pt"}))
        weight_map |= {n: shard for n in part}
    if change is not None:
        change(weight_map)
    (folder / index_name).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return folder / index_name


def test_bfloat16_float16_and_float64_tensors_are_read_bfloat16_widened_exactly(tmp_path):
    """Before: a BF16 tensor made the whole file "not a readable safetensors file" (NumPy has no bfloat16)."""
    rng = np.random.default_rng(0)
    wide = np.concatenate([rng.normal(0, 1, 20), [0.0, -0.0, 1e-40, -3e38, 3.3e38, 2 ** -133]]).astype(np.float32)
    half = rng.normal(0, 3, (3, 4)).astype(np.float16)
    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors_bytes({"b": ("BF16", wide), "h": ("F16", half), "d": ("F64", np.arange(3.0)),
                                        "s": ("F32", np.float32(2.5)), "e": ("BF16", np.zeros((0, 3)))},
                                       {"format": "pt"}))
    weights = read_weights(path)
    assert {k: (v.dtype, v.shape) for k, v in weights.items()} == {
        "b": (np.float32, (26,)), "h": (np.float16, (3, 4)), "d": (np.float64, (3,)), "s": (np.float32, ()),
        "e": (np.float32, (0, 3))}
    assert weights["b"].tobytes() == bf16_round(wide).tobytes()  # the bits themselves: -0.0 and subnormals too
    assert not np.array_equal(bf16_round(wide), wide)  # the rounding is real: the test can tell
    assert np.array_equal(weights["h"], half) and np.array_equal(weights["d"], np.arange(3.0))


@needs_safetensors
def test_reading_needs_no_safetensors_package_and_agrees_with_it(tmp_path, monkeypatch):
    """Before: reading imported safetensors.numpy (an ImportError without the hf extra)."""
    import safetensors.numpy
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "z": np.zeros((0,), np.float16),
               "c": np.array(7.0)}
    data = safetensors.numpy.save(tensors, metadata={"format": "pt"})  # the package's own layout and padding
    (tmp_path / "model.safetensors").write_bytes(data)
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    back = read_weights(tmp_path / "model.safetensors")
    assert back.keys() == tensors.keys()
    assert all(back[k].dtype == tensors[k].dtype and np.array_equal(back[k], tensors[k]) for k in tensors)


def test_a_sharded_folder_reads_as_the_single_file_bit_for_bit(tmp_path):
    """Before: a folder of model.safetensors.index.json and its shards "has no model.safetensors"."""
    from minitf import pretrained
    rng = np.random.default_rng(1)
    tensors = {f"layer.{i}.w": ("BF16" if i % 2 else "F32", rng.normal(0, 1, (3, i + 1)).astype(np.float32))
               for i in range(5)}
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    single.mkdir(), sharded.mkdir()
    (single / "model.safetensors").write_bytes(safetensors_bytes(tensors))
    write_sharded(sharded, tensors, shards=3)
    (sharded / "config.json").write_text('{"model_type": "gpt2"}')
    assert read_config(sharded, ("gpt2",), "Hugging Face GPT-2 folder") == {"model_type": "gpt2"}
    assert pretrained.weights_path(sharded) == sharded / "model.safetensors.index.json"
    assert pretrained.weights_path(single) == single / "model.safetensors"
    one, many = read_weights(pretrained.weights_path(single)), read_weights(pretrained.weights_path(sharded))
    assert one.keys() == many.keys() == tensors.keys()
    assert all(one[k].dtype == many[k].dtype and one[k].tobytes() == many[k].tobytes() for k in one)


#: the tensors of a good file (offsets: embed.weight [0, 24], h.0.w [24, 32], h.0.b [32, 36])
GOOD_TENSORS = {"embed.weight": ("F32", np.ones((2, 3))), "h.0.w": ("BF16", np.full((2, 2), 0.5)),
                "h.0.b": ("F16", np.zeros(2))}


def good(tensors=None, metadata=None, change=None):
    return safetensors_bytes(GOOD_TENSORS | (tensors or {}), metadata, change)


def edit(name, **entries):
    """A change to the header: ``entries`` set in tensor ``name``'s."""
    return lambda header: header[name].update(entries)


def raw_header(text):
    """A file of this header text (bytes) and no data."""
    return len(text).to_bytes(8, "little") + text


#: a damaged or foreign file (its bytes) -> what the one-line error says after the file's path
DAMAGED = {
    "empty": (b"", "is not a readable safetensors file \\(0 bytes, fewer than the 8 of the header's length\\)"),
    "header length past the end": ((10 ** 6).to_bytes(8, "little") + good()[8:],
                                   "its header length 1000000 runs past the end of the file \\(\\d+ bytes\\)"),
    "truncated inside a tensor": (good()[:-3], "tensor h.0.b: its data_offsets \\[32, 36\\] run past the end of "
                                               "the file's 33 bytes of data: truncated"),
    "trailing bytes": (good() + bytes(4), "4 bytes after the last tensor's data belong to no tensor"),
    "header not JSON": (raw_header(b'{"a": '), "its header is not JSON"),
    "header a list": (raw_header(b"[1, 2]"), "its header is not a JSON object"),
    "a name twice": (raw_header(b'{"w": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}, '
                                b'"w": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}'),
                     "its header names 'w' twice"),
    "overlapping offsets": (good(change=edit("h.0.w", data_offsets=[20, 28])),
                            "tensor h.0.w: its data_offsets \\[20, 28\\] overlap tensor embed.weight's \\[0, 24\\]"),
    "a hole": (good(change=edit("h.0.b", shape=[1], data_offsets=[34, 36])),
               "bytes \\[32, 34\\] of the data belong to no tensor"),
    "shape and span disagree": (good(change=edit("h.0.w", shape=[2, 3])),
                                "tensor h.0.w: shape \\[2, 3\\] of BF16 is 12 bytes, its data_offsets \\[24, 32\\] "
                                "span 8"),
    "unknown dtype": (good(change=edit("h.0.b", dtype="F17")), "tensor h.0.b: dtype 'F17' is not a safetensors dtype"),
    "a negative size": (good(change=edit("h.0.b", shape=[-2])), "tensor h.0.b: shape \\[-2\\] is not a list of sizes"),
    "a bool size": (good(change=edit("h.0.b", shape=[True, 2])), "shape \\[True, 2\\] is not a list of sizes"),
    "66 dimensions": (good(change=edit("h.0.b", shape=[1] * 65 + [2])),
                      "tensor h.0.b: shape \\[1, 1, .*, 2\\] is not an array NumPy can hold"),
    "an empty tensor of 2^70 columns": (good({"z": ("F32", np.zeros(0))}, change=edit("z", shape=[0, 2 ** 70])),
                                        "tensor z: shape \\[0, 1180591620717411303424\\] is not an array NumPy"),
    "offsets reversed": (good(change=edit("h.0.b", data_offsets=[36, 32])), "data_offsets \\[36, 32\\] is not"),
    "metadata not strings": (good(metadata={"format": 1}), "its __metadata__ is not an object of strings"),
    "an integer tensor": (good({"step": ("I64", np.arange(2))}),
                          "tensor step is I64, not floating-point weights \\(minitf reads F64, F32, F16, BF16\\)"),
    "NaN in bfloat16": (good({"h.1.w": ("BF16", np.array([1.0, np.nan, 2.0]))}),
                        "tensor h.1.w holds 1 NaN or infinite value\\(s\\) of 3; the weights are damaged"),
    "infinity in float16": (good({"h.1.b": ("F16", np.array([np.inf, -np.inf]))}),
                            "tensor h.1.b holds 2 NaN or infinite value\\(s\\) of 2"),
}


def refused_in_one_line(path, says, read=read_weights):
    with pytest.raises(ValueError) as error:
        read(path)
    message = str(error.value)
    assert "\n" not in message and re.search(says, message), message
    return message


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_or_foreign_file_is_refused_in_one_line_naming_the_file_and_tensor(tmp_path, case):
    data, says = DAMAGED[case]
    path = tmp_path / "model.safetensors"
    path.write_bytes(data)
    assert refused_in_one_line(path, says).startswith(str(path))


def test_a_buffer_named_by_the_reader_is_left_out_whatever_its_dtype(tmp_path):
    """GPT-2's older files carry their attention masks (bool, uint8 or float32): constants, not weights."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(good({"h.0.attn.bias": ("I64", np.ones((1, 1, 2, 2))), "h.0.attn.masked_bias": ("F32", -1e4)}))
    assert sorted(read_weights(path, buffers=(".attn.bias", ".attn.masked_bias"))) == sorted(GOOD_TENSORS)
    refused_in_one_line(path, "tensor h.0.attn.bias is I64, not floating-point weights")


#: a sharded folder's damage (a change to its files) -> what the one-line error says, and the file it names first
def _truncate_second_shard(folder):
    shard = folder / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-2])


SHARD_DAMAGE = {
    "a truncated shard": (dict(after=_truncate_second_shard), "model-00002-of-00002.safetensors",
                          "is not a readable safetensors file \\(tensor h.0.b: .*truncated"),
    "a path up out of the folder": (dict(change=lambda m: m.update({"h.0.b": "../model-00002-of-00002.safetensors"})),
                                    "model.safetensors.index.json", "tensor h.0.b is placed in "
                                    "'../model-00002-of-00002.safetensors', not a .safetensors file's name"),
    "an absolute path": (dict(change=lambda m: m.update({"h.0.b": "/etc/x.safetensors"})),
                         "model.safetensors.index.json", "tensor h.0.b is placed in '/etc/x.safetensors'"),
    "a backslash path": (dict(change=lambda m: m.update({"h.0.b": "..\\\\x.safetensors"})),
                         "model.safetensors.index.json", "not a .safetensors file's name"),
    "a tensor missing from its shard": (dict(change=lambda m: m.update({"h.9.w": "model-00001-of-00002.safetensors"})),
                                        "model-00001-of-00002.safetensors", "has no tensor h.9.w, which "
                                        "model.safetensors.index.json places there"),
    "a tensor the index places elsewhere": (dict(change=lambda m: m.update({"h.0.b": m["embed.weight"]})),
                                            "model-00002-of-00002.safetensors", "tensor h.0.b is here but "
                                            "model.safetensors.index.json places it in model-00001-of-00002"),
    "a tensor the index leaves out": (dict(change=lambda m: m.pop("h.0.b")), "model-00002-of-00002.safetensors",
                                      "tensor h.0.b is here but model.safetensors.index.json places it nowhere"),
    "a missing shard": (dict(after=lambda f: (f / "model-00002-of-00002.safetensors").unlink()),
                        "model.safetensors.index.json", "its shard model-00002-of-00002.safetensors \\(holding 2 "
                        "tensor\\(s\\), h.0.w first\\) is not in the folder"),
    "an index without weight_map": (dict(after=lambda f: (f / "model.safetensors.index.json").write_text('{"a": 1}')),
                                    "model.safetensors.index.json", 'has no "weight_map" of tensor names'),
    "an index not JSON": (dict(after=lambda f: (f / "model.safetensors.index.json").write_text('{"weight_map": ')),
                          "model.safetensors.index.json", "is not readable JSON"),
}


@pytest.mark.parametrize("case", sorted(SHARD_DAMAGE))
def test_a_damaged_sharded_folder_is_refused_in_one_line_naming_the_file_and_tensor(tmp_path, case):
    how, file, says = SHARD_DAMAGE[case]
    index = write_sharded(tmp_path, GOOD_TENSORS, shards=2, change=how.get("change"))
    if "after" in how:
        how["after"](tmp_path)
    assert refused_in_one_line(index, says).startswith(str(tmp_path / file))


def test_from_pretrained_refuses_bfloat16_and_other_dtypes_in_one_line(tmp_path):
    """Before: dtype="bfloat16" was a bare TypeError from NumPy ("data type 'bfloat16' not understood")."""
    from minitf import pretrained
    from minitf.lm import gpt2
    from minitf.nmt import marian
    for read in (gpt2.from_pretrained, marian.from_pretrained):
        for dtype in ("bfloat16", "int32", "float128", "nonsense"):
            with pytest.raises(ValueError) as error:
                read(tmp_path / "nowhere", dtype=dtype)  # refused before the folder is looked at
            message = str(error.value)
            assert "\n" not in message and "float32, float64, float16" in message, message
            assert ("bfloat16 weights are widened exactly" in message) == (dtype == "bfloat16"), message
    assert [pretrained.model_dtype(d) for d in ("float32", np.float64, "float16")] == [np.float32, np.float64,
                                                                                      np.float16]
    with backend.default_dtype("float64"):
        assert pretrained.model_dtype(None) is np.float64


# --------------------------------------------------------------------------- folders transformers writes
@pytest.mark.extra("torch", "bench")
@pytest.mark.extra("transformers", "bench")
@pytest.mark.parametrize("kind", ["gpt2", "marian"])
def test_a_bfloat16_folder_in_shards_from_transformers_reads_as_torch_widens_it(tmp_path, kind):
    """A folder as transformers writes one in bfloat16, sharded (save_pretrained(max_shard_size=...)): every
    tensor read equals torch's own float32 widening bit for bit, and the model's logits equal transformers' on
    the same weights rounded to bfloat16 (float32; the sinusoid tables, which minitf computes, kept exact)."""
    import copy

    import torch
    import transformers

    from minitf.lm import gpt2
    from minitf.nmt import marian
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=11, n_positions=6, n_embd=8, n_head=2, n_layer=2, bos_token_id=0,
                                         eos_token_id=0)
        model, inputs = transformers.GPT2LMHeadModel(config), dict(input_ids=torch.tensor([[1, 2, 3, 10]]))
        read = gpt2.from_pretrained
    else:
        config = transformers.MarianConfig(
            vocab_size=20, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=64,
            activation_function="swish", scale_embedding=True, pad_token_id=19, decoder_start_token_id=19,
            eos_token_id=0, forced_eos_token_id=0, bos_token_id=0, dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0)
        model, read = transformers.MarianMTModel(config), marian.from_pretrained
        inputs = dict(input_ids=torch.tensor([[3, 5, 7, 0]]), decoder_input_ids=torch.tensor([[19, 4, 6]]))
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                p.normal_(0.0, 0.3)  # values bfloat16 rounds visibly
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in [*rounded.named_parameters(), *rounded.named_buffers()]:
            if "embed_positions" not in name and p.is_floating_point():
                p.copy_(p.to(torch.bfloat16).float())
        expected = rounded(**inputs).logits.numpy()
    model.to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="2KB")
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) >= 2 and not (tmp_path / "model.safetensors").exists()
    weights = read_weights(tmp_path / "model.safetensors.index.json")
    widened = {name: t.float().numpy() for name, t in model.state_dict().items()}
    assert weights and all(weights[name].tobytes() == widened[name].tobytes() for name in weights)
    ours = read(tmp_path).eval()  # gpt2.from_pretrained gives a model in training mode (dropout)
    with minitf.no_grad():
        logits = backend.to_numpy(ours(*(x.numpy() for x in inputs.values())))
    assert np.abs(logits - expected).max() < 1e-5 * np.abs(expected).max()
