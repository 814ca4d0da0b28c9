"""Hugging Face GPT-2 folders in and out, the language-model kind's format: ``config.json`` (model_type gpt2)
checked value by value into a :class:`minitf.gpt.GPTConfig` (:func:`pretrained_config`), ``model.safetensors``
(or its shards, float32, float16 or bfloat16) through :func:`minitf.pretrained.read_weights` (no torch, no
pickle), and the way back (:func:`save_pretrained`), which transformers' ``GPT2LMHeadModel`` loads with the same
logits. A folder's config.json is never attached to the model: the loader keeps it (``Loaded.hf_config``) and a
writer is given it (``save_pretrained(model, folder, hf_config)``) to write its other entries back.
"""
import dataclasses
import pathlib

from minitf import backend, pretrained
from minitf.gpt import GPT, GPTConfig
from minitf.pretrained import HF_ACTIVATIONS, HF_NAME_OF_ACTIVATION


def from_pretrained(folder, dtype=None):
    """The :class:`minitf.gpt.GPT` of a Hugging Face GPT-2 folder, in training mode (as built), built under
    ``dtype`` (default: minitf's default float dtype; float32, float64 or float16; float16 and bfloat16 weights
    are widened as read). Every config value and tensor is checked (:func:`pretrained_config`,
    :func:`read_pretrained_state`, values within ``dtype``'s range) before the model is built; a ValueError
    names the file and the key or tensor that does not fit."""
    dtype = pretrained.model_dtype(dtype)  # "bfloat16" or another dtype: one line, before any file is read
    config, _ = pretrained_config(folder)
    state = read_pretrained_state(folder, config, dtype)
    with backend.default_dtype(dtype):
        model = GPT.from_config(dataclasses.replace(config, init="xavier"))  # the weights come next: no random draw
    model.config = dataclasses.replace(model.config, init=config.init)  # how it was made, for save_pretrained
    model.load_state_dict(state)
    return model


def save_pretrained(model, folder, hf_config=None):
    """Write the GPT ``model`` as a Hugging Face GPT-2 folder (``config.json`` and ``model.safetensors`` in the
    model's dtype), each file atomically; ``hf_config``: the config.json the model was read from (a
    ``Loaded.hf_config``), whose entries minitf does not compute (token ids, task parameters) are written back.
    Only GPT-2's shape can be written: pre-LN, learned positions, no embedding scale. A ValueError before anything
    is written for a ``folder`` that is a file (:func:`minitf.pretrained.check_save_folder`) or weights holding NaN
    or infinity (naming the tensor)."""
    folder = pathlib.Path(folder)
    pretrained.check_save_folder(folder)
    hf = hf_config_of(model.config, hf_config or {}, str(model.embed.weight.data.dtype))
    pretrained.write_weights(folder / "model.safetensors", minitf_to_hf_state(model.state_dict(), model.config))
    pretrained.write_json(folder / "config.json", hf)


# --------------------------------------------------------------------------- #
# Hugging Face's GPT-2 <-> minitf: names and configuration
# --------------------------------------------------------------------------- #
# GPT-2's Conv1D stores W as (d_in, d_out) with y = x W + b, minitf's Linear's layout, and c_attn
# holds [W^Q W^K W^V] side by side as minitf's w_qkv (D, 3D) does, heads split the same way
# ((B, L, H, dk) from the D columns): every array maps as it is, none transposed.
_LAYER = [("ln_1.weight", "self_attn_block.norm.gamma"), ("ln_1.bias", "self_attn_block.norm.beta"),
          ("attn.c_attn.weight", "self_attn.w_qkv"), ("attn.c_attn.bias", "self_attn.b_qkv"),
          ("attn.c_proj.weight", "self_attn.w_o"), ("attn.c_proj.bias", "self_attn.b_o"),
          ("ln_2.weight", "ff_block.norm.gamma"), ("ln_2.bias", "ff_block.norm.beta"),
          ("mlp.c_fc.weight", "feed_forward.linear1.weight"), ("mlp.c_fc.bias", "feed_forward.linear1.bias"),
          ("mlp.c_proj.weight", "feed_forward.linear2.weight"), ("mlp.c_proj.bias", "feed_forward.linear2.bias")]


def name_map(config):
    """``[(Hugging Face name, minitf name)]`` for every parameter of a GPT-2-shaped model of
    ``config`` (a :class:`minitf.gpt.GPTConfig`). Hugging Face names are those of
    ``GPT2LMHeadModel``'s state dict without the ``transformer.`` prefix."""
    pairs = [("wte.weight", "embed.weight"), ("wpe.weight", "positional.weight")]
    for i in range(config.num_layers):
        pairs += [(f"h.{i}.{hf}", f"decoder.layers.{i}.{ours}") for hf, ours in _LAYER]
    pairs += [("ln_f.weight", "decoder.final_norm.gamma"), ("ln_f.bias", "decoder.final_norm.beta")]
    if not config.tie_embeddings:
        pairs.append(("lm_head.weight", "generator.weight"))
    return pairs


def expected_shapes(config):
    """``{Hugging Face name: shape}`` (:func:`name_map`'s names) of a GPT-2-shaped model with this config."""
    V, P, D, F = config.vocab_size, config.max_len, config.d_model, config.d_ff
    layer = {"ln_1.weight": (D,), "ln_1.bias": (D,), "attn.c_attn.weight": (D, 3 * D), "attn.c_attn.bias": (3 * D,),
             "attn.c_proj.weight": (D, D), "attn.c_proj.bias": (D,), "ln_2.weight": (D,), "ln_2.bias": (D,),
             "mlp.c_fc.weight": (D, F), "mlp.c_fc.bias": (F,), "mlp.c_proj.weight": (F, D), "mlp.c_proj.bias": (D,)}
    shapes = {"wte.weight": (V, D), "wpe.weight": (P, D), "ln_f.weight": (D,), "ln_f.bias": (D,),
              "lm_head.weight": (V, D)}
    shapes |= {f"h.{i}.{name}": shape for i in range(config.num_layers) for name, shape in layer.items()}
    return {hf: shapes[hf] for hf, _ in name_map(config)}


#: Older files' attention-mask buffers (float32, uint8 or bool): constants, not parameters, left out
MASK_BUFFERS = (".attn.bias", ".attn.masked_bias")


def hf_to_minitf_state(weights, config, path="the weights"):
    """``{minitf name: array}`` from a GPT-2 state dict ``{name: array}`` (with or without the
    ``transformer.`` prefix; the attention-mask buffers ``attn.bias``/``attn.masked_bias`` of older
    files and a tied ``lm_head.weight`` are left out). A ValueError, naming ``path`` (the file) and the
    tensors, for unknown or missing names, a tensor that is not floating-point, or one of the wrong shape."""
    found, names = {}, {}
    for name, array in weights.items():
        short = name.removeprefix("transformer.")
        if short.endswith(MASK_BUFFERS):  # constant causal masks, not parameters
            continue
        if short == "lm_head.weight" and config.tie_embeddings:  # the same matrix as wte
            continue
        found[short], names[short] = array, name
    pretrained.check_layer_counts(found, {"n_layer": (config.num_layers, r"h\.(\d+)\.")}, path)
    pairs = name_map(config)
    missing = sorted({hf for hf, _ in pairs} - set(found))
    unknown = sorted(set(found) - {hf for hf, _ in pairs})
    if missing or unknown:
        raise ValueError(f"{path}: the weights do not fit a GPT-2 of its config.json: "
                         + "; ".join(filter(None, [missing and f"missing {missing}",
                                                   unknown and f"not GPT-2 parameters {unknown}"])))
    for short, array in found.items():
        if array.dtype.kind != "f":
            raise ValueError(f"{path}: tensor {names[short]} is {array.dtype}; expected floating-point weights "
                             "(the file is damaged or not a model's)")
    pretrained.check_shapes({names[hf]: found[hf] for hf in found},
                            {names[hf]: shape for hf, shape in expected_shapes(config).items()}, path)
    return {ours: found[hf] for hf, ours in pairs}


def minitf_to_hf_state(state, config):
    """``{Hugging Face name: array}`` (``GPT2LMHeadModel``'s, with the ``transformer.`` prefix)
    from ``GPT.state_dict()``."""
    return {(hf if hf == "lm_head.weight" else "transformer." + hf): state[ours] for hf, ours in name_map(config)}


def read_pretrained_state(folder, config, dtype=None):
    """``{minitf name: host array}`` of ``folder``'s ``model.safetensors`` (or its shards) for a GPT of ``config``
    (a :class:`minitf.gpt.GPTConfig`), in the file's dtype (bfloat16 as float32). A ValueError for a damaged file,
    a tensor holding NaN or infinity, weights of another shape, or (given ``dtype``, the model's) values beyond
    that dtype's range."""
    return pretrained.read_state(folder, config, hf_to_minitf_state, MASK_BUFFERS, dtype)


#: Names a GPT-2 folder in messages.
GPT2_FOLDER = "Hugging Face GPT-2 folder"


def pretrained_config(folder):
    """(the :class:`minitf.gpt.GPTConfig`, the config.json dict) of a Hugging Face GPT-2 folder, checked: a ValueError
    for a folder without config.json and model.safetensors, another model type, a key the model needs that
    is missing, a value of the wrong type or range (naming the key), or an option minitf does not compute.
    Only config.json is read (the weights are :func:`read_pretrained_state`'s)."""
    folder = pathlib.Path(folder)
    hf = pretrained.read_config(folder, ("gpt2",), GPT2_FOLDER)
    return config_from_hf(hf, str(folder / "config.json")), hf


#: GPT-2's options minitf computes one way only: config.json key -> the value minitf computes
_FIXED = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False}


def config_from_hf(hf, where="config.json"):
    """The :class:`minitf.gpt.GPTConfig` of a GPT-2 config.json (``where`` names it in messages). The shape (vocab_size,
    n_positions, n_embd, n_head, n_layer) must be there, as in every GPT-2 folder; the other keys take Hugging
    Face's defaults where absent (n_inner null: 4 n_embd). Every value read is checked for type and range,
    naming the key; options minitf does not compute are refused, not ignored. minitf has one dropout on the
    embeddings and each sublayer's output (resid_pdrop's: embd_pdrop is only checked) and attn_pdrop on the
    attention weights."""
    def value(key, kind, default=pretrained.REQUIRED, **checks):
        return pretrained.config_value(hf, key, kind, default, where=where, **checks)

    vocab_size = value("vocab_size", "int", low=1)
    n_positions, d_model = value("n_positions", "int", low=1), value("n_embd", "int", low=1)
    num_heads, num_layers = value("n_head", "int", low=1), value("n_layer", "int", low=1)
    if d_model % num_heads:
        raise ValueError(f"{where}: n_embd {d_model} is not a multiple of n_head {num_heads}; each head takes "
                         "n_embd / n_head of the width")
    d_ff = value("n_inner", "int", default=None, low=1) or 4 * d_model
    activation = value("activation_function", "str", default="gelu_new")
    dropout = {key: value(key, "float", default=0.1, low=0.0, high=1.0, high_open=True)
               for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
    layer_norm_eps = value("layer_norm_epsilon", "float", default=1e-5, low=0.0, low_open=True)
    init_std = value("initializer_range", "float", default=0.02, low=0.0)
    tie_embeddings = value("tie_word_embeddings", "bool", default=True)
    value("reorder_and_upcast_attn", "bool", default=False)  # float32 attention in a float16 model: numerics only
    value("eos_token_id", "int", default=None, low=0, high=vocab_size - 1)  # where generation stops
    refused = [] if activation in HF_ACTIVATIONS else [
        f"activation_function {activation!r} (minitf has {', '.join(HF_ACTIVATIONS)})"]
    refused += [f"{key}={hf[key]!r}" for key, fine in _FIXED.items() if value(key, "bool", default=fine) != fine]
    if refused:
        raise ValueError(f"{where}: this GPT-2 uses what minitf does not compute: {', '.join(refused)}")
    return GPTConfig(vocab_size=vocab_size, max_len=n_positions, d_model=d_model, num_heads=num_heads,
                     num_layers=num_layers, d_ff=d_ff, dropout=float(dropout["resid_pdrop"]),
                     attention_dropout=float(dropout["attn_pdrop"]), pre_norm=True,
                     activation=HF_ACTIVATIONS[activation], positions="learned", scale_embedding=False, init="gpt2",
                     init_std=float(init_std), layer_norm_eps=float(layer_norm_eps), tie_embeddings=tie_embeddings)


def hf_config_of(config, previous, dtype):
    """A GPT-2 config.json for a model of ``config`` (a :class:`minitf.gpt.GPTConfig`) whose arrays are of
    ``dtype`` (a name such as "float32"), keeping ``previous``'s other entries (token ids, task parameters of the
    folder it was read from). A ValueError for a model GPT-2 cannot describe."""
    wrong = [what for what, bad in [("post-LN (pre_norm=False)", not config.pre_norm),
                                    ("sinusoidal positions", config.positions != "learned"),
                                    ("a scaled embedding", config.scale_embedding),
                                    (f"the {config.activation!r} activation",
                                     config.activation not in HF_NAME_OF_ACTIVATION)] if bad]
    if wrong:
        raise ValueError(f"a Hugging Face GPT-2 folder cannot hold this model: it has {', '.join(wrong)}; "
                         "only GPT-2's shape (GPT.preset('gpt2', ...)) can be saved")
    hf = dict(previous)
    hf.update(architectures=["GPT2LMHeadModel"], model_type="gpt2", vocab_size=config.vocab_size,
              n_positions=config.max_len, n_embd=config.d_model, n_head=config.num_heads,
              n_layer=config.num_layers, n_inner=config.d_ff,
              activation_function=HF_NAME_OF_ACTIVATION[config.activation],
              resid_pdrop=config.dropout, embd_pdrop=config.dropout,
              attn_pdrop=config.attention_dropout,
              layer_norm_epsilon=config.layer_norm_eps, initializer_range=config.init_std,
              tie_word_embeddings=config.tie_embeddings, scale_attn_weights=True,
              scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False)
    hf.pop("n_ctx", None)  # an older name of n_positions: one number, not two that could disagree
    hf.pop("torch_dtype", None)  # transformers' older name of dtype
    hf["dtype"] = dtype
    return hf
