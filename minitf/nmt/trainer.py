"""The training loop: one update (forward, loss, backward, clipping, Adam), the
loop over token-count batches with validation and checkpoints, and saving and
restoring a run's state.

The recipe is the paper's (section 5): Adam (0.9, 0.98, 1e-9) with the warmup
schedule, label smoothing, dropout. Resuming is exact: the dropout generator is
re-seeded from (seed, step) before every step and the batch order depends only
on (seed, epoch), so a checkpoint needs only the parameters, Adam's moments and
the position in the data.
"""
import math
import pathlib
import sys
import time

from minitf import backend
from minitf.backend import xp
from minitf.loss import LabelSmoothedCrossEntropy
from minitf.optim import Adam, MixedPrecisionAdam, WarmupSchedule, buffer_norm, clip_buffer_norm
from minitf.transformer import Transformer
from minitf.nmt import checkpoint as ckpt
from minitf.nmt.budget import WallBudget
from minitf.nmt.collectives import get_world
from minitf.nmt.data import token_batches
from minitf.nmt.distributed import DataParallel
from minitf.nmt.errors import CheckpointError, DataError, StepOutOfMemory
from minitf.nmt.evaluate import bleu_score, evaluate_loss
from minitf.nmt.metrics import MetricsLog, perplexity
from minitf.nmt.tokenizer import PAD_ID


def step_seed(seed, step):
    """The dropout generator's seed for one step: resuming at a step redraws its masks."""
    return (int(seed) * 1_000_003 + int(step)) % (2 ** 63)



class Trainer:
    def __init__(self, config, run_dir, tokenizer, corpus, log, progress=True, world=None):
        self.world = world or get_world()  # the ranks of a data-parallel run (one process: a LocalWorld)
        self.world.bind_device()
        self.config, self.run_dir, self.tokenizer, self.corpus, self.log = config, pathlib.Path(run_dir), tokenizer, corpus, log
        self.progress = progress
        backend.manual_seed(config.seed)
        # fp16: a float16 model (parameters, activations, gradients) with float32 master weights in the optimizer
        self.mixed = config.precision == "fp16"
        with backend.default_dtype("float16" if self.mixed else backend.get_default_dtype()):
            self.model = Transformer.from_config(config.model_config(tokenizer.vocab_size))
        corpus.set_bpe_dropout(config.bpe_dropout)
        self.loss_fn = LabelSmoothedCrossEntropy(config.label_smoothing, ignore_index=PAD_ID)
        self.schedule = WarmupSchedule(config.d_model, config.warmup, config.lr_scale)
        self.optimizer = (MixedPrecisionAdam if self.mixed else Adam)(
            self.model.parameters(), lr=self.schedule, betas=(0.9, 0.98), eps=1e-9)
        self.step, self.epoch, self.batch_in_epoch, self.elapsed = 0, 0, 0, 0.0
        self.skipped_nonfinite = 0
        self.budget = WallBudget(config.max_minutes)  # --max-minutes: wall time of the whole command
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")
        self.last_checkpoint = None
        self.stop_requested = False
        self.nonfinite = None  # what the last train_step found not finite: None, "loss" or "gradients"
        self.grad_norm = float("nan")  # global gradient norm of the last step (before clipping)
        self.parallel = DataParallel(self, self.world, step_seed)  # ranks, --accumulate, --zero

    # -- checkpoints -----------------------------------------------------------
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
        meta = dict(config=self.config.to_dict(), model=self.model.config, step=self.step, epoch=self.epoch, batch_in_epoch=self.batch_in_epoch,
                    elapsed_seconds=self.elapsed, vocab_size=self.tokenizer.vocab_size,
                    tokenizer_sha256=self.tokenizer.sha256, skipped_nonfinite=self.skipped_nonfinite,
                    rng={"scheme": "dropout re-seeded from (seed, step); batch order from (seed, epoch)",
                         "seed": self.config.seed})
        if self.metrics.unwritten:  # records a full disk refused: --resume appends them to metrics.jsonl
            meta["unwritten_metrics"] = list(self.metrics.unwritten)
        optimizer = self.parallel.optimizer_state()  # every rank takes part (--zero 1 gathers the moments)
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
        ckpt.prune_checkpoints(self.run_dir, self.config.keep)
        self.last_checkpoint = path
        self.world.barrier()
        return path

    def check_fits(self, state, path="the checkpoint"):
        """Raise CheckpointError unless ``state`` can continue this run: same tokenizer,
        same model shapes, Adam's moments present, a position in the data."""
        self.check_meta(state["meta"], path)
        shapes = {name: tuple(p.shape) for name, p in self.model.named_parameters()}
        saved = {name: tuple(a.shape) for name, a in state["params"].items()}
        if saved != shapes:
            wrong = sorted(n for n in set(shapes) | set(saved) if shapes.get(n) != saved.get(n))
            raise CheckpointError(f"{path} does not fit this model: parameters {wrong[:3]} have shapes "
                                       f"{[saved.get(n) for n in wrong[:3]]}, "
                                       f"expected {[shapes.get(n) for n in wrong[:3]]}")
        if state["optimizer"] is None or set(state["optimizer"]) != {"m", "v"}:
            raise CheckpointError(f"{path} has no optimizer state (an averaged checkpoint?); "
                                       "resume needs a step-NNNNNNNN checkpoint of the run")

    def check_meta(self, meta, path="the checkpoint"):
        """The checks of :meth:`check_fits` that need only meta.json (run before any array is read)."""
        if meta.get("tokenizer_sha256") != self.tokenizer.sha256:
            raise CheckpointError(f"{path} was trained with another tokenizer than this run's tokenizer.model "
                                       f"(vocabulary {meta.get('vocab_size')} vs {self.tokenizer.vocab_size}); "
                                       "resume it from its own run folder")
        ours = self.config.model_fields()
        theirs = {k: meta["config"].get(k) for k in ours}
        if theirs != ours:
            diff = ", ".join(f"{k} {theirs[k]} (run: {ours[k]})" for k in ours if theirs[k] != ours[k])
            raise CheckpointError(f"{path} belongs to another model ({diff}); resume it from its own run folder")
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
        """What a checkpoint of this run must hold, for ``ckpt.read_checkpoint(expect=...)``:
        meta.json is checked first, then every array's name, shape and dtype is
        compared with this model's before any data is read. The saved parameters
        have the optimizer's dtype (fp16: the float32 master weights)."""
        self.check_meta(state["meta"], path)
        dtype = backend.host.dtype(self.optimizer.flat.data.dtype)  # Adam's moments match its flat buffer
        return {"model.npz": {name: (tuple(p.shape), dtype) for name, p in self.model.named_parameters()},
                "optimizer.npz": {key: (tuple(self.optimizer.flat.data.shape), dtype) for key in ("m", "v")}}

    def restore(self, state):
        self.check_fits(state)
        meta = state["meta"]
        try:
            self.model.load_state_dict(state["params"])
            self.parallel.load_optimizer_state(state["optimizer"], meta["step"])
            if self.mixed:  # the saved float32 parameters are the master weights, exactly
                self.optimizer.load_master([state["params"][name] for name, _ in self.model.named_parameters()])
                self.optimizer.load_scaler_state(meta["loss_scale"])
        except (ValueError, KeyError, TypeError) as error:
            raise CheckpointError(f"the checkpoint does not fit this model: {error}") from None
        self.step, self.epoch, self.batch_in_epoch = meta["step"], meta["epoch"], meta["batch_in_epoch"]
        self.elapsed, self.skipped_nonfinite = meta.get("elapsed_seconds", 0.0), meta.get("skipped_nonfinite", 0)

    # -- one update -------------------------------------------------------------
    def train_step(self, src, tgt_in, tgt_out):
        """Forward, loss, backward, (clip), Adam. Returns the loss (a logged scalar).

        A non-finite loss stops before backward, non-finite gradients before Adam:
        either way parameters and Adam's moments are untouched, and ``self.nonfinite``
        says which ("loss" or "gradients"; None after a good step). With fp16, non-finite
        gradients are a loss-scale overflow: the optimizer halves the scale and skips the
        update, and ``self.nonfinite`` is "overflow" (the run goes on)."""
        # overflow is checked below and reported once, not as numpy warnings
        with backend.host.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return self._train_step(src, tgt_in, tgt_out)

    def _train_step(self, src, tgt_in, tgt_out):
        backend.manual_seed(step_seed(self.config.seed, self.step))
        self.optimizer.zero_grad()
        self.nonfinite = None
        logits = self.model(src, tgt_in)
        loss = self.loss_fn(logits, tgt_out)
        if not math.isfinite(loss):
            self.model.clear_saved()
            self.loss_fn.clear_saved()  # its (B, T, V) cache too
            self.nonfinite = "loss"
            return loss
        if self.mixed:  # float16 backward of loss * scale, then float32 gradients / scale
            self.model.backward(self.loss_fn.backward(self.optimizer.scale))
            grads = self.optimizer.unscale_grads()
        else:
            self.model.backward(self.loss_fn.backward())
            grads = self.optimizer.flat.grad  # the model's flat gradient buffer
        if self.config.clip_norm > 0:
            norm = clip_buffer_norm(grads, self.config.clip_norm)
        else:
            norm = buffer_norm(grads)
        self.grad_norm = float(norm)  # a logged scalar, and the finiteness check of every gradient
        if self.mixed:
            if not self.optimizer.update(math.isfinite(self.grad_norm)):
                self.nonfinite = "overflow"
            return loss
        if not math.isfinite(self.grad_norm):
            self.nonfinite = "gradients"
            return loss
        self.optimizer.step()
        return loss

    def eta(self):
        """' ETA m:ss' to the end of the command under a time budget (tqdm shows its own
        ETA when --max-steps sets a total)."""
        return "" if self.config.max_steps is not None else self.budget.eta()

    def end_reserve(self):
        """Seconds the end of the run needs (:meth:`WallBudget.end_reserve`)."""
        n_valid = len(self.corpus.text["valid"][0]) if "valid" in self.corpus.text else 0
        n_test = len(self.corpus.text["test"][0]) if "test" in self.corpus.text else 0
        return self.budget.end_reserve(n_valid, n_test, self.config.beam)

    def finished(self):
        c = self.config
        return self.parallel.agree_finished(  # every rank of a data-parallel run stops at the same step
            (c.max_steps is not None and self.step >= c.max_steps)
            or (c.epochs is not None and self.epoch >= c.epochs)
            or (c.max_minutes is not None and self.budget.over(self.end_reserve()))
            or self.stop_requested)

    def run(self, eval_every, save_every, bleu_sentences, beam, alpha):
        c = self.config
        total = c.max_steps
        bar = None
        if self.progress:
            from tqdm import tqdm
            bar = tqdm(total=total, initial=self.step, unit="step", dynamic_ncols=True, file=sys.stderr)
        window_tokens, window_start = 0, time.perf_counter()
        self.budget.before = self.elapsed  # a resumed run: wall time of its earlier invocations
        while not self.finished():
            self.corpus.start_epoch(c.seed, self.epoch)  # BPE-dropout: this epoch's segmentation
            lengths = self.corpus.lengths("train")
            batches, skipped = token_batches(*lengths, c.max_tokens, c.seed, self.epoch, c.max_len)
            if not batches:
                raise DataError(f"every training pair is longer than --max-len {c.max_len} tokens; raise --max-len")
            if self.batch_in_epoch == 0 and skipped:
                self.log(f"epoch {self.epoch + 1}: skipped {skipped} sentence pairs longer than --max-len {c.max_len}")
            while self.batch_in_epoch < len(batches) and not self.finished():
                update = batches[self.batch_in_epoch:self.batch_in_epoch + c.accumulate]  # one update's batches
                lr = self.optimizer.current_lr(self.step + 1)
                try:
                    loss = self.train_step(*self.corpus.batch("train", update[0])) if self.parallel.trivial else \
                        self.parallel.step(update, lengths)
                except MemoryError:
                    self.model.clear_saved()
                    self.loss_fn.clear_saved()  # its (B, T, V) cache too
                    src, tgt_in, _ = self.corpus.batch("train", update[0])  # its shape, for the message
                    raise StepOutOfMemory(
                        f"out of memory at step {self.step + 1} on a batch of {src.shape[0]} sentences padded to "
                        f"{src.shape[1]} source and {tgt_in.shape[1]} target tokens (rank {self.world.rank}, "
                        f"{len(update)} batches per update); use a smaller --max-tokens "
                        f"(this run: {c.max_tokens}), e.g. --resume {self.run_dir} --max-tokens "
                        f"{max(1, c.max_tokens // 2)}; last good checkpoint: {self.last_checkpoint or 'none yet'}",
                        step=self.step + 1) from None
                self.elapsed = self.budget.elapsed()  # wall time: skipped batches, validations and saves count
                if self.nonfinite == "overflow":  # fp16: scale halved, update skipped; the batch is used up
                    self.batch_in_epoch += len(update)
                    continue
                if self.nonfinite:
                    what = f"the loss became {loss}" if self.nonfinite == "loss" else \
                        f"the gradients became non-finite (loss {loss:.4g})"
                    if not c.skip_nonfinite:
                        where = self.last_checkpoint or "none yet"
                        raise FloatingPointError(f"{what} at step {self.step + 1}; last good checkpoint: {where}; "
                                                 f"continue from it with --resume {self.run_dir} and a smaller "
                                                 "--lr-scale, --clip-norm 1 or --skip-nonfinite")
                    self.skipped_nonfinite += 1
                    self.batch_in_epoch += len(update)
                    self.log(f"warning: {what} at step {self.step + 1}: skipped this batch "
                             f"({self.skipped_nonfinite} skipped so far)")
                    continue
                self.step += 1
                self.batch_in_epoch += len(update)
                tokens = int(self.loss_fn.num_tokens)  # non-pad target tokens, counted by the loss
                window_tokens += tokens
                now = time.perf_counter()
                tokens_per_s = window_tokens / max(now - window_start, 1e-9)
                nll = self.loss_fn.nll_sum / max(self.loss_fn.num_tokens, 1)
                self.metrics.write(kind="train", step=self.step, epoch=self.epoch + 1, loss=round(loss, 5),
                                   ppl=round(perplexity(nll), 3), lr=lr, tokens=tokens,
                                   tokens_per_s=round(tokens_per_s, 1), elapsed=round(self.elapsed, 2),
                                   grad_norm=round(self.grad_norm, 4),
                                   **(dict(loss_scale=self.optimizer.scale, overflows=self.optimizer.overflows)
                                      if self.mixed else {}))
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(f"ep {self.epoch + 1} loss {loss:.3f} ppl {perplexity(nll):.1f} "
                                        f"lr {lr:.2e} {tokens_per_s:.0f} tok/s{self.eta()}")
                if now - window_start > 30:
                    window_tokens, window_start = 0, now
                if self.step % eval_every == 0:
                    self.validate(bleu_sentences, beam=1, alpha=alpha, bar=bar)
                if self.step % save_every == 0:
                    self.save()
            if self.batch_in_epoch >= len(batches):
                self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        if bar is not None:
            bar.close()

    def validate(self, bleu_sentences, beam, alpha, bar=None, split="valid", samples=3, model_name=None):
        if not self.world.is_root:  # rank 0 validates (and decodes BLEU); the others wait at the next step
            return {}
        started = self.budget.now()
        loss, ppl = evaluate_loss(self.model, self.loss_fn, self.corpus, split, self.config.max_tokens)
        record = dict(kind=split, step=self.step, loss=round(loss, 5), ppl=round(ppl, 3))
        if model_name is not None:  # the end-of-run candidates: "last", "average of last N"
            record["model"] = model_name
        if bleu_sentences > 0:
            sources, references = (t[:bleu_sentences] for t in self.corpus.text[split])
            bleu, hypotheses = bleu_score(self.model, self.tokenizer, sources, references, beam, alpha)
            record.update(bleu=round(bleu, 2), bleu_sentences=len(sources), beam=beam)
        self.metrics.write(**record)
        message = f"step {self.step} {split}: loss {loss:.3f}  ppl {ppl:.2f}" + (
            f"  BLEU {record['bleu']:.2f} ({record['bleu_sentences']} sentences, beam {beam})" if "bleu" in record else "")
        for i in range(min(samples, len(sources)) if bleu_sentences > 0 else 0):
            message += f"\n  src: {sources[i]}\n  ref: {references[i]}\n  out: {hypotheses[i]}"
        (bar.write if bar is not None else self.log)(message)
        if split == "valid" and model_name is None and bleu_sentences > 0:  # periodic: times the end's estimate
            self.budget.note_validation(self.budget.now() - started, record.get("bleu_sentences", 0))
        return record
