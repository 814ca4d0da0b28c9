"""What a model package tells the ``train.py`` command (:mod:`minitf.train`), which knows no model: a
:class:`Task` (fairseq's tasks). The command parses, checks, launches the ranks, keeps the run folder, its lock
and the resume bookkeeping; a model's task says which options it adds, how a new run's tokenizer and data are
made (its own files, its default corpus, a prepared corpus, a pretrained folder given by ``--init-from``), how a
resumed run reopens them, which trainer runs it (whose ``finish`` says what the end of a run prints) and the line
that opens a run. Translation's is :class:`minitf.nmt.task.TranslationTask`, the language model's
:class:`minitf.lm.task.LanguageModelTask`.

Also here: what both tasks use while they make a new run (the rank-0 log, the run folder made under its lock,
a BPE tokenizer trained into it, a run on a prepared folder, Ctrl-C before training)."""
import contextlib
import dataclasses
import pathlib
import signal
import sys
import time

from minitf import kinds
from minitf.training import files
from minitf.training.config import RunConfig
from minitf.training.distributed import get_world
from minitf.training.errors import DataError, Interrupted, UsageError, pause_for_tests
from minitf.training.files import check_output_folder, file_sha256
from minitf.training.tokenizer import train_tokenizer


@dataclasses.dataclass
class RunData:
    """A run's tokenizer and corpus; ``prepared``: the prepared folder they were mapped from (None: read as text)."""
    tokenizer: object
    corpus: object
    prepared: pathlib.Path | None = None


class Task:
    """One model of ``train.py --model NAME``. The class attributes describe it to the command; the methods are
    called in this order for a new run: :meth:`add_arguments` (every task's, into one parser; the flags of
    the other tasks are refused), :meth:`pretrained_fields` (with ``--init-from``), :meth:`check_config`,
    :meth:`default_run_dir`, :meth:`check_command` (before ``mpiexec`` starts the ranks) or :meth:`new_run` (in
    every rank), then :meth:`make_trainer` and :meth:`describe`. A resumed run calls :meth:`reopen` instead.

    ``--init-from``'s weights are read once per process, in :meth:`pretrained_fields` (:meth:`read_once`): a
    damaged file (truncated, a NaN) is refused there, before ``mpiexec`` starts the ranks and before any run
    folder is made, and the same arrays go to the trainer (:meth:`make_trainer`). Under ``mpiexec`` the
    launcher's check and each rank read the file once each: a rank needs the weights in its own memory, and
    reading them is cheaper than sending them."""
    #: ``--model``'s value.
    name = None
    #: What it is called in a sentence ("translation"): its flags "belong to" it.
    title = None
    #: What a run of it trains, for the command's description (``Train <this>``).
    description = ""
    #: ``--model``'s help for this choice.
    summary = ""
    #: ``--preset``'s help for this model's presets.
    presets_help = ""
    #: The :class:`minitf.training.trainer.Trainer` subclass that runs it (its ``finish`` ends the run).
    trainer = None
    #: What ``--init-from FOLDER`` starts this model from ("GPT"), or None: this model has no pretrained start.
    pretrained = None
    #: ``--init-from``'s help for this model (a task with ``pretrained``).
    init_from_help = ""

    def add_arguments(self, parser):
        """Add this model's data options to ``parser`` (every task's are in the one parser: --help shows them all;
        a flag two tasks add is one flag of both; another ``--model`` refuses them, ``--resume`` too). Its
        run-config options are declared in its kind's run config (``Kind.run_config``), not here."""

    def foreign_flags_error(self, flags, owner):
        """The one line refusing ``flags`` of the task ``owner`` for a run of this model."""
        return f"{', '.join(flags)} belong to {owner.title or '--model ' + owner.name}"

    def default_run_dir(self, preset):
        """The run folder without ``--out``."""
        return pathlib.Path("runs") / f"{self.name}-{preset}"

    def pretrained_fields(self, args):
        """The RunConfig fields ``--init-from FOLDER`` fixes (the model's shape, its tokenizer), read from the
        folder, whose weights are read and checked here too (:meth:`read_once`); a one-line UsageError for a
        folder that cannot be read or a flag that contradicts it, a DataError for damaged weights."""
        raise UsageError(f"--init-from is not supported by --model {self.name}")

    def read_once(self, path, read):
        """``read()`` (the weights of the file ``path``, checked), once per process while the file is unchanged:
        the command's checks and the run in the same process share one read. :meth:`take_pretrained` hands the
        result to the run (and forgets it)."""
        path = pathlib.Path(path)
        stat = path.stat()
        key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
        kept = getattr(self, "_kept", None)
        if kept is None or kept[0] != key:
            self._kept = kept = (key, read())
        return kept[1]

    def take_pretrained(self):
        """The weights :meth:`read_once` kept (None if none), forgotten here: the trainer holds them now."""
        kept, self._kept = getattr(self, "_kept", None), None
        return kept[1] if kept is not None else None

    def make_trainer(self, config, run_dir, data, log, progress=True):
        """The run's :attr:`trainer` on ``data`` (:class:`RunData`); a new fine-tuning run's starts from the
        weights :meth:`pretrained_fields` read (``pretrained=``: {minitf name: host array}); without them (a
        resumed run) the trainer reads them itself where it has no checkpoint yet."""
        pretrained = self.take_pretrained()
        extra = {"pretrained": pretrained} if pretrained is not None else {}
        return self.trainer(config, run_dir, data.tokenizer, data.corpus, log, progress=progress, **extra)

    def check_config(self, args, config):
        """A new run's config made from the preset and the flags: refuse or adjust what does not fit the data."""

    def uses_prepared(self, args):
        """Whether the run trains on a prepared corpus (memory-mapped ids)."""
        return args.corpus_dir is not None

    def check_command(self, args, config):
        """What every rank would refuse of the data flags, checked once before ``mpiexec`` starts them."""
        if self.uses_prepared(args) and config.bpe_dropout > 0:
            raise UsageError("--bpe-dropout needs the text of every epoch; a prepared corpus holds token ids only")

    def new_run(self, args, given, config, run_dir, world):
        """A new run's :class:`RunData`, made on every rank: rank 0 fetches or prepares the data once, makes the
        run folder (:func:`new_run_folder`) and writes its tokenizer and config.json; ``given``: the dests of the
        options written on the command line."""
        raise NotImplementedError

    def reopen(self, config, run_dir):
        """A resumed run's :class:`RunData` from its folder and the data its config names."""
        raise NotImplementedError

    def describe(self, trainer, data, run_dir):
        """The line that opens a new run: the model, its size, the data, the run folder."""
        raise NotImplementedError


def default(name, kind=None):
    """'default: X' for a flag's help, from the run config and the presets of ``kind`` (a :class:`Kind`; None: the
    default kind's): the one place that holds the defaults."""
    kind = kind or kinds.get(kinds.names()[0])
    field = kind.run_config.__dataclass_fields__[name].default
    presets = kind.presets
    value = presets[RunConfig.preset].get(name, field) if RunConfig.preset in presets else field  # the default preset's
    other = [f"{v.get(name, field)} with --preset {p}" for p, v in presets.items() if v.get(name, field) != value]
    return f"default: {value}" + (f"; {', '.join(other)}" if other else "")


def log(message):
    """A line on stderr, from rank 0 only (under ``mpiexec`` only rank 0 reports)."""
    if get_world().is_root:
        print(message, file=sys.stderr, flush=True)


def refuse_with_init_from(args, names):
    """Refuse the flags of ``names`` given with ``--init-from`` (its folder fixes them)."""
    contradicting = [f"--{name.replace('_', '-')}" for name in names if getattr(args, name)]
    if contradicting:
        raise UsageError(f"{', '.join(contradicting)} cannot go with --init-from: the model's shape and tokenizer "
                         f"are those of {args.init_from}; leave them out")


@contextlib.contextmanager
def before_training(run_dir):
    """Ctrl-C or SIGTERM while a new run reads, fetches, prepares or tokenizes its data: one line saying
    what is kept and what the next command does (a download or a preparation says it itself)."""
    try:
        yield
    except KeyboardInterrupt as stop:
        if isinstance(stop, Interrupted):
            raise
        kept = (f"the run has no checkpoint yet: continue with python train.py --resume {run_dir}"
                if (pathlib.Path(run_dir) / "config.json").is_file() else
                "stopped before training: nothing to keep, the same command starts again")
        raise Interrupted(getattr(stop, "signum", signal.SIGINT), kept) from None


@contextlib.contextmanager
def new_run_folder(run_dir):
    """Rank 0's start of a new run folder: made, and locked before anything is written (one process per run
    folder), then checked again under the lock (another run may have started meanwhile). A DataError inside
    (e.g. a --vocab-size too large for the text) leaves no half-made run behind: the folder is released, its
    tokenizer removed and the folder too if this call made it."""
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    files.lock_run_folder(run_dir)
    check_output_folder(run_dir)
    try:
        yield
    except DataError:
        if created:  # a tokenizer of a refused run is no use to anyone
            (run_dir / "tokenizer.model").unlink(missing_ok=True)
        files.release(run_dir)
        if created and not any(run_dir.iterdir()):
            run_dir.rmdir()
        raise


def prepare_tokenizer(run_dir, train_texts, vocab_size, log):
    """Train a new run's tokenizer, also over a tokenizer.model left by a run killed before it wrote
    config.json (it may come from other flags); a resumed run reads its own instead."""
    path = pathlib.Path(run_dir) / "tokenizer.model"
    start = time.perf_counter()
    pause_for_tests("tokenize")
    tokenizer = train_tokenizer(train_texts, path, vocab_size)
    log(f"trained a joint BPE vocabulary of {tokenizer.vocab_size} on {len(train_texts)} sentences "
        f"in {time.perf_counter() - start:.1f} s")
    return tokenizer


def start_prepared_run(config, run_dir, tokenizer, folder, world, **data):
    """A new run on the prepared ``folder`` (either model): its config names the folder and its manifest's
    sha256; rank 0 makes the run folder under its lock and writes the tokenizer and config.json."""
    folder = pathlib.Path(folder)
    config.data = {"prepared": str(folder.resolve()), **data}
    config.data_sha256 = {"manifest": file_sha256(folder / "manifest.json")}
    if world.is_root:
        with new_run_folder(run_dir):
            files.write_atomic(run_dir / "tokenizer.model", tokenizer.model_bytes())
            config.write(run_dir)
    world.barrier()
