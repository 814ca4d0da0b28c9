"""The language-model kind's part of the run config: its presets and the checks of its own fields
(``LanguageModelKind.config_fields``). Read by its kind (:mod:`minitf.lm.kind`) and its task."""
import dataclasses

from minitf.layers import ACTIVATIONS
from minitf.training.config import TOKENIZERS, RunConfig, option
from minitf.training.errors import UsageError

#: The language model's presets: GPT-2's choices (pre-LN, GELU, learned positions) at a CPU size;
#: ``num_decoder_layers`` is the GPT's number of blocks (docs/architecture.md, the layout decision).
PRESETS = {
    "tiny": dict(d_model=192, num_heads=4, num_encoder_layers=0, num_decoder_layers=4, d_ff=768, dropout=0.1,
                 pre_norm=True, vocab_size=4096, block_size=128, warmup=400, lr_scale=0.5, max_tokens=2048,
                 label_smoothing=0.0, max_minutes=9.0, eval_every=200, save_every=200, keep=5, average=0),
}


GROUP = "language models (--model gpt, llama)"


@dataclasses.dataclass
class TextBlocksRunConfig(RunConfig):
    """What every language model's run adds: blocks of text and their tokenizer (the GPT's and the Llama's)."""
    block_size: int = option(128, "tokens per training block, the model's context (default: "
                             f"{PRESETS['tiny']['block_size']})", model=True, type="positive int", group=GROUP)
    tokenizer: str = option("bpe", "bpe: sentencepiece BPE of --vocab-size (default); char: one id per character of "
                            "the training text", choices=TOKENIZERS, group=GROUP)


@dataclasses.dataclass
class LanguageModelRunConfig(TextBlocksRunConfig):
    """A ``--model gpt`` run's config: text blocks, and what a GPT-2 folder fixes (--init-from)."""
    n_positions: int | None = option(None, flag=False, model=True)  # rows of the learned position table (None: block_size)
    activation: str = option("gelu_tanh", flag=False, model=True)   # the feed-forward's (GPT-2's gelu_new)
    layer_norm_eps: float = option(1e-5, flag=False, model=True)


def check_decoder_only(config):
    """A decoder-only model: at least one block (``num_decoder_layers``; ``--num-layers`` sets it, and the encoder
    layers it also sets are not built)."""
    if config.num_decoder_layers < 1:
        raise UsageError(f"--num-decoder-layers must be a positive integer (the model's blocks), got "
                         f"{config.num_decoder_layers!r}")


def check_text_blocks(config):
    """A language model's blocks: at least one block of the model, its tokenizer one of --tokenizer's."""
    check_decoder_only(config)
    if config.tokenizer not in TOKENIZERS + ("pretrained",):
        raise UsageError(f"--tokenizer must be one of {TOKENIZERS}, got {config.tokenizer!r}")


def validate(config):
    """Refuse (one line naming the flag or key) what does not fit in a language-model run's own fields."""
    check_text_blocks(config)
    if config.activation not in ACTIVATIONS:
        raise UsageError(f"activation must be one of {tuple(ACTIVATIONS)}, got {config.activation!r}")
    if not (isinstance(config.layer_norm_eps, float) and 0 < config.layer_norm_eps < 1):
        raise UsageError(f"layer_norm_eps must be a number in (0, 1), got {config.layer_norm_eps!r}")
    for name in ("block_size", "n_positions"):
        value = getattr(config, name)
        if value is None and name == "n_positions":  # no pretrained table: block_size positions
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    if config.n_positions is not None and config.block_size > config.n_positions:
        raise UsageError(f"--block-size {config.block_size} is longer than the model's {config.n_positions} "
                         f"positions (n_positions of --init-from {config.init_from}); use --block-size "
                         f"{config.n_positions} or less")
