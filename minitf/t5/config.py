"""T5's shape and choices: one frozen dataclass, :class:`T5Config`, in Hugging Face's names, checked once when it is
made (a ValueError naming the field); and ``train.py --model t5``'s run config (:class:`T5RunConfig`: the translation
run's fields and T5's own), its presets and checks."""
import dataclasses
import math

from minitf.nmt.config import TranslationRunConfig
from minitf.training.config import option
from minitf.training.errors import UsageError
from minitf.transformer import check_positive_ints

#: config.json's ``feed_forward_proj`` -> (gated, minitf's activation), as transformers reads it: "gated-gelu" is
#: GELU's tanh form (its "gelu_new"), a plain "gelu" the exact one.
FEED_FORWARDS = {"relu": (False, "relu"), "gelu": (False, "gelu"), "silu": (False, "silu"),
                 "gated-gelu": (True, "gelu_tanh"), "gated-relu": (True, "relu"), "gated-silu": (True, "silu")}


@dataclasses.dataclass(frozen=True)
class T5Config:
    """What :class:`T5` is built from, in Hugging Face's ``T5Config`` names (frozen, checked once: a ValueError
    naming the field). ``num_decoder_layers`` None: ``num_layers``. ``tie_word_embeddings``: the output projection
    is the shared embedding's matrix (v1.0); False: an ``lm_head`` of its own (v1.1, flan-t5, mT5).
    ``scale_decoder_outputs``: the decoder's output is multiplied by d_model^-0.5 before the output projection
    (v1.0's; None: as ``tie_word_embeddings``, transformers' rule). ``decoder_start_token_id`` starts every output
    (T5's pad); ``eos_token_id`` ends it. ``n_positions``: the longest input a folder names (T5's relative
    positions have no table; None: no limit)."""
    vocab_size: int
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_decoder_layers: int | None = None
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "relu"
    tie_word_embeddings: bool = True
    scale_decoder_outputs: bool | None = None
    initializer_factor: float = 1.0
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 0
    n_positions: int | None = None

    def __post_init__(self):
        if self.num_decoder_layers is None:
            object.__setattr__(self, "num_decoder_layers", self.num_layers)
        if self.scale_decoder_outputs is None:
            object.__setattr__(self, "scale_decoder_outputs", self.tie_word_embeddings)
        check_positive_ints(self, ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers",
                                   "num_heads", "relative_attention_num_buckets", "relative_attention_max_distance"))
        if self.relative_attention_num_buckets < 4:
            raise ValueError(f"T5Config: relative_attention_num_buckets must be at least 4 (two halves of exact and "
                             f"logarithmic buckets), got {self.relative_attention_num_buckets}")
        if self.relative_attention_max_distance <= self.relative_attention_num_buckets // 2:
            raise ValueError(f"T5Config: relative_attention_max_distance {self.relative_attention_max_distance} must "
                             f"be above the decoder's exact buckets, {self.relative_attention_num_buckets // 2} (half "
                             "of relative_attention_num_buckets): the logarithmic buckets span the distances between")
        if self.feed_forward_proj not in FEED_FORWARDS:
            raise ValueError(f"T5Config: feed_forward_proj must be one of {', '.join(FEED_FORWARDS)}, got "
                             f"{self.feed_forward_proj!r}")
        for name, low, high in (("dropout_rate", 0.0, 1.0), ("layer_norm_epsilon", 0.0, 1.0),
                                ("initializer_factor", 0.0, math.inf)):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                    and (low <= value < high if name == "dropout_rate" else low < value < high)):
                raise ValueError(f"T5Config: {name} must be a number in {'[' if name == 'dropout_rate' else '('}"
                                 f"{low:g}, {high:g}), got {value!r}")
        for name in ("tie_word_embeddings", "scale_decoder_outputs"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"T5Config: {name} must be true or false, got {getattr(self, name)!r}")
        for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < self.vocab_size):
                raise ValueError(f"T5Config: {name} must be a token id in [0, {self.vocab_size}), got {value!r}")
        if self.n_positions is not None:
            check_positive_ints(self, ("n_positions",))

    def replace(self, **fields):
        """A copy with ``fields`` changed (checked again)."""
        return dataclasses.replace(self, **fields)

    @property
    def gated(self):
        """Whether the feed-forward is gated (v1.1): act(x W_0) * (x W_1)."""
        return FEED_FORWARDS[self.feed_forward_proj][0]

    @property
    def activation(self):
        """The feed-forward's activation, by its name in :data:`minitf.layers.ACTIVATIONS`."""
        return FEED_FORWARDS[self.feed_forward_proj][1]

    # the names the translation decoders read (minitf.nmt.decode): one vocabulary, T5's start, end and pad
    @property
    def src_vocab_size(self):
        return self.vocab_size

    @property
    def tgt_vocab_size(self):
        return self.vocab_size

    @property
    def decoder_start_id(self):
        return self.decoder_start_token_id

    @property
    def eos_id(self):
        return self.eos_token_id

    @property
    def pad_id(self):
        return self.pad_token_id


# --------------------------------------------------------------------------- #
# train.py --model t5: its run config, presets and checks
# --------------------------------------------------------------------------- #
GROUP = "T5 (--model t5)"
#: Plain cross-entropy (as T5 was trained), short runs on a CPU. Fine-tuning a T5 folder (--init-from: its sizes, the
#: paper's schedule at a tenth unless --lr-scale) on parallel text; from scratch, these sizes (v1.1's layout).
PRESETS = {
    "tiny": dict(d_model=128, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=256, vocab_size=2000,
                 max_len=128, dropout=0.1, warmup=400, lr_scale=1.0, max_tokens=1500, label_smoothing=0.0,
                 max_minutes=10.0, save_every=200, keep=5, average=0, eval_every=200, bleu_sentences=20, beam=1),
}


@dataclasses.dataclass
class T5RunConfig(TranslationRunConfig):
    """A ``--model t5`` run's config: the translation run's fields (its data, BLEU's settings), the task prefix put
    before each source, and the T5 folder's config.json it was started from (``t5``, from --init-from)."""
    prefix: str = option(None, "the task prefix put before each source sentence, e.g. 'translate English to German: "
                         "' (default: --init-from's first translation task's, config.json's task_specific_params; "
                         "'' for none)", type="str", group=GROUP, absent="")
    # the --init-from folder's config.json (tie_word_embeddings as its weights say), kept so that the run needs the
    # folder no more: its model is built from it, an export writes it again
    t5: dict | None = option(None, flag=False, model=True)


def validate_run(config):
    """Refuse (one line naming the flag) what does not fit in a ``--model t5`` run's own fields."""
    if config.bpe_dropout:
        raise UsageError("--bpe-dropout samples minitf's own BPE merges; a T5 run keeps its folder's sentencepiece "
                         "tokenizer: leave it out")
    if config.lexicon:
        raise UsageError("--lexicon mixes in the Ding dictionary's lexicon; a T5 run trains on --train-src ... only")
    if config.t5 is not None and not isinstance(config.t5, dict):
        raise UsageError("config.json's \"t5\" must be the T5 folder's config.json (an object); start a new run")
    if config.prefix is not None and not isinstance(config.prefix, str):
        raise UsageError(f"--prefix must be text, got {config.prefix!r}")
