"""Training, shared by every model: one update for any world size, the loop over the batches with
validation, checkpoints and the time budget, resume and signals. What differs between models (the model, its
batches, its loss, validation, the end of a run) is a subclass's:
:class:`minitf.nmt.translation_trainer.TranslationTrainer`, :class:`minitf.lm.trainer.LanguageModelTrainer`.

The recipe is the paper's (section 5): Adam (0.9, 0.98, 1e-9) with the warmup schedule,
label smoothing, dropout. One update (:meth:`Trainer.update`, as fairseq's ``train_step``
and llm.c's ``gpt2_update``) serves N ranks of ``mpiexec``, K accumulated batches
(``--accumulate``) and Adam's moments sharded over the ranks (``--zero 1``): it takes K
consecutive batches of the global batch list (the same on every rank: it depends only on
(seed, epoch)), each rank runs its token-balanced share of each batch, and each
micro-batch's gradient is scaled by its tokens that carry loss (translation's target tokens,
a masked language model's masked positions) / those of the whole update, so one sum over
ranks gives the gradient of the loss averaged over the update's tokens, whatever N and K.
A model's auxiliary losses (a mixture of experts' load balance) are added with their
coefficients and logged apart. Resuming is exact: dropout is re-seeded from (seed, step) before every
step, so a checkpoint needs only the parameters, Adam's moments and the position in the data.
"""
import dataclasses
import errno
import json
import math
import os
import pathlib
import reprlib
import signal
import sys
import time

from minitf import backend
from minitf.backend import host as np
from minitf.backend import xp
from minitf.optim import OPTIMIZERS, WarmupSchedule, clip_factor, mixed_precision
from minitf.training import checkpoint as ckpt
from minitf.training.config import with_added_fields
from minitf.training.distributed import get_world, rank_share, shard_range
from minitf.training.errors import CheckpointError, DataError, MetricsWriteError
from minitf.training.files import write_atomic


def step_seed(seed, step):
    """The dropout generator's seed for one step: resuming at a step redraws its masks."""
    return (int(seed) * 1_000_003 + int(step)) % (2 ** 63)


def micro_batch_seed(seed, step, rank, j, accumulate):
    """The dropout seed of micro-batch ``j`` of an update on ``rank``: rank 0's first
    micro-batch draws what one process would (``step_seed``); the others differ."""
    return (step_seed(seed, step) + 7919 * (rank * accumulate + j)) % (2 ** 63)


@dataclasses.dataclass
class UpdateResult:
    """What one update measured (host numbers: the logged scalars)."""
    loss: float            # the loss averaged over the update's tokens that carry loss (+ the auxiliary losses)
    nll_sum: float         # unsmoothed negative log-likelihood summed over them (for perplexity)
    tokens: float          # non-pad target tokens of the update, all ranks
    grad_norm: float       # global gradient norm before clipping (nan when the loss was not finite)
    nonfinite: str = None  # None, "loss", "gradients" or (fp16) "overflow": the update was skipped
    aux: dict = dataclasses.field(default_factory=dict)  # each auxiliary loss averaged as the loss is (logged
    #                        apart; ``loss`` holds them times their coefficients)


#: exp() of a per-token NLL above this overflows into meaningless numbers early in training
_MAX_LOG_PERPLEXITY = 50.0


def perplexity(nll_per_token):
    """exp(mean negative log-likelihood per token), clamped at exp(50)."""
    return math.exp(min(nll_per_token, _MAX_LOG_PERPLEXITY))


def differences(theirs, ours, name):
    """``["NAME THEIRS (run: OURS)"]`` of a field that differs; of a dict (a fine-tuned run's kept Marian config),
    one entry per differing key, named by its path ("marian.config.activation_function"): never both whole
    dicts in one line. Values longer than 60 characters are cut."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        keys = sorted(set(theirs) | set(ours), key=str)
        return [line for k in keys if theirs.get(k, _ABSENT) != ours.get(k, _ABSENT)
                for line in differences(theirs.get(k, _ABSENT), ours.get(k, _ABSENT), f"{name}.{k}")]
    if theirs == ours:
        return []
    short = lambda value: "absent" if value is _ABSENT else reprlib.repr(value)  # noqa: E731
    return [f"{name} {short(theirs)} (run: {short(ours)})"]


_ABSENT = object()


class MetricsLog:
    """metrics.jsonl: one JSON object per line, {"kind": "train" | "valid" | "test" | ..., "step": ...};
    only rank 0's is ``enabled`` (writes)."""

    def __init__(self, path, enabled=True):
        self.path, self.enabled = pathlib.Path(path), enabled
        self.unwritten = []  # records a failed write kept (saved in the next checkpoint's meta.json)

    def check_writable(self):
        """Refuse, before any step, a metrics path that is not a regular file (or absent)."""
        if self.enabled and (self.path.exists() or self.path.is_symlink()) and not self.path.is_file():
            kind = "a folder" if self.path.is_dir() else "not a regular file"
            raise DataError(f"{self.path} is {kind}; it must be the run's metrics log (a regular file): "
                            "move it away and run again")

    def write(self, **record):
        """Append one record. If the disk refuses (ENOSPC, EIO) the file is cut back (no torn line),
        the record kept in ``unwritten`` and MetricsWriteError raised."""
        if not self.enabled:
            return
        line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
        try:
            with open(self.path, "ab", buffering=0) as handle:
                size = handle.tell()
                try:
                    if handle.write(line) != len(line):
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                except OSError:
                    try:
                        handle.truncate(size)
                    except OSError:
                        pass
                    raise
        except OSError as error:
            self.unwritten.append(record)
            raise MetricsWriteError(self.path, error.strerror or str(error)) from None

    def validations(self):
        """{step: perplexity} of the periodic validations in the log (a resumed run's history)."""
        found = {}
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines() if self.path.is_file() else []:
            try:
                record = json.loads(line)
            except ValueError:  # a line torn by a kill
                continue
            if isinstance(record, dict) and record.get("kind") == "valid" and "model" not in record and \
                    isinstance(record.get("step"), int) and isinstance(record.get("ppl"), (int, float)):
                found[record["step"]] = record["ppl"]
        return found

    def append_unwritten(self, records):
        """Append the records a run could not write before its checkpoint (meta.json's ``unwritten_metrics``)."""
        for record in records if isinstance(records, list) else []:
            if isinstance(record, dict):
                self.write(**record)

    def truncate(self, step):
        """Keep, atomically, the records written when the checkpoint at ``step`` was saved (the longest
        prefix with step <= ``step`` and no end-of-run report), so that a resumed run appends exactly
        what an uninterrupted one would; return the number dropped (a torn last line counts as one)."""
        if not self.enabled or not self.path.is_file():
            return 0
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        kept = []
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:  # a line torn by a kill
                break
            if not isinstance(record, dict) or record.get("kind") == "done" or not record.get("step", 0) <= step:
                break
            kept.append(line)
        if len(kept) < len(lines) or (data and not data.endswith(b"\n")):
            try:
                write_atomic(self.path, b"".join(line + b"\n" for line in kept))
            except OSError as error:  # write_atomic left the file as it was and no temp file
                raise MetricsWriteError(self.path, error.strerror or str(error),
                                        "nothing was changed; free disk space and try again") from None
        return len(lines) - len(kept)


#: The budget's clock; a test replaces it with a fake one.
clock = time.monotonic
_command_start = None


def mark_command_start(started=None):
    """Called first thing by ``train.py``: the budget counts the whole command from here, or from
    ``started`` (``time.time()`` when the command started: before its imports, and in every rank before
    the launch of ``mpiexec``)."""
    global _command_start
    _command_start = clock() - (0.0 if started is None else min(max(time.time() - started, 0.0), 86400.0))


class WallBudget:
    """Wall seconds spent by a run and what is left of ``--max-minutes`` (None: no budget), the whole
    command from its start to its last line. Training stops early enough for the end, whose cost is
    estimated from the measured periodic validations (the end decodes the validation set per candidate
    model and the test set, which a kind may evaluate at a higher cost per sentence: translation's beam search):
    a slower machine stops sooner instead of overrunning."""
    #: Seconds added to the estimate for saving, averaging and the examples.
    MARGIN_SECONDS = 10.0
    #: Before any validation was timed: reserve this share of the budget for the end.
    UNMEASURED_SHARE = 0.08

    def __init__(self, max_minutes):
        self.limit = None if max_minutes is None else 60.0 * float(max_minutes)
        self.started = clock() if _command_start is None else _command_start
        self.before = 0.0  # wall seconds of earlier invocations of a resumed run
        self.seconds_per_sentence = None  # of a periodic validation (loss + greedy BLEU), per sentence
        self.validation_seconds = 0.0

    def elapsed(self):
        """Wall seconds of the run so far (earlier invocations included)."""
        return self.before + clock() - self.started

    def note_validation(self, seconds, sentences):
        """Record a periodic validation's duration; the end's estimate follows it."""
        self.validation_seconds = float(seconds)
        self.seconds_per_sentence = float(seconds) / max(int(sentences), 1)

    def end_reserve(self, n_valid, n_test, test_cost=1.0, candidates=2):
        """Seconds to keep for what follows training: one more periodic validation, an evaluation of the
        ``n_valid`` sentences per candidate model, the test set's ``n_test`` at ``test_cost`` times a validation
        sentence's time, a margin."""
        if self.limit is None:
            return 0.0
        if self.seconds_per_sentence is None:
            return self.UNMEASURED_SHARE * self.limit + self.MARGIN_SECONDS
        per = self.seconds_per_sentence
        test = per * n_test * test_cost
        return self.validation_seconds + candidates * per * n_valid + test + self.MARGIN_SECONDS

    def over(self, reserve):
        """True once training must stop to end the command within the budget."""
        return self.limit is not None and self.elapsed() + reserve >= self.limit

    def eta(self):
        """' ETA m:ss' to the end of the command ('' without a time budget)."""
        if self.limit is None:
            return ""
        left = max(0, int(self.limit - self.elapsed()))
        return f" ETA {left // 60}:{left % 60:02d}"


#: Set by the launcher for its ranks (a rank's stderr is mpiexec's pipe): "1" when the command's stderr is a terminal.
STDERR_TERMINAL_ENV = "MINITF_STDERR_IS_TERMINAL"
#: Seconds between two progress lines when stderr is not a terminal (``train.py > log 2>&1``).
PROGRESS_EVERY = 30.0


def stderr_is_terminal():
    """Whether the command's stderr is a terminal: the launcher's word in a rank, else this process's stderr."""
    told = os.environ.get(STDERR_TERMINAL_ENV)
    return told == "1" if told in ("0", "1") else sys.stderr.isatty()


def progress_bar(total, initial):
    """tqdm's bar on a terminal; in a log file (no terminal), :class:`ProgressLines`."""
    if stderr_is_terminal():
        from tqdm import tqdm
        return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=sys.stderr)
    return ProgressLines(total, initial, sys.stderr)


class ProgressLines:
    """The progress bar in a log file: one plain line at the first step, then one when ``every`` seconds have
    passed since the last, never a carriage return (tqdm redraws its bar once a step: 886 KB of log for the
    default 14-minute run). What the loop uses of tqdm: update, set_postfix_str (which writes a due line),
    write, close."""

    def __init__(self, total, initial, file, every=PROGRESS_EVERY):
        self.n, self.total, self.file, self.every = initial, total, file, every
        self.start, self.last = time.monotonic(), None

    def update(self, n=1):
        self.n += n

    def set_postfix_str(self, text):
        now = time.monotonic()
        if self.last is not None and now - self.last < self.every:
            return
        self.last = now
        of = f"/{self.total} ({100 * self.n / self.total:.0f}%)" if self.total else ""
        self.write(f"progress: step {self.n}{of}, {text.strip()}, {now - self.start:.0f} s")

    def write(self, message):
        print(message, file=self.file, flush=True)

    def close(self):
        pass


class EndOfRunInterrupted(BaseException):
    """Ctrl-C or SIGTERM during the end-of-run evaluation (a BaseException, so that nothing swallows it)."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def signal_name(signum):
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class Trainer:
    """A run: the model, the loss, Adam, the data and the run folder, on the ranks of
    ``world`` (one process: a world of one). The update, the loop, checkpoints, resume and signals are
    here; a model's subclass provides the few methods below that differ (its model, batches, loss,
    validation and end of run)."""

    def __init__(self, config, run_dir, tokenizer, corpus, log, progress=True, world=None, pretrained=None):
        """``pretrained``: a fine-tuning run's start ({minitf name: host array}), --init-from's weights as the
        command's checks read them (None: :meth:`read_pretrained` reads them if the run needs them)."""
        self.world = world or get_world()
        self.world.bind_device()
        self.config, self.run_dir, self.tokenizer, self.corpus, self.log = (
            config, pathlib.Path(run_dir), tokenizer, corpus, log)
        self.progress = progress and self.world.is_root  # only rank 0 reports
        backend.manual_seed(config.seed)
        # fp16: a float16 model (parameters, activations, gradients) with float32 master weights in the optimizer
        self.mixed = config.precision == "fp16"
        with backend.default_dtype("float16" if self.mixed else backend.get_default_dtype()):
            self.model = self.build_model()
            pretrained = self.start_from_pretrained(pretrained)
        self.prepare_corpus()
        self.loss_fn = self.build_loss()
        self.schedule = WarmupSchedule(config.d_model, config.warmup, config.lr_scale)
        # the gradient sums over ranks: MPI on host buffers, NCCL on the GPU (None for one process)
        self.collectives = self.world.device_collectives() if self.world.size > 1 else None
        n = sum(p.data.size for p in self.model.parameters())
        zero = bool(config.zero) and self.world.size > 1  # --zero 1: Adam updates this rank's shard only
        rule = OPTIMIZERS[config.optimizer]  # the paper's Adam (0.9, 0.98, 1e-9): its defaults
        self.optimizer = (mixed_precision(rule) if self.mixed else rule)(
            self.model.parameters(), lr=self.schedule,
            shard=shard_range(n, self.world.size, self.world.rank) if zero else None,
            gather=self.collectives.allgather if zero else None)
        if self.mixed and pretrained is not None:  # fp16: the master weights are the folder's, not rounded
            self.optimizer.load_master([pretrained[name] for name, _ in self.model.named_parameters()])
        self.step, self.epoch, self.batch_in_epoch, self.elapsed = 0, 0, 0, 0.0
        self.skipped_nonfinite = 0
        self.budget = WallBudget(config.max_minutes)  # --max-minutes: wall time of the whole command
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", enabled=self.world.is_root)
        self.last_checkpoint = None
        self.valid_ppl = {}  # step -> perplexity of the periodic validations (a resumed run: from metrics.jsonl)
        self.stop_requested = False
        self._stopping_now = False  # signals raise EndOfRunInterrupted during the end-of-run evaluation
        if self.world.size > 1:
            pids = ", ".join(f"{rank}={pid}" for rank, pid in enumerate(self.world.pids()))
            log(f"data parallel: {self.world.size} ranks (pids {pids}), {config.accumulate} batch(es) of "
                f"--max-tokens {config.max_tokens} per update{', ZeRO-1 sharded Adam' if zero else ''}")

    # -- what a model's subclass provides (minitf.nmt.translation_trainer, minitf.lm.trainer) -----------------
    def build_model(self):
        """The model of this run (built under the run's default dtype)."""
        raise NotImplementedError

    def read_pretrained(self):
        """``{minitf name: host array}`` of the ``--init-from`` folder (``config.init_from``) for :attr:`model`."""
        raise NotImplementedError

    def start_from_pretrained(self, pretrained):
        """Load --init-from's weights (``pretrained``, else :meth:`read_pretrained`: a resumed run stopped before
        its first checkpoint) into the model and return them; None (nothing loaded) for a run without
        --init-from or with a checkpoint to resume from (its weights come from there)."""
        if self.config.init_from is None or ckpt.list_checkpoints(self.run_dir):
            return None
        try:
            if pretrained is None:
                pretrained = self.read_pretrained()
            self.model.load_state_dict(pretrained)
        except (OSError, ValueError) as error:
            raise DataError(f"--init-from {self.config.init_from}: {error}") from None
        return pretrained

    def build_loss(self):
        """The loss over the model's outputs (its ``num_tokens`` and ``nll_sum`` after each call are logged)."""
        raise NotImplementedError

    def prepare_corpus(self):
        """Set up the corpus for this run's recipe (translation: BPE-dropout, the lexicon); nothing by default."""

    def epoch_batches(self):
        """(batches, lengths) of this epoch: the global batch list (index arrays, the same on every rank,
        from (seed, epoch)) and what measures its items (by default the host arrays (input, target) of tokens per
        item: :meth:`rank_items` and :meth:`loss_tokens` read them)."""
        raise NotImplementedError

    def rank_items(self, index, lengths):
        """This rank's items of the batch ``index``: about 1/ranks of its input + target tokens each."""
        return rank_share(index, *lengths, self.world.size, self.world.rank)

    def loss_tokens(self, index, lengths):
        """The tokens that carry loss in the batch ``index``, every rank's items (a host number: the update's mean
        divides by their sum over its batches). By default every target token; a masked language model counts
        its masked positions."""
        return int(lengths[1][np.asarray(index)].sum())

    def forward_loss(self, share):
        """The loss of the training items ``share`` (index array) of this epoch: its ``loss_fn`` holds the tokens
        that carried it (``num_tokens``) and their summed negative log-likelihood (``nll_sum``)."""
        raise NotImplementedError

    def train_record(self):
        """What a kind adds to each step's metrics.jsonl record (a mixture of experts' tokens per expert); {}."""
        return {}

    def auxiliary_coefficients(self):
        """{name: coefficient} of the auxiliary losses this run's model reports after every forward (a mixture of
        experts' load balance): the update adds coefficient x loss to the loss, logs each loss apart and calls
        :meth:`backward_auxiliary`. None by default."""
        return {}

    def auxiliary_losses(self):
        """{name: value} (host numbers) of the auxiliary losses of the last :meth:`forward_loss`."""
        return {}

    def backward_auxiliary(self, scale):
        """Add ``scale`` x the gradient of sum(coefficient x loss) of :meth:`auxiliary_losses` into the
        parameters' gradients (before the model's backward of the same micro-batch, whose caches it reads)."""
        raise NotImplementedError

    def end_reserve(self):
        """Seconds the end of the run needs, kept free of training by --max-minutes."""
        raise NotImplementedError

    def _out_of_memory(self, update):
        """The StepOutOfMemory to raise for ``update`` (after freeing the step's caches)."""
        raise NotImplementedError

    def validate(self, bar=None, split="valid", samples=3, model_name=None):
        """Evaluate on ``split`` as the kind does (its own measures: translation's BLEU with its settings), log,
        write metrics.jsonl; a periodic validation (``split`` "valid", no ``model_name``) records
        ``valid_ppl[step]`` on every rank. Rank 0 returns the record, the others {}."""
        raise NotImplementedError

    def finish(self, final):
        """The end of a run after its last checkpoint ``final`` (every rank calls it)."""
        raise NotImplementedError

    @property
    def sharded(self):
        """True when Adam updates only this rank's shard of the parameters (--zero 1)."""
        return self.optimizer.hi - self.optimizer.lo < self.optimizer.flat.data.size

    def update(self, batches, lengths):
        """One update on ``batches`` (K lists of item indices of the global batch list), given this epoch's
        ``lengths`` (:meth:`epoch_batches`): forward and backward of this rank's share of each batch, the gradient
        summed over ranks, clipping, Adam; returns an :class:`UpdateResult`. A non-finite loss skips backward,
        non-finite gradients skip Adam (parameters and moments untouched); with fp16 they are a loss-scale
        overflow: the scale halves and the update is skipped."""
        # overflow is checked below and reported once, not as numpy warnings
        with backend.host.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return self._update(batches, lengths)

    def _update(self, batches, lengths):
        c, world, opt, model, loss_fn = self.config, self.world, self.optimizer, self.model, self.loss_fn
        total = float(sum(self.loss_tokens(b, lengths) for b in batches))  # tokens that carry loss, all ranks
        opt.zero_grad()
        coefficients = self.auxiliary_coefficients()
        names = sorted(coefficients)
        stats = np.zeros(3 + len(names))  # sum of loss * weight, sum of nll, tokens, each aux loss * weight: logged
        for j, index in enumerate(batches):
            share = self.rank_items(index, lengths)
            if share.size == 0:
                continue
            backend.manual_seed(micro_batch_seed(c.seed, self.step, world.rank, j, len(batches)))
            loss = self.forward_loss(share)
            weight = loss_fn.num_tokens / total  # this share's part of the update's mean (1.0 for one batch)
            aux = self.auxiliary_losses() if names else {}
            stats += (loss * weight, loss_fn.nll_sum, loss_fn.num_tokens, *(aux[k] * weight for k in names))
            if not math.isfinite(loss):
                model.clear_saved()
                loss_fn.clear_saved()  # its (B, T, V) cache too
                continue
            scale = weight * (opt.scale if self.mixed else 1.0)
            if names:  # the auxiliary losses' gradients first: the model's backward then consumes the caches
                self.backward_auxiliary(scale)
            model.backward(loss_fn.backward(scale))  # grads add up
        if world.size > 1:
            stats = world.sum_host(stats)
        loss, nll_sum, tokens = (float(s) for s in stats[:3])
        aux = {k: float(v) for k, v in zip(names, stats[3:])}
        loss += sum(coefficients[k] * v for k, v in aux.items())  # what the gradient is the gradient of
        if not math.isfinite(loss):  # the same on every rank: all skip the update
            return UpdateResult(loss, nll_sum, tokens, float("nan"), "loss", aux)
        grads = opt.unscale_grads() if self.mixed else opt.flat.grad  # float32 (fp16: / scale)
        if self.sharded:  # ZeRO-1: this rank gets the sum of its shard only
            grads = self.collectives.reduce_scatter(grads)
            norm = xp.asarray(math.sqrt(world.sum_host([float(xp.dot(grads, grads))])[0]), dtype=grads.dtype)
        else:
            if self.collectives is not None:
                self.collectives.allreduce(grads)
            norm = xp.sqrt(xp.dot(grads, grads))
        if c.clip_norm > 0:
            grads *= clip_factor(norm, c.clip_norm, grads.dtype)
        grad_norm = float(norm)  # a logged scalar, and the finiteness check of every gradient
        finite = math.isfinite(grad_norm)
        if self.mixed:
            return UpdateResult(loss, nll_sum, tokens, grad_norm,
                                None if opt.update(finite, grads if self.sharded else None) else "overflow", aux)
        if not finite:
            return UpdateResult(loss, nll_sum, tokens, grad_norm, "gradients", aux)
        opt.step(grads if self.sharded else None)
        return UpdateResult(loss, nll_sum, tokens, grad_norm, aux=aux)

    def finished(self):
        """Every rank stops at the same step: finished if any rank is; a signal seen by any rank
        becomes every rank's ``stop_requested``."""
        c = self.config
        done = ((c.max_steps is not None and self.step >= c.max_steps)
                or (c.epochs is not None and self.epoch >= c.epochs)
                or (c.max_minutes is not None and self.budget.over(self.end_reserve()))
                or bool(self.stop_requested))
        if self.world.size == 1:
            return done
        done_any, signum = self.world.max_host([done, int(self.stop_requested or 0)])
        if signum and not self.stop_requested:
            self.stop_requested = int(signum)
        return bool(done_any)

    def run(self):
        """Train until --max-steps, --epochs, --max-minutes or a signal; validate and save periodically."""
        c = self.config
        self.metrics.check_writable()
        bar = progress_bar(c.max_steps, self.step) if self.progress else None  # plain lines in a log file
        window_tokens, window_start = 0, time.perf_counter()
        self.budget.before = self.elapsed  # a resumed run: wall time of its earlier invocations
        while not self.finished():
            batches, lengths = self.epoch_batches()
            while self.batch_in_epoch < len(batches) and not self.finished():
                update = batches[self.batch_in_epoch:self.batch_in_epoch + c.accumulate]  # one update's batches
                lr = self.optimizer.current_lr(self.step + 1)
                try:
                    result = self.update(update, lengths)
                except MemoryError:
                    raise self._out_of_memory(update) from None
                self.elapsed = self.budget.elapsed()  # wall time: skipped batches, validations and saves count
                if result.nonfinite and result.nonfinite != "overflow":  # fp16 overflow: scale halved, skipped
                    self._skip_nonfinite(result)  # raises unless --skip-nonfinite
                self.batch_in_epoch += len(update)  # used up, also when skipped
                if result.nonfinite:
                    continue
                self.step += 1
                window_tokens += result.tokens
                now = time.perf_counter()
                tokens_per_s = window_tokens / max(now - window_start, 1e-9)
                ppl = perplexity(result.nll_sum / max(result.tokens, 1))
                self.metrics.write(kind="train", step=self.step, epoch=self.epoch + 1, loss=round(result.loss, 5),
                                   ppl=round(ppl, 3), lr=lr, tokens=int(result.tokens),
                                   tokens_per_s=round(tokens_per_s, 1), elapsed=round(self.elapsed, 2),
                                   grad_norm=round(result.grad_norm, 4),
                                   **{f"aux_{k}": round(v, 6) for k, v in result.aux.items()},
                                   **self.train_record(),
                                   **(dict(loss_scale=self.optimizer.scale, overflows=self.optimizer.overflows)
                                      if self.mixed else {}))
                if bar is not None:
                    bar.update(1)
                    eta = "" if c.max_steps is not None else self.budget.eta()  # tqdm shows its own with a total
                    bar.set_postfix_str(f"ep {self.epoch + 1} loss {result.loss:.3f} ppl {ppl:.1f} "
                                        f"lr {lr:.2e} {tokens_per_s:.0f} tok/s{eta}")
                if now - window_start > 30:
                    window_tokens, window_start = 0, now
                if self.step % c.eval_every == 0:
                    self.validate(bar=bar)
                if self.step % c.save_every == 0:
                    self.save()
            if self.batch_in_epoch >= len(batches):
                self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        if bar is not None:
            bar.close()

    def _skip_nonfinite(self, result):
        """A skipped update: stop with one line, or (--skip-nonfinite) count it and go on."""
        what = f"the loss became {result.loss}" if result.nonfinite == "loss" else \
            f"the gradients became non-finite (loss {result.loss:.4g})"
        if not self.config.skip_nonfinite:
            raise FloatingPointError(f"{what} at step {self.step + 1}; last good checkpoint: "
                                     f"{self.last_checkpoint or 'none yet'}; continue from it with --resume "
                                     f"{self.run_dir} and a smaller --lr-scale, --clip-norm 1 or --skip-nonfinite")
        self.skipped_nonfinite += 1
        self.log(f"warning: {what} at step {self.step + 1}: skipped this batch "
                 f"({self.skipped_nonfinite} skipped so far)")

    def optimizer_state(self):
        """The optimizer's state (Adam's moments) as full host arrays by name on rank 0 (None elsewhere); every
        rank calls it (--zero 1 gathers)."""
        opt = self.optimizer
        if not self.sharded:
            return {name: backend.to_numpy(a) for name, a in opt.state.items()} if self.world.is_root else None
        n = opt.flat.data.size
        state = {name: self.world.gather_shards(a, n) for name, a in opt.state.items()}
        return state if self.world.is_root else None

    def save(self):
        """Write the checkpoint of the current step (once: a step already saved is not rewritten)."""
        path = ckpt.checkpoint_path(self.run_dir, self.step)
        if self.last_checkpoint is not None and pathlib.Path(self.last_checkpoint) == path and (
                path.is_dir() or not self.world.is_root):  # the other ranks follow rank 0's decision
            return path
        if not bool(xp.isfinite(self.optimizer.flat.data).all()):  # the model's, or the float32 master weights
            raise FloatingPointError(f"the parameters are not finite at step {self.step}; not saving them; "
                                     f"last good checkpoint: {self.last_checkpoint or 'none yet'} "
                                     "(try a smaller --lr-scale or --clip-norm 1)")
        model = self.model.config  # a dict, or a kind's frozen dataclass (minitf.llama's LlamaConfig)
        model = dataclasses.asdict(model) if dataclasses.is_dataclass(model) else model
        meta = dict(config=self.config.to_dict(), model=model, step=self.step, epoch=self.epoch,
                    batch_in_epoch=self.batch_in_epoch, elapsed_seconds=self.elapsed,
                    vocab_size=self.tokenizer.vocab_size, tokenizer_sha256=self.tokenizer.sha256,
                    skipped_nonfinite=self.skipped_nonfinite,
                    rng={"scheme": "dropout re-seeded from (seed, step); batch order from (seed, epoch)",
                         "seed": self.config.seed})
        if self.metrics.unwritten:  # records a full disk refused: --resume appends them to metrics.jsonl
            meta["unwritten_metrics"] = list(self.metrics.unwritten)
        optimizer = self.optimizer_state()
        if not self.world.is_root:  # rank 0 writes, the others wait for it
            self.world.barrier()
            self.last_checkpoint = path
            return path
        params = self.model.state_dict()
        if self.mixed:  # the float32 master weights are the parameters: translate loads a float32 model
            names = [name for name, _ in self.model.named_parameters()]
            params = {name: backend.to_numpy(a).copy() for name, a in zip(names, self.optimizer.master_params())}
            meta["loss_scale"] = self.optimizer.scaler_state()
        try:
            path = ckpt.write_checkpoint(path, params, meta, self.tokenizer.model_bytes(), optimizer)
        except CheckpointError as error:
            raise CheckpointError(f"{error}; last good checkpoint: {self.last_checkpoint or 'none yet'}") from None
        best = min(self.valid_ppl, key=self.valid_ppl.get) if self.valid_ppl else None  # a candidate at the end
        ckpt.prune_checkpoints(self.run_dir, self.config.keep,
                               protect=[ckpt.checkpoint_path(self.run_dir, best)] if best is not None else [])
        self.last_checkpoint = path
        self.world.barrier()
        return path

    def check_meta(self, meta, path="the checkpoint"):
        """CheckpointError unless a checkpoint's meta.json fits this run: same tokenizer, model and
        precision, a position in the data (checked before any array is read)."""
        if meta.get("tokenizer_sha256") != self.tokenizer.sha256:
            raise CheckpointError(f"{path} was trained with another tokenizer than this run's tokenizer.model "
                                  f"(vocabulary {meta.get('vocab_size')} vs {self.tokenizer.vocab_size}); "
                                  "resume it from its own run folder")
        ours = self.config.model_fields()
        theirs = {k: with_added_fields(meta["config"]).get(k) for k in ours}  # an older run's: its meaning kept
        if theirs != ours:
            diff = [line for k in ours for line in differences(theirs[k], ours[k], k)]
            more = f" and {len(diff) - 3} more" if len(diff) > 3 else ""
            raise CheckpointError(f"{path} belongs to another model ({', '.join(diff[:3])}{more}); resume it from "
                                  "its own run folder")
        theirs, ours = meta["config"].get("precision"), self.config.precision
        if theirs != ours:
            raise CheckpointError(f"{path} was trained with --precision {theirs}, the run with {ours}; "
                                  "resume it from its own run folder")
        if self.mixed and not isinstance(meta.get("loss_scale"), dict):
            raise CheckpointError(f"{path}: meta.json has no loss scale for this fp16 run; use another checkpoint")
        for key in ("step", "epoch", "batch_in_epoch"):
            if not isinstance(meta.get(key), int) or isinstance(meta.get(key), bool) or meta[key] < 0:
                raise CheckpointError(f"{path}: meta.json has no valid {key!r} (got {meta.get(key)!r}); "
                                      "use another checkpoint")

    def expected_arrays(self, state, path="the checkpoint"):
        """``expect`` for ``ckpt.read_checkpoint``: checks meta.json, then names every array's shape and
        dtype (the optimizer's dtype: fp16 saves the float32 master weights; the moments full-size)."""
        self.check_meta(state["meta"], path)
        if "optimizer.npz" not in state["meta"]["sha256"]:
            raise CheckpointError(f"{path} has no optimizer state (an averaged checkpoint?); "
                                  "resume needs a step-NNNNNNNN checkpoint of the run")
        dtype, opt = backend.host.dtype(self.optimizer.flat.data.dtype), self.optimizer
        return {"model.npz": {name: (tuple(p.shape), dtype) for name, p in self.model.named_parameters()},
                "optimizer.npz": {key: (tuple(opt.flat.data.shape), dtype) for key in opt.state_names},
                "non_negative": {"optimizer.npz": opt.non_negative_state}}

    def restore(self, state):
        """Continue from a checkpoint read with :meth:`expected_arrays` (shapes already checked)."""
        meta, opt = state["meta"], self.optimizer
        if state["optimizer"] is None or set(state["optimizer"]) != set(opt.state_names):
            raise CheckpointError("the checkpoint has no optimizer state (an averaged checkpoint?); "
                                  "resume needs a step-NNNNNNNN checkpoint of the run")
        try:
            self.model.load_state_dict(state["params"])
            opt.load_state_dict({key: state["optimizer"][key][opt.lo:opt.hi] for key in opt.state_names}
                                | {"step": meta["step"]})  # this rank's range of the full state
            if self.mixed:  # the saved float32 parameters are the master weights, exactly
                opt.load_master([state["params"][name] for name, _ in self.model.named_parameters()])
                opt.load_scaler_state(meta["loss_scale"])
        except (ValueError, KeyError, TypeError) as error:
            raise CheckpointError(f"the checkpoint does not fit this model: {error}") from None
        self.step, self.epoch, self.batch_in_epoch = meta["step"], meta["epoch"], meta["batch_in_epoch"]
        self.elapsed, self.skipped_nonfinite = meta.get("elapsed_seconds", 0.0), meta.get("skipped_nonfinite", 0)

    def train_and_finish(self):
        """Train, save the last checkpoint, then the end of the run. Ctrl-C or SIGTERM during training:
        every rank stops after the step and saves (status 128 + signal); during the end-of-run
        evaluation it stops at once. A full disk refusing metrics: a checkpoint carries the records."""
        def on_signal(signum, frame):
            if self._stopping_now:
                raise EndOfRunInterrupted(signum)
            self.stop_requested = signum
            self.log(f"{signal_name(signum)}: saving a checkpoint after this step (Ctrl-C again to abort "
                     "without saving)")
            signal.signal(signal.SIGINT, signal.default_int_handler)

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            try:
                self.run()
                final = self.save()
            except MetricsWriteError as error:
                raise self._save_after_metrics_failure(error) from None
            if self.stop_requested:
                self.log(f"stopped at step {self.step}; checkpoint {final}; continue with: "
                         f"python train.py --resume {self.run_dir}")
                return 128 + int(self.stop_requested)  # 130 after Ctrl-C, 143 after SIGTERM
            signal.signal(signal.SIGINT, on_signal)
            try:
                self._stopping_now = True
                if self.stop_requested:  # a signal after the check above: the evaluation stops as it would
                    raise EndOfRunInterrupted(self.stop_requested)
                self.metrics.write(kind="done", step=self.step, train_minutes=round(self.elapsed / 60, 2))
                self.log(f"trained {self.step} steps, {self.elapsed / 60:.1f} min after the start; checkpoint {final}")
                self.finish(final)
            except EndOfRunInterrupted as stop:
                self.log(f"{signal_name(stop.signum)} during the end-of-run evaluation: stopped it; the run is "
                         f"complete (checkpoint {final}, named by best.json unless the evaluation had already "
                         f"chosen); redo the evaluation with: python train.py --resume {self.run_dir}")
                return 128 + stop.signum
            except MetricsWriteError as error:
                raise MetricsWriteError(error.path, error.reason, f"the run is complete up to checkpoint {final}; "
                                        f"free disk space, then python train.py --resume {self.run_dir} writes the "
                                        "end-of-run report") from None
            return 0
        finally:
            self._stopping_now = False
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _save_after_metrics_failure(self, error):
        """After metrics.jsonl refused a record: try to save a checkpoint (it carries the unwritten
        records, for --resume); the error names what is safe."""
        try:
            saved = f"saved checkpoint {self.save()} (last good checkpoint)"
        except (CheckpointError, FloatingPointError, OSError):
            saved = f"could not save a checkpoint either; last good checkpoint: {self.last_checkpoint or 'none yet'}"
        return MetricsWriteError(error.path, error.reason, f"{saved}; free disk space, then continue with "
                                 f"python train.py --resume {self.run_dir}")

    def _best_validated_checkpoint(self):
        """The kept checkpoint with the lowest periodic validation perplexity if lower than the last's, else None."""
        kept = {ckpt.checkpoint_step(p): p for p in ckpt.list_checkpoints(self.run_dir)}
        scored = [(ppl, step) for step, ppl in self.valid_ppl.items() if step in kept]
        if not scored:
            return None
        best_ppl, best_step = min(scored)
        return kept[best_step] if best_ppl < self.valid_ppl[max(self.valid_ppl)] else None
