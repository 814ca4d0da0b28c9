"""One typed run config (:class:`RunConfig`): the presets, the flag overrides and their
validation, written to and read from a run folder's config.json. ``train.py``, ``--resume``,
the trainer and ``minitf.translate`` all read it; the model is built from its ``model_config``."""
import dataclasses
import json
import math
import pathlib
import sys

from minitf.training.errors import UsageError
from minitf.training.files import write_json_atomic
from minitf.training.tokenizer import PAD_ID
from minitf.layers import ACTIVATIONS
from minitf.marian import max_positions, transformer_config
from minitf.transformer import TransformerConfig

#: Bumped whenever a field changes meaning; config.json records it.
#: 3: ``accumulate`` and ``zero`` (data parallelism) or ``bpe_dropout`` (two branches each wrote a version
#: 3); 4: both, and ``max_minutes`` is the wall time of the whole command (it counted training steps only).
#: 6: ``model`` (transformer or gpt), ``block_size`` and ``tokenizer`` (the language model's).
#: 7: ``init_from``, ``n_positions``, ``activation``, ``layer_norm_eps`` (a GPT fine-tuned from a pretrained one).
#: 8: ``marian`` (a translation model fine-tuned from a Hugging Face Marian folder; ``init_from`` then names it).
SCHEMA_VERSION = 8
#: Fields added since an older schema, with the values that keep the old meaning (a file's own values win).
_ADDED_SINCE_7 = {"marian": None}
_ADDED_SINCE_6 = {"init_from": None, "n_positions": None, "activation": "gelu_tanh", "layer_norm_eps": 1e-5,
                  **_ADDED_SINCE_7}
_ADDED_SINCE_5 = {"model": "transformer", "block_size": 128, "tokenizer": "bpe", **_ADDED_SINCE_6}
_ADDED_SINCE_4 = {"lexicon": 0.0, **_ADDED_SINCE_5}
_ADDED_SINCE_2 = {"accumulate": 1, "zero": 0, "bpe_dropout": 0.0, **_ADDED_SINCE_4}
ADDED_FIELDS = {2: _ADDED_SINCE_2, 3: _ADDED_SINCE_2, 4: _ADDED_SINCE_4, 5: _ADDED_SINCE_5, 6: _ADDED_SINCE_6,
                7: _ADDED_SINCE_7}

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
#: The language model's presets (``--model gpt``): GPT-2's choices (pre-LN, GELU, learned positions) at a CPU
#: size; ``num_decoder_layers`` is the GPT's number of blocks (docs/architecture.md, the layout decision).
LM_PRESETS = {
    "tiny": dict(d_model=192, num_heads=4, num_encoder_layers=0, num_decoder_layers=4, d_ff=768, dropout=0.1,
                 pre_norm=True, vocab_size=4096, block_size=128, warmup=400, lr_scale=0.5, max_tokens=2048,
                 label_smoothing=0.0, max_minutes=9.0, eval_every=200, save_every=200, keep=5, average=0),
}
MODELS = ("transformer", "gpt")
TOKENIZERS = ("bpe", "char")  # --tokenizer's choices; "pretrained" is the tokenizer of --init-from's folder
PRECISIONS = ("fp32", "tf32", "fp16")
#: The fields that shape the model (a checkpoint fits a run only if these agree, dropout aside).
MODEL_FIELDS = ("d_model", "num_heads", "num_encoder_layers", "num_decoder_layers", "d_ff", "dropout", "pre_norm")
#: The fields that shape a GPT besides those (a --model gpt checkpoint fits a run only if these agree too).
GPT_FIELDS = ("model", "block_size", "tokenizer", "n_positions", "activation", "layer_norm_eps")
#: What ``--resume`` may change: the run's length and a few recipe knobs.
RESUME_CHANGEABLE = ("max_steps", "epochs", "max_minutes", "max_tokens", "lr_scale", "clip_norm", "accumulate")
#: How often to evaluate and save, and what to report: a resumed run keeps them unless given again.
RUN_OPTIONS = ("eval_every", "save_every", "keep", "average", "bleu_sentences", "beam", "alpha")
#: Flags that only steer this invocation (never refused with --resume).
INVOCATION_OPTIONS = ("skip_nonfinite", "zero")  # --zero 1 only shards Adam's state: same trajectory
#: The largest --alpha: the penalty ((5 + |Y|) / 6) ** alpha stays far inside float32 for outputs of thousands of
#: tokens (about 1e22 at 1,000), where 1e308 overflowed at the first finished hypothesis; past a few it only
#: prefers the longest output anyway (the paper: 0.6).
MAX_ALPHA = 10.0


_noted = set()


def with_added_fields(values):
    """A config dict of an older schema with the fields added since, at the values that keep its meaning
    (its own values win), as this schema's; other dicts as they are."""
    if values.get("schema_version") not in ADDED_FIELDS:
        return values
    return {**ADDED_FIELDS[values["schema_version"]], **values, "schema_version": SCHEMA_VERSION}


def _note_once(message):
    """One line on stderr per distinct message and process (a run has many checkpoints)."""
    if message not in _noted:
        _noted.add(message)
        print(message, file=sys.stderr, flush=True)


@dataclasses.dataclass
class RunConfig:
    """Everything that defines a training run. Field names are the flags' names
    (``--d-model`` is ``d_model``)."""
    # the model (paper Table 3)
    preset: str = "tiny"
    d_model: int = 128
    num_heads: int = 4
    num_encoder_layers: int = 2
    num_decoder_layers: int = 2
    d_ff: int = 512
    dropout: float = 0.1
    pre_norm: bool = False
    model: str = "transformer"  # or "gpt": the decoder-only language model (minitf.lm)
    block_size: int = 128       # gpt: tokens per training block (the model's context)
    tokenizer: str = "bpe"      # gpt: "bpe" (sentencepiece), "char" (one id per character) or "pretrained"
    # fine-tuned from a Hugging Face folder (--init-from): its path, and what its config.json fixes (a GPT-2
    # folder for gpt; a Marian folder for transformer: then the sizes above, vocab_size and these two are its)
    init_from: str | None = None
    n_positions: int | None = None  # gpt: rows of the learned position table (None: block_size)
    activation: str = "gelu_tanh"   # the feed-forward's (GPT-2's gelu_new; Marian's silu)
    layer_norm_eps: float = 1e-5
    # transformer from a Marian folder: {"config": its config.json, "generation": its generation_config.json or
    # None}, kept so that the run needs the folder no more: the model is built from "config" (model_config), an
    # export writes both again
    marian: dict | None = None
    # the recipe
    vocab_size: int = 4000
    warmup: int = 800
    lr_scale: float = 1.0
    max_tokens: int = 1500
    max_len: int = 100
    label_smoothing: float = 0.1
    bpe_dropout: float = 0.0
    lexicon: float = 0.0  # dictionary pairs mixed into each epoch, per training sentence (--lexicon)
    clip_norm: float = 0.0
    precision: str = "fp32"
    seed: int = 1
    skip_nonfinite: bool = False
    # data parallelism: batches (of --max-tokens each, over all ranks) per update; ZeRO-1 sharded Adam
    accumulate: int = 1
    zero: int = 0
    # how long: whichever comes first; all None means 10 epochs
    max_steps: int | None = None
    epochs: int | None = None
    max_minutes: float | None = 14.0  # wall time of the whole command (schema 4; was training steps only)
    # evaluation, checkpoints, reporting
    eval_every: int = 1000
    save_every: int = 500
    keep: int = 5
    average: int = 5
    bleu_sentences: int = 200
    beam: int = 4
    alpha: float = 0.6
    # the data: six paths (test may be None) and their sha256 when the run started
    src_lang: str = "de"
    tgt_lang: str = "en"
    data: dict = dataclasses.field(default_factory=dict)
    data_sha256: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def from_preset(cls, preset, **overrides):
        """The preset's values, then every override that is not None, validated.
        An explicit ``max_steps`` or ``epochs`` replaces the preset's time budget."""
        presets = LM_PRESETS if overrides.get("model") == "gpt" else PRESETS
        if preset not in presets:
            raise UsageError(f"unknown preset {preset!r}{' for --model gpt' if presets is LM_PRESETS else ''}; "
                             f"expected one of {sorted(presets)}")
        values = dict(presets[preset], preset=preset)
        given = {k: v for k, v in overrides.items() if v is not None}
        if "max_steps" in given or "epochs" in given:
            values["max_minutes"] = None
        values.update(given)
        config = cls(**values)
        if config.max_steps is None and config.epochs is None and config.max_minutes is None:
            config.epochs = 10
        config.validate()
        return config

    def validate(self):
        """Raise UsageError (one line, naming the flag) unless the values fit together."""
        def flag(name):
            return "--" + name.replace("_", "-")

        if self.model not in MODELS:
            raise UsageError(f"--model must be one of {MODELS}, got {self.model!r}")
        if self.tokenizer not in TOKENIZERS + ("pretrained",):
            raise UsageError(f"--tokenizer must be one of {TOKENIZERS}, got {self.tokenizer!r}")
        if (self.tokenizer == "pretrained") != (self.init_from is not None):
            raise UsageError("the pretrained tokenizer comes with --init-from FOLDER and only with it; "
                             f"got tokenizer {self.tokenizer!r} and --init-from {self.init_from}")
        if self.model == "gpt" and self.marian is not None:
            raise UsageError("a Marian folder's config (\"marian\") belongs to a translation run, not --model gpt")
        if self.model == "transformer" and (self.init_from is None) != (self.marian is None):
            raise UsageError("a translation run fine-tuned with --init-from records the Marian folder's path "
                             f"(init_from) and its config.json (marian) together; got init_from {self.init_from!r} "
                             f"and marian {'set' if self.marian is not None else 'null'}: start a new run")
        if self.marian is not None:
            self._validate_marian()
        if self.activation not in ACTIVATIONS:
            raise UsageError(f"activation must be one of {tuple(ACTIVATIONS)}, got {self.activation!r}")
        if not (isinstance(self.layer_norm_eps, float) and 0 < self.layer_norm_eps < 1):
            raise UsageError(f"layer_norm_eps must be a number in (0, 1), got {self.layer_norm_eps!r}")
        for name in ("d_model", "num_heads", "num_encoder_layers", "num_decoder_layers", "d_ff", "vocab_size", "warmup",
                     "max_tokens", "max_len", "eval_every", "save_every", "keep", "beam", "accumulate", "max_steps",
                     "epochs", "block_size", "n_positions"):
            value = getattr(self, name)
            if value is None and name in ("max_steps", "epochs", "n_positions"):  # no such limit
                continue
            if name == "num_encoder_layers" and self.model == "gpt" and value == 0:  # a GPT has no encoder
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UsageError(f"{flag(name)} must be a positive integer, got {value!r}")
        for name in ("dropout", "label_smoothing", "bpe_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UsageError(f"{flag(name)} must be in [0, 1), got {getattr(self, name)}")
        if not (isinstance(self.lexicon, (int, float)) and 0 <= self.lexicon <= 10):
            raise UsageError(f"--lexicon must be a ratio in [0, 10] (lexicon pairs per training sentence), "
                             f"got {self.lexicon}")
        if self.n_positions is not None and self.block_size > self.n_positions:
            raise UsageError(f"--block-size {self.block_size} is longer than the model's {self.n_positions} positions "
                             f"(n_positions of --init-from {self.init_from}); use --block-size {self.n_positions} "
                             "or less")
        if self.d_model % self.num_heads:
            raise UsageError(f"--d-model must be divisible by --num-heads, got {self.d_model} and {self.num_heads}")
        if not self.clip_norm >= 0:
            raise UsageError(f"--clip-norm must be >= 0, got {self.clip_norm}")
        if not (self.lr_scale > 0 and math.isfinite(self.lr_scale)):
            raise UsageError(f"--lr-scale must be a positive number, got {self.lr_scale}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise UsageError(f"--max-minutes must be positive, got {self.max_minutes}")
        if self.vocab_size < 8:
            raise UsageError(f"--vocab-size must be at least 8, got {self.vocab_size}")
        if self.zero not in (0, 1) or isinstance(self.zero, bool):
            raise UsageError(f"--zero must be 0 (off) or 1 (shard Adam's moments over the ranks), got {self.zero!r}")
        if self.precision not in PRECISIONS:
            raise UsageError(f"--precision must be one of {PRECISIONS}, got {self.precision!r}")
        if not (isinstance(self.alpha, (int, float)) and 0 <= self.alpha <= MAX_ALPHA):
            raise UsageError(f"--alpha must be a finite number >= 0 and at most {MAX_ALPHA:g} (the paper: 0.6), "
                             f"got {self.alpha}")
        if self.average < 0 or self.bleu_sentences < 0:
            raise UsageError(f"--average and --bleu-sentences must be >= 0, got {self.average} and "
                             f"{self.bleu_sentences}")
        return self

    def _validate_marian(self):
        """A run fine-tuned from a Marian folder: its kept config.json describes a model minitf computes, whose
        shape is the run's (a hand-edited config.json that disagrees is refused, naming the field)."""
        where = "config.json's \"marian\""
        if not (isinstance(self.marian, dict) and isinstance(self.marian.get("config"), dict)
                and isinstance(self.marian.get("generation"), (dict, type(None)))):
            raise UsageError(f"{where} must be {{\"config\": the folder's config.json, \"generation\": its "
                             "generation_config.json or null}; start a new run")
        try:
            args = transformer_config(self.marian["config"], where)
            positions = max_positions(self.marian["config"], where)
        except ValueError as error:
            raise UsageError(str(error)) from None
        shape = {name: args[name] for name in ("d_model", "num_heads", "num_encoder_layers", "num_decoder_layers",
                                               "d_ff", "activation", "layer_norm_eps", "pre_norm")}
        shape["vocab_size"] = args["src_vocab_size"]
        wrong = [f"{name} {getattr(self, name)!r} (the folder's: {value!r})" for name, value in shape.items()
                 if getattr(self, name) != value]
        if wrong:
            raise UsageError(f"the run's {', '.join(wrong)} differ from the Marian folder's config it was started "
                             f"from ({where}); restore config.json or start a new run")
        if self.max_len + 1 > positions:  # a sentence and its eos (or the start token) at most
            raise UsageError(f"--max-len {self.max_len} is longer than the model's {positions} positions less one "
                             f"(max_position_embeddings of --init-from {self.init_from}); use --max-len "
                             f"{positions - 1} or less")

    def model_config(self, vocab_size):
        """This run's TransformerConfig: one shared vocabulary, tied embeddings (paper 3.4), the tokenizer's pad id.
        A run fine-tuned from a Marian folder: the folder's model (its config.json, :func:`minitf.marian.
        transformer_config`: Marian's options, its vocabulary and ids) with the run's dropout."""
        if self.marian is not None:
            args = transformer_config(self.marian["config"])
            if vocab_size > args["src_vocab_size"]:
                raise ValueError(f"the tokenizer has {vocab_size} ids, the Marian model {args['src_vocab_size']}")
            return TransformerConfig(**dict(args, dropout=self.dropout))
        return TransformerConfig(src_vocab_size=vocab_size, tgt_vocab_size=vocab_size,
                                 **{k: getattr(self, k) for k in MODEL_FIELDS},
                                 share_embeddings=True, pad_id=PAD_ID)

    def model_fields(self, with_dropout=False):
        fields = MODEL_FIELDS + (GPT_FIELDS if self.model == "gpt" else ()) + (
            ("marian",) if self.marian is not None else ())  # a checkpoint of the same Marian model only
        return {k: getattr(self, k) for k in fields if with_dropout or k != "dropout"}

    def to_dict(self):
        return dict(dataclasses.asdict(self), schema_version=SCHEMA_VERSION)

    @classmethod
    def from_dict(cls, values, where="config.json"):
        """Read back what :meth:`to_dict` wrote; UsageError for anything else."""
        if not isinstance(values, dict):
            raise UsageError(f"{where} holds {type(values).__name__}, expected a JSON object written by train.py")
        values = with_added_fields(values)
        version = values.get("schema_version")
        if version != SCHEMA_VERSION:
            raise UsageError(f"{where} has schema version {version!r}, this minitf reads version {SCHEMA_VERSION} "
                             "(the run was written by another minitf version); start a new run")
        if "zero" in values and values["zero"] is None:  # written by a --resume without --zero (fixed since)
            values = dict(values, zero=0)
            _note_once(f"note: {where} has \"zero\": null (left by an earlier --resume); read as --zero 0")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names - {"schema_version"})
        missing = sorted(names - set(values))
        if unknown or missing:
            raise UsageError(f"{where} does not match this minitf's run config (unknown {unknown}, missing "
                             f"{missing}); start a new run")
        try:
            return cls(**{k: v for k, v in values.items() if k in names}).validate()
        except (TypeError, ValueError) as error:
            raise UsageError(f"{where}: {error}") from None

    def write(self, run_dir):
        write_json_atomic(pathlib.Path(run_dir) / "config.json", self.to_dict())

    @classmethod
    def read(cls, run_dir):
        """config.json of a run folder, with a one-line UsageError for anything that is not one."""
        run_dir = pathlib.Path(run_dir)
        if not run_dir.exists():
            raise UsageError(f"--resume {run_dir}: no such folder; pass the --out folder of an earlier train.py run")
        if not run_dir.is_dir():
            raise UsageError(f"--resume {run_dir} is a file; pass the --out folder of an earlier train.py run")
        if not (run_dir / "config.json").is_file():
            if (run_dir / "tokenizer.model").is_file():
                raise UsageError(f"--resume {run_dir}: the run was stopped before it wrote config.json, so there "
                                 "is nothing to resume; start it again with the original command (same --out)")
            raise UsageError(f"--resume {run_dir}: no config.json there, so it is not a run folder; "
                             "pass the --out folder of an earlier train.py run")
        try:
            values = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise UsageError(f"--resume {run_dir}: config.json is not valid JSON ({error}); restore it from a "
                             "checkpoint's meta.json (its \"config\") or start a new run") from None
        return cls.from_dict(values, where=f"--resume {run_dir}: config.json")
