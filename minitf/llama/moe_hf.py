"""Hugging Face folders of the Llama family's newer members in and out: Qwen3 (q/k norms per head), and the
mixtures of experts Qwen3-MoE, Qwen2-MoE (a shared expert), Mixtral and OLMoE (q/k norms over the projection),
beside :mod:`minitf.llama.hf` (Llama, Qwen2, Mistral), which this module calls for what the families share (the
attention's and the rotary's keys, the end-of-text ids, the dense layers' names and layouts) and hands those three
folders whole.

The experts' weights come in two layouts, both read:

- the hub's (and what transformers 5's ``save_pretrained`` writes back): one tensor per expert and projection,
  ``model.layers.I.mlp.experts.J.gate_proj/up_proj/down_proj.weight`` (Qwen, OLMoE) or
  ``model.layers.I.block_sparse_moe.experts.J.w1/w3/w2.weight`` (Mixtral: gate, up, down), each nn.Linear's
  (out, in), with the router ``...gate.weight`` (E, D);
- transformers 5's stacked parameters: ``model.layers.I.mlp.experts.gate_up_proj`` (E, 2F, D: the gate's F rows,
  then the up projection's) and ``...experts.down_proj`` (E, D, F), the router ``model.layers.I.mlp.gate.weight``.

minitf keeps each expert's matrices (in, out), stacked: ``experts.gate_proj``, ``experts.up_proj`` (E, D, F),
``experts.down_proj`` (E, F, D). :func:`save_pretrained` writes the hub's layout. Every bad value or tensor is
refused in one line naming the file and the key, before a model is built.
"""
import pathlib

from minitf import backend, pretrained
from minitf.llama import hf

np = backend.host

#: The model types read here (and hf's, handed to it)
NEW = ("qwen3", "qwen3_moe", "qwen2_moe", "mixtral", "olmoe")
FAMILY = hf.FAMILY + NEW
#: the family of :mod:`minitf.llama.hf` whose shared keys each new type reads as
_BASE = {"qwen3": "llama", "qwen3_moe": "llama", "olmoe": "llama", "qwen2_moe": "qwen2", "mixtral": "mistral"}
#: transformers' defaults where a config.json leaves a key out (those that differ from the base family's)
_DEFAULTS = {
    "qwen3": dict(head_dim=128, max_position_embeddings=32768, rms_norm_eps=1e-6, bos_token_id=None,
                  eos_token_id=None),
    "qwen3_moe": dict(max_position_embeddings=32768, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None),
    "qwen2_moe": dict(max_position_embeddings=32768, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None),
    "mixtral": dict(max_position_embeddings=4096 * 32, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2),
    "olmoe": dict(max_position_embeddings=4096, rms_norm_eps=1e-5, pad_token_id=1, bos_token_id=None,
                  eos_token_id=50279)}
_AUX_COEF = {"qwen3_moe": 0.001, "qwen2_moe": 0.001, "mixtral": 0.001, "olmoe": 0.01}
_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                  "qwen2_moe": "Qwen2MoeForCausalLM", "mixtral": "MixtralForCausalLM", "olmoe": "OlmoeForCausalLM"}
#: the expert projections' hub names: (gate, up, down)
_EXPERT_NAMES = {"mixtral": ("w1", "w3", "w2")}
_QWEN_NAMES = ("gate_proj", "up_proj", "down_proj")


def config_from_hf(raw, where="config.json"):
    """The :class:`LlamaConfig` of a config.json dict of any :data:`FAMILY` type; a ValueError naming the key."""
    def value(key, kind, default=pretrained.REQUIRED, **checks):
        return pretrained.config_value(raw, key, kind, default, where=where, **checks)

    model_type = value("model_type", "str", choices=FAMILY)
    if model_type in hf.FAMILY:
        return hf.config_from_hf(raw, where)
    if model_type != "qwen2_moe" and value("attention_bias", "bool", default=False):
        raise ValueError(f"{where}: attention_bias is true: {model_type} then has a bias on o_proj too, which "
                         "minitf's grouped-query attention does not compute")
    if model_type in ("qwen3", "qwen3_moe", "qwen2_moe") and value("use_sliding_window", "bool", default=False):
        raise ValueError(f"{where}: use_sliding_window is true; minitf computes full attention only")
    if model_type == "olmoe" and raw.get("clip_qkv") is not None:
        raise ValueError(f"{where}: clip_qkv is {raw['clip_qkv']!r}; minitf does not clip queries, keys and values "
                         "(null)")
    layer_types = raw.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list)
                                    or any(t != "full_attention" for t in layer_types)):
        raise ValueError(f"{where}: layer_types is {layer_types!r}; minitf computes full attention only (every "
                         "layer 'full_attention')")
    # Qwen's sliding_window is read only with use_sliding_window (refused above); Mixtral's is Mistral's (checked)
    dropped = ("attention_bias", "layer_types") + (() if model_type == "mixtral" else ("sliding_window",))
    shared_keys = {k: v for k, v in raw.items() if k not in dropped}
    config = hf.config_from_hf(_DEFAULTS[model_type] | shared_keys | {"model_type": _BASE[model_type]}, where)
    fields = dict(qk_norm={"qwen3": "head", "qwen3_moe": "head", "olmoe": "projection"}.get(model_type),
                  attention_bias=model_type == "qwen2_moe" and value("qkv_bias", "bool", default=True))
    if model_type != "qwen3":
        fields |= _expert_fields(raw, model_type, config, value, where)
    return config.replace(**fields)


def _expert_fields(raw, model_type, config, value, where):
    """The mixture-of-experts fields of a sparse type's config.json."""
    key = "num_local_experts" if model_type == "mixtral" or "num_experts" not in raw else "num_experts"
    experts = value(key, "int", low=1)
    per_token = value("num_experts_per_tok", "int", low=1)
    if per_token > experts:
        raise ValueError(f"{where}: num_experts_per_tok {per_token} is more than {key} {experts}; each token "
                         "chooses among the experts")
    fields = dict(num_experts=experts, num_experts_per_tok=per_token,
                  router_aux_loss_coef=float(value("router_aux_loss_coef", "float", default=_AUX_COEF[model_type],
                                                   low=0.0)))
    if model_type == "mixtral":
        value("router_jitter_noise", "float", default=0.0, low=0.0)  # training only; minitf has none
        return fields | dict(norm_topk_prob=True)
    fields["norm_topk_prob"] = value("norm_topk_prob", "bool", default=False)
    if model_type == "olmoe":
        return fields
    layers = raw.get("mlp_only_layers") or []
    if not isinstance(layers, list) or any(not isinstance(i, int) or isinstance(i, bool)
                                           or not 0 <= i < config.num_layers for i in layers):
        raise ValueError(f"{where}: mlp_only_layers is {layers!r}; expected a list of layer numbers in "
                         f"[0, {config.num_layers})")
    fields |= dict(moe_d_ff=value("moe_intermediate_size", "int", low=1), mlp_only_layers=tuple(sorted(set(layers))),
                   decoder_sparse_step=value("decoder_sparse_step", "int", default=1, low=1))
    if model_type == "qwen2_moe":
        fields["shared_expert_d_ff"] = value("shared_expert_intermediate_size", "int", low=1)
    return fields


def pretrained_config(folder):
    """(:class:`LlamaConfig`, the config.json dict) of a folder of any :data:`FAMILY` type, checked (config.json
    and generation_config.json only, as :func:`minitf.llama.hf.pretrained_config`)."""
    folder = pathlib.Path(folder)
    raw = pretrained.read_config(folder, FAMILY, hf.LLAMA_FOLDER)
    return hf.with_generation_ends(config_from_hf(raw, str(folder / "config.json")), folder), raw


def read_pretrained_state(folder, config, dtype=None, warn=None):
    """:func:`minitf.llama.hf.read_pretrained_state` of a folder of any :data:`FAMILY` type (its config.json's
    model_type names the tensors: either expert layout of :func:`hf_to_minitf_state`)."""
    model_type = pretrained.read_config(pathlib.Path(folder), FAMILY, hf.LLAMA_FOLDER)["model_type"]
    if model_type in hf.FAMILY:
        return hf.read_pretrained_state(folder, config, dtype, warn)
    return hf.read_pretrained_state(folder, config, dtype, warn,
                                    lambda weights, c, path: hf_to_minitf_state(weights, c, path, model_type))


# --------------------------------------------------------------------------- #
# Weights: names and layouts
# --------------------------------------------------------------------------- #
def _sparse_prefix(model_type, layer, stacked):
    """The Hugging Face name of sparse layer ``layer``'s feed-forward."""
    return f"model.layers.{layer}.{'block_sparse_moe' if model_type == 'mixtral' and not stacked else 'mlp'}"


def dense_pairs(config):
    """``[(Hugging Face name, minitf name, transposed)]`` of everything but the sparse layers' feed-forwards:
    :func:`minitf.llama.hf.name_map`'s, with the q and k norms."""
    sparse = tuple(f"model.layers.{i}.mlp." for i in range(config.num_layers) if config.is_sparse(i))
    pairs = [p for p in hf.name_map(config) if not p[0].startswith(sparse)]
    if config.qk_norm is not None:
        pairs += [(f"model.layers.{i}.self_attn.{n}_norm.weight", f"layers.{i}.self_attn.{n}_norm.weight", False)
                  for i in range(config.num_layers) for n in "qk"]
    return pairs


def expected_shapes(config, model_type, stacked=False):
    """``{Hugging Face name: shape}`` of every tensor of a ``model_type`` folder of a model of ``config``, the
    experts in the hub's layout or (``stacked``) transformers 5's."""
    dense = {name for name, _, _ in dense_pairs(config)}
    shapes = {name: shape for name, shape in hf.expected_shapes(config).items() if name in dense}
    D, E, F, H = config.d_model, config.num_experts, config.expert_d_ff, config.head_size
    if config.qk_norm is not None:
        q, k = (H, H) if config.qk_norm == "head" else (config.num_heads * H, config.num_kv_heads * H)
        for i in range(config.num_layers):
            shapes[f"model.layers.{i}.self_attn.q_norm.weight"] = (q,)
            shapes[f"model.layers.{i}.self_attn.k_norm.weight"] = (k,)
    gate, up, down = _EXPERT_NAMES.get(model_type, _QWEN_NAMES)
    for i in range(config.num_layers):
        if not config.is_sparse(i):
            continue
        p = _sparse_prefix(model_type, i, stacked)
        shapes[f"{p}.gate.weight"] = (E, D)
        if stacked:
            shapes |= {f"{p}.experts.gate_up_proj": (E, 2 * F, D), f"{p}.experts.down_proj": (E, D, F)}
        else:
            for e in range(E):
                shapes |= {f"{p}.experts.{e}.{gate}.weight": (F, D), f"{p}.experts.{e}.{up}.weight": (F, D),
                           f"{p}.experts.{e}.{down}.weight": (D, F)}
        if config.shared_expert_d_ff:
            S = config.shared_expert_d_ff
            shapes |= {f"{p}.shared_expert.gate_proj.weight": (S, D), f"{p}.shared_expert.up_proj.weight": (S, D),
                       f"{p}.shared_expert.down_proj.weight": (D, S), f"{p}.shared_expert_gate.weight": (1, D)}
    return shapes


def hf_to_minitf_state(weights, config, path, model_type):
    """``{minitf name: array}`` from a ``model_type`` folder's state dict (either expert layout, found from the
    names). A ValueError naming ``path`` and the tensors: missing or unknown names, a tensor that is not
    floating-point, or one of another shape than ``config`` gives it (an expert's, a router's)."""
    found = hf.model_tensors(weights, config)
    stacked = any(name.endswith(".experts.gate_up_proj") for name in found)
    hf.check_tensors(found, expected_shapes(config, model_type, stacked), path)
    state = {ours: (found[name].T if transposed else found[name]) for name, ours, transposed in dense_pairs(config)}
    gate, up, down = _EXPERT_NAMES.get(model_type, _QWEN_NAMES)
    F = config.expert_d_ff
    for i in range(config.num_layers):
        if not config.is_sparse(i):
            continue
        p, ours = _sparse_prefix(model_type, i, stacked), f"layers.{i}.mlp"
        state[f"{ours}.gate.weight"] = found[f"{p}.gate.weight"].T                    # (E, D) -> (D, E)
        if stacked:
            gate_up = found[f"{p}.experts.gate_up_proj"]                               # (E, 2F, D)
            state[f"{ours}.experts.gate_proj"] = gate_up[:, :F].transpose(0, 2, 1)     # (E, F, D) -> (E, D, F)
            state[f"{ours}.experts.up_proj"] = gate_up[:, F:].transpose(0, 2, 1)       # (E, F, D) -> (E, D, F)
            state[f"{ours}.experts.down_proj"] = found[f"{p}.experts.down_proj"].transpose(0, 2, 1)  # -> (E, F, D)
        else:
            for theirs, mine in ((gate, "gate_proj"), (up, "up_proj"), (down, "down_proj")):
                state[f"{ours}.experts.{mine}"] = np.stack(
                    [found[f"{p}.experts.{e}.{theirs}.weight"].T for e in range(config.num_experts)])  # (E, in, out)
        if config.shared_expert_d_ff:
            for n in ("gate_proj", "up_proj", "down_proj"):
                state[f"{ours}.shared_expert.{n}.weight"] = found[f"{p}.shared_expert.{n}.weight"].T
            state[f"{ours}.shared_expert_gate.weight"] = found[f"{p}.shared_expert_gate.weight"].T   # (1, D) -> (D, 1)
    return state


def minitf_to_hf_state(state, config, model_type):
    """``{Hugging Face name: array}`` of ``Llama.state_dict()`` in the hub's layout of ``model_type``."""
    out = {name: (np.ascontiguousarray(state[ours].T) if transposed else state[ours])
           for name, ours, transposed in dense_pairs(config)}
    gate, up, down = _EXPERT_NAMES.get(model_type, _QWEN_NAMES)
    for i in range(config.num_layers):
        if not config.is_sparse(i):
            continue
        p, ours = _sparse_prefix(model_type, i, False), f"layers.{i}.mlp"
        out[f"{p}.gate.weight"] = np.ascontiguousarray(state[f"{ours}.gate.weight"].T)
        for theirs, mine in ((gate, "gate_proj"), (up, "up_proj"), (down, "down_proj")):
            for e in range(config.num_experts):
                out[f"{p}.experts.{e}.{theirs}.weight"] = np.ascontiguousarray(state[f"{ours}.experts.{mine}"][e].T)
        if config.shared_expert_d_ff:
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[f"{p}.shared_expert.{n}.weight"] = np.ascontiguousarray(state[f"{ours}.shared_expert.{n}.weight"].T)
            out[f"{p}.shared_expert_gate.weight"] = np.ascontiguousarray(state[f"{ours}.shared_expert_gate.weight"].T)
    return out


def from_pretrained(model_class, folder, dtype=None, warn=None):
    """The ``model_class`` (:class:`minitf.llama.model.Llama`) of a folder of any :data:`FAMILY` type, built under
    ``dtype`` after config.json and every tensor are checked (:func:`minitf.llama.hf.from_pretrained`, ``warn``
    its)."""
    return hf.from_pretrained(model_class, folder, dtype, warn, (pretrained_config, read_pretrained_state))


# --------------------------------------------------------------------------- #
# Writing
# --------------------------------------------------------------------------- #
def model_type_of(config, previous=None):
    """The ``model_type`` a folder of ``config`` is written as: ``previous``'s (the config.json it was read from)
    where it holds the model, else the one type that does; a ValueError where none does."""
    wanted = (previous or {}).get("model_type")
    candidates = ([wanted] if wanted in NEW else []) + ["qwen3", "mixtral", "qwen3_moe", "qwen2_moe", "olmoe"]
    if config.num_experts == 0 and config.qk_norm is None:
        return None  # a Llama, Qwen2 or Mistral: minitf.llama.hf's
    for model_type in candidates:
        if not _misfits(config, model_type):
            return model_type
    raise ValueError("a Hugging Face folder cannot hold this model: "
                     + "; ".join(f"{t}: {_misfits(config, t)}" for t in NEW))


def _misfits(config, model_type):
    """What of ``config`` a ``model_type`` folder cannot hold ('' where it holds it all)."""
    sparse, c = config.num_experts > 0, config
    problems = [
        (model_type == "qwen3") == sparse and ("experts" if sparse else "no experts"),
        c.qk_norm != {"qwen3": "head", "qwen3_moe": "head", "olmoe": "projection"}.get(model_type)
        and f"qk_norm {c.qk_norm!r}",
        c.attention_bias and model_type != "qwen2_moe" and "q/k/v biases",
        c.mlp_bias and "feed-forward biases",
        bool(c.shared_expert_d_ff) != (model_type == "qwen2_moe") and sparse and "a shared expert or none",
        model_type in ("mixtral", "olmoe") and (c.mlp_only_layers or c.decoder_sparse_step != 1)
        and "dense layers among the sparse",
        model_type in ("mixtral", "olmoe") and c.moe_d_ff not in (None, c.d_ff) and "experts of another width",
        model_type == "mixtral" and not c.norm_topk_prob and "unrenormalised top-k weights",
        model_type != "mixtral" and c.sliding_window is not None and "a sliding window",
        model_type == "olmoe" and c.num_heads * c.head_size != c.d_model
        and "a q norm of another width than d_model (OLMoE's is hidden_size wide)"]
    return ", ".join(p for p in problems if p)


def hf_config_of(config, previous, dtype):
    """A config.json dict of ``config`` (:func:`model_type_of`'s type), keeping ``previous``'s other entries."""
    model_type = model_type_of(config, previous)
    if model_type is None:
        return hf.hf_config_of(config, previous, dtype)
    dense = config.replace(num_experts=0, qk_norm=None, mlp_only_layers=(), attention_bias=False)
    base = hf.hf_config_of(dense, {k: v for k, v in previous.items() if k != "model_type"}, dtype)
    base = {k: v for k, v in base.items() if k not in ("mlp_bias", "num_experts", "num_local_experts")}
    base.update(model_type=model_type, architectures=[_ARCHITECTURES[model_type]])
    if model_type in ("qwen3", "qwen3_moe", "qwen2_moe"):
        base.update(use_sliding_window=False, sliding_window=None)
    if model_type == "olmoe":
        base["clip_qkv"] = None
    if model_type == "mixtral":
        base["sliding_window"] = config.sliding_window
    if model_type == "qwen2_moe":
        base["qkv_bias"] = config.attention_bias
        base.pop("attention_bias", None)
    if config.num_experts:
        base.update({"num_local_experts" if model_type == "mixtral" else "num_experts": config.num_experts},
                    num_experts_per_tok=config.num_experts_per_tok, router_aux_loss_coef=config.router_aux_loss_coef,
                    output_router_logits=False)
        if model_type != "mixtral":
            base["norm_topk_prob"] = config.norm_topk_prob
        if model_type in ("qwen3_moe", "qwen2_moe"):
            base.update(moe_intermediate_size=config.expert_d_ff, decoder_sparse_step=config.decoder_sparse_step,
                        mlp_only_layers=list(config.mlp_only_layers))
        if model_type == "qwen2_moe":
            base["shared_expert_intermediate_size"] = config.shared_expert_d_ff
        if model_type in ("mixtral", "olmoe"):
            base["intermediate_size"] = config.expert_d_ff
    return base


def save_pretrained(model, folder, hf_config=None):
    """Write ``model`` as a Hugging Face folder of :func:`model_type_of`'s type (config.json,
    generation_config.json, model.safetensors: the experts in the hub's layout), as
    :func:`minitf.llama.hf.save_pretrained`; a ValueError before anything is written for a model no folder holds."""
    config = model.config
    model_type = model_type_of(config, hf_config)
    if model_type is None:
        return hf.save_pretrained(model, folder, hf_config)
    folder = pathlib.Path(folder)
    pretrained.check_save_folder(folder)
    values = hf_config_of(config, hf_config or {}, str(model.embed_tokens.weight.data.dtype))
    pretrained.write_weights(folder / pretrained.WEIGHTS, minitf_to_hf_state(model.state_dict(), config, model_type))
    pretrained.write_json(folder / "config.json", values)
    generation = {k: values[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if values.get(k) is not None}
    pretrained.write_json(folder / "generation_config.json", generation)
