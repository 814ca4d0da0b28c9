"""Hugging Face folders of the Llama family in and out: ``config.json`` of ``model_type`` llama, qwen2 or mistral
(a Mistral's sliding window limiting its positions), every value checked before a model is built (one line naming the key); the weights
(``model.safetensors`` or shards, float32, float16 or bfloat16) through :func:`minitf.pretrained.read_weights`;
``tokenizer.json`` through the ``tokenizers`` package as transformers applies it (its post-processor puts
``<s>`` or ``<|begin_of_text|>`` first); ``generation_config.json``'s end-of-text ids. :func:`save_pretrained`
writes a folder transformers loads with the same logits.

Layouts: Hugging Face's ``nn.Linear`` keeps its weight as (out, in) and computes x W^T; minitf's
:class:`minitf.layers.Linear` keeps (in, out) and computes x W: every projection's matrix is transposed on the
way in and out, nothing else. The embedding and an untied ``lm_head`` are (V, D) on both sides.
"""
import json
import pathlib
import warnings

from minitf import backend, pretrained
from minitf.llama.config import LlamaConfig
from minitf.rotary import ROPE_KEYS

np = backend.host

#: The model types read here, and what each is called in a sentence.
FAMILY = ("llama", "qwen2", "mistral")
LLAMA_FOLDER = "Hugging Face Llama-family folder"
#: transformers' defaults where a config.json leaves a key out: {model_type: {key: default}}
_DEFAULTS = {"llama": dict(max_position_embeddings=2048, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2),
             "qwen2": dict(max_position_embeddings=32768, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None),
             "mistral": dict(max_position_embeddings=4096 * 32, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)}
#: Constant buffers some files carry (older transformers saved the rotary frequencies): not parameters
BUFFERS = (".rotary_emb.inv_freq",)
#: Each block's parameters: (Hugging Face name, minitf name, transposed)
_LINEARS = [f"self_attn.{p}_proj" for p in "qkvo"] + [f"mlp.{p}_proj" for p in ("gate", "up", "down")]


def config_from_hf(hf, where="config.json"):
    """The :class:`LlamaConfig` of a Llama, Qwen2 or Mistral config.json dict (``where`` names it in messages).
    Every key minitf reads is checked (type, range), naming it; what minitf does not compute is refused naming
    the key: another model_type, an activation other than silu (or its other name swish), rope_type other than
    default, linear and llama3 (yarn, dynamic...), Qwen2's use_sliding_window, Llama's attention_bias (it puts a
    bias on o_proj too). Rotary settings resolve as transformers resolves them (:func:`_rope`); a Mistral's
    sliding_window is kept (``LlamaConfig.positions``: the model then has at most that many positions)."""
    def value(key, kind, default=pretrained.REQUIRED, **checks):
        return pretrained.config_value(hf, key, kind, default, where=where, **checks)

    model_type = value("model_type", "str", choices=FAMILY)
    defaults = _DEFAULTS[model_type]
    vocab_size = value("vocab_size", "int", low=1)
    d_model, num_layers = value("hidden_size", "int", low=1), value("num_hidden_layers", "int", low=1)
    num_heads = value("num_attention_heads", "int", low=1)
    num_kv_heads = value("num_key_value_heads", "int", default=None, low=1) or num_heads
    if num_heads % num_kv_heads:
        raise ValueError(f"{where}: num_attention_heads {num_heads} is not a multiple of num_key_value_heads "
                         f"{num_kv_heads}; each key/value head serves the same number of query heads")
    head_dim = value("head_dim", "int", default=None, low=1)
    if head_dim is None and d_model % num_heads:
        raise ValueError(f"{where}: hidden_size {d_model} is not a multiple of num_attention_heads {num_heads} and "
                         "there is no head_dim")
    if (head_dim or d_model // num_heads) % 2:
        raise ValueError(f"{where}: head_dim {head_dim or d_model // num_heads} is odd; rotary positions turn pairs")
    d_ff = value("intermediate_size", "int", low=1)
    value("hidden_act", "str", default="silu",  # "swish" is transformers' other name of x sigmoid(x)
          choices=tuple(sorted(k for k, v in pretrained.HF_ACTIVATIONS.items() if v == "silu")))
    eps = value("rms_norm_eps", "float", default=defaults["rms_norm_eps"], low=0.0, low_open=True)
    max_positions = value("max_position_embeddings", "int", default=defaults["max_position_embeddings"], low=1)
    tie = value("tie_word_embeddings", "bool", default=False)
    value("attention_dropout", "float", default=0.0, low=0.0, high=1.0)  # training only; minitf has none there
    value("pretraining_tp", "int", default=1, low=1)  # the same product split in slices: numerics only
    value("initializer_range", "float", default=0.02, low=0.0)
    if model_type == "llama":
        if value("attention_bias", "bool", default=False):
            raise ValueError(f"{where}: attention_bias is true: a Llama with biases has one on o_proj too, which "
                             "minitf's grouped-query attention does not compute (Qwen2's q, k and v biases it does)")
        mlp_bias = value("mlp_bias", "bool", default=False)
    else:
        mlp_bias = False
    # a Mistral's window: full attention is it exactly over at most that many positions (LlamaConfig.positions)
    window = value("sliding_window", "int", default=None, low=1) if model_type == "mistral" else None
    if model_type == "qwen2":
        if value("use_sliding_window", "bool", default=False):
            raise ValueError(f"{where}: use_sliding_window is true; minitf computes full attention only")
        layer_types = hf.get("layer_types")
        if layer_types is not None and (not isinstance(layer_types, list)
                                        or any(t != "full_attention" for t in layer_types)):
            raise ValueError(f"{where}: layer_types is {layer_types!r}; minitf computes full attention only "
                             "(every layer 'full_attention')")
    if value("rope_interleaved", "bool", default=False):  # nanotron's key (SmolLM2's config.json has it false)
        raise ValueError(f"{where}: rope_interleaved is true: rotary pairs of neighbouring coordinates, which "
                         "minitf does not compute (it turns Hugging Face's halves, rope_interleaved false)")
    theta, scaling = _rope(hf, where, max_positions)
    ids = {key: None if key in hf and hf[key] is None  # null: no such token (absent: transformers' default)
           else value(key, "int", default=defaults.get(key), low=0, high=vocab_size - 1)
           for key in ("pad_token_id", "bos_token_id")}
    eos = eos_ids(hf, vocab_size, where, default=defaults["eos_token_id"])
    return LlamaConfig(vocab_size=vocab_size, d_model=d_model, num_layers=num_layers, num_heads=num_heads,
                       num_kv_heads=num_kv_heads, head_dim=head_dim, d_ff=d_ff, rms_norm_eps=float(eps),
                       rope_theta=float(theta), rope_scaling=scaling, max_position_embeddings=max_positions,
                       tie_word_embeddings=tie, attention_bias=model_type == "qwen2", mlp_bias=mlp_bias,
                       initializer_range=float(value("initializer_range", "float", default=0.02)),
                       eos_token_id=eos, sliding_window=window, **ids)


def eos_ids(values, vocab_size, where, default=None):
    """``values["eos_token_id"]`` (an id or a list of ids, or absent/null: ``default``) as None, an int or a
    tuple, each id checked within the vocabulary, naming the key."""
    eos = values.get("eos_token_id", default)
    if eos is None:
        return None
    if isinstance(eos, list) and eos:
        for i, e in enumerate(eos):
            pretrained.config_value({f"eos_token_id[{i}]": e}, f"eos_token_id[{i}]", "int", low=0,
                                    high=vocab_size - 1, where=where)
        return tuple(eos) if len(eos) > 1 else eos[0]
    if isinstance(eos, list):
        raise ValueError(f"{where}: eos_token_id is an empty list; give an id, a list of ids or null")
    return pretrained.config_value(values, "eos_token_id", "int", low=0, high=vocab_size - 1, where=where)


def _rope(hf, where, max_positions):
    """(rope_theta, rope_scaling or None) of a config.json, resolved as transformers 5 resolves them
    (``RotaryEmbeddingConfigMixin.convert_rope_params_to_dict`` and ``standardize_rope_params``): a legacy
    ``rope_scaling`` object that is not empty takes the place of ``rope_parameters`` (whatever that holds); the theta
    is the chosen object's ``rope_theta``, else the top-level ``rope_theta``, else 10000; the type its
    ``rope_type``, else its ``type``, else "default"; llama3 without ``original_max_position_embeddings`` takes
    the top-level one, else ``max_position_embeddings`` (``max_positions``)."""
    for key in ("rope_parameters", "rope_scaling"):
        if hf.get(key) is not None and not isinstance(hf[key], dict):
            raise ValueError(f"{where}: {key} is {hf[key]!r}; expected an object or null")
    key = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    params = dict(hf.get(key) or {})
    if "rope_theta" in params:
        theta = pretrained.config_value(params, "rope_theta", "float", low=0.0, low_open=True, where=f"{where}: {key}")
    else:
        theta = pretrained.config_value(hf, "rope_theta", "float", default=10000.0, low=0.0, low_open=True,
                                        where=where)
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if "partial_rotary_factor" in hf:
        params.setdefault("partial_rotary_factor", hf["partial_rotary_factor"])
    if params.get("partial_rotary_factor", 1.0) not in (1.0, None):
        raise ValueError(f"{where}: {key}.partial_rotary_factor is {params['partial_rotary_factor']!r}; minitf "
                         "turns whole heads (1.0)")
    if rope_type == "default":
        return theta, None
    if rope_type not in ROPE_KEYS:
        raise ValueError(f"{where}: {key}.rope_type is {rope_type!r}; minitf computes "
                         f"{', '.join(map(repr, ROPE_KEYS))} rotary frequencies only")
    if rope_type == "llama3":
        params.setdefault("original_max_position_embeddings", max_positions)
        if "original_max_position_embeddings" in hf:  # transformers gives the top-level one priority
            params["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
    missing = [k for k in ROPE_KEYS[rope_type] if k not in params]
    if missing:
        raise ValueError(f"{where}: {key} of rope_type {rope_type!r} has no {', '.join(missing)}")
    scaling = {"rope_type": rope_type}
    for k in ROPE_KEYS[rope_type]:
        kind = "int" if k == "original_max_position_embeddings" else "float"
        scaling[k] = pretrained.config_value(params, k, kind, low=0, low_open=True, where=f"{where}: {key}")
    if rope_type == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise ValueError(f"{where}: {key}.high_freq_factor {scaling['high_freq_factor']} is not above "
                         f"low_freq_factor {scaling['low_freq_factor']}")
    return theta, scaling


# --------------------------------------------------------------------------- #
# Weights: names and layouts
# --------------------------------------------------------------------------- #
def name_map(config):
    """``[(Hugging Face name, minitf name, transposed)]`` for every parameter of a model of ``config``:
    ``LlamaForCausalLM``'s names (``model.`` before all but ``lm_head``)."""
    pairs = [("model.embed_tokens.weight", "embed_tokens.weight", False)]
    for i in range(config.num_layers):
        block = [(f"{n}.weight", True) for n in _LINEARS]
        block += [(f"self_attn.{p}_proj.bias", False) for p in "qkv" if config.attention_bias]
        block += [(f"mlp.{p}_proj.bias", False) for p in ("gate", "up", "down") if config.mlp_bias]
        block += [("input_layernorm.weight", False), ("post_attention_layernorm.weight", False)]
        pairs += [(f"model.layers.{i}.{name}", f"layers.{i}.{name}", t) for name, t in block]
    pairs.append(("model.norm.weight", "norm.weight", False))
    if not config.tie_word_embeddings:
        pairs.append(("lm_head.weight", "lm_head.weight", False))
    return pairs


def expected_shapes(config):
    """``{Hugging Face name: shape}`` of a model of ``config`` (their layouts: nn.Linear (out, in))."""
    V, D, F, E = config.vocab_size, config.d_model, config.d_ff, config.head_size
    q, kv = config.num_heads * E, config.num_kv_heads * E
    layer = {"self_attn.q_proj.weight": (q, D), "self_attn.k_proj.weight": (kv, D), "self_attn.v_proj.weight": (kv, D),
             "self_attn.o_proj.weight": (D, q), "self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
             "self_attn.v_proj.bias": (kv,), "mlp.gate_proj.weight": (F, D), "mlp.up_proj.weight": (F, D),
             "mlp.down_proj.weight": (D, F), "mlp.gate_proj.bias": (F,), "mlp.up_proj.bias": (F,),
             "mlp.down_proj.bias": (D,), "input_layernorm.weight": (D,), "post_attention_layernorm.weight": (D,)}
    shapes = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,), "lm_head.weight": (V, D)}
    for hf, _, _ in name_map(config):
        if hf.startswith("model.layers."):
            shapes[hf] = layer[hf.split(".", 3)[3]]
    return {hf: shapes[hf] for hf, _, _ in name_map(config)}


def hf_to_minitf_state(weights, config, path="the weights"):
    """``{minitf name: array}`` from a ``LlamaForCausalLM`` state dict (``lm_head.weight`` of a tied model left
    out). A ValueError naming ``path`` and the tensors: missing or unknown names, a tensor that is not
    floating-point, or one of another shape than ``config`` gives it."""
    found = model_tensors(weights, config)
    return pretrained.state_of_pairs(found, name_map(config), expected_shapes(config), path)


def model_tensors(weights, config):
    """``weights`` less a tied model's ``lm_head.weight`` (the embedding's, not a parameter of its own)."""
    return {name: array for name, array in weights.items()
            if not (name == "lm_head.weight" and config.tie_word_embeddings)}


def check_tensors(found, expected, path):
    """A ValueError naming ``path`` and the tensors where ``found`` ({name: array}) is not ``expected`` ({name:
    shape}): missing or unknown names (five of each named), a tensor that is not floating-point, a wrong shape
    (:func:`minitf.pretrained.check_names`, :func:`minitf.pretrained.check_shapes`)."""
    pretrained.check_names(found, expected, path)
    pretrained.check_shapes(found, expected, path)


def minitf_to_hf_state(state, config):
    """``{Hugging Face name: array}`` (``LlamaForCausalLM``'s) from ``Llama.state_dict()``."""
    return pretrained.hf_state_of_pairs(state, name_map(config))


def read_pretrained_state(folder, config, dtype=None, warn=None, to_state=hf_to_minitf_state):
    """``{minitf name: host array}`` of ``folder``'s weights for a model of ``config``; with ``dtype`` (the
    model's), a tensor beyond that dtype's range is refused too. A tied ``config`` whose file holds an
    ``lm_head.weight`` of other values than the embedding is untied, as transformers unties it (it warns and uses
    the file's head): the state then holds ``lm_head.weight`` (:func:`config_of_state`) and ``warn`` (default
    :func:`warnings.warn`) hears one line. ``to_state(weights, config, path)``: the names' and layouts' map
    (:func:`hf_to_minitf_state`; :mod:`minitf.llama.moe_hf` gives its own for its types)."""
    def convert(weights, config, path):
        return to_state(weights, untied_by_file(weights, config, path, warn), path)
    return pretrained.read_state(folder, config, convert, BUFFERS, dtype)


def untied_by_file(weights, config, path, warn=None):
    """``config``, untied where it ties the output to the embedding but ``weights`` hold an ``lm_head.weight`` of
    the embedding's shape and other values (transformers' loader then does not tie them; equal values stay tied)."""
    head, embedding = weights.get("lm_head.weight"), weights.get("model.embed_tokens.weight")
    if (not config.tie_word_embeddings or head is None or embedding is None or head.shape != embedding.shape
            or np.array_equal(head, embedding)):
        return config
    (warn or warnings.warn)(f"{path}: config.json says tie_word_embeddings true, but the file holds an "
                            "lm_head.weight of other values than the embedding; as transformers does, the model "
                            "uses the file's head (untied): set tie_word_embeddings false in config.json to say so")
    return config.replace(tie_word_embeddings=False)


def config_of_state(config, state):
    """The config of a model holding ``state`` (:func:`read_pretrained_state`'s): untied where the state has its
    own ``lm_head.weight``."""
    return config.replace(tie_word_embeddings=False) if "lm_head.weight" in state else config


def pretrained_config(folder):
    """(:class:`LlamaConfig`, the config.json dict) of a folder, checked (only config.json and, where it is
    there, generation_config.json are read). The end-of-text ids are those transformers' generate stops at:
    generation_config.json's eos_token_id where the folder has that file (none there: no end, though config.json
    lists some), config.json's where it has none."""
    folder = pathlib.Path(folder)
    hf = pretrained.read_config(folder, FAMILY, LLAMA_FOLDER)
    return with_generation_ends(config_from_hf(hf, str(folder / "config.json")), folder), hf


def with_generation_ends(config, folder):
    """``config`` with the end-of-text ids of ``folder``'s generation_config.json where it has that file (its
    eos_token_id, none there: no end), as transformers' generate stops."""
    folder = pathlib.Path(folder)
    if not (folder / "generation_config.json").is_file():
        return config
    return config.replace(eos_token_id=eos_ids(read_generation_config(folder), config.vocab_size,
                                               str(folder / "generation_config.json")))


def read_generation_config(folder):
    """``generation_config.json``'s dict ({} where there is none); a ValueError naming it if it is damaged."""
    return read_json_object(pathlib.Path(folder) / "generation_config.json")


def read_json_object(path):
    """The JSON object of a folder's settings file ``path`` ({} where there is none); a ValueError naming it if
    it is damaged."""
    if not path.is_file():
        return {}
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{path} is not readable JSON ({error}); copy it again or remove it") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path} holds a JSON {type(values).__name__}, not an object of settings")
    return values


#: generation_config.json's settings minitf's generate applies (besides the end-of-text ids), with their checks
SAMPLING = {"do_sample": dict(kind="bool"), "temperature": dict(kind="float", low=0.0),
            "top_k": dict(kind="int", low=0), "top_p": dict(kind="float", low=0.0, low_open=True, high=1.0),
            "repetition_penalty": dict(kind="float", low=0.0, low_open=True)}
#: Its entries that change nothing generate computes: ids, what transformers returns, its bookkeeping
NOT_SETTINGS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "transformers_version",
                "_from_model_config", "output_attentions", "output_hidden_states", "output_scores", "output_logits",
                "return_dict_in_generate", "use_cache", "cache_implementation", "cache_config")
#: transformers' defaults of the settings minitf does not compute (``GenerationConfig._get_default_generation_params``):
#: a file stating one of these values asks for nothing minitf leaves out
IGNORED_DEFAULTS = {"max_length": 20, "min_length": 0, "early_stopping": False, "num_beams": 1, "typical_p": 1.0,
                    "length_penalty": 1.0, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0,
                    "num_return_sequences": 1, "remove_invalid_values": False, "epsilon_cutoff": 0.0,
                    "eta_cutoff": 0.0, "encoder_repetition_penalty": 1.0, "num_beam_groups": 1,
                    "diversity_penalty": 0.0, "renormalize_logits": False}


def generation_settings(folder, warn):
    """The sampling settings ``folder``'s generation_config.json states ({} without one): ``do_sample``,
    ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, each checked naming the key; every other setting
    it states with a value transformers would act on (``num_beams`` 4, ``no_repeat_ngram_size`` 3, ...) is named in
    one line to ``warn`` as ignored."""
    values = read_generation_config(folder)
    where = str(pathlib.Path(folder) / "generation_config.json")
    stated = {key: pretrained.config_value(values, key, default=None, where=where, **checks)
              for key, checks in SAMPLING.items()}
    ignored = [f"{key} {value!r}" for key, value in values.items()
               if key not in SAMPLING and key not in NOT_SETTINGS and value is not None
               and not (key in IGNORED_DEFAULTS and value == IGNORED_DEFAULTS[key])]
    if ignored:
        warn(f"{where}: minitf's generate ignores {', '.join(ignored)} (it applies do_sample, temperature, top_k, "
             "top_p, repetition_penalty and eos_token_id; the length is --max-new-tokens)")
    return {key: value for key, value in stated.items() if value is not None}


def from_pretrained(model_class, folder, dtype=None, warn=None, reader=None):
    """The ``model_class`` (:class:`minitf.llama.model.Llama`) of a Hugging Face folder, built under ``dtype``
    (default: minitf's default float dtype) after config.json and every tensor are checked; ``warn`` hears what
    minitf applies as transformers does though the folder contradicts itself (:func:`read_pretrained_state`).
    ``reader``: (pretrained_config, read_pretrained_state) of the module reading the folder (this one's, or
    :mod:`minitf.llama.moe_hf`'s)."""
    read_config, read_state = reader or (pretrained_config, read_pretrained_state)
    dtype = pretrained.model_dtype(dtype)
    config, _ = read_config(folder)
    state = read_state(folder, config, dtype, warn)
    config = config_of_state(config, state)
    with backend.default_dtype(dtype):
        model = model_class(config)
    model.load_state_dict(state)
    return model


def hf_config_of(config, previous, dtype):
    """A config.json dict for a model of ``config`` whose arrays are ``dtype`` (a name), keeping ``previous``'s
    other entries; Qwen2's where the model has q/k/v biases, Llama's otherwise."""
    model_type = "qwen2" if config.attention_bias else previous.get("model_type", "mistral" if config.sliding_window
                                                                                    else "llama")
    if model_type not in FAMILY or (model_type != "qwen2" and config.attention_bias):
        model_type = "llama"
    if model_type == "qwen2" and config.mlp_bias:
        raise ValueError("a Hugging Face folder cannot hold this model: it has q/k/v biases (Qwen2's) and "
                         "feed-forward biases (Llama's mlp_bias), which no model_type has together")
    hf = {k: v for k, v in previous.items() if k not in ("rope_theta", "rope_scaling", "torch_dtype")}
    rope = {"rope_type": "default", "rope_theta": config.rope_theta} if config.rope_scaling is None else \
        dict(config.rope_scaling, rope_theta=config.rope_theta)
    eos = config.eos_token_id
    hf.update(architectures=[{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                              "mistral": "MistralForCausalLM"}[model_type]],
              model_type=model_type, vocab_size=config.vocab_size, hidden_size=config.d_model,
              num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
              num_key_value_heads=config.num_kv_heads, head_dim=config.head_size, intermediate_size=config.d_ff,
              hidden_act="silu", rms_norm_eps=config.rms_norm_eps, rope_parameters=rope,
              max_position_embeddings=config.max_position_embeddings,
              tie_word_embeddings=config.tie_word_embeddings, initializer_range=config.initializer_range,
              pad_token_id=config.pad_token_id, bos_token_id=config.bos_token_id,
              eos_token_id=list(eos) if isinstance(eos, tuple) else eos, dtype=dtype)
    if model_type == "llama":
        hf.update(attention_bias=False, mlp_bias=config.mlp_bias)
    if model_type == "mistral":
        hf["sliding_window"] = config.sliding_window
    if model_type == "qwen2":
        hf.update(use_sliding_window=False, sliding_window=None)
        hf.pop("layer_types", None)
    return hf


def save_pretrained(model, folder, hf_config=None):
    """Write ``model`` as a Hugging Face folder (config.json, generation_config.json, model.safetensors in the
    model's dtype), each file atomically; ``hf_config``: the config.json it was read from (a ``Loaded.hf_config``),
    whose other entries are written back. A ValueError before anything is written for a folder that cannot be one
    or weights holding NaN or infinity."""
    folder = pathlib.Path(folder)
    pretrained.check_save_folder(folder)
    config = model.config
    hf = hf_config_of(config, hf_config or {}, str(model.embed_tokens.weight.data.dtype))
    pretrained.write_weights(folder / pretrained.WEIGHTS, minitf_to_hf_state(model.state_dict(), config))
    pretrained.write_json(folder / "config.json", hf)
    generation = {k: hf[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if hf.get(k) is not None}
    pretrained.write_json(folder / "generation_config.json", generation)
