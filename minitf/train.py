"""The ``train.py`` command: a new run, or ``--resume`` of an earlier one, of the model ``--model`` names. The
command knows no model: each model package gives it a task (:class:`minitf.training.task.Task`: its options, how
a new run's data and tokenizer are made, how a resumed run's are reopened, its trainer), and the command keeps
the rest: the parser, the checks made before ``mpiexec`` starts the ranks, the launch, the run folder and its
lock, and the resume bookkeeping. A kill costs the steps since the last checkpoint (docs/reliability.md):
``--resume`` takes the newest checkpoint that passes its checks (checksums, model shape, tokenizer), moves newer
bad ones aside with a warning, and cuts metrics.jsonl back to that checkpoint's step."""
import contextlib
import io
import os
import pathlib
import re
import shutil
import sys
import time

from minitf import backend, kinds
from minitf.training import checkpoint as ckpt, files, trainer as training
from minitf.training.config import RunConfig, options
from minitf.training.distributed import get_world, launched_by_mpi
from minitf.training.download import DEFAULT_CACHE, sigterm_raises
from minitf.training.errors import (CheckpointError, Interrupted, OneLineParser, UsageError, non_negative, positive,
                                   report_errors)
from minitf.training.files import check_output_folder, check_resumable, file_sha256
from minitf.training.task import default, log

#: The models, by ``--model``: every kind's task (minitf.kinds), the first the default.
TASKS = {kind.name: kind.task() for kind in kinds.every()}
#: The command's own options, which no run config holds, and whether ``--resume`` takes them (--out only as the
#: run's folder): every other option is a run-config field (its declaration says) or a kind's data (refused).
COMMAND_OPTIONS = {"model": False, "preset": False, "num_layers": False, "init_from": False, "corpus_dir": False,
                   "prepare_again": False, "device": True, "out": True, "resume": True, "no_progress": True,
                   "cache_dir": True}
#: The argparse type of each declared ``type`` (minitf.training.config.option).
FLAG_TYPES = {"positive int": positive(int), "positive float": positive(float), "int": int, "float": float,
              "non-negative": non_negative, "str": str}


def declared_flags(kind=None):
    """{dest: (flag, argparse keywords, group)} of the run-config fields of ``kind`` (None: the shared ones) that
    have a flag."""
    flags = {}
    for name, field in options(RunConfig if kind is None else kind.run_config).items():
        m = field.metadata
        if not m["flag"]:
            continue
        keywords = dict(default=m["flag_default"])
        if m["action"]:
            keywords["action"] = m["action"]
        else:
            choices = m["choices"]() if callable(m["choices"]) else m["choices"]
            keywords.update({k: v for k, v in (("type", FLAG_TYPES.get(m["type"])), ("choices", choices),
                                               ("metavar", m["metavar"])) if v is not None})
        if m["help"]:
            keywords["help"] = m["help"].replace("{default}", default(name, kind)) if "{default}" in m["help"] else m["help"]
        flags[name] = ("--" + name.replace("_", "-"), keywords, m["group"])
    return flags


class _Flags:
    """The one parser as each kind adds its flags to it: a flag two kinds declare (the language models' --block-size,
    --train-text) is added once and belongs to both; :attr:`owners` maps each dest to the kinds it belongs to."""

    def __init__(self, parser):
        self.parser, self.groups, self.owners, self.kind = parser, {}, {}, None

    def group(self, title):
        if title not in self.groups:
            self.groups[title] = _Group(self, self.parser.add_argument_group(title))
        return self.groups[title]

    add_argument_group = group  # a task's add_arguments(parser) sees this object as the parser

    def add(self, target, flag, **keywords):
        dest = keywords.get("dest") or flag.lstrip("-").replace("-", "_")
        if dest not in self.owners:
            target.add_argument(flag, **keywords)
        self.owners.setdefault(dest, set()).add(self.kind)


class _Group:
    def __init__(self, flags, group):
        self.flags, self.group = flags, group

    def add_argument(self, flag, **keywords):
        self.flags.add(self.group, flag, **keywords)


def _parser_and_owners():
    default_model, *others = TASKS.values()
    p = OneLineParser(prog="train.py", description=f"Train {default_model.description}" + "".join(
        f", or with --model {task.name} {task.description}" for task in others) + ".")
    p.add_argument("--model", choices=tuple(TASKS), default=default_model.name,
                   help="; ".join(f"{task.name}: {task.summary}" for task in TASKS.values()))
    p.add_argument("--preset", choices=sorted({p for kind in kinds.every() for p in kind.presets}), default="tiny",
                   help="model size and recipe: " + "; ".join(task.presets_help for task in TASKS.values()))
    flags = _Flags(p)
    flags.kind = "*"  # every kind's: the shared run config
    shared = declared_flags()
    for dest, (flag, keywords, group) in shared.items():
        flags.add(flags.group(group).group, flag, **keywords)
        if dest == "num_heads":
            flags.group(group).group.add_argument("--num-layers", type=positive(int), help="encoder and decoder layers")
    for kind in kinds.every():  # each kind's own fields, then its task's data flags
        flags.kind = kind.name
        for dest, (flag, keywords, group) in declared_flags(kind).items():
            if dest not in shared:
                flags.add(flags.group(group).group, flag, **keywords)
        TASKS[kind.name].add_arguments(flags)
    g = p.add_argument_group("run")
    g.add_argument("--device", choices=["cpu", "gpu"], default=None, help="default: MINITF_DEVICE, else cpu")
    g.add_argument("--out", type=pathlib.Path, help="run folder (default runs/<preset>)")
    g.add_argument("--resume", type=pathlib.Path, metavar="RUN_DIR", help="continue the run in RUN_DIR exactly")
    g.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    g = p.add_argument_group("a pretrained start, a prepared corpus, the cache (either model)")
    g.add_argument("--init-from", type=pathlib.Path, metavar="FOLDER",
                   help="; ".join(f"--model {task.name}: {task.init_from_help}" for task in TASKS.values()
                                  if task.pretrained))
    g.add_argument("--corpus-dir", type=pathlib.Path, metavar="DIR",
                   help="a prepared corpus (memory-mapped token arrays): train from DIR; with --train-src etc., "
                   "prepare those files into DIR first (once; a changed source is refused)")
    g.add_argument("--prepare-again", action="store_true",
                   help="prepare the corpus of --corpus-dir (with its --train-src etc.) or of --corpus wmt14-en-de "
                   "again: replaces one made from other files or settings, or damaged (a whole one is reused)")
    g.add_argument("--cache-dir", type=pathlib.Path, default=DEFAULT_CACHE)
    return p, flags.owners


def build_parser():
    return _parser_and_owners()[0]


def flag_owners():
    """{dest: the names of the kinds whose flag it is ("*": every kind's)} of every run-config and data flag."""
    return _parser_and_owners()[1]


def given_options(argv):
    """The dests of the options written on the command line (abbreviations and ``--flag=value``
    included), told apart from defaults by parsing twice."""
    parser = build_parser()
    unset = object()
    parser.set_defaults(**{name: unset for name in vars(parser.parse_args(argv))})
    return {name for name, value in vars(parser.parse_args(argv)).items() if value is not unset}


def check_model_flags(args, given):
    """One line for a flag of another kind than --model's (--train-src with --model gpt, ...); a flag two kinds
    share (the language models' --train-text) belongs to both."""
    task = TASKS[args.model]
    owners = flag_owners()
    foreign = {}
    for dest in sorted(given, key=lambda d: list(owners).index(d) if d in owners else -1):
        kinds_of = owners.get(dest, {"*"})
        if "*" not in kinds_of and args.model not in kinds_of:
            foreign.setdefault(min(kinds_of, key=list(TASKS).index), []).append("--" + dest.replace("_", "-"))
    for owner, flags in foreign.items():
        raise UsageError(task.foreign_flags_error(flags, TASKS[owner]))


def config_from_args(args):
    """The run config of a new run: the preset, overridden by the flags given (and by --init-from's folder)."""
    task = TASKS[args.model]
    layers = dict(num_encoder_layers=args.num_encoder_layers or args.num_layers,
                  num_decoder_layers=args.num_decoder_layers or args.num_layers)
    values = {name: getattr(args, name) for name in declared_flags(kinds.get(args.model))} | layers
    values["model"] = args.model
    if args.init_from is not None:
        if task.pretrained is None:
            starts = [each for each in TASKS.values() if each.pretrained]
            raise UsageError("--init-from FOLDER fine-tunes " + " or ".join(f"a pretrained {each.pretrained}"
                                                                            for each in starts)
                             + ": add " + " or ".join(f"--model {each.name}" for each in starts))
        values.update(task.pretrained_fields(args))
    config = RunConfig.from_preset(args.preset, **values)
    task.check_config(args, config)
    return config


def setup_device(precision, device):
    """Select ``device`` (None: MINITF_DEVICE, checked here). TF32 is CuPy's CUPY_TF32, read when CuPy
    first picks a float32 matmul mode: so it is set before ``backend.set_device``."""
    if device is None:
        backend.check_environment()  # a bad MINITF_DEVICE: one line, not a traceback at import
        device = backend.get_device()
    if precision == "tf32":
        if device != "gpu":
            raise UsageError("--precision tf32 needs --device gpu (TF32 is a tensor-core mode of NVIDIA GPUs)")
        os.environ["CUPY_TF32"] = "1"
    backend.set_device(device)


def run(argv=None):
    args = build_parser().parse_args(argv)
    if args.resume is not None:
        return resume_run(args, given_options(argv))
    task = TASKS[args.model]
    given = given_options(argv)
    check_model_flags(args, given)
    config = config_from_args(args)
    run_dir = args.out or task.default_run_dir(args.preset)
    world = get_world()
    check_output_folder(run_dir)
    setup_device(config.precision, args.device)
    data = task.new_run(args, given, config, run_dir, world)
    trainer = task.make_trainer(config, run_dir, data, log, progress=not args.no_progress)
    log(task.describe(trainer, data, run_dir))
    return trainer.train_and_finish()


def resume_rules(model=None):
    """{dest: its resume rule} of the run-config flags of the kind ``model`` (None: before the run's config.json is
    read, any kind's: the most lenient rule of each)."""
    config_classes = [kinds.get(model).run_config] if model else [kind.run_config for kind in kinds.every()]
    rules = {}
    for config_class in config_classes:
        for name, field in options(config_class).items():
            if field.metadata["flag"] and rules.get(name, "fixed") == "fixed":
                rules[name] = field.metadata["resume"]
    return rules


def check_resume_flags(args, given, model=None):
    """Refuse the flags that belong to the run being resumed, or (``model``: the run's kind, once its config.json is
    read) to another kind's runs: every flag but the command's own and those whose declaration lets --resume
    change them."""
    rules = resume_rules(model)
    allowed = [name for name, rule in rules.items() if rule != "fixed"]
    fixed = [k for k in sorted(given) if rules.get(k, "fixed") == "fixed" and not COMMAND_OPTIONS.get(k)]
    if args.out is not None and pathlib.Path(args.out).resolve() != pathlib.Path(args.resume).resolve():
        fixed.append("out")
    if fixed:
        flags = ", ".join("--" + k.replace("_", "-") for k in fixed)
        raise UsageError(f"--resume continues a run with its own settings, so {flags} cannot be given; allowed with "
                         "--resume: " + ", ".join("--" + k.replace("_", "-") for k in allowed if rules[k] != "invocation")
                         + ", --device, " + ", ".join("--" + k.replace("_", "-") for k in allowed
                                                      if rules[k] == "invocation") + ", --no-progress")


def resume_run(args, given):
    run_dir = args.resume
    check_resume_flags(args, given)
    config = RunConfig.read(run_dir)  # reads only: the run's kind decides which of its flags --resume takes
    check_resume_flags(args, given, config.model)
    world = get_world()
    if world.is_root:  # before anything is written; refused while another process trains here
        files.lock_run_folder(run_dir)
    check_resumable(run_dir)
    rules = resume_rules(config.model)
    changed = {k: getattr(args, k) for k, rule in rules.items()
               if rule not in ("fixed", "invocation") and k in given and getattr(args, k) != getattr(config, k)}
    lengths = [k for k, rule in rules.items() if rule == "length"]
    if changed.keys() & set(lengths):  # a new length replaces the old one
        changed.update({key: getattr(args, key) for key in lengths})
    for name, value in changed.items():
        setattr(config, name, value)
    config.validate()
    for name in (k for k, rule in rules.items() if rule == "invocation"):  # this invocation only: not given means
        value = getattr(args, name)                                         # the field's default
        setattr(config, name, options(type(config))[name].default if value is None else value)
    setup_device(config.precision, args.device)
    for key, digest in config.data_sha256.items():
        data_file = config.data.get(key) if key != "manifest" else pathlib.Path(config.data["prepared"]) / "manifest.json"
        if data_file and pathlib.Path(data_file).is_file() and file_sha256(data_file) != digest:
            log(f"warning: {data_file} changed since the run started: the resumed run will not repeat an "
                "uninterrupted one (restore the original file for an exact resume)")
    task = TASKS[config.model]
    data = task.reopen(config, run_dir)
    trainer = task.make_trainer(config, run_dir, data, log, progress=not args.no_progress)
    if not world.is_root:
        world.barrier()  # rank 0 recovers and checks the checkpoints (moving bad ones aside) first
    for stale in ckpt.recover_checkpoints(run_dir):
        log(f"removed {stale.name}, left by an interrupted checkpoint write")
    state, path, errors = ckpt.latest_valid_checkpoint(run_dir, expect=trainer.expected_arrays)
    if state is None and errors:
        raise CheckpointError(f"--resume {run_dir}: none of its {len(errors)} checkpoints is usable, the newest "
                              f"because: {errors[0][1]}; restore a good checkpoint or start a new run")
    if state is not None:  # in memory only: a checkpoint that does not load changes nothing on disk
        trainer.restore(state)
        trainer.last_checkpoint = path
    if world.is_root:  # the folder is usable: from here on it changes (metrics first: if the disk refuses,
        dropped = trainer.metrics.truncate(trainer.step)  # nothing else has)
        if dropped:
            log(f"metrics.jsonl: dropped {dropped} records written after step {trainer.step} (they are redone)")
        if state is not None:  # records a full disk refused before this checkpoint was saved
            trainer.metrics.append_unwritten(state["meta"].get("unwritten_metrics"))
    if changed and world.is_root:  # written only now: a refused --resume changes nothing
        config.write(run_dir)
        recipe = sorted(k for k in changed if rules[k] == "recipe")
        if recipe:
            log("warning: changed " + ", ".join(f"--{k.replace('_', '-')} to {changed[k]}" for k in recipe)
                + ": from here on the run departs from an uninterrupted one (config.json now holds the new values)")
    for bad, error in errors:
        log(f"warning: skipping a bad checkpoint, moved aside to {ckpt.set_aside(bad).name}: {error}")
    if world.is_root:
        world.barrier()
    trainer.valid_ppl = trainer.metrics.validations()  # the run's validations so far (end-of-run candidates)
    if state is not None:
        log(f"resumed from {path} at step {trainer.step} (epoch {trainer.epoch + 1})")
    else:
        log(f"no checkpoint in {run_dir} yet: starting from step 0")
    return trainer.train_and_finish()


def check_command(args, argv):
    """What every rank would refuse at once, checked before ``mpiexec`` starts them: the run's config
    from the flags, --out (or the folder of --resume) and the data flags. Raises the rank's error."""
    if args.resume is not None:
        check_resume_flags(args, given_options(argv))
        with contextlib.redirect_stderr(io.StringIO()):  # its notes: said once, by rank 0
            config = RunConfig.read(args.resume)
        check_resume_flags(args, given_options(argv), config.model)
        check_resumable(args.resume)
        return 0
    task = TASKS[args.model]
    check_model_flags(args, given_options(argv))
    config = config_from_args(args)
    check_output_folder(args.out or task.default_run_dir(args.preset))
    task.check_command(args, config)
    return 0


def wanted_ranks():
    """``MINITF_RANKS`` (None: unset, one rank per core); anything but a positive whole number is refused."""
    wanted = os.environ.get("MINITF_RANKS")
    if wanted is None:
        return None
    if not re.fullmatch(r"\s*[0-9]+\s*", wanted) or int(wanted) < 1:
        raise UsageError(f"MINITF_RANKS must be a positive whole number of processes, got {wanted!r}; "
                         "MINITF_RANKS=1 runs one process, unset it for one rank per core")
    return int(wanted)


def every_core_command(argv, device=None):
    """(the ``mpiexec`` command running this command with one rank per core and one BLAS thread each
    (one process leaves a core idle in NumPy's elementwise work), its first line) or (None, a note or
    None): one core, a GPU (``device``, else MINITF_DEVICE), no MPI, ``MINITF_RANKS=1``.
    ``MINITF_RANKS=N`` sets the ranks; the global batch and the recipe are the same at any number of
    ranks, only the speed changes."""
    wanted = wanted_ranks()
    if wanted == 1:
        return None, None
    if (device or os.environ.get("MINITF_DEVICE", "cpu")) == "gpu":
        return None, None  # on GPUs the ranks are GPUs: mpiexec -n <GPUs> python train.py --device gpu
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ranks = wanted or cores
    if ranks < 2:
        return None, None
    import importlib.util
    beside = pathlib.Path(sys.executable).parent / "mpiexec"  # the mpich wheel's, in this environment
    mpiexec = str(beside) if beside.is_file() else shutil.which("mpiexec")
    if importlib.util.find_spec("mpi4py") is None or mpiexec is None:
        return None, (f"note: one process on {cores} cores; pip install -e '.[mpi]' runs one rank per core "
                      "(data parallel, faster on the CPU)")
    if wanted is None:
        how = "one per core"
    elif ranks <= cores:
        how = f"MINITF_RANKS={ranks}, on {cores} usable cores"
    else:
        how = (f"MINITF_RANKS={ranks}, more ranks than the {cores} usable cores: they share them and each "
               "runs slower")
    line = f"train.py: {ranks} ranks through mpiexec, {how} (MINITF_RANKS=1 runs one process)"
    # -S: a rank imports site after train.py's Ctrl-C handler (train.StartUp), not before its first line
    return [mpiexec, "-n", str(ranks), sys.executable, "-S", str(pathlib.Path(sys.argv[0]).resolve()), *argv], line


def launch(argv, started, start_up=None):
    """The command ``python train.py``, before any rank starts: the flags and the run's config are checked
    here (one line and the exit status of a rank's refusal, without starting ``mpiexec``); then this
    process runs ``mpiexec`` with one rank per core and returns its exit status, or returns None to run here.
    ``start_up``: train.py's Ctrl-C handling until then (one line, 130)."""
    args = build_parser().parse_args(argv)  # --help, an unknown or bad flag: here, as argparse reads them
    status = report_errors("train.py", lambda _: check_command(args, argv), argv, memory_hint="")
    if status:
        return status
    try:
        command, line = every_core_command(argv, args.device)
    except UsageError as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    if command is None:
        if line:
            print(line, file=sys.stderr, flush=True)
        return None
    sys.stderr.flush()
    os.write(2, (line + "\n").encode())  # one write: a Ctrl-C's line (train.StartUp) cannot land inside it
    env = dict(os.environ, MINITF_COMMAND_START=repr(started),  # the ranks count the whole command from here
               MINITF_SITE_AFTER_HANDLER="1",  # train.py imports site itself in the ranks it started with -S
               **{training.STDERR_TERMINAL_ENV: str(int(sys.stderr.isatty()))},  # a rank's stderr is mpiexec's pipe
               **{name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")})
    if start_up is not None:
        start_up.pause("launch")
    from minitf.training.distributed import run_ranks

    ranks = int(command[command.index("-n") + 1])
    return run_ranks(command, env, ranks)  # signals reach this process, passed on once the ranks hold them


def command_start(started):
    """When the command started (``time.time()``): a rank's, from the launcher (MINITF_COMMAND_START)."""
    if launched_by_mpi():
        try:
            return float(os.environ["MINITF_COMMAND_START"])
        except (KeyError, ValueError):
            pass
    return started


def after_start_up(start_up):
    """``run``, once train.py's start-up hands Ctrl-C over (``train.StartUp``): a Ctrl-C a rank held back
    while it imported or MPI started ends the run here, before anything is written, as every rank's
    :class:`Interrupted` (one line, 130)."""
    def run_after_start_up(argv):
        held = start_up.end() if start_up is not None else None
        if held is not None:
            raise Interrupted(held, start_up.kept)
        return run(argv)
    return run_after_start_up


def main(argv=None, started=None, start_up=None):
    """Entry point: bad input gives one error line and a non-zero exit. Under ``mpiexec`` every rank
    runs it (data parallelism); as the command on several CPU cores with MPI installed it checks the
    command line and restarts itself under ``mpiexec`` with one rank per core (``MINITF_RANKS=1``: one
    process). ``started``: ``time.time()`` at the command's start (train.py's first line), which the
    wall time of the whole command and --max-minutes count from. ``start_up``: train.py's handling of
    Ctrl-C before the run takes it (``train.StartUp``), ended when the run starts."""
    started = command_start(started)
    training.mark_command_start(started)
    if argv is None and pathlib.Path(sys.argv[0]).name == "train.py" and not launched_by_mpi():
        status = launch(sys.argv[1:], time.time() if started is None else started, start_up)
        if status is not None:
            return status
    backend.keep_freed_memory()  # a step's large temporaries reuse freed memory: no page faults (~20% on CPU)
    with files.released_on_exit(), sigterm_raises():  # SIGTERM before training: cleanup runs, one line, 143
        if launched_by_mpi():
            from minitf.training import distributed
            return distributed.main(after_start_up(start_up), argv, "train.py",
                                    memory_hint="use a smaller --max-tokens",
                                    interrupt_message="interrupted; nothing after the last checkpoint was saved")
        return report_errors("train.py", after_start_up(start_up), argv, memory_hint="use a smaller --max-tokens",
                             interrupt_message="interrupted; nothing after the last checkpoint was saved "
                             "(continue with --resume RUN_DIR if the run had written config.json)")
