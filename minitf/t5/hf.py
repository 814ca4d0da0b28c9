"""Hugging Face ``T5ForConditionalGeneration`` folders in and out (t5 v1.0, t5 v1.1 and flan-t5, and mT5's
``MT5ForConditionalGeneration``): ``config.json`` of ``model_type`` t5 or mt5, every value checked before a model is
built (one line naming the file and key, what minitf does not compute refused: an unknown ``feed_forward_proj``, a
bucket count or distance the bucket function cannot split); the weights (``model.safetensors`` or shards, float32,
float16 or bfloat16) through :func:`minitf.pretrained.read_weights`. :func:`save_pretrained` writes a folder
transformers loads with the same logits.

Layouts: Hugging Face's ``nn.Linear`` keeps its weight as (out, in), minitf's :class:`minitf.layers.Linear` as (in,
out): every projection is transposed on the way in and out. The embedding, the lm_head (V, D) and the bias tables
(num_buckets, H) are the same on both sides; a stack's table is its first block's ``relative_attention_bias``.

Tied or not: transformers 5 reads ``tie_word_embeddings`` as "scale the decoder's output by d_model^-0.5" (the old
T5 rule, ``scale_decoder_outputs`` where a folder names it; mT5 never scales) and ties the lm_head to the shared
embedding unless the file holds an ``lm_head.weight`` of other values: minitf reads a folder so too.
"""
import pathlib

from minitf import backend, pretrained
from minitf.t5.config import FEED_FORWARDS, T5Config

np = backend.host

FAMILY = ("t5", "mt5")
T5_FOLDER = "Hugging Face T5 folder"
#: Tensors some files carry that are no parameter of the model: the stacks' copies of the shared embedding (older
#: saves), and a cross-attention table transformers ignores (``_keys_to_ignore_on_load_unexpected``)
BUFFERS = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
           "EncDecAttention.relative_attention_bias.weight")
#: transformers' defaults where a config.json leaves a key out: {model_type: {key: default}}
_DEFAULTS = {"t5": dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                        feed_forward_proj="relu"),
             "mt5": dict(vocab_size=250112, d_model=512, d_kv=64, d_ff=1024, num_layers=8, num_heads=6,
                         feed_forward_proj="gated-gelu")}


def config_from_hf(hf, where="config.json"):
    """The :class:`T5Config` of a T5 or mT5 config.json dict (``where`` names it in messages), tied (the file's
    lm_head decides that: :func:`from_pretrained`). Every key read is checked, naming it."""
    def value(key, kind, default=pretrained.REQUIRED, **checks):
        return pretrained.config_value(hf, key, kind, default, where=where, **checks)

    model_type = value("model_type", "str", choices=FAMILY)
    defaults = _DEFAULTS[model_type]
    sizes = {key: value(key, "int", default=defaults[key], low=1)
             for key in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")}
    sizes["num_decoder_layers"] = value("num_decoder_layers", "int", default=None, low=1) or sizes["num_layers"]
    buckets = value("relative_attention_num_buckets", "int", default=32, low=4)
    # the decoder's buckets below num_buckets / 2 are exact: the logarithmic ones need distances beyond them
    distance = value("relative_attention_max_distance", "int", default=128, low=buckets // 2, low_open=True)
    feed_forward = value("feed_forward_proj", "str", default=defaults["feed_forward_proj"],
                         choices=tuple(FEED_FORWARDS))
    tie = value("tie_word_embeddings", "bool", default=True)
    scale = False if model_type == "mt5" else value("scale_decoder_outputs", "bool", default=tie)
    vocab = sizes["vocab_size"]
    ids = {key: value(key, "int", default=default, low=0, high=vocab - 1)
           for key, default in (("pad_token_id", 0), ("eos_token_id", 1))}
    ids["decoder_start_token_id"] = value("decoder_start_token_id", "int", default=ids["pad_token_id"], low=0,
                                          high=vocab - 1)
    return T5Config(**sizes, relative_attention_num_buckets=buckets, relative_attention_max_distance=distance,
                    dropout_rate=float(value("dropout_rate", "float", default=0.1, low=0.0, high=1.0, high_open=True)),
                    layer_norm_epsilon=float(value("layer_norm_epsilon", "float", default=1e-6, low=0.0,
                                                   low_open=True, high=1.0, high_open=True)),
                    feed_forward_proj=feed_forward, tie_word_embeddings=True, scale_decoder_outputs=scale,
                    initializer_factor=float(value("initializer_factor", "float", default=1.0, low=0.0,
                                                   low_open=True)),
                    n_positions=value("n_positions", "int", default=None, low=1), **ids)


# --------------------------------------------------------------------------- #
# Weights: names and layouts
# --------------------------------------------------------------------------- #
def name_map(config):
    """``[(Hugging Face name, minitf name, transposed)]`` for every parameter of a model of ``config``."""
    pairs = [("shared.weight", "shared.weight", False)]
    ff = ["wi_0", "wi_1", "wo"] if config.gated else ["wi", "wo"]
    for stack, count in (("encoder", config.num_layers), ("decoder", config.num_decoder_layers)):
        pairs.append((f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                      f"{stack}.relative_attention_bias.weight", False))
        sublayers = [("SelfAttention", "self_attn")] + ([("EncDecAttention", "cross_attn")] if stack == "decoder"
                                                        else [])
        for i in range(count):
            hf_block, block = f"{stack}.block.{i}.layer", f"{stack}.block.{i}"
            for j, (theirs, ours) in enumerate(sublayers):
                pairs += [(f"{hf_block}.{j}.{theirs}.{p}.weight", f"{block}.{ours}.{p}.weight", True) for p in "qkvo"]
                pairs.append((f"{hf_block}.{j}.layer_norm.weight", f"{block}.{ours}_norm.weight", False))
            j = len(sublayers)
            pairs += [(f"{hf_block}.{j}.DenseReluDense.{p}.weight", f"{block}.ff.{p}.weight", True) for p in ff]
            pairs.append((f"{hf_block}.{j}.layer_norm.weight", f"{block}.ff_norm.weight", False))
        pairs.append((f"{stack}.final_layer_norm.weight", f"{stack}.final_layer_norm.weight", False))
    if not config.tie_word_embeddings:
        pairs.append(("lm_head.weight", "lm_head.weight", False))
    return pairs


def expected_shapes(config):
    """``{Hugging Face name: shape}`` of a model of ``config`` (nn.Linear's (out, in))."""
    V, D, F, inner = config.vocab_size, config.d_model, config.d_ff, config.num_heads * config.d_kv
    by_end = {"q.weight": (inner, D), "k.weight": (inner, D), "v.weight": (inner, D), "o.weight": (D, inner),
              "wi.weight": (F, D), "wi_0.weight": (F, D), "wi_1.weight": (F, D), "wo.weight": (D, F),
              "layer_norm.weight": (D,), "relative_attention_bias.weight": (config.relative_attention_num_buckets,
                                                                            config.num_heads)}
    shapes = {}
    for hf, _, _ in name_map(config):
        if hf in ("shared.weight", "lm_head.weight"):
            shapes[hf] = (V, D)
        elif hf.endswith("final_layer_norm.weight"):
            shapes[hf] = (D,)
        else:
            shapes[hf] = by_end[".".join(hf.split(".")[-2:])]
    return shapes


def untied(weights):
    """Whether a file's weights hold an lm_head of its own (``lm_head.weight`` of other values than
    ``shared.weight``), as transformers decides whether to tie them."""
    head, shared = weights.get("lm_head.weight"), weights.get("shared.weight")
    return head is not None and not (shared is not None and head.shape == shared.shape
                                     and np.array_equal(head, shared))


def hf_to_minitf_state(weights, config, path="the weights"):
    """``{minitf name: array}`` from a ``T5ForConditionalGeneration`` state dict (a tied model's lm_head.weight, the
    same values as shared.weight, left out). A ValueError naming ``path`` and the tensors: missing or unknown names,
    a tensor that is not floating-point, or one of another shape than ``config`` gives it."""
    found = {name: array for name, array in weights.items()
             if not (name == "lm_head.weight" and config.tie_word_embeddings)}
    pairs = name_map(config)
    pretrained.check_layer_counts(found, {
        "num_layers": (config.num_layers, r"encoder\.block\.(\d+)\."),
        "num_decoder_layers": (config.num_decoder_layers, r"decoder\.block\.(\d+)\.")}, path)
    return pretrained.state_of_pairs(found, pairs, expected_shapes(config), path)


def minitf_to_hf_state(state, config):
    """``{Hugging Face name: array}`` (``T5ForConditionalGeneration``'s) from ``T5.state_dict()``."""
    return pretrained.hf_state_of_pairs(state, name_map(config))


def pretrained_config(folder):
    """(:class:`T5Config` read from config.json, tied, the config.json dict) of a folder, checked."""
    folder = pathlib.Path(folder)
    hf = pretrained.read_config(folder, FAMILY, T5_FOLDER)
    return config_from_hf(hf, str(folder / "config.json")), hf


def read_pretrained(folder, dtype=None):
    """(:class:`T5Config`, ``{minitf name: host array}``, the config.json dict) of a folder: its lm_head tied or
    not as the weights say; with ``dtype`` (the model's), a tensor beyond that dtype's range is refused too."""
    config, hf = pretrained_config(folder)
    path = pretrained.weights_path(folder)
    weights = pretrained.read_weights(path, buffers=BUFFERS)
    config = config.replace(tie_word_embeddings=not untied(weights))
    state = hf_to_minitf_state(weights, config, path)
    if dtype is not None:
        pretrained.check_dtype_range(weights, dtype, path)
    return config, state, hf


def from_pretrained(model_class, folder, dtype=None):
    """The ``model_class`` (:class:`minitf.t5.model.T5`) of a Hugging Face folder, built under ``dtype`` (default:
    minitf's default float dtype) after config.json and every tensor are checked."""
    dtype = pretrained.model_dtype(dtype)
    config, state, _ = read_pretrained(folder, dtype)
    with backend.default_dtype(dtype):
        model = model_class(config)
    model.load_state_dict(state)
    return model


def hf_config_of(config, previous, dtype):
    """A config.json dict for a model of ``config`` whose arrays are ``dtype`` (a name), keeping ``previous``'s
    other entries (an mT5's model_type if it was one and the model computes as mT5 does: no output scale)."""
    model_type = "mt5" if previous.get("model_type") == "mt5" and not config.scale_decoder_outputs else "t5"
    hf = {k: v for k, v in previous.items() if k not in ("torch_dtype", "dense_act_fn", "is_gated_act")}
    hf.update(architectures=["MT5ForConditionalGeneration" if model_type == "mt5" else "T5ForConditionalGeneration"],
              model_type=model_type, vocab_size=config.vocab_size, d_model=config.d_model, d_kv=config.d_kv,
              d_ff=config.d_ff, num_layers=config.num_layers, num_decoder_layers=config.num_decoder_layers,
              num_heads=config.num_heads, relative_attention_num_buckets=config.relative_attention_num_buckets,
              relative_attention_max_distance=config.relative_attention_max_distance,
              dropout_rate=config.dropout_rate, layer_norm_epsilon=config.layer_norm_epsilon,
              feed_forward_proj=config.feed_forward_proj, initializer_factor=config.initializer_factor,
              # transformers reads tie_word_embeddings as the output's scale; the file's lm_head decides the tying
              tie_word_embeddings=config.scale_decoder_outputs, scale_decoder_outputs=config.scale_decoder_outputs,
              pad_token_id=config.pad_token_id, eos_token_id=config.eos_token_id,
              decoder_start_token_id=config.decoder_start_token_id, is_encoder_decoder=True, dtype=dtype)
    if model_type == "mt5":
        hf.pop("scale_decoder_outputs")
    if config.n_positions is not None:
        hf["n_positions"] = config.n_positions
    return hf


def save_pretrained(model, folder, hf_config=None):
    """Write ``model`` as a Hugging Face folder (config.json, generation_config.json, model.safetensors in the
    model's dtype), each file atomically; ``hf_config``: the config.json it was read from, whose other entries are
    written back. A ValueError before anything is written for a folder that cannot be one or weights holding NaN
    or infinity."""
    folder = pathlib.Path(folder)
    pretrained.check_save_folder(folder)
    config = model.config
    hf = hf_config_of(config, hf_config or {}, str(model.shared.weight.data.dtype))
    pretrained.write_weights(folder / pretrained.WEIGHTS, minitf_to_hf_state(model.state_dict(), config))
    pretrained.write_json(folder / "config.json", hf)
    pretrained.write_json(folder / "generation_config.json", {
        "decoder_start_token_id": config.decoder_start_token_id, "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id})
