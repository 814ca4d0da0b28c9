"""One typed run config (:class:`RunConfig`): a kind's preset, the flag overrides and their validation,
written to and read from a run folder's config.json. ``train.py``, ``--resume``, the trainer and the loader
all read it. It knows no model: each field is either shared by every kind (the seed, the steps, the batches,
the schedule, the precision, the model's common sizes) or one kind's own (``Kind.config_fields``, found through
:mod:`minitf.kinds`); config.json records the shared fields and those of the run's kind, no other kind's, and the
kind checks its own (``Kind.validate``) and builds the model from them (``Kind.build_model``)."""
import dataclasses
import json
import math
import pathlib
import sys

from minitf import kinds
from minitf.optim import OPTIMIZERS
from minitf.training.errors import UsageError
from minitf.training.files import write_json_atomic

#: Bumped whenever a field changes meaning; config.json records it.
#: 3: ``accumulate`` and ``zero`` (data parallelism) or ``bpe_dropout`` (two branches each wrote a version
#: 3); 4: both, and ``max_minutes`` is the wall time of the whole command (it counted training steps only).
#: 6: ``model`` (transformer or gpt), ``block_size`` and ``tokenizer`` (the language model's).
#: 7: ``init_from``, ``n_positions``, ``activation``, ``layer_norm_eps`` (a GPT fine-tuned from a pretrained one).
#: 8: ``marian`` (a translation model fine-tuned from a Hugging Face Marian folder; ``init_from`` then names it).
#: 9: config.json holds the shared fields and its kind's own only (8 held every kind's; read as 9 by dropping
#: the other kinds' fields, which that run did not compute), and ``optimizer`` (minitf.optim.OPTIMIZERS),
#: ``num_kv_heads`` and ``rope_theta`` (the Llama family's).
#: 10: ``llama`` (a Llama-family model fine-tuned from a Hugging Face folder: its model's config; ``init_from``
#: names the folder).
SCHEMA_VERSION = 10
#: Fields added since an older schema, with the values that keep the old meaning (a file's own values win).
_ADDED_SINCE_9 = {"llama": None}
_ADDED_SINCE_8 = {"optimizer": "adam", "num_kv_heads": None, "rope_theta": 10000.0, **_ADDED_SINCE_9}
_ADDED_SINCE_7 = {"marian": None, **_ADDED_SINCE_8}
_ADDED_SINCE_6 = {"init_from": None, "n_positions": None, "activation": "gelu_tanh", "layer_norm_eps": 1e-5,
                  **_ADDED_SINCE_7}
_ADDED_SINCE_5 = {"model": "transformer", "block_size": 128, "tokenizer": "bpe", **_ADDED_SINCE_6}
_ADDED_SINCE_4 = {"lexicon": 0.0, **_ADDED_SINCE_5}
_ADDED_SINCE_2 = {"accumulate": 1, "zero": 0, "bpe_dropout": 0.0, **_ADDED_SINCE_4}
ADDED_FIELDS = {2: _ADDED_SINCE_2, 3: _ADDED_SINCE_2, 4: _ADDED_SINCE_4, 5: _ADDED_SINCE_5, 6: _ADDED_SINCE_6,
                7: _ADDED_SINCE_7, 8: _ADDED_SINCE_8, 9: _ADDED_SINCE_9}

TOKENIZERS = ("bpe", "char")  # --tokenizer's choices; "pretrained" is the tokenizer of --init-from's folder
PRECISIONS = ("fp32", "tf32", "fp16")
#: The fields that shape every kind's model (a checkpoint fits a run only if these and the kind's own
#: ``Kind.model_fields`` agree, dropout aside).
MODEL_FIELDS = ("d_model", "num_heads", "num_encoder_layers", "num_decoder_layers", "d_ff", "dropout", "pre_norm")
#: What ``--resume`` may change: the run's length and a few recipe knobs.
RESUME_CHANGEABLE = ("max_steps", "epochs", "max_minutes", "max_tokens", "lr_scale", "clip_norm", "accumulate")
#: How often to evaluate and save, and what to report: a resumed run keeps them unless given again.
RUN_OPTIONS = ("eval_every", "save_every", "keep", "average")  # and a kind's own (Task.resume_changeable)
#: Flags that only steer this invocation (never refused with --resume).
INVOCATION_OPTIONS = ("skip_nonfinite", "zero")  # --zero 1 only shards Adam's state: same trajectory


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


def _kind(name):
    """The kind of ``--model name``; a one-line UsageError naming the kinds for any other."""
    try:
        return kinds.get(name)
    except ValueError:
        raise UsageError(f"--model must be one of {kinds.names()}, got {name!r}") from None


def _all_fields():
    return [f.name for f in dataclasses.fields(RunConfig)]


def recorded_fields(model):
    """The RunConfig fields a run of the kind ``model`` records in config.json: those no kind owns, and its own."""
    owned = {field for kind in kinds.every() for field in kind.config_fields}
    own = set(_kind(model).config_fields)
    return [name for name in _all_fields() if name not in owned or name in own]


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
    num_kv_heads: int | None = None  # llama: key/value heads of grouped-query attention (None: num_heads)
    rope_theta: float = 10000.0      # llama: the rotary positions' base
    layer_norm_eps: float = 1e-5
    # transformer from a Marian folder: {"config": its config.json, "generation": its generation_config.json or
    # None}, kept so that the run needs the folder no more: the model is built from "config", an export writes
    # both again. Each kind records only its own of these (minitf.nmt.kind, minitf.lm.kind: ``config_fields``)
    marian: dict | None = None
    # llama from a Hugging Face Llama, Qwen2 or Mistral folder: its model's config (minitf.llama.config.LlamaConfig's
    # fields), kept so that the run needs the folder no more: the model is built from it, an export writes it again
    llama: dict | None = None
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
    optimizer: str = "adam"  # the update rule (minitf.optim.OPTIMIZERS); the paper's Adam (0.9, 0.98, 1e-9)
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
        """The preset of the run's kind (``model``), then every override that is not None, validated.
        An explicit ``max_steps`` or ``epochs`` replaces the preset's time budget."""
        model = overrides.get("model") or cls.model
        kind = _kind(model)
        if preset not in kind.presets:
            raise UsageError(f"unknown preset {preset!r}{'' if model == kinds.names()[0] else ' for --model ' + model}; "
                             f"expected one of {sorted(kind.presets)}")
        values = dict(kind.presets[preset], preset=preset)
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

        kind = _kind(self.model)
        if self.tokenizer not in TOKENIZERS + ("pretrained",):
            raise UsageError(f"--tokenizer must be one of {TOKENIZERS}, got {self.tokenizer!r}")
        if (self.tokenizer == "pretrained") != (self.init_from is not None):
            raise UsageError("the pretrained tokenizer comes with --init-from FOLDER and only with it; "
                             f"got tokenizer {self.tokenizer!r} and --init-from {self.init_from}")
        for name in ("d_model", "num_heads", "num_encoder_layers", "num_decoder_layers", "d_ff", "vocab_size", "warmup",
                     "max_tokens", "max_len", "eval_every", "save_every", "keep", "accumulate", "max_steps", "epochs"):
            value = getattr(self, name)
            if value is None and name in ("max_steps", "epochs"):  # no such limit
                continue
            if name == "num_encoder_layers" and value == 0 and self.num_decoder_layers:  # a decoder-only model
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UsageError(f"{flag(name)} must be a positive integer, got {value!r}")
        for name in ("dropout", "label_smoothing", "bpe_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UsageError(f"{flag(name)} must be in [0, 1), got {getattr(self, name)}")
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
        if self.optimizer not in OPTIMIZERS:
            raise UsageError(f"--optimizer must be one of {tuple(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.precision not in PRECISIONS:
            raise UsageError(f"--precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.average < 0:
            raise UsageError(f"--average must be >= 0, got {self.average}")
        kind.validate(self)  # the kind's own fields
        return self

    def model_fields(self, with_dropout=False):
        """The fields that shape this run's model: every kind's and its kind's own (dropout only if asked)."""
        fields = MODEL_FIELDS + ("model",) + _kind(self.model).model_fields
        return {k: getattr(self, k) for k in fields if with_dropout or k != "dropout"}

    def recorded_fields(self):
        """The fields config.json records: the shared ones and this run's kind's own."""
        return recorded_fields(self.model)

    def to_dict(self):
        values = dataclasses.asdict(self)
        return dict({k: values[k] for k in self.recorded_fields()}, schema_version=SCHEMA_VERSION)

    @classmethod
    def from_dict(cls, values, where="config.json"):
        """Read back what :meth:`to_dict` wrote; UsageError for anything else."""
        if not isinstance(values, dict):
            raise UsageError(f"{where} holds {type(values).__name__}, expected a JSON object written by train.py")
        version_read = values.get("schema_version")
        values = with_added_fields(values)
        version = values.get("schema_version")
        if version != SCHEMA_VERSION:
            raise UsageError(f"{where} has schema version {version!r}, this minitf reads version {SCHEMA_VERSION} "
                             "(the run was written by another minitf version); start a new run")
        if "zero" in values and values["zero"] is None:  # written by a --resume without --zero (fixed since)
            values = dict(values, zero=0)
            _note_once(f"note: {where} has \"zero\": null (left by an earlier --resume); read as --zero 0")
        model = values.get("model")
        if model not in kinds.names():
            raise UsageError(f"{where}: \"model\" is {model!r}; this minitf trains {', '.join(kinds.names())}; "
                             "start a new run")
        names = set(recorded_fields(model))
        if version_read < SCHEMA_VERSION:  # every kind's fields were recorded: the other kinds' are not this run's
            values = {k: v for k, v in values.items() if k in names or k not in _all_fields()}
        unknown = sorted(set(values) - names - {"schema_version"})
        missing = sorted(names - set(values))
        if unknown or missing:
            raise UsageError(f"{where} does not match this minitf's run config of a --model {model} run (unknown "
                             f"{unknown}, missing {missing}); start a new run")
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
