"""Data-parallel training: the same recipe at any world size (``mpiexec -n N python
train.py ...``), gradient accumulation (``--accumulate K``, fairseq's ``--update-freq``)
and sharded Adam state (``--zero 1``, as llm.c's ZeRO-1).

One update takes K consecutive batches of the global batch list (the same list on
every rank: it depends only on (seed, epoch)); each rank runs its disjoint,
token-balanced share of each batch's sentences. Every micro-batch's gradient is
scaled by (its non-pad target tokens) / (those of the whole update), which every rank
knows from the sentence lengths, so one sum over ranks gives the gradient of the
loss averaged over all non-pad target tokens of the update, whatever N and K are.
That sum is one all-reduce of the flat gradient buffer (``--zero 1``: one
reduce-scatter, the update of this rank's slice, one all-gather of the parameters).
Non-finite checks, clipping and fp16's loss scale then act on the reduced gradient,
so every rank takes the same decision.
"""
import contextlib
import io
import math
import sys

from minitf import backend
from minitf.backend import host as np
from minitf.backend import xp
from minitf.optim import buffer_norm, clip_buffer_norm
from minitf.nmt.collectives import MpiWorld, init_mpi, report_and_abort, shard_range


def rank_share(index, src_lens, tgt_lens, size, rank):
    """This rank's sentences of one batch: a contiguous run (the batch is sorted by
    length, so little padding) holding about 1/size of its source+target tokens.
    The shares of all ranks are disjoint and cover the batch; a share may be empty."""
    index = np.asarray(index)
    if size == 1:
        return index
    cost = (src_lens[index] + tgt_lens[index]).astype(np.float64)
    end = np.cumsum(cost)
    owner = np.minimum(((end - cost / 2) / end[-1] * size).astype(np.int64), size - 1)
    return index[owner == rank]


class ShardedAdam:
    """ZeRO-1: this rank's slice ``[lo, hi)`` of Adam's moments, updating the same slice
    of the flat parameters. The formula is :class:`minitf.optim.Adam`'s (bias corrections
    folded into the step size and eps); ``tests/test_distributed.py`` checks they agree.
    The optimizer's own full-size moments are released: Adam's memory per rank is 1/N."""

    def __init__(self, optimizer, world):
        self.optimizer = optimizer
        self.n = optimizer.flat.data.size
        self.lo, self.hi = shard_range(self.n, world.size, world.rank)
        self.m = xp.zeros(self.hi - self.lo, dtype=optimizer.flat.data.dtype)
        self.v = xp.zeros_like(self.m)
        self._scratch = xp.empty_like(self.m)
        optimizer.m = optimizer.v = None  # never used with --zero 1 (a stray full step would fail loudly)

    def step(self, g):
        """Adam on ``flat.data[lo:hi]`` with ``g``, this rank's slice of the reduced gradient."""
        opt = self.optimizer
        opt.step_count += 1
        t, (b1, b2) = opt.step_count, opt.betas
        step_size = opt.current_lr(t) * (1 - b2 ** t) ** 0.5 / (1 - b1 ** t)
        eps_hat = opt.eps * (1 - b2 ** t) ** 0.5
        m, v, tmp = self.m, self.v, self._scratch
        m *= b1
        m += xp.multiply(g, 1 - b1, out=tmp)
        v *= b2
        g2 = xp.multiply(g, g, out=tmp)
        g2 *= 1 - b2
        v += g2
        denom = xp.sqrt(v, out=tmp)
        denom += eps_hat
        update = xp.divide(m, denom, out=tmp)
        update *= step_size
        opt.flat.data[self.lo:self.hi] -= update

    def load(self, m, v):
        for name, full in (("m", m), ("v", v)):
            if tuple(full.shape) != (self.n,):
                raise ValueError(f"optimizer state {name!r} has shape {tuple(full.shape)}, expected {(self.n,)}")
        self.m[...] = backend.asarray(full_slice(m, self.lo, self.hi), dtype=self.m.dtype)
        self.v[...] = backend.asarray(full_slice(v, self.lo, self.hi), dtype=self.v.dtype)


def full_slice(array, lo, hi):
    return backend.to_numpy(array)[lo:hi]


class _NoMetrics:
    """metrics.jsonl is rank 0's: the other ranks write nothing."""
    unwritten = ()

    def write(self, **record):
        pass

    def truncate(self, step):
        return 0

    def append_unwritten(self, records):
        pass


class DataParallel:
    """The update of a :class:`~minitf.nmt.trainer.Trainer` over ranks and micro-batches.

    ``trivial`` (one process, K = 1, no sharding): the trainer's own ``train_step`` runs,
    exactly as before this module existed."""

    def __init__(self, trainer, world, step_seed):
        self.trainer, self.world, self.step_seed = trainer, world, step_seed
        config = trainer.config
        self.accumulate, self.zero = config.accumulate, config.zero
        self.trivial = world.size == 1 and self.accumulate == 1 and not self.zero
        self.collectives = world.device_collectives() if world.size > 1 else None
        self.sharded = ShardedAdam(trainer.optimizer, world) if self.zero else None
        if not world.is_root:  # only rank 0 reports
            trainer.metrics, trainer.progress = _NoMetrics(), False
        if world.size > 1:
            pids = ", ".join(f"{rank}={pid}" for rank, pid in enumerate(world.pids()))
            trainer.log(f"data parallel: {world.size} ranks (pids {pids}), {self.accumulate} batch(es) of "
                        f"--max-tokens {config.max_tokens} per update{', ZeRO-1 sharded Adam' if self.zero else ''}")

    # -- agreement -------------------------------------------------------------------
    def agree_finished(self, done):
        """Every rank stops at the same step: finished if any rank is (time budget,
        a signal); a signal seen by any rank becomes every rank's ``stop_requested``."""
        if self.world.size == 1:
            return bool(done)
        done_any, signum = self.world.max_host([bool(done), int(self.trainer.stop_requested or 0)])
        if signum and not self.trainer.stop_requested:
            self.trainer.stop_requested = int(signum)
        return bool(done_any)

    # -- checkpoints -------------------------------------------------------------------
    def optimizer_state(self):
        """Adam's moments as full host arrays for the checkpoint (gathered on rank 0 with
        --zero 1: every rank must call this; the other ranks get None)."""
        if self.sharded is None:
            opt = self.trainer.optimizer
            return {"m": backend.to_numpy(opt.m), "v": backend.to_numpy(opt.v)} if self.world.is_root else None
        m = self.world.gather_shards(self.sharded.m, self.sharded.n)
        v = self.world.gather_shards(self.sharded.v, self.sharded.n)
        return {"m": m, "v": v} if self.world.is_root else None

    def load_optimizer_state(self, moments, step):
        opt = self.trainer.optimizer
        if self.sharded is None:
            opt.load_state_dict(dict(moments, step=step))
        else:
            self.sharded.load(moments["m"], moments["v"])
            opt.step_count = int(step)

    # -- one update ----------------------------------------------------------------------
    def step(self, update, lengths):
        """One update on the batches ``update`` (lists of sentence indices of the global
        batch list), given this epoch's ``lengths`` (source, target; BPE-dropout changes them
        every epoch). Returns the loss averaged over all their non-pad target tokens."""
        with backend.host.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return self._step(update, lengths)

    def _step(self, update, lengths):
        t, world = self.trainer, self.world
        opt, config = t.optimizer, t.config
        src_lens, tgt_lens = lengths
        total = float(sum(int(tgt_lens[np.asarray(b)].sum()) for b in update))  # target tokens + EOS
        base = self.step_seed(config.seed, t.step)
        opt.zero_grad()
        t.nonfinite = None
        stats = np.zeros(3)  # sum of loss * tokens, sum of nll, tokens: host numbers, logged
        for j, index in enumerate(update):
            share = rank_share(index, src_lens, tgt_lens, world.size, world.rank)
            if share.size == 0:
                continue
            # dropout: rank 0's first micro-batch draws what one process would; the others differ
            backend.manual_seed((base + 7919 * (world.rank * len(update) + j)) % (2 ** 63))
            src, tgt_in, tgt_out = t.corpus.batch("train", share)
            loss = t.loss_fn(t.model(src, tgt_in), tgt_out)
            tokens = t.loss_fn.num_tokens
            stats += (loss * tokens, t.loss_fn.nll_sum, tokens)
            if not math.isfinite(loss):
                t.model.clear_saved()
                t.loss_fn.clear_saved()  # its (B, T, V) cache too
                continue
            dloss = tokens / total * (opt.scale if t.mixed else 1.0)
            t.model.backward(t.loss_fn.backward(dloss))  # gradients add up in the flat buffer
        stats = world.sum_host(stats)
        loss = float(stats[0] / max(stats[2], 1.0))
        t.loss_fn.nll_sum, t.loss_fn.num_tokens = float(stats[1]), float(stats[2])  # the update's, for the log
        if not math.isfinite(loss):  # the same on every rank: all skip the update
            t.nonfinite = "loss"
            return loss
        grads = opt.unscale_grads() if t.mixed else opt.flat.grad
        if self.sharded is not None:
            g = self.collectives.reduce_scatter(grads) if self.collectives else grads
            norm = math.sqrt(float(world.sum_host([float(xp.dot(g, g))])[0]))
            if config.clip_norm > 0 and math.isfinite(norm):  # clip_buffer_norm's factor, on the global norm
                g *= min(1.0, config.clip_norm / (norm + 1e-6))
        else:
            if self.collectives:
                self.collectives.allreduce(grads)
            norm = float(clip_buffer_norm(grads, config.clip_norm) if config.clip_norm > 0 else buffer_norm(grads))
        t.grad_norm = norm
        finite = math.isfinite(norm)
        if not finite:
            if t.mixed:
                opt.update(False)  # halve the loss scale, skip
                t.nonfinite = "overflow"
            else:
                t.nonfinite = "gradients"
            return loss
        if self.sharded is None:
            opt.update(True) if t.mixed else opt.step()
            return loss
        self.sharded.step(g)
        if self.collectives:
            self.collectives.allgather(opt.flat.data)
        if t.mixed:  # MixedPrecisionAdam.update's bookkeeping after a finite step
            opt.model_flat.data[...] = opt.flat.data
            opt.good_steps += 1
            if opt.good_steps >= opt.growth_interval:
                opt.scale, opt.good_steps = opt.scale * 2, 0
        return loss


# --------------------------------------------------------------------------- #
# the entry point under mpiexec
# --------------------------------------------------------------------------- #
def main(run, argv, prog, **report_options):
    """``run(argv)`` on every rank of ``mpiexec -n N``. A failure on any rank ends the
    whole job within seconds with one line naming the rank (MPI_Abort); rank 0 alone
    prints progress, --help and usage errors."""
    from minitf.nmt.cli import report_errors

    world = init_mpi()
    if world.size > 1:
        prog = f"{prog} (rank {world.rank} of {world.size})"
    captured = io.StringIO()
    quiet = contextlib.ExitStack()
    if not world.is_root:  # the other ranks' output is shown only if they fail alone
        quiet.enter_context(contextlib.redirect_stdout(captured))
        quiet.enter_context(contextlib.redirect_stderr(captured))
    line = None
    with quiet:
        try:
            status = report_errors(prog, run, argv, **report_options)
        except SystemExit as error:  # argparse: --help (0) or a usage error (2)
            status = error.code if isinstance(error.code, int) else 1
        except BaseException as error:  # a bug: still end every rank, in one line
            status, line = 1, f"{prog}: error: {type(error).__name__}: {error}"
    if world.size > 1 and status not in (0, None) and not _ended_by_signal(status):
        said = [text for text in captured.getvalue().splitlines() if text.strip()]
        if line is None and not world.is_root and said:
            line = said[-1] if prog in said[-1] else said[-1].replace(": error:", f" (rank {world.rank} of "
                                                                       f"{world.size}): error:", 1)
        report_and_abort(world, status, line)
    if line is not None:
        print(line, file=sys.stderr)
    return status


def _ended_by_signal(status):
    """130/143: every rank stopped at the same step after Ctrl-C/SIGTERM and rank 0 saved."""
    return status in (130, 143)


__all__ = ["DataParallel", "MpiWorld", "ShardedAdam", "main", "rank_share"]
