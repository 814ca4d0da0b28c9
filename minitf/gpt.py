"""The decoder-only Transformer (GPT): the decoder's masked self-attention and feed-forward
blocks without cross-attention, trained to predict the next token. Every piece is a layer the
encoder-decoder uses; what separates the paper's decoder, GPT-1 and GPT-2 is constructor options:

    option            the paper's decoder   GPT-1 (2018)        GPT-2 (2019, the default)
    pre_norm          False (post-LN)       False               True, with a final LayerNorm
    activation        "relu"                "gelu_tanh"         "gelu_tanh"
    positions         "sinusoidal"          "learned"           "learned"
    scale_embedding   True (x sqrt(D))      False               False
    init              "xavier"              "normal" (0.02)     "gpt2": normal(0, 0.02), residual
                                                                projections / sqrt(2 x layers)

(``GPT.preset(name, vocab_size, ...)`` fills in one column.) ``GPT.from_pretrained(folder)``
reads a Hugging Face GPT-2 folder (``config.json``, ``model.safetensors``) and ``save_pretrained``
writes one; :func:`generate` samples with the key/value cache of the translation decoder.

Shapes: B batch, L sequence length, D d_model, V vocabulary size.
"""
import dataclasses
import math
import pathlib

from minitf import backend, pretrained
from minitf.layers import (ACTIVATIONS, Dropout, Embedding, LearnedPositionalEmbedding,
                           OutputProjection, PositionalEncoding)
from minitf.module import Module, no_grad
from minitf.transformer import Decoder, check_ids

np = backend.host  # sampling works on the host: one (B, V) row of logits per step

POSITIONS = ("learned", "sinusoidal")
INITS = ("gpt2", "normal", "xavier")


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """A GPT's shape and choices: what ``GPT.from_config`` needs (defaults: GPT-2 small, 124M
    parameters, but for the vocabulary size)."""
    vocab_size: int
    max_len: int = 1024
    d_model: int = 768
    num_heads: int = 12
    num_layers: int = 12
    d_ff: int = 3072
    dropout: float = 0.1
    pre_norm: bool = True
    activation: str = "gelu_tanh"
    positions: str = "learned"
    scale_embedding: bool = False
    init: str = "gpt2"
    init_std: float = 0.02
    layer_norm_eps: float = 1e-5
    tie_embeddings: bool = True


PRESETS = {
    "paper": dict(pre_norm=False, activation="relu", positions="sinusoidal", scale_embedding=True, init="xavier"),
    "gpt1": dict(pre_norm=False, activation="gelu_tanh", positions="learned", scale_embedding=False, init="normal"),
    "gpt2": dict(pre_norm=True, activation="gelu_tanh", positions="learned", scale_embedding=False, init="gpt2"),
}


class GPT(Module):
    """Decoder-only Transformer: ``model(ids)`` takes token ids (B, L) and returns next-token
    logits (B, L, V); position t sees tokens 0..t only.

    Parts: ``embed`` (token embedding, tied to the output projection ``generator`` unless
    ``tie_embeddings=False``), ``positional`` (learned table or sinusoids), ``dropout`` on their
    sum, ``decoder`` (a :class:`minitf.transformer.Decoder` without cross-attention, with its final
    LayerNorm when pre-LN), ``generator``. The next-token loss is
    ``LabelSmoothedCrossEntropy(0.0, ignore_index=-1)(model(ids[:, :-1]), ids[:, 1:])``.
    """

    def __init__(self, vocab_size, max_len=1024, d_model=768, num_heads=12, num_layers=12, d_ff=3072, dropout=0.1,
                 pre_norm=True, activation="gelu_tanh", positions="learned", scale_embedding=False, init="gpt2",
                 init_std=0.02, layer_norm_eps=1e-5, tie_embeddings=True):
        for name, value in [("vocab_size", vocab_size), ("max_len", max_len), ("d_model", d_model),
                            ("num_heads", num_heads), ("num_layers", num_layers), ("d_ff", d_ff)]:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if d_model % num_heads != 0:
            raise ValueError(f"d_model must be divisible by num_heads, got d_model={d_model}, num_heads={num_heads}")
        for name, value, allowed in [("activation", activation, tuple(ACTIVATIONS)), ("positions", positions, POSITIONS),
                                     ("init", init, INITS)]:
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        self.config = dict(vocab_size=vocab_size, max_len=max_len, d_model=d_model, num_heads=num_heads,
                           num_layers=num_layers, d_ff=d_ff, dropout=dropout, pre_norm=pre_norm, activation=activation,
                           positions=positions, scale_embedding=scale_embedding, init=init, init_std=init_std,
                           layer_norm_eps=layer_norm_eps, tie_embeddings=tie_embeddings)
        self.vocab_size, self.max_len = vocab_size, max_len
        self.embed = Embedding(vocab_size, d_model, scale=scale_embedding)
        self.positional = (LearnedPositionalEmbedding(max_len, d_model, init_std) if positions == "learned"
                           else PositionalEncoding(d_model))
        self.dropout = Dropout(dropout)
        self.decoder = Decoder(num_layers, d_model, num_heads, d_ff, dropout, pre_norm, activation,
                               cross_attention=False, layer_norm_eps=layer_norm_eps)  # GPT-2's layer_norm_epsilon
        # tied (paper 3.4, GPT-2): the embedding's own weight; untied: a weight of its own
        self.generator = OutputProjection(self.embed.weight if tie_embeddings
                                          else Embedding(vocab_size, d_model).weight)
        if init != "xavier":
            self.init_normal(init_std, residual_scaling=init == "gpt2")

    def init_normal(self, std, residual_scaling):
        """Every weight matrix and table ~ N(0, std^2), biases 0, LayerNorm gains 1 (GPT-1, GPT-2).
        With ``residual_scaling`` (GPT-2, section 2.3), the two projections that write into the
        residual stream in each layer (attention's W^O, the feed-forward's second linear) get
        std / sqrt(2 x layers): the stream adds 2 x layers of them, and its variance stays O(1)."""
        rng = backend.init_rng()
        residual_std = std / math.sqrt(2 * self.config["num_layers"])
        for name, p in self.named_parameters():
            if p.data.ndim != 2:  # biases and LayerNorm's gamma and beta keep their 0 and 1
                continue
            scaled = residual_scaling and name.endswith(("self_attn.w_o", "feed_forward.linear2.weight"))
            p.data[...] = backend.asarray(rng.normal(0.0, residual_std if scaled else std, p.shape), dtype=p.data.dtype)

    @classmethod
    def from_config(cls, config):
        """Build the model a :class:`GPTConfig` (or its dict) describes."""
        return cls(**(dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)))

    @classmethod
    def preset(cls, name, vocab_size, **options):
        """The model of one column of the module's table ("paper", "gpt1" or "gpt2"), with
        ``options`` (sizes, dropout...) on top."""
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {name!r}")
        return cls(vocab_size, **(PRESETS[name] | options))

    @property
    def position_limit(self):
        """The positions the model has (its learned table's rows), or None (sinusoids: any length).
        :func:`generate` asks every model this, whatever its kind."""
        return self.max_len if self.config["positions"] == "learned" else None

    # -- forward / backward ---------------------------------------------------------
    def forward(self, ids, cache=None, start=0):
        """ids (B, L) integer array -> logits (B, L, V). With ``cache`` (a dict, no_grad only),
        ``ids`` holds only the new positions, the first at position ``start``; the keys and values
        of the earlier positions come from the cache (:func:`generate`)."""
        ids = check_ids(ids, "ids", self.vocab_size)
        x = self.embed(ids)                                      # W[ids] (* sqrt(D) in the paper)
        x = self.dropout(self.positional(x, start=start))        # + positions, then dropout
        h = self.decoder(x, cache=cache)                         # N masked blocks (+ final LayerNorm)
        return self.generator(h)                                 # logits = h W^T

    def backward(self, dlogits):
        """dlogits (B, L, V) -> fills ``p.grad`` of every parameter (accumulating)."""
        dh = self.generator.backward(dlogits)                    # logits = h W^T
        dx, _ = self.decoder.backward(dh)                        # no encoder: no memory gradient
        dembedded = self.positional.backward(self.dropout.backward(dx))
        self.embed.backward(dembedded)                           # tied: adds into the generator's dW

    # -- Hugging Face GPT-2 folders ---------------------------------------------------
    @classmethod
    def from_pretrained(cls, folder, dtype=None):
        """The GPT of a Hugging Face GPT-2 folder: ``config.json`` and ``model.safetensors`` (or sharded
        weights), read by :func:`minitf.pretrained.read_weights` (no torch, no pickle; float16 and bfloat16
        weights widened), built under ``dtype`` (default: minitf's default float dtype; float32, float64 or
        float16). Every config value and tensor is checked (:func:`pretrained_config`,
        :func:`read_pretrained_state`, values within ``dtype``'s range) before the model is built; a
        ValueError names the file and the key or tensor that does not fit."""
        dtype = pretrained.model_dtype(dtype)  # "bfloat16" or another dtype: one line, before any file is read
        config, hf = pretrained_config(folder)
        state = read_pretrained_state(folder, config, dtype)
        with backend.default_dtype(dtype):
            model = cls(**(config | {"init": "xavier"}))  # the weights come next: no second random draw
        model.config["init"] = config["init"]  # how the model was made, for save_pretrained's config.json
        model.hf_config = hf  # kept, so that save_pretrained writes back its other entries
        model.load_state_dict(state)
        return model

    def save_pretrained(self, folder):
        """Write this model as a Hugging Face GPT-2 folder (``config.json`` and ``model.safetensors``
        in the model's dtype), each file atomically. Only GPT-2's shape can be written: pre-LN,
        learned positions, no embedding scale. A ValueError before anything is written for a ``folder`` that is a
        file (:func:`pretrained.check_save_folder`) or weights holding NaN or infinity (naming the tensor)."""
        folder = pathlib.Path(folder)
        pretrained.check_save_folder(folder)
        hf = _hf_config_from(self.config, getattr(self, "hf_config", {}), str(self.embed.weight.data.dtype))
        pretrained.write_weights(folder / "model.safetensors", minitf_to_hf_state(self.state_dict(), self.config))
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
#: Hugging Face's activation_function -> minitf's activation
HF_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
_HF_NAME_OF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def name_map(config):
    """``[(Hugging Face name, minitf name)]`` for every parameter of a GPT-2-shaped model with
    this config (a dict of ``GPT``'s arguments). Hugging Face names are those of
    ``GPT2LMHeadModel``'s state dict without the ``transformer.`` prefix."""
    pairs = [("wte.weight", "embed.weight"), ("wpe.weight", "positional.weight")]
    for i in range(config["num_layers"]):
        pairs += [(f"h.{i}.{hf}", f"decoder.layers.{i}.{ours}") for hf, ours in _LAYER]
    pairs += [("ln_f.weight", "decoder.final_norm.gamma"), ("ln_f.bias", "decoder.final_norm.beta")]
    if not config.get("tie_embeddings", True):
        pairs.append(("lm_head.weight", "generator.weight"))
    return pairs


def expected_shapes(config):
    """``{Hugging Face name: shape}`` (:func:`name_map`'s names) of a GPT-2-shaped model with this config."""
    V, P, D, F = config["vocab_size"], config["max_len"], config["d_model"], config["d_ff"]
    layer = {"ln_1.weight": (D,), "ln_1.bias": (D,), "attn.c_attn.weight": (D, 3 * D), "attn.c_attn.bias": (3 * D,),
             "attn.c_proj.weight": (D, D), "attn.c_proj.bias": (D,), "ln_2.weight": (D,), "ln_2.bias": (D,),
             "mlp.c_fc.weight": (D, F), "mlp.c_fc.bias": (F,), "mlp.c_proj.weight": (F, D), "mlp.c_proj.bias": (D,)}
    shapes = {"wte.weight": (V, D), "wpe.weight": (P, D), "ln_f.weight": (D,), "ln_f.bias": (D,),
              "lm_head.weight": (V, D)}
    shapes |= {f"h.{i}.{name}": shape for i in range(config["num_layers"]) for name, shape in layer.items()}
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
        if short == "lm_head.weight" and config.get("tie_embeddings", True):  # the same matrix as wte
            continue
        found[short], names[short] = array, name
    pretrained.check_layer_counts(found, {"n_layer": (config["num_layers"], r"h\.(\d+)\.")}, path)
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
    (a dict of ``GPT``'s arguments), in the file's dtype (bfloat16 as float32). A ValueError for a damaged file,
    a tensor holding NaN or infinity, weights of another shape, or (given ``dtype``, the model's) values beyond
    that dtype's range."""
    return pretrained.read_state(folder, config, hf_to_minitf_state, MASK_BUFFERS, dtype)


#: Names a GPT-2 folder in messages.
GPT2_FOLDER = "Hugging Face GPT-2 folder"


def pretrained_config(folder):
    """(``GPT``'s arguments, the config.json dict) of a Hugging Face GPT-2 folder, checked: a ValueError
    for a folder without config.json and model.safetensors, another model type, a key the model needs that
    is missing, a value of the wrong type or range (naming the key), or an option minitf does not compute.
    Only config.json is read (the weights are :func:`read_pretrained_state`'s)."""
    folder = pathlib.Path(folder)
    hf = pretrained.read_config(folder, ("gpt2",), GPT2_FOLDER)
    return _config_from_hf(hf, str(folder / "config.json")), hf


#: GPT-2's options minitf computes one way only: config.json key -> the value minitf computes
_FIXED = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False}


def _config_from_hf(hf, where="config.json"):
    """``GPT``'s arguments from a GPT-2 config.json (``where`` names it in messages). The shape (vocab_size,
    n_positions, n_embd, n_head, n_layer) must be there, as in every GPT-2 folder; the other keys take Hugging
    Face's defaults where absent (n_inner null: 4 n_embd). Every value read is checked for type and range,
    naming the key; options minitf does not compute are refused, not ignored. minitf has one dropout (on the
    embeddings and each sublayer's output, resid_pdrop's) and none on the attention weights: embd_pdrop and
    attn_pdrop are only checked."""
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
               for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}["resid_pdrop"]
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
    return dict(vocab_size=vocab_size, max_len=n_positions, d_model=d_model, num_heads=num_heads,
                num_layers=num_layers, d_ff=d_ff, dropout=float(dropout), pre_norm=True,
                activation=HF_ACTIVATIONS[activation], positions="learned", scale_embedding=False, init="gpt2",
                init_std=float(init_std), layer_norm_eps=float(layer_norm_eps), tie_embeddings=tie_embeddings)


def _hf_config_from(config, previous, dtype):
    """A GPT-2 config.json for a model of ``config`` whose arrays are of ``dtype`` (a name such as
    "float32"), keeping ``previous``'s other entries (token ids, task parameters of a loaded model).
    A ValueError for a model GPT-2 cannot describe."""
    wrong = [what for what, bad in [("post-LN (pre_norm=False)", not config["pre_norm"]),
                                    ("sinusoidal positions", config["positions"] != "learned"),
                                    ("a scaled embedding", config["scale_embedding"]),
                                    (f"the {config['activation']!r} activation",
                                     config["activation"] not in _HF_NAME_OF_ACTIVATION)] if bad]
    if wrong:
        raise ValueError(f"a Hugging Face GPT-2 folder cannot hold this model: it has {', '.join(wrong)}; "
                         "only GPT-2's shape (GPT.preset('gpt2', ...)) can be saved")
    hf = dict(previous)
    hf.update(architectures=["GPT2LMHeadModel"], model_type="gpt2", vocab_size=config["vocab_size"],
              n_positions=config["max_len"], n_embd=config["d_model"], n_head=config["num_heads"],
              n_layer=config["num_layers"], n_inner=config["d_ff"],
              activation_function=_HF_NAME_OF_ACTIVATION[config["activation"]],
              resid_pdrop=config["dropout"], embd_pdrop=config["dropout"],
              attn_pdrop=0.0,  # minitf has no dropout on the attention weights (nor has the paper)
              layer_norm_epsilon=config["layer_norm_eps"], initializer_range=config["init_std"],
              tie_word_embeddings=config["tie_embeddings"], scale_attn_weights=True,
              scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False)
    hf.pop("n_ctx", None)  # an older name of n_positions: one number, not two that could disagree
    hf.pop("torch_dtype", None)  # transformers' older name of dtype
    hf["dtype"] = dtype
    return hf


# --------------------------------------------------------------------------- #
# Sampling with the key/value cache
# --------------------------------------------------------------------------- #
def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None, eos_id=None,
             return_logits=False):
    """Continue ``prompt`` (B, L) token ids by ``max_new_tokens`` tokens, one at a time.

    The prompt runs once; then each step runs the model on the one new token only, its
    self-attention reading the keys and values of every earlier position from a cache (the
    translation decoder's, ``MultiHeadAttention``'s ``cache``), so a step costs one position, not
    the whole sequence. ``temperature`` 0 is greedy (the most likely token); otherwise the token
    is drawn from softmax(logits / temperature), restricted to the ``top_k`` most likely tokens
    and to the smallest set of most likely tokens whose probability reaches ``top_p`` (nucleus
    sampling), by a host generator seeded with ``seed``. A row that produced ``eos_id`` (an id, or a list of
    ids: Llama 3 has several) repeats it; generation stops when every row has. Runs in eval mode under no_grad
    (the model's mode is restored). Returns ids (B, L + n), and with ``return_logits`` also the logits (B, n, V)
    each new token was chosen from.

    Any model with this interface generates here: ``model(ids, cache=dict, start=position)`` -> logits
    (B, L, V), ``vocab_size``, ``position_limit`` (the positions it has, or None), ``training``, ``eval()``
    and ``train(mode)`` (:class:`GPT`, :class:`minitf.llama.model.Llama`).
    """
    prompt = backend.to_numpy(check_ids(prompt, "prompt", model.vocab_size))
    B, L = prompt.shape
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")
    fed = L + max_new_tokens - 1  # the last new token is never fed back
    limit = model.position_limit
    if limit is not None and fed > limit:
        raise ValueError(f"a prompt of {L} tokens and {max_new_tokens} new tokens need {fed} positions, the model "
                         f"has {limit}; ask for at most {limit - L + 1} new tokens")
    eos_ids = None if eos_id is None else np.asarray([eos_id] if np.ndim(eos_id) == 0 else list(eos_id))
    rng = np.random.default_rng(seed)
    ids, steps, done = [prompt], [], np.zeros(B, dtype=bool)
    training = model.training
    model.eval()
    try:
        with no_grad():
            cache = {}
            logits = model(prompt, cache=cache)[:, -1]                       # the prompt once  (B, V)
            for step in range(max_new_tokens):
                row = backend.to_numpy(logits).astype(np.float64)           # (B, V) on the host
                check_logits(row, step, "generation")                       # no NaN reaches the sampler
                steps.append(row)
                token = choose_tokens(row, temperature, top_k, top_p, rng)  # (B,)
                if eos_ids is not None:
                    token = np.where(done, eos_ids[0], token)               # a finished row repeats eos
                    done |= np.isin(token, eos_ids)
                ids.append(token[:, None])
                if step + 1 == max_new_tokens or done.all():
                    break
                logits = model(token[:, None], cache=cache, start=L + step)[:, -1]  # one position
    finally:
        model.train(training)
    ids = np.concatenate(ids, axis=1)
    if return_logits:
        V = model.vocab_size
        return ids, (np.stack(steps, axis=1) if steps else np.zeros((B, 0, V)))
    return ids


def nonfinite_rows(logits):
    """(N,) bool, on the logits' own device (no host sync): which rows of ``logits`` (N, V) hold NaN or infinity.
    No token can be chosen from such a row (argmax and the sampler's CDF would both answer id 0, over and over).
    A row's sum is NaN or infinite when one of its entries is (one matrix-vector product, a pass over the
    logits; entries beyond 1e33, themselves an overflow, count too)."""
    module = np if isinstance(logits, np.ndarray) else backend.xp
    with np.errstate(invalid="ignore", over="ignore"):          # NaN and infinity are what it looks for
        return ~module.isfinite(logits @ module.ones(logits.shape[-1], dtype=logits.dtype))


def non_finite_logits_error(step, what):
    """The one-line FloatingPointError for non-finite logits: ``what`` ("generation", "translation") and the
    new token (``step`` from 0)."""
    return FloatingPointError(f"{what}: the model's logits for new token {step + 1} hold NaN or infinity, so no "
                              "token can be chosen; its weights are damaged or its arithmetic overflowed "
                              "(float16: use float32): check the model it was loaded from")


def check_logits(logits, step, what):
    """Refuse host ``logits`` (N, V) that hold NaN or infinity (:func:`nonfinite_rows`). The translation decoders,
    whose logits live on the device, carry the rows' flags in the copy they make each step instead."""
    if nonfinite_rows(logits).any():
        raise non_finite_logits_error(step, what)


def choose_tokens(logits, temperature=1.0, top_k=None, top_p=None, rng=None):
    """One token id per row of host ``logits`` (B, V): greedy at temperature 0, else a draw from
    softmax(logits / temperature) cut to the top_k most likely tokens and to the nucleus of
    probability top_p (the most likely token always stays). Returns (B,) int64."""
    if temperature == 0:
        return logits.argmax(axis=-1)
    B, V = logits.shape
    z = logits / temperature
    if top_k is not None and top_k < V:
        kth = np.partition(z, V - top_k, axis=-1)[:, V - top_k, None]     # the k-th largest  (B, 1)
        z = np.where(z >= kth, z, -np.inf)

    def softmax_rows(z):                                                 # a block of rows' softmax
        p = np.exp(z - z.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        return p
    p = backend.by_rows(softmax_rows, z)                                 # softmax (B, V), rows on threads
    if top_p is not None and top_p < 1:
        order = np.argsort(-p, axis=-1, kind="stable")                   # most likely first
        sorted_p = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p                 # mass of the more likely tokens
        keep = np.zeros_like(p, dtype=bool)
        np.put_along_axis(keep, order, before < top_p, axis=-1)          # the nucleus, in vocabulary order
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    cdf = np.cumsum(p, axis=-1)
    u = (rng if rng is not None else np.random.default_rng()).random((B, 1)) * cdf[:, -1:]  # in [0, total)
    # inverse CDF: token i when cdf[i-1] <= u < cdf[i] (a token of probability 0 is never chosen)
    return (cdf <= u).sum(axis=-1)
