"""A Llama-family model's shape and choices: one frozen dataclass, :class:`LlamaConfig`, checked once when it is
made (a ValueError naming the field), and its presets: a tiny one that trains in minutes on a CPU and
SmolLM2-135M's shape."""
import dataclasses
import math

from minitf.lm.config import TextBlocksRunConfig, check_text_blocks
from minitf.rotary import ROPE_KEYS
from minitf.training.config import option
from minitf.transformer import check_positive_ints


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """What :class:`minitf.llama.model.Llama` is built from (Hugging Face's ``LlamaConfig`` names where they exist).

    ``head_dim`` None: d_model / num_heads. ``rope_scaling`` None (the default frequencies) or a dict with
    ``rope_type`` "linear" and its ``factor``, or "llama3" and its four parameters (:data:`minitf.rotary.ROPE_KEYS`).
    ``attention_bias``: biases on the query, key and value projections (Qwen2's; none on the output projection).
    ``mlp_bias``: biases on the feed-forward's three projections. ``tie_word_embeddings``: the output projection is
    the embedding's matrix.
    ``eos_token_id``: None, one id, or a tuple of ids (Llama 3's several ends). ``sliding_window``: None, or a
    Mistral's window W (a query sees the W latest keys, itself included): minitf computes full attention, which is
    that exactly over at most W positions, so the model has min(max_position_embeddings, W) positions
    (:attr:`positions`).

    ``qk_norm``: None, "head" (Qwen3: an RMSNorm of each query and key head before the rotation) or "projection"
    (OLMoE: of the whole query and key projections). Mixtures of experts (:class:`minitf.moe.SparseMoE`):
    ``num_experts`` 0 is dense; otherwise layer i is sparse unless i is in ``mlp_only_layers`` or (i + 1) is not
    a multiple of ``decoder_sparse_step`` (Qwen's rule), with ``num_experts_per_tok`` experts of width
    ``moe_d_ff`` (None: d_ff) per token, their weights renormalised where ``norm_topk_prob``, and a shared
    expert of width ``shared_expert_d_ff`` behind a sigmoid gate where it is set (Qwen2-MoE); the dense
    layers' width is d_ff. ``router_aux_loss_coef`` and ``router_z_loss_coef``: the coefficients the model
    reports with its load-balancing and z auxiliary losses (:meth:`minitf.llama.model.Llama.aux_losses`)."""
    vocab_size: int
    d_model: int = 576
    num_layers: int = 30
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int | None = None
    d_ff: int = 1536
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    mlp_bias: bool = False
    initializer_range: float = 0.02
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | tuple | None = None
    sliding_window: int | None = None
    qk_norm: str | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 2
    moe_d_ff: int | None = None
    shared_expert_d_ff: int | None = None
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple = ()
    router_aux_loss_coef: float = 0.001
    router_z_loss_coef: float = 0.0

    def __post_init__(self):
        check_positive_ints(self, ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "d_ff",
                                   "max_position_embeddings"))
        if self.sliding_window is not None and (not _is_int(self.sliding_window) or self.sliding_window < 1):
            raise ValueError(f"LlamaConfig: sliding_window must be a positive integer or None, got "
                             f"{self.sliding_window!r}")
        if self.head_dim is not None and (not _is_int(self.head_dim) or self.head_dim < 1):
            raise ValueError(f"LlamaConfig: head_dim must be a positive integer or None, got {self.head_dim!r}")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(f"LlamaConfig: d_model {self.d_model} is not a multiple of num_heads {self.num_heads}; "
                             "give head_dim")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"LlamaConfig: num_heads {self.num_heads} is not a multiple of num_kv_heads "
                             f"{self.num_kv_heads}; each key/value head serves the same number of query heads")
        if self.head_size % 2:
            raise ValueError(f"LlamaConfig: the head dimension {self.head_size} is odd; rotary positions turn "
                             "pairs of coordinates")
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if not _is_number(value) or value <= 0:
                raise ValueError(f"LlamaConfig: {name} must be a positive number, got {value!r}")
        if not _is_number(self.initializer_range) or self.initializer_range < 0:
            raise ValueError(f"LlamaConfig: initializer_range must be a number >= 0, got {self.initializer_range!r}")
        for name in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"LlamaConfig: {name} must be true or false, got {getattr(self, name)!r}")
        if self.rope_scaling is not None:
            scaling = dict(self.rope_scaling)
            keys = ROPE_KEYS.get(scaling.pop("rope_type", None), ())
            if not keys or sorted(scaling) != sorted(keys) or not all(_is_number(v) and v > 0
                                                                      for v in scaling.values()):
                llama3 = ", ".join(repr(k) + ": ..." for k in ROPE_KEYS["llama3"])
                raise ValueError(f"LlamaConfig: rope_scaling must be None, {{'rope_type': 'linear', 'factor': ...}} or "
                                 f"{{'rope_type': 'llama3', {llama3}}} (positive numbers), got {self.rope_scaling!r}")
        check_sparse_fields(self)
        ids = {"pad_token_id": self.pad_token_id, "bos_token_id": self.bos_token_id}
        eos = self.eos_token_id
        ids |= {f"eos_token_id[{i}]": e for i, e in enumerate(eos)} if isinstance(eos, tuple) else {"eos_token_id": eos}
        for name, value in ids.items():
            if value is not None and (not _is_int(value) or not 0 <= value < self.vocab_size):
                raise ValueError(f"LlamaConfig: {name} must be None or an id in [0, {self.vocab_size}), got {value!r}")

    @property
    def head_size(self):
        """The width of one head: head_dim, or d_model / num_heads without one."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    def is_sparse(self, layer):
        """Whether block ``layer`` (0-based) has the sparse feed-forward (Qwen2-MoE's rule)."""
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    @property
    def expert_d_ff(self):
        """An expert's width: moe_d_ff, or d_ff without one."""
        return self.moe_d_ff or self.d_ff

    @property
    def positions(self):
        """(the positions the model computes exactly, what limits them in a sentence): max_position_embeddings, or a
        shorter sliding_window (beyond it a query would no longer see every earlier key)."""
        if self.sliding_window is not None and self.sliding_window < self.max_position_embeddings:
            return self.sliding_window, f"its sliding_window {self.sliding_window}"
        return self.max_position_embeddings, "its max_position_embeddings"

    @property
    def eos_ids(self):
        """The end-of-text ids as a tuple (empty without one)."""
        eos = self.eos_token_id
        return () if eos is None else tuple(eos) if isinstance(eos, tuple) else (eos,)

    def replace(self, **changes):
        """A copy with ``changes``, checked again."""
        return dataclasses.replace(self, **changes)


def check_sparse_fields(config):
    """The qk_norm and mixture-of-experts fields of a :class:`LlamaConfig`, each refused naming it."""
    if config.qk_norm not in (None, "head", "projection"):
        raise ValueError(f"LlamaConfig: qk_norm must be None, 'head' or 'projection', got {config.qk_norm!r}")
    if not _is_int(config.num_experts) or config.num_experts < 0:
        raise ValueError(f"LlamaConfig: num_experts must be an integer >= 0 (0: dense), got {config.num_experts!r}")
    for name in ("num_experts_per_tok", "decoder_sparse_step"):
        if not _is_int(getattr(config, name)) or getattr(config, name) < 1:
            raise ValueError(f"LlamaConfig: {name} must be a positive integer, got {getattr(config, name)!r}")
    if config.num_experts and config.num_experts_per_tok > config.num_experts:
        raise ValueError(f"LlamaConfig: num_experts_per_tok {config.num_experts_per_tok} is more than the "
                         f"{config.num_experts} experts")
    for name in ("moe_d_ff", "shared_expert_d_ff"):
        value = getattr(config, name)
        if value is not None and (not _is_int(value) or value < 1):
            raise ValueError(f"LlamaConfig: {name} must be a positive integer or None, got {value!r}")
    if not isinstance(config.norm_topk_prob, bool):
        raise ValueError(f"LlamaConfig: norm_topk_prob must be true or false, got {config.norm_topk_prob!r}")
    layers = config.mlp_only_layers
    if not isinstance(layers, tuple) or any(not _is_int(i) or not 0 <= i < config.num_layers for i in layers):
        raise ValueError(f"LlamaConfig: mlp_only_layers must be a tuple of layer numbers in [0, {config.num_layers})"
                         f", got {layers!r}")
    for name in ("router_aux_loss_coef", "router_z_loss_coef"):
        if not _is_number(getattr(config, name)) or getattr(config, name) < 0:
            raise ValueError(f"LlamaConfig: {name} must be a number >= 0, got {getattr(config, name)!r}")


#: Shapes by name: {name: LlamaConfig's fields}. "tiny" trains in minutes on a CPU; "smollm2-135m" is
#: HuggingFaceTB/SmolLM2-135M's (134.5M parameters with its vocabulary of 49152, tied output).
PRESETS = {
    "tiny": dict(vocab_size=4096, d_model=192, num_layers=4, num_heads=6, num_kv_heads=2, d_ff=512,
                 rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=256, tie_word_embeddings=True),
    "smollm2-135m": dict(vocab_size=49152, d_model=576, num_layers=30, num_heads=9, num_kv_heads=3, d_ff=1536,
                         rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192,
                         tie_word_embeddings=True, initializer_range=576 ** -0.5, bos_token_id=0, eos_token_id=0),
}


def preset(name, **changes):
    """The :class:`LlamaConfig` of preset ``name`` with ``changes`` on top; a ValueError naming the presets."""
    if name not in PRESETS:
        raise ValueError(f"no Llama preset {name!r}; minitf has {', '.join(PRESETS)}")
    return LlamaConfig(**(PRESETS[name] | changes))


#: ``train.py --model llama``'s presets (RunConfig fields): "tiny" is the GPT's tiny run (minitf.lm.config) with
#: the Llama block (grouped-query attention of 6 query and 2 key/value heads, SwiGLU of 512, RMSNorm, rotary
#: positions), so that the two blocks train side by side at equal minutes; no dropout (Llama uses none).
RUN_PRESETS = {
    "tiny": dict(d_model=192, num_heads=6, num_kv_heads=2, num_encoder_layers=0, num_decoder_layers=4, d_ff=512,
                 dropout=0.0, pre_norm=True, vocab_size=4096, block_size=128, rope_theta=10000.0, warmup=400,
                 lr_scale=0.5, max_tokens=2048, label_smoothing=0.0, max_minutes=9.0, eval_every=200,
                 save_every=200, keep=5, average=0),
}


_GROUP = "the Llama block (--model llama)"


@dataclasses.dataclass
class LlamaRunConfig(TextBlocksRunConfig):
    """A ``--model llama`` run's config: the language models' text blocks, grouped-query attention's key/value heads,
    the rotary base, and a fine-tuned folder's model config (``llama``, from --init-from)."""
    num_kv_heads: int | None = option(None, "key/value heads of grouped-query attention, a divisor of --num-heads "
                                      f"(default: the preset's, {RUN_PRESETS['tiny']['num_kv_heads']} for tiny)",
                                      model=True, type="positive int", group=_GROUP)
    rope_theta: float = option(10000.0, f"the rotary positions' base (default: {RUN_PRESETS['tiny']['rope_theta']:g})",
                               model=True, type="positive float", group=_GROUP)
    # a mixture of experts (minitf.moe.SparseMoE in every block's feed-forward): 0 experts is the dense block
    num_experts: int = option(0, "experts of each block's sparse feed-forward (0: dense, the default)", model=True,
                              type="int", group=_GROUP)
    experts_per_token: int = option(2, "experts each token is routed to, the top k of the router's softmax "
                                    "(default 2)", model=True, type="positive int", group=_GROUP)
    moe_d_ff: int | None = option(None, "each expert's SwiGLU width (default: --d-ff)", model=True,
                                  type="positive int", group=_GROUP)
    router_aux_loss_coef: float | None = option(
        None, f"the load-balancing loss's coefficient (default: {LlamaConfig.router_aux_loss_coef:g}, or the "
        "--init-from folder's)", type="float", group=_GROUP)
    router_z_loss_coef: float | None = option(
        None, f"the router z-loss's coefficient (default: {LlamaConfig.router_z_loss_coef:g}: none, or the "
        "--init-from folder's)", type="float", group=_GROUP)
    # from a Hugging Face Llama, Qwen2 or Mistral folder: its model's config (LlamaConfig's fields), kept so that the
    # run needs the folder no more: the model is built from it, an export writes it again
    llama: dict | None = option(None, flag=False, model=True)


def folder_fields(config):
    """A :class:`LlamaConfig` as JSON values (a fine-tuning run's ``llama`` field: the folder's model, kept in
    config.json so that the run needs the folder no more)."""
    values = dataclasses.asdict(config)
    eos = values["eos_token_id"]
    return dict(values, eos_token_id=list(eos) if isinstance(eos, tuple) else eos,
                mlp_only_layers=list(config.mlp_only_layers))


def from_folder_fields(values):
    """The :class:`LlamaConfig` of :func:`folder_fields`' values; a ValueError naming what does not fit."""
    names = [f.name for f in dataclasses.fields(LlamaConfig)]
    if isinstance(values, dict):  # a run saved before sliding_window, the q/k norms, the experts: their defaults
        values = {f.name: f.default for f in dataclasses.fields(LlamaConfig) if f.name in _LATER_FIELDS} | values
    if not isinstance(values, dict) or sorted(values) != sorted(names):
        got = sorted(values) if isinstance(values, dict) else type(values).__name__
        raise ValueError(f"\"llama\" must hold the fields {names}, got {got}")
    eos, dense = values["eos_token_id"], values["mlp_only_layers"]
    return LlamaConfig(**dict(values, eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
                              mlp_only_layers=tuple(dense) if isinstance(dense, list) else dense))


#: the fields added with sliding_window, Qwen3 and the mixtures of experts (a run's "llama" field written before
#: lacks them)
_LATER_FIELDS = ("sliding_window", "qk_norm", "num_experts", "num_experts_per_tok", "moe_d_ff", "shared_expert_d_ff",
                 "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef", "router_z_loss_coef")


#: LlamaConfig's fields a run sets by a flag of another name (named in its refusals)
RUN_FIELD_FLAGS = {"num_experts_per_tok": "--experts-per-token", "num_experts": "--num-experts",
                   "moe_d_ff": "--moe-d-ff", "router_aux_loss_coef": "--router-aux-loss-coef",
                   "router_z_loss_coef": "--router-z-loss-coef"}


def validate_run(config):
    """Refuse (one line naming the flag) what does not fit in a ``--model llama`` run's own fields, and a shape the
    Llama block cannot take (checked by building its :class:`LlamaConfig` once); a fine-tuning run's blocks must
    fit in its folder's positions."""
    from minitf.training.errors import UsageError
    check_text_blocks(config)
    if not (isinstance(config.block_size, int) and not isinstance(config.block_size, bool) and config.block_size > 0):
        raise UsageError(f"--block-size must be a positive integer, got {config.block_size!r}")
    if config.num_kv_heads is not None and not (isinstance(config.num_kv_heads, int) and config.num_kv_heads > 0):
        raise UsageError(f"--num-kv-heads must be a positive integer, got {config.num_kv_heads!r}")
    try:
        model = run_model_config(config, 8)
    except ValueError as error:
        message = str(error).replace("LlamaConfig: ", "--model llama: ")
        for field, flag in RUN_FIELD_FLAGS.items():  # the run's flags where its fields say them
            message = message.replace(f"{field} ", f"{flag} ")
        raise UsageError(message) from None
    positions, why = model.positions
    if config.llama is not None and config.block_size > positions:
        raise UsageError(f"--block-size {config.block_size} is longer than the {positions} positions of "
                         f"{config.init_from} ({why}); give --block-size {positions} or less")


def run_model_config(config, vocab_size):
    """The :class:`LlamaConfig` of a ``--model llama`` run's RunConfig: a fine-tuning run's folder's model (its
    ``llama`` field, ``vocab_size`` aside: the folder's), or the run's sizes, ``num_decoder_layers`` blocks,
    ``block_size`` positions, tied output."""
    coefficients = {name: float(getattr(config, name)) for name in ("router_aux_loss_coef", "router_z_loss_coef")
                    if getattr(config, name) is not None}  # given: they replace the folder's or the default
    if config.llama is not None:
        return from_folder_fields(config.llama).replace(**coefficients)
    return LlamaConfig(vocab_size=vocab_size, d_model=config.d_model, num_layers=config.num_decoder_layers,
                       num_heads=config.num_heads, num_kv_heads=config.num_kv_heads or config.num_heads,
                       d_ff=config.d_ff, rope_theta=float(config.rope_theta),
                       max_position_embeddings=config.block_size, tie_word_embeddings=True,
                       num_experts=config.num_experts, num_experts_per_tok=config.experts_per_token,
                       moe_d_ff=config.moe_d_ff, **coefficients)
