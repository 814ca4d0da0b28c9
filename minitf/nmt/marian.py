"""Hugging Face Marian folders (the opus-mt translation models) in and out of :class:`minitf.Transformer`: the
translation kind's Hugging Face format (the core model knows no file format).

A Marian model is the paper's encoder-decoder with a few differences, each an option of the
Transformer with the paper's value as its default (the table in ``Transformer``'s docstring):
the feed-forward's activation is swish (SiLU), the logits have a bias (``final_logits_bias``), the
sinusoids are laid out as [sin | cos] halves, the decoder starts from the padding token (so the
target's padding is not masked: only the causal mask applies) and the pad id is the vocabulary's
last. ``from_pretrained(folder)`` builds the model of a folder (``config.json``, ``model.safetensors`` through
:mod:`minitf.pretrained`, or ``pytorch_model.bin`` through ``torch.load(weights_only=True)`` where
torch is installed; :func:`read` gives the config.json read beside it); ``save_pretrained(model, folder)``
writes one that ``transformers.MarianMTModel`` loads. Nothing is attached to the model: what a folder had
beyond it (its config.json's other entries, its tokenizer's files) is given to the writer as arguments.

Layouts: Hugging Face's ``nn.Linear`` stores W as (out, in) with y = x W^T + b, minitf's ``Linear``
as (in, out) with y = x W + b, so every matrix is transposed on the way; minitf's attention holds
W^Q, W^K, W^V side by side in ``w_qkv`` (D, 3D), Hugging Face's as three (D, D) ``q_proj``,
``k_proj``, ``v_proj``; heads are split the same way (contiguous blocks of D/H columns).
A model with the paper's interleaved sinusoids is written exactly by renaming the model axis
(:func:`halves_permutation`): the residual stream's coordinates are permuted consistently through
the embeddings, every weight that reads or writes the stream, and LayerNorm's gamma and beta.

Shapes: V vocabulary, D d_model, F d_ff, P max_position_embeddings.
"""
import pathlib

from minitf import backend, pretrained
from minitf.atomic import write_atomic
from minitf.pretrained import HF_ACTIVATIONS, HF_NAME_OF_ACTIVATION
from minitf.layers import sinusoidal_table
from minitf.transformer import Transformer, TransformerConfig

np = backend.host  # files are read and written on the host

WHAT = "Hugging Face Marian folder"
MODEL_TYPES = ("marian",)
#: Legacy entries of old opus-mt config.json files that today's transformers no longer reads, with the only
#: value minitf (and the code transformers runs) computes: any other value is refused, never ignored.
LEGACY_FIXED = {"normalize_before": False, "add_final_layer_norm": False, "normalize_embedding": False,
                "static_position_embeddings": True, "add_bias_logits": False}
#: Training-only entries minitf has no place for (it drops out sublayer outputs and embeddings only, as the
#: paper; ``dropout`` is read as that): off in eval mode, so accepted for translating; refused unless 0 for
#: fine-tuning, where minitf would train without them.
ZERO_ONLY = ("attention_dropout", "activation_dropout", "encoder_layerdrop", "decoder_layerdrop")
#: LayerNorm's epsilon in Hugging Face's Marian (torch.nn.LayerNorm's default; not in config.json)
LAYER_NORM_EPS = 1e-5
#: The tokenizer's files a Marian folder may hold, copied by ``save_pretrained`` from the folder a model was read
#: from.
TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json", "target_vocab.json", "tokenizer_config.json",
                   "special_tokens_map.json")
#: Tolerance of a position table stored in a file against the sinusoids minitf computes: float32 rounding of
#: values in [-1, 1] is below 6e-8; another formula (Marian C++'s, a trained table) is off by 1e-3 or more.
POSITION_TABLE_ATOL = 1e-6


# --------------------------------------------------------------------------- #
# config.json -> the Transformer's config
# --------------------------------------------------------------------------- #
def transformer_config(hf, where="config.json", training=False):
    """The :class:`minitf.TransformerConfig` of a Marian config.json dict. A ValueError (one line,
    naming the key, its value and the fix) for a missing or mistyped value or one minitf does not compute
    (with ``training``, fine-tuning's: also a training-only dropout of :data:`ZERO_ONLY` above 0)."""
    def value(key, kind, default=pretrained.REQUIRED, **checks):
        return pretrained.config_value(hf, key, kind, default, where=where, **checks)

    activation = value("activation_function", "str", choices=tuple(HF_ACTIVATIONS))
    d_model = value("d_model", "int", low=1)
    heads = {side: value(f"{side}_attention_heads", "int", low=1) for side in ("encoder", "decoder")}
    ffn = {side: value(f"{side}_ffn_dim", "int", low=1) for side in ("encoder", "decoder")}
    if heads["encoder"] != heads["decoder"]:
        raise ValueError(f"{where}: encoder_attention_heads {heads['encoder']} and decoder_attention_heads "
                         f"{heads['decoder']} differ; minitf's Transformer has one number of heads")
    if ffn["encoder"] != ffn["decoder"]:
        raise ValueError(f"{where}: encoder_ffn_dim {ffn['encoder']} and decoder_ffn_dim {ffn['decoder']} differ; "
                         "minitf's Transformer has one d_ff")
    if d_model % heads["encoder"]:
        raise ValueError(f"{where}: d_model {d_model} is not divisible by encoder_attention_heads {heads['encoder']}")
    vocab = value("vocab_size", "int", low=1)
    share = value("share_encoder_decoder_embeddings", "bool", default=True)
    tgt_vocab = value("decoder_vocab_size", "int", default=None, low=1) or vocab
    if share and tgt_vocab != vocab:
        raise ValueError(f"{where}: decoder_vocab_size {tgt_vocab} differs from vocab_size {vocab} but "
                         "share_encoder_decoder_embeddings is true (one shared matrix); fix one of them")
    tied = value("tie_word_embeddings", "bool", default=True)
    if share and not tied:
        raise ValueError(f"{where}: tie_word_embeddings is false with share_encoder_decoder_embeddings true; "
                         "minitf ties the output projection to a shared embedding (set it true, or both false)")
    for key, fixed in LEGACY_FIXED.items():
        if value(key, "bool", default=fixed) != fixed:
            raise ValueError(f"{where}: {key} is {hf[key]!r}; minitf (like transformers' MarianMTModel) computes "
                             f"only {key} {str(fixed).lower()}: this is not an opus-mt model's config")
    for key in ZERO_ONLY:
        if value(key, "float", default=0.0, low=0.0, high=1.0) != 0 and training:
            raise ValueError(f"{where}: {key} is {hf[key]!r}; minitf cannot compute it when training (it drops out "
                             f"sublayer outputs and embeddings only, 'dropout'): set {key} to 0.0 to fine-tune "
                             "(translating ignores it: dropout is off there)")
    min_vocab = min(vocab, tgt_vocab)
    return TransformerConfig(
        src_vocab_size=vocab, tgt_vocab_size=tgt_vocab, d_model=d_model, num_heads=heads["encoder"],
        num_encoder_layers=value("encoder_layers", "int", low=1), num_decoder_layers=value("decoder_layers", "int", low=1),
        d_ff=ffn["encoder"], dropout=float(value("dropout", "float", default=0.1, low=0.0, high=0.99)),
        share_embeddings=share, pad_id=value("pad_token_id", "int", low=0, high=min_vocab - 1), pre_norm=False,
        activation=HF_ACTIVATIONS[activation], positions="halves",
        scale_embedding=value("scale_embedding", "bool"), output_bias=True, layer_norm_eps=LAYER_NORM_EPS,
        mask_target_padding=False, freeze_pad_embedding=True, tie_target_output=not share and tied,
        decoder_start_id=value("decoder_start_token_id", "int", low=0, high=tgt_vocab - 1),
        eos_id=value("eos_token_id", "int", low=0, high=tgt_vocab - 1))


def max_positions(hf, where="config.json"):
    """Rows of the folder's sinusoid table (``max_position_embeddings``): transformers refuses longer inputs."""
    return pretrained.config_value(hf, "max_position_embeddings", "int", low=1, where=where)


# --------------------------------------------------------------------------- #
# Names and layouts
# --------------------------------------------------------------------------- #
_PROJECTIONS = ("q_proj", "k_proj", "v_proj")


def _attentions(side):
    """(Hugging Face name, minitf attention, minitf residual block) of one layer's attentions."""
    if side == "encoder":
        return [("self_attn", "self_attn", "attn_block")]
    return [("self_attn", "self_attn", "self_attn_block"), ("encoder_attn", "cross_attn", "cross_attn_block")]


def _layers(config):
    """(Hugging Face prefix, minitf prefix, side) of every encoder and decoder layer."""
    return [(f"model.{side}.layers.{i}.", f"{side}.layers.{i}.", side)
            for side in ("encoder", "decoder")
            for i in range(config.num_encoder_layers if side == "encoder" else config.num_decoder_layers)]


def _layer_names(hf, ours, side):
    """``[(Hugging Face name, minitf name, transposed)]`` of one layer's tensors, except the q/k/v projections
    (three (D, D) there, side by side in one ``w_qkv`` here: the callers join and cut them); ``transposed``: a
    matrix, (out, in) there and (in, out) here."""
    names = []
    for hf_attn, attn, block in _attentions(side):
        names += [(f"{hf}{hf_attn}.out_proj.weight", f"{ours}{attn}.w_o", True),
                  (f"{hf}{hf_attn}.out_proj.bias", f"{ours}{attn}.b_o", False),
                  (f"{hf}{hf_attn}_layer_norm.weight", f"{ours}{block}.norm.gamma", False),
                  (f"{hf}{hf_attn}_layer_norm.bias", f"{ours}{block}.norm.beta", False)]
    for fc, linear in (("fc1", "linear1"), ("fc2", "linear2")):
        names += [(f"{hf}{fc}.weight", f"{ours}feed_forward.{linear}.weight", True),
                  (f"{hf}{fc}.bias", f"{ours}feed_forward.{linear}.bias", False)]
    return names + [(f"{hf}final_layer_norm.weight", f"{ours}ff_block.norm.gamma", False),
                    (f"{hf}final_layer_norm.bias", f"{ours}ff_block.norm.beta", False)]


def expected_shapes(config):
    """``{Hugging Face name: shape}`` of every tensor ``MarianMTModel.save_pretrained`` writes for a model of
    ``config`` (a TransformerConfig): final_logits_bias, the embedding(s), every layer's."""
    D, F = config.d_model, config.d_ff
    V, V_tgt = config.src_vocab_size, config.tgt_vocab_size
    shapes = {"final_logits_bias": (1, V_tgt)}
    if config.share_embeddings:
        shapes["model.shared.weight"] = (V, D)
    else:
        shapes.update({"model.encoder.embed_tokens.weight": (V, D), "model.decoder.embed_tokens.weight": (V_tgt, D),
                       "lm_head.weight": (V_tgt, D)})
    for prefix, _, side in _layers(config):
        for hf, _, _ in _attentions(side):
            for projection in _PROJECTIONS + ("out_proj",):
                shapes[f"{prefix}{hf}.{projection}.weight"], shapes[f"{prefix}{hf}.{projection}.bias"] = (D, D), (D,)
            shapes[f"{prefix}{hf}_layer_norm.weight"] = shapes[f"{prefix}{hf}_layer_norm.bias"] = (D,)
        shapes.update({f"{prefix}fc1.weight": (F, D), f"{prefix}fc1.bias": (F,), f"{prefix}fc2.weight": (D, F),
                       f"{prefix}fc2.bias": (D,), f"{prefix}final_layer_norm.weight": (D,),
                       f"{prefix}final_layer_norm.bias": (D,)})
    return shapes


def _aliases(config):
    """``{alias: the name it repeats}``: tensors an older file (torch.save of a state dict) may carry twice."""
    if config.share_embeddings:
        return {name: "model.shared.weight" for name in
                ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")}
    return {}


POSITION_TABLES = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def hf_to_minitf_state(weights, config, path="model.safetensors"):
    """``{minitf name: host array}`` for a Transformer of ``config`` from a Marian state dict (``{name: array}``).
    Checked, each a one-line ValueError naming ``path`` and the tensor: missing or unknown tensors, wrong
    shapes, aliases of the embedding that differ from it, position tables that are not the sinusoids minitf
    computes. A missing final_logits_bias is zeros (as transformers reads it)."""
    pretrained.check_layer_counts(weights, {
        "encoder_layers": (config.num_encoder_layers, r"model\.encoder\.layers\.(\d+)\."),
        "decoder_layers": (config.num_decoder_layers, r"model\.decoder\.layers\.(\d+)\.")}, path)
    shapes = expected_shapes(config)
    aliases = _aliases(config)
    if not config.share_embeddings and config.tie_target_output:
        aliases["lm_head.weight"] = "model.decoder.embed_tokens.weight"
    optional = {"final_logits_bias", *aliases, *POSITION_TABLES}
    missing = sorted(set(shapes) - set(weights) - optional)
    unknown = sorted(set(weights) - set(shapes) - optional)
    if missing or unknown:
        raise ValueError(f"{path}: the tensors do not fit a Marian model of its config.json: " + "; ".join(filter(None, [
            missing and f"missing {len(missing)} ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})",
            unknown and f"not Marian tensors {len(unknown)} ({', '.join(unknown[:3])}"
                        f"{', ...' if len(unknown) > 3 else ''})"])) + "; use the folder's own model file")
    pretrained.check_shapes(weights, shapes | {a: shapes[target] for a, target in aliases.items()}, path)
    for alias, target in aliases.items():
        if alias in weights and target in weights and not np.array_equal(weights[alias], weights[target]):
            raise ValueError(f"{path}: {alias} differs from {target}, which it must repeat (tied weights); "
                             "the file is damaged or of another model")
    D = config.d_model
    for name in POSITION_TABLES:
        if name in weights:
            table = weights[name]
            if table.ndim != 2 or table.shape[1] != D:
                raise ValueError(f"{path}: {name} has shape {tuple(table.shape)}, expected (positions, {D})")
            ours = backend.to_numpy(sinusoidal_table(table.shape[0], D, dtype=np.float64, layout="halves"))
            worst = float(np.abs(table.astype(np.float64) - ours).max(initial=0.0))
            if worst > POSITION_TABLE_ATOL:
                raise ValueError(f"{path}: {name} is not the sinusoid table transformers computes (off by up to "
                                 f"{worst:.3g}); minitf computes its positions and cannot use another table: "
                                 "remove it from the file only if the model was trained with the sinusoids")
    if "final_logits_bias" not in weights:
        weights = dict(weights, final_logits_bias=np.zeros(shapes["final_logits_bias"], dtype=np.float32))

    state = {"src_embed.weight": weights["model.shared.weight" if config.share_embeddings
                                         else "model.encoder.embed_tokens.weight"],
             "generator.bias": weights["final_logits_bias"].reshape(-1)}
    if not config.share_embeddings:
        state["tgt_embed.weight"] = weights["model.decoder.embed_tokens.weight"]
        if not config.tie_target_output:
            state["generator.weight"] = weights["lm_head.weight"]
    for hf, ours, side in _layers(config):
        for hf_name, name, transposed in _layer_names(hf, ours, side):
            state[name] = weights[hf_name].T if transposed else weights[hf_name]
        for hf_attn, attn, _ in _attentions(side):
            a = f"{hf}{hf_attn}."
            # [q k v] = x [W^Q W^K W^V]: Hugging Face's three (out, in) matrices, transposed, side by side
            state[f"{ours}{attn}.w_qkv"] = np.concatenate([weights[f"{a}{p}.weight"].T for p in _PROJECTIONS], 1)
            state[f"{ours}{attn}.b_qkv"] = np.concatenate([weights[f"{a}{p}.bias"] for p in _PROJECTIONS])
    return state


def minitf_to_hf_state(state, config):
    """The Marian state dict (``expected_shapes``' names: no aliases, no position tables, as
    ``MarianMTModel.save_pretrained`` writes it) of a Transformer's ``state_dict()`` (``config``: its
    TransformerConfig, with Marian's layout: "halves" positions)."""
    D = config.d_model
    V_tgt = config.tgt_vocab_size
    bias = state.get("generator.bias")
    weights = {"final_logits_bias": (bias if bias is not None else np.zeros(V_tgt, dtype=state["src_embed.weight"].dtype))
               .reshape(1, V_tgt)}
    if config.share_embeddings:
        weights["model.shared.weight"] = state["src_embed.weight"]
    else:
        weights["model.encoder.embed_tokens.weight"] = state["src_embed.weight"]
        weights["model.decoder.embed_tokens.weight"] = state["tgt_embed.weight"]
        weights["lm_head.weight"] = state["tgt_embed.weight" if config.tie_target_output else "generator.weight"]
    for hf, ours, side in _layers(config):
        for hf_name, name, transposed in _layer_names(hf, ours, side):
            weights[hf_name] = state[name].T if transposed else state[name]
        for hf_attn, attn, _ in _attentions(side):
            a = f"{hf}{hf_attn}."
            w_qkv, b_qkv = state[f"{ours}{attn}.w_qkv"], state[f"{ours}{attn}.b_qkv"]
            for k, projection in enumerate(_PROJECTIONS):
                weights[f"{a}{projection}.weight"] = w_qkv[:, k * D:(k + 1) * D].T  # (D, D) block, transposed
                weights[f"{a}{projection}.bias"] = b_qkv[k * D:(k + 1) * D]
    return {name: np.ascontiguousarray(array) for name, array in weights.items()}


# --------------------------------------------------------------------------- #
# The paper's interleaved sinusoids -> Marian's halves, exactly
# --------------------------------------------------------------------------- #
def halves_permutation(d_model):
    """``perm`` (D,) with ``interleaved_table[:, perm] == halves_table``: the even coordinates (the
    sines), then the odd ones (the cosines)."""
    return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def permute_model_axis(state, config, perm):
    """The state of the same function in coordinates ``x' = x[perm]`` of the residual stream (every (., D)
    vector between the embeddings and the output projection): embeddings' columns, the rows of every matrix
    that reads the stream (w_qkv of self- and cross-attention: the memory is the stream too; linear1), the
    columns and bias of every matrix that writes it (w_o, linear2), LayerNorm's gamma and beta (its mean
    and variance do not depend on the order). The logits are unchanged: h'W'^T = h W^T."""
    out = {}
    for name, array in state.items():
        if name.endswith(("embed.weight", "generator.weight")):   # (V, D): a row per token, D columns
            out[name] = array[:, perm]
        elif name.endswith(("w_qkv", "linear1.weight")):          # (D, .): reads the stream, y = x W
            out[name] = array[perm, :]
        elif name.endswith(("w_o", "linear2.weight")):            # (., D): writes the stream
            out[name] = array[:, perm]
        elif name.endswith(("b_o", "linear2.bias", "norm.gamma", "norm.beta")):  # (D,): one per coordinate
            out[name] = array[perm]
        elif name.endswith(("b_qkv", "linear1.bias", "generator.bias")):        # not on the stream
            out[name] = array
        else:
            raise ValueError(f"permute_model_axis: no rule for parameter {name!r}")
    return out


# --------------------------------------------------------------------------- #
# Folders
# --------------------------------------------------------------------------- #
def _refuse_run_folder(folder):
    if (folder / "checkpoints").is_dir() or (folder / "meta.json").is_file():
        raise ValueError(f"{folder} is a minitf run (or checkpoint) folder, not a {WHAT}; translate with it as "
                         f"--checkpoint {folder}, or write it as one: python -m minitf.export {folder} FOLDER")


def _weights_file(folder):
    for name in (pretrained.WEIGHTS, pretrained.SHARD_INDEX, "pytorch_model.bin"):  # transformers' preference
        if (folder / name).is_file():
            return name
    return pretrained.WEIGHTS  # read_config names it as missing


def read_torch_weights(path):
    """``{name: host array}`` of a ``pytorch_model.bin`` read with ``torch.load(weights_only=True)`` (no
    code runs: only tensors and containers are unpickled), every tensor checked finite. A one-line
    ValueError without torch (saying how to convert the file) or for a file that is not a state dict."""
    try:
        import torch
    except ImportError:
        folder = path.parent
        raise ValueError(f"{folder} has only pytorch_model.bin (a PyTorch pickle) and torch is not installed; "
                         "convert it once where transformers is: python -c \"from transformers import "
                         f"MarianMTModel; MarianMTModel.from_pretrained('{folder}').save_pretrained('{folder}')\" "
                         "(writes model.safetensors), or pip install torch") from None
    try:
        loaded = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:  # torch's unpickler: damaged, truncated, or holding more than tensors
        raise ValueError(f"{path} is not a readable PyTorch state dict ({pretrained.quoted_message(error)}); "
                         "download or write it again") from None
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise ValueError(f"{path} holds a {type(loaded).__name__}, not a state dict of tensors; "
                         "give the folder of a MarianMTModel")
    weights = {}
    for name, tensor in loaded.items():
        tensor = tensor.detach()
        if tensor.dtype == torch.bfloat16:  # NumPy has no bfloat16: float32 holds it exactly
            tensor = tensor.float()
        array = tensor.numpy()
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise ValueError(f"{path}: tensor {name} holds NaN or infinite values; the weights are damaged: "
                             "use another copy")
        weights[name] = array
    return weights


def read_folder_config(folder, training=False):
    """(config.json's dict, the :class:`minitf.TransformerConfig`, the weights file's path) of a Marian
    folder, every value checked (``training``: for fine-tuning, :func:`transformer_config`); the weights are not
    read. A ValueError (one line, naming the file)."""
    folder = pathlib.Path(folder)
    if folder.is_dir():
        _refuse_run_folder(folder)
    weights_name = _weights_file(folder)
    hf = pretrained.read_config(folder, MODEL_TYPES, WHAT,
                                weights=pretrained.WEIGHTS if weights_name == pretrained.SHARD_INDEX else weights_name)
    where = str(folder / "config.json")
    config = transformer_config(hf, where, training)
    max_positions(hf, where)
    return hf, config, folder / weights_name


def read_state(folder, dtype=None):
    """(config.json's dict, the :class:`minitf.TransformerConfig`, ``{minitf name: host array}``) of a Marian
    folder, every value and tensor checked (finite, of the config's shapes; given ``dtype``, the model's, within
    its range), without building a model: what :func:`from_pretrained` builds, and what ``train.py --init-from`` checks
    before it makes a run folder. The weights: model.safetensors or its shards (float64, float32, float16,
    bfloat16 widened to float32; :func:`minitf.pretrained.read_weights`), else pytorch_model.bin. A ValueError
    (one line, naming the file) for anything that does not fit."""
    hf, config, path = read_folder_config(folder)
    weights = read_torch_weights(path) if path.name == "pytorch_model.bin" else pretrained.read_weights(path)
    if dtype is not None:
        pretrained.check_dtype_range(weights, dtype, path)
    return hf, config, hf_to_minitf_state(weights, config, path)


def read(folder, dtype=None):
    """(the model, config.json's dict) of a Marian folder: the model in eval mode, built under ``dtype``
    (default: minitf's default float dtype; float32, float64 or float16: bfloat16 weights are widened as they
    are read), and the folder's config.json, whose other entries :func:`save_pretrained` writes back
    (``hf_config``). Nothing is written. A ValueError (one line, naming the file) for anything that does not
    fit."""
    dtype = pretrained.model_dtype(dtype)  # "bfloat16" or another dtype: one line, before any file is read
    hf, config, state = read_state(pathlib.Path(folder), dtype)
    with backend.default_dtype(dtype):
        model = Transformer.from_config(config)
    model.load_state_dict(state)
    return model.eval(), hf


def from_pretrained(folder, dtype=None):
    """The :class:`minitf.Transformer` of a Hugging Face Marian folder (an opus-mt model: ``config.json`` and
    ``model.safetensors``, or ``pytorch_model.bin`` read by torch's weights-only loader), in eval mode, under
    ``dtype`` (:func:`read`, without the config.json). A ValueError names what does not fit."""
    return read(folder, dtype)[0]


def config_json(model, previous=None, decoder_start_id=None, eos_id=None, max_position_embeddings=512):
    """The config.json dict of ``model`` (its ``config``), keeping ``previous``'s other entries (those of the
    folder it was read from). A ValueError for what Marian cannot describe."""
    c = model.config
    start = c.decoder_start_id if c.decoder_start_id is not None else decoder_start_id
    eos = c.eos_id if c.eos_id is not None else eos_id
    wrong = [what for what, bad in [
        ("pre-LN (pre_norm=True; Marian is post-LN)", c.pre_norm),
        (f"LayerNorm epsilon {c.layer_norm_eps} (Marian's is {LAYER_NORM_EPS})", c.layer_norm_eps != LAYER_NORM_EPS),
        ("no decoder start token (give decoder_start_id)", start is None),
        ("no end token (give eos_id)", eos is None)] if bad]
    if wrong:
        raise ValueError(f"a {WHAT} cannot hold this model: it has {', '.join(wrong)}")
    hf = dict(previous or {})
    for legacy in ("torch_dtype", "num_hidden_layers"):  # older names of dtype and encoder_layers
        hf.pop(legacy, None)
    share = c.share_embeddings
    hf.update(architectures=["MarianMTModel"], model_type="marian", is_encoder_decoder=True,
              vocab_size=c.src_vocab_size, decoder_vocab_size=c.tgt_vocab_size, d_model=c.d_model,
              encoder_layers=c.num_encoder_layers, decoder_layers=c.num_decoder_layers,
              encoder_attention_heads=c.num_heads, decoder_attention_heads=c.num_heads,
              encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff,
              activation_function=HF_NAME_OF_ACTIVATION[c.activation],
              scale_embedding=c.scale_embedding, dropout=c.dropout,
              **{key: hf.get(key, 0.0) for key in ZERO_ONLY},  # training-only, off when translating: the folder's kept
              pad_token_id=c.pad_id, eos_token_id=eos, forced_eos_token_id=eos, decoder_start_token_id=start,
              share_encoder_decoder_embeddings=share, tie_word_embeddings=share or c.tie_target_output,
              dtype=str(model.src_embed.weight.data.dtype))
    hf.setdefault("max_position_embeddings", max_position_embeddings)
    hf.setdefault("init_std", 0.02)
    hf.setdefault("use_cache", True)
    for key, fixed in LEGACY_FIXED.items():  # an old file's legacy entries stay, at the values read
        if key in hf:
            hf[key] = fixed
    return hf


def generation_config(hf, num_beams=4, max_length=512):
    """An opus-mt generation_config.json for config.json ``hf`` (the converter's template)."""
    pad, eos = hf["pad_token_id"], hf["eos_token_id"]
    return {"bad_words_ids": [[pad]], "bos_token_id": hf.get("bos_token_id", eos), "decoder_start_token_id":
            hf["decoder_start_token_id"], "eos_token_id": eos, "forced_eos_token_id": eos, "max_length": max_length,
            "num_beams": num_beams, "pad_token_id": pad, "renormalize_logits": True}


def save_pretrained(model, folder, hf_config=None, source=None, decoder_start_id=None, eos_id=None,
                    generation=None, tokenizer_files=None):
    """Write ``model`` as a Marian folder: config.json (:func:`config_json`, keeping ``hf_config``'s other entries:
    those of the config.json the model was read from, :func:`read`), model.safetensors (the tensors
    ``MarianMTModel.save_pretrained`` writes, in the model's dtype), generation_config.json (that of ``source``,
    the folder the model was read from, else ``generation`` or the opus-mt template), and the tokenizer's files:
    ``tokenizer_files`` ({name: bytes}) or those of ``source``. A model with the paper's interleaved sinusoids is
    written exactly in Marian's halves (:func:`permute_model_axis`). ``decoder_start_id`` and ``eos_id`` fill in
    a model whose config names none (a minitf run's: its tokenizer's BOS and EOS). Everything is checked before
    the first file is written (:func:`pretrained.check_save_folder`, every tensor finite in
    :func:`pretrained.write_weights`, which makes the folder); each file is written atomically."""
    folder = pathlib.Path(folder)
    source = None if source is None else pathlib.Path(source)
    pretrained.check_save_folder(folder)
    hf = config_json(model, hf_config, decoder_start_id, eos_id)
    c = model.config
    state = model.state_dict()
    if c.positions == "interleaved":
        state = permute_model_axis(state, c, halves_permutation(c.d_model))
    tensors = minitf_to_hf_state(state, c)
    if source is not None and (source / "generation_config.json").is_file():
        generation_bytes = (source / "generation_config.json").read_bytes()
    else:
        generation_bytes = None
    files = dict(tokenizer_files or {})
    if source is not None and tokenizer_files is None:
        files = {name: (source / name).read_bytes() for name in TOKENIZER_FILES if (source / name).is_file()}
    pretrained.safetensors_numpy()  # the missing extra is an ImportError before anything is written
    pretrained.write_weights(folder / "model.safetensors", tensors)
    pretrained.write_json(folder / "config.json", hf)
    if generation_bytes is not None:
        write_atomic(folder / "generation_config.json", generation_bytes)
    else:
        pretrained.write_json(folder / "generation_config.json", generation or generation_config(hf))
    for name, data in files.items():
        write_atomic(folder / name, data)
    return folder
