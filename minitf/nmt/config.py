"""The translation kind's part of the run config: its presets (the paper's Table 3 and the CPU default), the
checks of its own fields (``TranslationKind.config_fields``), and the model a run's config describes
(:func:`model_config`). Read by its kind (:mod:`minitf.nmt.kind`), its task and its trainer."""
import dataclasses

from minitf.nmt import marian
from minitf.training.config import RunConfig, option
from minitf.training.errors import UsageError
from minitf.training.tokenizer import PAD_ID

# Table 3 of the paper (base, big); tiny is the CPU default, chosen by measurement (docs/training.md: more
# updates of a small, fast model win a 15-minute budget; scripts/recipe_arms.sh decided dropout and BPE-dropout).
PRESETS = {
    "tiny": dict(d_model=128, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=512, dropout=0.1,
                 vocab_size=4000, warmup=800, lr_scale=1.0, max_tokens=1500, max_minutes=14.0, bpe_dropout=0.0,
                 save_every=400, keep=10, average=10, eval_every=800),  # averages the last 3,600 steps (docs/results.md)
    "base": dict(d_model=512, num_heads=8, num_encoder_layers=6, num_decoder_layers=6, d_ff=2048, dropout=0.1,
                 vocab_size=8000, warmup=4000, lr_scale=1.0, max_tokens=25000, max_minutes=None),
    "big": dict(d_model=1024, num_heads=16, num_encoder_layers=6, num_decoder_layers=6, d_ff=4096, dropout=0.3,
                vocab_size=8000, warmup=4000, lr_scale=1.0, max_tokens=25000, max_minutes=None),
}
#: The largest --alpha: the penalty ((5 + |Y|) / 6) ** alpha stays far inside float32 for outputs of thousands of
#: tokens (about 1e22 at 1,000), where 1e308 overflowed at the first finished hypothesis; past a few it only
#: prefers the longest output anyway (the paper: 0.6).
MAX_ALPHA = 10.0


_BLEU = "translation's BLEU (validation and the end of the run)"
DATA_GROUP = "data (default: the Ding de-en example sentences, fetched with apt)"


@dataclasses.dataclass
class TranslationRunConfig(RunConfig):
    """A translation run's config: the shared fields and translation's own, each declared once."""
    lexicon: float = option(0.0, "mix the dictionary's headwords and phrases into each epoch, RATIO pairs per "
                            "training sentence, a new sample every epoch; the tokenizer is trained on the sentences "
                            "alone ({default}; 0 = sentences only; the preset's value is for the default corpus only; "
                            "docs/results.md, 'Recipe arms')", type="non-negative", metavar="RATIO", group=DATA_GROUP)
    src_lang: str = option("de", type="str", group=DATA_GROUP, flag_default="de")
    tgt_lang: str = option("en", type="str", group=DATA_GROUP, flag_default="en")
    bleu_sentences: int = option(200, "validation sentences decoded for BLEU ({default})", resume="changes",
                                 type="int", group=_BLEU)
    beam: int = option(4, "beam size ({default})", resume="changes", type="positive int", group=_BLEU)
    alpha: float = option(0.6, "length penalty exponent ({default})", resume="changes", type="non-negative",
                          group=_BLEU)
    # a run fine-tuned from a Marian folder (--init-from): {"config": its config.json, "generation": its
    # generation_config.json or None}, kept so that the run needs the folder no more (a checkpoint of the same model)
    marian: dict | None = option(None, flag=False, model=True)


def validate(config):
    """Refuse (one line naming the flag or key) what does not fit in a translation run's own fields."""
    for name in ("num_encoder_layers", "num_decoder_layers"):
        if getattr(config, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(config, name)!r}")
    for name in ("beam", "bleu_sentences"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name == "beam" else 0):
            raise UsageError(f"--{name.replace('_', '-')} must be a{' positive' * (name == 'beam')} integer"
                             f"{' >= 0' * (name != 'beam')}, got {value!r}")
    if not (isinstance(config.lexicon, (int, float)) and 0 <= config.lexicon <= 10):
        raise UsageError(f"--lexicon must be a ratio in [0, 10] (lexicon pairs per training sentence), "
                         f"got {config.lexicon}")
    if not (isinstance(config.alpha, (int, float)) and 0 <= config.alpha <= MAX_ALPHA):
        raise UsageError(f"--alpha must be a finite number >= 0 and at most {MAX_ALPHA:g} (the paper: 0.6), "
                         f"got {config.alpha}")
    if (config.init_from is None) != (config.marian is None):
        raise UsageError("a translation run fine-tuned with --init-from records the Marian folder's path "
                         f"(init_from) and its config.json (marian) together; got init_from {config.init_from!r} "
                         f"and marian {'set' if config.marian is not None else 'null'}: start a new run")
    if config.marian is not None:
        _validate_marian(config)

def _validate_marian(config):
    """A run fine-tuned from a Marian folder: its kept config.json describes a model minitf computes, whose
    shape is the run's (a hand-edited config.json that disagrees is refused, naming the field)."""
    where = "config.json's \"marian\""
    if not (isinstance(config.marian, dict) and isinstance(config.marian.get("config"), dict)
            and isinstance(config.marian.get("generation"), (dict, type(None)))):
        raise UsageError(f"{where} must be {{\"config\": the folder's config.json, \"generation\": its "
                         "generation_config.json or null}; start a new run")
    try:
        args = marian.transformer_config(config.marian["config"], where, training=True)
        positions = marian.max_positions(config.marian["config"], where)
    except ValueError as error:
        raise UsageError(str(error)) from None
    shape = {name: getattr(args, name) for name in ("d_model", "num_heads", "num_encoder_layers",
                                                    "num_decoder_layers", "d_ff", "pre_norm")}
    shape["vocab_size"] = args.src_vocab_size
    wrong = [f"{name} {getattr(config, name)!r} (the folder's: {value!r})" for name, value in shape.items()
             if getattr(config, name) != value]
    if wrong:
        raise UsageError(f"the run's {', '.join(wrong)} differ from the Marian folder's config it was started "
                         f"from ({where}); restore config.json or start a new run")
    if config.max_len + 1 > positions:  # a sentence and its eos (or the start token) at most
        raise UsageError(f"--max-len {config.max_len} is longer than the model's {positions} positions less one "
                         f"(max_position_embeddings of --init-from {config.init_from}); use --max-len "
                         f"{positions - 1} or less")

def model_config(config, vocab_size):
    """A run's TransformerConfig: one shared vocabulary, tied embeddings (paper 3.4), the tokenizer's pad id.
    A run fine-tuned from a Marian folder: the folder's model (its config.json, :func:`minitf.nmt.marian.
    transformer_config`: Marian's options, its vocabulary and ids) with the run's dropout."""
    from minitf.transformer import TransformerConfig
    if config.marian is not None:
        folder = marian.transformer_config(config.marian["config"])
        if vocab_size > folder.src_vocab_size:
            raise ValueError(f"the tokenizer has {vocab_size} ids, the Marian model {folder.src_vocab_size}")
        return dataclasses.replace(folder, dropout=config.dropout)
    return TransformerConfig(src_vocab_size=vocab_size, tgt_vocab_size=vocab_size,
                             **{k: getattr(config, k) for k in ("d_model", "num_heads", "num_encoder_layers",
                                                                "num_decoder_layers", "d_ff", "dropout", "pre_norm")},
                             share_embeddings=True, pad_id=PAD_ID)
