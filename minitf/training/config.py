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
#: Only the shared fields' changes bump it: a kind's option added later reads older files through its ``absent``.
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
#: What ``--resume`` does with an option (:func:`option`'s ``resume``): "fixed" names the run's model, recipe or
#: data and is refused; "length" (a new length replaces the old one), "recipe" (changed with a warning: the run
#: departs from an uninterrupted one) and "changes" (how the run evaluates, saves and reports) may be given again
#: and are kept in config.json; "invocation" steers this invocation only (not given: the field's default).
RESUME_RULES = ("fixed", "length", "recipe", "changes", "invocation")
_AS_DEFAULT = object()


def option(default, help="", *, flag=True, resume="fixed", model=False, type=None, choices=None, metavar=None,
           action=None, group="recipe", flag_default=None, absent=_AS_DEFAULT):
    """A run-config field declared once, with everything the rest derives from it: its ``train.py`` flag
    (``--field-name``; ``flag=False``: set by the command or a folder, never by a flag), the flag's ``help``
    (``{default}`` is replaced by the presets' values), ``type``, ``choices`` (or a function giving them when the
    parser is built: a registry that grows), ``metavar``, ``action`` and
    ``group`` in --help, its argparse value when not given (``flag_default``: None, the preset's), what ``--resume``
    does with it (:data:`RESUME_RULES`), whether it shapes the model (``model``: a checkpoint fits a run only if
    these agree, dropout aside), and the value a config.json written before the field existed means
    (``absent``: the default unless said; a kind's new option needs no schema bump)."""
    assert resume in RESUME_RULES, resume
    metadata = dict(flag=flag, help=help, resume=resume, model=model, type=type, choices=choices, metavar=metavar,
                    action=action, group=group, flag_default=flag_default,
                    absent=default if absent is _AS_DEFAULT else absent)
    if isinstance(default, dict):
        return dataclasses.field(default_factory=dict, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def options(config_class):
    """{name: dataclasses.Field} of every field of a run config class, in declaration order."""
    return {f.name: f for f in dataclasses.fields(config_class)}


def own_options(config_class):
    """The fields a kind's run config adds to the shared :class:`RunConfig` (config.json records them for that kind
    only)."""
    shared = options(RunConfig)
    return {name: f for name, f in options(config_class).items() if name not in shared}


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
    """Every field some kind's run config has."""
    return list(dict.fromkeys(name for kind in kinds.every() for name in options(kind.run_config)))


def recorded_fields(model):
    """The run-config fields a run of the kind ``model`` records in config.json: the shared ones and its own."""
    return list(options(_kind(model).run_config))


@dataclasses.dataclass
class RunConfig:
    """Everything that defines a training run, shared by every kind; a kind's run config subclasses it with its
    own fields (``Kind.run_config``: :class:`minitf.nmt.config.TranslationRunConfig`, ...). Field names are the
    flags' names (``--d-model`` is ``d_model``); each field's :func:`option` declares its flag and rules."""
    # the model (paper Table 3); which kind and preset are the command's (--model, --preset)
    preset: str = option("tiny", flag=False)
    d_model: int = option(128, model=True, group="model (override the preset)", type="positive int")
    num_heads: int = option(4, model=True, group="model (override the preset)", type="positive int")
    num_encoder_layers: int = option(2, model=True, group="model (override the preset)", type="positive int")
    num_decoder_layers: int = option(2, model=True, group="model (override the preset)", type="positive int")
    d_ff: int = option(512, model=True, group="model (override the preset)", type="positive int")
    dropout: float = option(0.1, model=True, group="model (override the preset)", type="float")
    pre_norm: bool = option(False, "pre-LN blocks instead of the paper's post-LN", model=True, action="store_true",
                            group="model (override the preset)")
    model: str = option("transformer", flag=False, model=True)  # the kind: minitf.kinds' name
    tokenizer: str = option("bpe", flag=False)  # a language model's --tokenizer; "pretrained": --init-from's folder's
    init_from: str | None = option(None, flag=False)  # fine-tuned from a Hugging Face folder: its path (--init-from)
    # the recipe
    vocab_size: int = option(4000, "joint BPE vocabulary size", type="positive int")
    warmup: int = option(800, "warmup steps of the learning-rate schedule", type="positive int")
    lr_scale: float = option(1.0, "factor on d_model^-0.5 * min(step^-0.5, step*warmup^-1.5)", resume="recipe",
                             type="positive float")
    max_tokens: int = option(1500, "padded tokens per batch and side (paper: ~25000)", resume="recipe",
                             type="positive int")
    max_len: int = option(100, "skip longer sentences (in BPE tokens; {default})", type="positive int")
    label_smoothing: float = option(0.1, "{default}", type="float")
    bpe_dropout: float = option(0.0, "BPE-dropout on the training side: probability of dropping a merge, sampled "
                                "anew each epoch from (seed, epoch) (0 = off; the preset's value)", type="float")
    clip_norm: float = option(0.0, "global gradient-norm clipping (0 = off; {default})", resume="recipe",
                              type="float")
    optimizer: str = option("adam", "the update rule ({default}: the paper's, beta1 0.9, beta2 0.98, eps 1e-9)",
                            choices=lambda: tuple(OPTIMIZERS))  # read when the parser is built
    precision: str = option("fp32", "{default}: fp32; tf32 (GPU: TF32 tensor-core matmuls via CUPY_TF32=1); fp16 "
                            "(float16 model, float32 master weights and Adam moments, dynamic loss scaling)",
                            choices=PRECISIONS, group="run")
    seed: int = option(1, "{default}", type="int", group="run")
    skip_nonfinite: bool = option(False, "skip (and count) a step whose loss is not finite instead of stopping",
                                  resume="invocation", action="store_true")
    # data parallelism: batches (of --max-tokens each, over all ranks) per update; ZeRO-1 sharded Adam
    accumulate: int = option(1, "batches of --max-tokens per update (gradient accumulation; {default})",
                             resume="changes", type="positive int", metavar="K")
    zero: int = option(0, "1: shard Adam's moments over the mpiexec ranks (ZeRO-1); same parameters as 0 "
                       "({default})", resume="invocation", type="int", choices=(0, 1))
    # how long: whichever comes first; all None means 10 epochs
    max_steps: int | None = option(None, resume="length", type="positive int", group="run")
    epochs: int | None = option(None, resume="length", type="positive int", group="run")
    max_minutes: float | None = option(14.0, "wall time of the whole command: training stops early enough for "
                                       "validation, checkpoints and the end-of-run evaluation to end within it",
                                       resume="length", type="positive float", group="run")
    # evaluation, checkpoints, reporting
    eval_every: int = option(1000, "steps between validations ({default})", resume="changes", type="positive int",
                             group="run")
    save_every: int = option(500, "steps between checkpoints ({default})", resume="changes", type="positive int",
                             group="run")
    keep: int = option(5, "checkpoints kept ({default})", resume="changes", type="positive int", group="run")
    average: int = option(5, "average the last N checkpoints at the end (0/1 = off; {default})", resume="changes",
                          type="int", group="run")
    # the data: its paths and their sha256 when the run started (the kind's task fills them)
    data: dict = option({}, flag=False)
    data_sha256: dict = option({}, flag=False)

    @classmethod
    def from_preset(cls, preset, **overrides):
        """The preset of the run's kind (``model``), then every override that is not None, validated.
        An explicit ``max_steps`` or ``epochs`` replaces the preset's time budget."""
        model = overrides.get("model") or "transformer"
        kind = _kind(model)
        cls = kind.run_config
        if preset not in kind.presets:
            raise UsageError(f"unknown preset {preset!r}{'' if model == kinds.names()[0] else ' for --model ' + model}; "
                             f"expected one of {sorted(kind.presets)}")
        values = dict(kind.presets[preset], preset=preset, model=model)
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
        if (self.tokenizer == "pretrained") != (self.init_from is not None):
            raise UsageError("the pretrained tokenizer comes with --init-from FOLDER and only with it; "
                             f"got tokenizer {self.tokenizer!r} and --init-from {self.init_from}")
        for name in ("d_model", "num_heads", "d_ff", "vocab_size", "warmup", "max_tokens", "max_len", "eval_every",
                     "save_every", "keep", "accumulate", "max_steps", "epochs"):
            value = getattr(self, name)
            if value is None and name in ("max_steps", "epochs"):  # no such limit
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UsageError(f"{flag(name)} must be a positive integer, got {value!r}")
        for name in ("num_encoder_layers", "num_decoder_layers"):  # how many of each: the kind's check
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UsageError(f"{flag(name)} must be a whole number, got {value!r}")
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
        """The fields that shape this run's model (declared ``model=True``; dropout only if asked)."""
        return {name: getattr(self, name) for name, f in options(type(self)).items()
                if f.metadata["model"] and (with_dropout or name != "dropout")}

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
        config_class = _kind(model).run_config
        names = set(recorded_fields(model))
        if version_read < SCHEMA_VERSION:  # every kind's fields were recorded: the other kinds' are not this run's
            values = {k: v for k, v in values.items() if k in names or k not in _all_fields()}
        own = own_options(config_class)  # a kind's option added since the run started: the value that keeps its meaning
        values = {**{k: f.metadata["absent"] for k, f in own.items() if k not in values}, **values}
        unknown = sorted(set(values) - names - {"schema_version"})
        missing = sorted(names - set(values))
        if unknown or missing:
            raise UsageError(f"{where} does not match this minitf's run config of a --model {model} run (unknown "
                             f"{unknown}, missing {missing}); start a new run")
        try:
            return config_class(**{k: v for k, v in values.items() if k in names}).validate()
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
