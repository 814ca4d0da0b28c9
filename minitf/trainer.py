"""Training a translation model end to end: ``python train.py`` (see ``--help``).

The recipe is the paper's (section 5): a joint BPE vocabulary, shared
embeddings, token-count batches, Adam (0.9, 0.98, 1e-9) with the warmup
schedule, label smoothing 0.1, dropout, checkpoints averaged at the end,
beam search (4, alpha 0.6) for the final BLEU.

Resuming is exact: the dropout generator is re-seeded from (seed, step) before
every step and the batch order depends only on (seed, epoch), so a checkpoint
needs only the parameters, Adam's moments and the position in the data.

What a kill costs (README, "Resuming and what is guaranteed"): the steps since the
last checkpoint. ``--resume`` takes the newest checkpoint that passes its checks
(checksums, model shape, tokenizer), moves newer bad ones aside with a warning,
and cuts metrics.jsonl back to that checkpoint's step.
"""
import argparse
import json
import math
import os
import pathlib
import signal
import sys
import time

from minitf import backend, checkpoint as ckpt
from minitf.backend import DeviceError, xp
from minitf.data import DataError, fetch_default_corpus, make_target_io, pad_batch, parse_ding, read_parallel, \
    split_pairs, token_batches, write_lines
from minitf.loss import LabelSmoothedCrossEntropy
from minitf.module import no_grad
from minitf.optim import Adam, MixedPrecisionAdam, WarmupSchedule, buffer_norm, clip_buffer_norm
from minitf.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, train_tokenizer
from minitf.transformer import Transformer

# Table 3 of the paper (base, big); tiny is the CPU default, chosen by measurement
# (see README: more updates of a small, fast model win a 15-minute budget).
PRESETS = {
    "tiny": dict(d_model=128, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=512, dropout=0.1,
                 vocab_size=4000, warmup=800, lr_scale=1.0, max_tokens=1500, max_minutes=13.0),
    "base": dict(d_model=512, num_heads=8, num_encoder_layers=6, num_decoder_layers=6, d_ff=2048, dropout=0.1,
                 vocab_size=8000, warmup=4000, lr_scale=1.0, max_tokens=25000, max_minutes=None),
    "big": dict(d_model=1024, num_heads=16, num_encoder_layers=6, num_decoder_layers=6, d_ff=4096, dropout=0.3,
                vocab_size=8000, warmup=4000, lr_scale=1.0, max_tokens=25000, max_minutes=None),
}
MODEL_KEYS = ("d_model", "num_heads", "num_encoder_layers", "num_decoder_layers", "d_ff", "dropout", "pre_norm")
PRECISIONS = ("fp32", "tf32", "fp16")
DEFAULT_CACHE = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "minitf"


class UsageError(ValueError):
    """An impossible flag combination or value."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit status 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return value
    return parse


def build_parser():
    p = OneLineParser(prog="train.py", description="Train a Transformer translation model (German to English "
                      "on the Ding dictionary's example sentences by default).")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                   help="model size and recipe: tiny (CPU default), base and big (paper, Table 3)")
    g = p.add_argument_group("model (override the preset)")
    g.add_argument("--d-model", type=positive(int))
    g.add_argument("--num-heads", type=positive(int))
    g.add_argument("--num-layers", type=positive(int), help="encoder and decoder layers")
    g.add_argument("--num-encoder-layers", type=positive(int))
    g.add_argument("--num-decoder-layers", type=positive(int))
    g.add_argument("--d-ff", type=positive(int))
    g.add_argument("--dropout", type=float)
    g.add_argument("--pre-norm", action="store_true", help="pre-LN blocks instead of the paper's post-LN")
    g = p.add_argument_group("recipe")
    g.add_argument("--vocab-size", type=positive(int), help="joint BPE vocabulary size")
    g.add_argument("--max-tokens", type=positive(int), help="padded tokens per batch and side (paper: ~25000)")
    g.add_argument("--max-len", type=positive(int), default=100, help="skip longer sentences (in BPE tokens)")
    g.add_argument("--warmup", type=positive(int), help="warmup steps of the learning-rate schedule")
    g.add_argument("--lr-scale", type=positive(float), help="factor on d_model^-0.5 * min(step^-0.5, step*warmup^-1.5)")
    g.add_argument("--label-smoothing", type=float, default=0.1)
    g.add_argument("--clip-norm", type=float, default=0.0, help="global gradient-norm clipping (0 = off)")
    g.add_argument("--skip-nonfinite", action="store_true",
                   help="skip (and count) a step whose loss is not finite instead of stopping")
    g = p.add_argument_group("run")
    g.add_argument("--device", choices=["cpu", "gpu"], default=os.environ.get("MINITF_DEVICE", "cpu"))
    g.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp32; tf32 (GPU: TF32 tensor-core matmuls via CUPY_TF32=1); fp16 (float16 model, "
                   "float32 master weights and Adam moments, dynamic loss scaling)")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--max-steps", type=positive(int))
    g.add_argument("--epochs", type=positive(int))
    g.add_argument("--max-minutes", type=positive(float), help="stop training after this much wall time")
    g.add_argument("--out", type=pathlib.Path, help="run folder (default runs/<preset>)")
    g.add_argument("--resume", type=pathlib.Path, metavar="RUN_DIR", help="continue the run in RUN_DIR exactly")
    g.add_argument("--eval-every", type=positive(int), default=1000, help="steps between validations")
    g.add_argument("--save-every", type=positive(int), default=500, help="steps between checkpoints")
    g.add_argument("--keep", type=positive(int), default=5, help="checkpoints kept")
    g.add_argument("--average", type=int, default=5, help="average the last N checkpoints at the end (0/1 = off)")
    g.add_argument("--bleu-sentences", type=int, default=200, help="validation sentences decoded for BLEU")
    g.add_argument("--beam", type=positive(int), default=4)
    g.add_argument("--alpha", type=float, default=0.6)
    g.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    g = p.add_argument_group("data (default: the Ding de-en example sentences, fetched with apt)")
    for split in ("train", "valid", "test"):
        g.add_argument(f"--{split}-src", type=pathlib.Path)
        g.add_argument(f"--{split}-tgt", type=pathlib.Path)
    g.add_argument("--src-lang", default="de")
    g.add_argument("--tgt-lang", default="en")
    g.add_argument("--cache-dir", type=pathlib.Path, default=DEFAULT_CACHE)
    return p


# --------------------------------------------------------------------------- #
# configuration
# --------------------------------------------------------------------------- #
def resolve_config(args):
    """Preset values overridden by explicit flags; checks that they fit together."""
    config = dict(PRESETS[args.preset], preset=args.preset, pre_norm=args.pre_norm)
    overrides = dict(d_model=args.d_model, num_heads=args.num_heads, num_encoder_layers=args.num_encoder_layers,
                     num_decoder_layers=args.num_decoder_layers, d_ff=args.d_ff, dropout=args.dropout,
                     vocab_size=args.vocab_size, warmup=args.warmup, lr_scale=args.lr_scale,
                     max_tokens=args.max_tokens, max_minutes=args.max_minutes)
    if args.num_layers is not None:
        overrides["num_encoder_layers"] = overrides["num_encoder_layers"] or args.num_layers
        overrides["num_decoder_layers"] = overrides["num_decoder_layers"] or args.num_layers
    config.update({k: v for k, v in overrides.items() if v is not None})
    if args.max_steps is not None or args.epochs is not None:
        config["max_minutes"] = args.max_minutes  # an explicit length replaces the preset's time budget
    config.update(max_steps=args.max_steps, epochs=args.epochs, max_len=args.max_len, seed=args.seed,
                  label_smoothing=args.label_smoothing, clip_norm=args.clip_norm, src_lang=args.src_lang,
                  tgt_lang=args.tgt_lang, skip_nonfinite=args.skip_nonfinite, precision=args.precision)
    if config["d_model"] % config["num_heads"]:
        raise UsageError(f"--d-model must be divisible by --num-heads, got {config['d_model']} and {config['num_heads']}")
    if not 0.0 <= config["dropout"] < 1.0:
        raise UsageError(f"--dropout must be in [0, 1), got {config['dropout']}")
    if not 0.0 <= config["label_smoothing"] < 1.0:
        raise UsageError(f"--label-smoothing must be in [0, 1), got {config['label_smoothing']}")
    if config["clip_norm"] < 0:
        raise UsageError(f"--clip-norm must be >= 0, got {config['clip_norm']}")
    if config["vocab_size"] < 8:
        raise UsageError(f"--vocab-size must be at least 8, got {config['vocab_size']}")
    if config["max_steps"] is None and config["epochs"] is None and config["max_minutes"] is None:
        config["epochs"] = 10
    return config


def setup_precision(precision, device):
    """Before ``backend.set_device``: TF32 is switched on through CuPy's environment
    variable CUPY_TF32, which CuPy reads when it first picks a float32 matmul mode."""
    if precision == "tf32":
        if device != "gpu":
            raise UsageError("--precision tf32 needs --device gpu (TF32 is a tensor-core mode of NVIDIA GPUs)")
        os.environ["CUPY_TF32"] = "1"


def data_paths(args):
    """The six corpus files, from the flags or from the default corpus (fetched once)."""
    given = {f"{s}_{side}": getattr(args, f"{s}_{side}") for s in ("train", "valid", "test") for side in ("src", "tgt")}
    if any(v is not None for v in given.values()):
        for split in ("train", "valid"):
            if given[f"{split}_src"] is None or given[f"{split}_tgt"] is None:
                raise UsageError(f"a custom corpus needs --{split}-src and --{split}-tgt "
                                 "(and optionally --test-src/--test-tgt)")
        if (given["test_src"] is None) != (given["test_tgt"] is None):
            raise UsageError("--test-src and --test-tgt go together")
        # absolute, so that --resume works from any working directory
        return {k: (os.path.abspath(v) if v is not None else None) for k, v in given.items()}
    if {args.src_lang, args.tgt_lang} != {"de", "en"}:
        raise UsageError(f"the default corpus is German-English: --src-lang/--tgt-lang must be de/en, "
                         f"got {args.src_lang}/{args.tgt_lang}; pass --train-src etc. for another corpus")
    return default_corpus_splits(args.cache_dir, args.src_lang, args.tgt_lang)


def default_corpus_splits(cache_dir, src_lang, tgt_lang):
    """Fetch the Ding dictionary, extract sentence pairs, split 500/500 (seed 1234), cache as text."""
    folder = pathlib.Path(cache_dir) / "ding-de-en"
    names = {f"{s}_{side}": folder / f"{s}.{lang}" for s in ("train", "valid", "test")
             for side, lang in (("src", src_lang), ("tgt", tgt_lang))}
    if not all(p.is_file() for p in names.values()):
        pairs = parse_ding(fetch_default_corpus(cache_dir))
        for split, part in zip(("train", "valid", "test"), split_pairs(pairs, seed=1234)):
            write_lines(folder / f"{split}.de", [de for de, _ in part])
            write_lines(folder / f"{split}.en", [en for _, en in part])
    return {k: os.path.abspath(v) for k, v in names.items()}


def check_output_folder(out, resume):
    """Refuse to overwrite another run, and fail early on a folder we cannot write."""
    out = pathlib.Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder; expected a run folder, choose another --out")
    if not resume and (out / "config.json").exists():
        raise UsageError(f"--out {out} already holds a run; continue it with --resume {out} or choose another --out")
    probe = out if out.exists() else next((p for p in out.parents if p.exists()), pathlib.Path("."))
    if not probe.is_dir():
        raise UsageError(f"--out {out} lies below {probe}, which is a file, not a folder; choose another --out")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write to {probe} (for --out {out}); choose a writable --out")


def write_json_atomic(path, value):
    """Write JSON to a temp file beside ``path``, flush it to disk, rename it into place."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(value, indent=1, sort_keys=True))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------- #
# data
# --------------------------------------------------------------------------- #
class Corpus:
    """Encoded splits: lists of token-id lists per side."""

    def __init__(self, tokenizer, paths, log):
        self.text = {}
        self.ids = {}
        for split in ("train", "valid", "test"):
            if paths.get(f"{split}_src") is None:
                continue
            pairs = read_parallel(paths[f"{split}_src"], paths[f"{split}_tgt"])
            if pairs.n_dropped:
                log(f"{split}: dropped {pairs.n_dropped} line pairs with an empty side")
            self.text[split] = ([s for s, _ in pairs], [t for _, t in pairs])
            self.ids[split] = (tokenizer.encode(self.text[split][0]), tokenizer.encode(self.text[split][1]))

    def lengths(self, split):
        src, tgt = self.ids[split]
        host = backend.host
        return host.array([len(s) + 1 for s in src]), host.array([len(t) + 1 for t in tgt])  # + EOS / BOS

    def batch(self, split, index):
        """Host int arrays (src (B, S), tgt_in (B, T), tgt_out (B, T)) for sentence indices."""
        src, tgt = self.ids[split]
        tgt_in, tgt_out = make_target_io([tgt[i] for i in index], PAD_ID, BOS_ID, EOS_ID)
        return pad_batch([src[i] for i in index], PAD_ID, eos_id=EOS_ID), tgt_in, tgt_out


def prepare_tokenizer(run_dir, train_texts, vocab_size, log):
    """Train the run's tokenizer. A new run always trains it, also over a
    tokenizer.model left by a run killed before it wrote config.json (it may
    come from other flags); a resumed run reads its own instead."""
    path = pathlib.Path(run_dir) / "tokenizer.model"
    start = time.perf_counter()
    tokenizer = train_tokenizer(train_texts, path, vocab_size)
    log(f"trained a joint BPE vocabulary of {tokenizer.vocab_size} on {len(train_texts)} sentences "
        f"in {time.perf_counter() - start:.1f} s")
    return tokenizer


# --------------------------------------------------------------------------- #
# training and evaluation
# --------------------------------------------------------------------------- #
def step_seed(seed, step):
    """The dropout generator's seed for one step: resuming at a step redraws its masks."""
    return (int(seed) * 1_000_003 + int(step)) % (2 ** 63)


def build_model(config, vocab_size):
    return Transformer(vocab_size, vocab_size, **{k: config[k] for k in MODEL_KEYS},
                       share_embeddings=True, pad_id=PAD_ID)


def evaluate_loss(model, loss_fn, corpus, split, max_tokens):
    """Mean per-token loss and perplexity (from the unsmoothed NLL) over a split."""
    batches, _ = token_batches(*corpus.lengths(split), max_tokens, seed=0, epoch=0)
    total_loss = total_nll = total_tokens = 0.0
    was_training = model.training
    model.eval()
    with no_grad():
        for index in batches:
            src, tgt_in, tgt_out = corpus.batch(split, index)
            loss = loss_fn(model(src, tgt_in), tgt_out)
            total_loss += loss * loss_fn.num_tokens
            total_nll += loss_fn.nll_sum
            total_tokens += loss_fn.num_tokens
    model.train(was_training)
    tokens = max(total_tokens, 1.0)
    return total_loss / tokens, math.exp(min(total_nll / tokens, 50.0))


def bleu_score(model, tokenizer, sources, references, beam, alpha):
    """Corpus BLEU (sacrebleu, detokenized text) and the hypotheses."""
    import sacrebleu

    from minitf.translate import translate_texts
    hypotheses = translate_texts(model, tokenizer, sources, beam_size=beam, alpha=alpha)
    return sacrebleu.corpus_bleu(hypotheses, [references]).score, hypotheses


class MetricsLog:
    """One JSON object per line: {"kind": "train" | "valid" | "test" | ..., "step": ..., ...}."""

    def __init__(self, path):
        self.path = pathlib.Path(path)

    def write(self, **record):
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")

    def truncate(self, step):
        """Keep the records a run had written when it saved its checkpoint at ``step``
        (the longest prefix with step <= ``step`` and no end-of-run report), atomically.
        A resumed run then appends exactly what an uninterrupted run would have.
        Returns the number of records dropped (a torn last line counts as one)."""
        if not self.path.is_file():
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
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            with open(tmp, "wb") as handle:
                handle.write(b"".join(line + b"\n" for line in kept))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        return len(lines) - len(kept)


class Trainer:
    def __init__(self, config, run_dir, tokenizer, corpus, log, progress=True):
        self.config, self.run_dir, self.tokenizer, self.corpus, self.log = config, pathlib.Path(run_dir), tokenizer, corpus, log
        self.progress = progress
        backend.manual_seed(config["seed"])
        # fp16: a float16 model (parameters, activations, gradients) with float32 master weights in the optimizer
        self.mixed = config.get("precision", "fp32") == "fp16"
        with backend.default_dtype("float16" if self.mixed else backend.get_default_dtype()):
            self.model = build_model(config, tokenizer.vocab_size)
        self.loss_fn = LabelSmoothedCrossEntropy(config["label_smoothing"], ignore_index=PAD_ID)
        self.schedule = WarmupSchedule(config["d_model"], config["warmup"], config["lr_scale"])
        self.optimizer = (MixedPrecisionAdam if self.mixed else Adam)(
            self.model.parameters(), lr=self.schedule, betas=(0.9, 0.98), eps=1e-9)
        self.step, self.epoch, self.batch_in_epoch, self.elapsed = 0, 0, 0, 0.0
        self.skipped_nonfinite = 0
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")
        self.last_checkpoint = None
        self.stop_requested = False
        self.nonfinite = None  # what the last train_step found not finite: None, "loss" or "gradients"
        self.grad_norm = float("nan")  # global gradient norm of the last step (before clipping)

    # -- checkpoints -----------------------------------------------------------
    def save(self):
        """Write the checkpoint of the current step (once: a step already saved is not rewritten)."""
        path = ckpt.checkpoint_path(self.run_dir, self.step)
        if self.last_checkpoint is not None and pathlib.Path(self.last_checkpoint) == path and path.is_dir():
            return path
        if not bool(xp.isfinite(self.optimizer.flat.data).all()):  # the model's, or the float32 master weights
            raise FloatingPointError(f"the parameters are not finite at step {self.step}; not saving them; "
                                     f"last good checkpoint: {self.last_checkpoint or 'none yet'} "
                                     "(try a smaller --lr-scale or --clip-norm 1)")
        meta = dict(config=self.config, model=self.model.config, step=self.step, epoch=self.epoch, batch_in_epoch=self.batch_in_epoch,
                    elapsed_seconds=self.elapsed, vocab_size=self.tokenizer.vocab_size,
                    tokenizer_sha256=self.tokenizer.sha256, skipped_nonfinite=self.skipped_nonfinite,
                    rng={"scheme": "dropout re-seeded from (seed, step); batch order from (seed, epoch)",
                         "seed": self.config["seed"]})
        optimizer = {k: backend.to_numpy(v) for k, v in (("m", self.optimizer.m), ("v", self.optimizer.v))}
        params = self.model.state_dict()
        if self.mixed:  # the float32 master weights are the parameters: translate loads a float32 model
            names = [name for name, _ in self.model.named_parameters()]
            params = {name: backend.to_numpy(a).copy() for name, a in zip(names, self.optimizer.master_params())}
            meta["loss_scale"] = self.optimizer.scaler_state()
        try:
            path = ckpt.write_checkpoint(path, params, meta, self.tokenizer.model_bytes(), optimizer)
        except ckpt.CheckpointError as error:
            raise ckpt.CheckpointError(f"{error}; last good checkpoint: {self.last_checkpoint or 'none yet'}") from None
        ckpt.prune_checkpoints(self.run_dir, self.config.get("keep", 5))
        self.last_checkpoint = path
        return path

    def check_fits(self, state, path="the checkpoint"):
        """Raise CheckpointError unless ``state`` can continue this run: same tokenizer,
        same model shapes, Adam's moments present, a position in the data."""
        meta = state["meta"]
        if meta.get("tokenizer_sha256") != self.tokenizer.sha256:
            raise ckpt.CheckpointError(f"{path} was trained with another tokenizer than this run's tokenizer.model "
                                       f"(vocabulary {meta.get('vocab_size')} vs {self.tokenizer.vocab_size}); "
                                       "resume it from its own run folder")
        theirs = {k: meta["config"].get(k) for k in MODEL_KEYS if k != "dropout"}
        ours = {k: self.config.get(k) for k in MODEL_KEYS if k != "dropout"}
        if theirs != ours:
            diff = ", ".join(f"{k} {theirs[k]} (run: {ours[k]})" for k in ours if theirs[k] != ours[k])
            raise ckpt.CheckpointError(f"{path} belongs to another model ({diff}); resume it from its own run folder")
        shapes = {name: tuple(p.shape) for name, p in self.model.named_parameters()}
        saved = {name: tuple(a.shape) for name, a in state["params"].items()}
        if saved != shapes:
            wrong = sorted(n for n in set(shapes) | set(saved) if shapes.get(n) != saved.get(n))
            raise ckpt.CheckpointError(f"{path} does not fit this model: parameters {wrong[:3]} have shapes "
                                       f"{[saved.get(n) for n in wrong[:3]]}, "
                                       f"expected {[shapes.get(n) for n in wrong[:3]]}")
        if state["optimizer"] is None or set(state["optimizer"]) != {"m", "v"}:
            raise ckpt.CheckpointError(f"{path} has no optimizer state (an averaged checkpoint?); "
                                       "resume needs a step-NNNNNNNN checkpoint of the run")
        theirs, ours = meta["config"].get("precision", "fp32"), self.config.get("precision", "fp32")
        if theirs != ours:
            raise ckpt.CheckpointError(f"{path} was trained with --precision {theirs}, the run with {ours}; "
                                       "resume it from its own run folder")
        if self.mixed and not isinstance(meta.get("loss_scale"), dict):
            raise ckpt.CheckpointError(f"{path}: meta.json has no loss scale for this fp16 run; use another checkpoint")
        for key in ("step", "epoch", "batch_in_epoch"):
            if not isinstance(meta.get(key), int) or meta[key] < 0:
                raise ckpt.CheckpointError(f"{path}: meta.json has no valid {key!r} (got {meta.get(key)!r}); "
                                           "use another checkpoint")

    def restore(self, state):
        self.check_fits(state)
        meta = state["meta"]
        try:
            self.model.load_state_dict(state["params"])
            self.optimizer.load_state_dict(dict(state["optimizer"], step=meta["step"]))
            if self.mixed:  # the saved float32 parameters are the master weights, exactly
                self.optimizer.load_master([state["params"][name] for name, _ in self.model.named_parameters()])
                self.optimizer.load_scaler_state(meta["loss_scale"])
        except (ValueError, KeyError, TypeError) as error:
            raise ckpt.CheckpointError(f"the checkpoint does not fit this model: {error}") from None
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
        backend.manual_seed(step_seed(self.config["seed"], self.step))
        self.optimizer.zero_grad()
        self.nonfinite = None
        logits = self.model(src, tgt_in)
        loss = self.loss_fn(logits, tgt_out)
        if not math.isfinite(loss):
            self.model.clear_saved()
            self.nonfinite = "loss"
            return loss
        if self.mixed:  # float16 backward of loss * scale, then float32 gradients / scale
            self.model.backward(self.loss_fn.backward(self.optimizer.scale))
            grads = self.optimizer.unscale_grads()
        else:
            self.model.backward(self.loss_fn.backward())
            grads = self.optimizer.flat.grad  # the model's flat gradient buffer
        if self.config["clip_norm"] > 0:
            norm = clip_buffer_norm(grads, self.config["clip_norm"])
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
        """' ETA m:ss' of a time budget (tqdm shows its own ETA when --max-steps sets a total)."""
        if self.config["max_minutes"] is None or self.config["max_steps"] is not None:
            return ""
        left = max(0, int(60 * self.config["max_minutes"] - self.elapsed))
        return f" ETA {left // 60}:{left % 60:02d}"

    def finished(self):
        c = self.config
        return ((c["max_steps"] is not None and self.step >= c["max_steps"])
                or (c["epochs"] is not None and self.epoch >= c["epochs"])
                or (c["max_minutes"] is not None and self.elapsed >= 60 * c["max_minutes"])
                or self.stop_requested)

    def run(self, eval_every, save_every, bleu_sentences, beam, alpha):
        c = self.config
        lengths = self.corpus.lengths("train")
        total = c["max_steps"]
        bar = None
        if self.progress:
            from tqdm import tqdm
            bar = tqdm(total=total, initial=self.step, unit="step", dynamic_ncols=True, file=sys.stderr)
        window_tokens, window_start = 0, time.perf_counter()
        while not self.finished():
            batches, skipped = token_batches(*lengths, c["max_tokens"], c["seed"], self.epoch, c["max_len"])
            if self.batch_in_epoch == 0 and skipped:
                self.log(f"epoch {self.epoch + 1}: skipped {skipped} sentence pairs longer than --max-len {c['max_len']}")
            while self.batch_in_epoch < len(batches) and not self.finished():
                started = time.perf_counter()
                src, tgt_in, tgt_out = self.corpus.batch("train", batches[self.batch_in_epoch])
                lr = self.optimizer.current_lr(self.step + 1)
                try:
                    loss = self.train_step(src, tgt_in, tgt_out)
                except MemoryError:
                    self.model.clear_saved()
                    raise MemoryError(f"out of memory at step {self.step + 1} on a batch of {src.shape[0]} sentences "
                                      f"padded to {src.shape[1]} source and {tgt_in.shape[1]} target tokens; use a "
                                      f"smaller --max-tokens (this run: {c['max_tokens']}), e.g. --resume "
                                      f"{self.run_dir} --max-tokens {max(1, c['max_tokens'] // 2)}; last good "
                                      f"checkpoint: {self.last_checkpoint or 'none yet'}") from None
                self.elapsed += time.perf_counter() - started  # skipped batches spend the time budget too
                if self.nonfinite == "overflow":  # fp16: scale halved, update skipped; the batch is used up
                    self.batch_in_epoch += 1
                    continue
                if self.nonfinite:
                    what = f"the loss became {loss}" if self.nonfinite == "loss" else \
                        f"the gradients became non-finite (loss {loss:.4g})"
                    if not c.get("skip_nonfinite"):
                        where = self.last_checkpoint or "none yet"
                        raise FloatingPointError(f"{what} at step {self.step + 1}; last good checkpoint: {where}; "
                                                 f"continue from it with --resume {self.run_dir} and a smaller "
                                                 "--lr-scale, --clip-norm 1 or --skip-nonfinite")
                    self.skipped_nonfinite += 1
                    self.batch_in_epoch += 1
                    self.log(f"warning: {what} at step {self.step + 1}: skipped this batch "
                             f"({self.skipped_nonfinite} skipped so far)")
                    continue
                self.step += 1
                self.batch_in_epoch += 1
                tokens = int(self.loss_fn.num_tokens)  # non-pad target tokens, counted by the loss
                window_tokens += tokens
                now = time.perf_counter()
                tokens_per_s = window_tokens / max(now - window_start, 1e-9)
                nll = self.loss_fn.nll_sum / max(self.loss_fn.num_tokens, 1)
                self.metrics.write(kind="train", step=self.step, epoch=self.epoch + 1, loss=round(loss, 5),
                                   ppl=round(math.exp(min(nll, 50)), 3), lr=lr, tokens=tokens,
                                   tokens_per_s=round(tokens_per_s, 1), elapsed=round(self.elapsed, 2),
                                   grad_norm=round(self.grad_norm, 4),
                                   **(dict(loss_scale=self.optimizer.scale, overflows=self.optimizer.overflows)
                                      if self.mixed else {}))
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(f"ep {self.epoch + 1} loss {loss:.3f} ppl {math.exp(min(nll, 50)):.1f} "
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
        loss, ppl = evaluate_loss(self.model, self.loss_fn, self.corpus, split, self.config["max_tokens"])
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
        return record


# --------------------------------------------------------------------------- #
# the command
# --------------------------------------------------------------------------- #
def given_options(argv):
    """The dests of the options written on the command line (abbreviations and
    ``--flag=value`` included), told apart from defaults by parsing twice."""
    parser = build_parser()
    unset = object()
    parser.set_defaults(**{name: unset for name in vars(parser.parse_args(argv))})
    return {name for name, value in vars(parser.parse_args(argv)).items() if value is not unset}


def run(argv=None):
    args = build_parser().parse_args(argv)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    if args.resume is not None:
        return resume_run(args, log, given_options(argv))
    config = resolve_config(args)
    config.update({name: getattr(args, name) for name in RUN_OPTIONS})
    run_dir = args.out or pathlib.Path("runs") / args.preset
    check_output_folder(run_dir, resume=False)
    setup_precision(config["precision"], args.device)
    backend.set_device(args.device)
    paths = data_paths(args)
    train_pairs = read_parallel(paths["train_src"], paths["train_tgt"])  # fail on bad data before writing
    read_parallel(paths["valid_src"], paths["valid_tgt"])
    if paths.get("test_src"):
        read_parallel(paths["test_src"], paths["test_tgt"])
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    config["data"] = paths
    try:
        tokenizer = prepare_tokenizer(run_dir, [s for s, _ in train_pairs] + [t for _, t in train_pairs],
                                      config["vocab_size"], log)
    except DataError:  # e.g. --vocab-size too large for the text: leave no empty run folder behind
        if created and not any(run_dir.iterdir()):
            run_dir.rmdir()
        raise
    config["data_sha256"] = {key: ckpt.file_sha256(path) for key, path in paths.items() if path is not None}
    write_json_atomic(run_dir / "config.json", config)
    corpus = Corpus(tokenizer, paths, log)
    trainer = Trainer(config, run_dir, tokenizer, corpus, log, progress=not args.no_progress)
    log(f"{config['preset']} model: {trainer.model.num_parameters():,} parameters, d_model {config['d_model']}, "
        f"{config['num_encoder_layers']}+{config['num_decoder_layers']} layers, on {args.device}; "
        f"{len(corpus.ids['train'][0])} training pairs; run folder {run_dir}")
    return train_and_report(trainer, args, log)


# flags that --resume may change (they are written into config.json); every other
# recipe or model flag belongs to the run and is refused with --resume
RESUME_CHANGEABLE = ("max_steps", "epochs", "max_minutes", "max_tokens", "lr_scale", "clip_norm")
# how often to evaluate and save, and what to report: kept in config.json, so that a
# resumed run saves as often as the original did, unless given again
RUN_OPTIONS = ("eval_every", "save_every", "keep", "average", "bleu_sentences", "beam", "alpha")
RESUME_FIXED = ("d_model", "num_heads", "num_layers", "num_encoder_layers", "num_decoder_layers", "d_ff", "dropout",
                "pre_norm", "vocab_size", "max_len", "warmup", "label_smoothing", "seed", "src_lang", "tgt_lang",
                "preset", "precision", "train_src", "train_tgt", "valid_src", "valid_tgt", "test_src", "test_tgt")
CONFIG_REQUIRED = ("data", "seed", "vocab_size", "warmup", "lr_scale", "max_tokens", "max_len", "label_smoothing",
                   "clip_norm", "max_steps", "epochs", "max_minutes") + MODEL_KEYS


def read_run_config(run_dir):
    """config.json of a run folder, with a one-line UsageError for anything that is not one."""
    run_dir = pathlib.Path(run_dir)
    if not run_dir.exists():
        raise UsageError(f"--resume {run_dir}: no such folder; pass the --out folder of an earlier train.py run")
    if not run_dir.is_dir():
        raise UsageError(f"--resume {run_dir} is a file; pass the --out folder of an earlier train.py run")
    if not (run_dir / "config.json").is_file():
        if (run_dir / "tokenizer.model").is_file():
            raise UsageError(f"--resume {run_dir}: the run was stopped before it wrote config.json, so there is "
                             "nothing to resume; start it again with the original command (same --out)")
        raise UsageError(f"--resume {run_dir}: no config.json there, so it is not a run folder; "
                         "pass the --out folder of an earlier train.py run")
    try:
        config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise UsageError(f"--resume {run_dir}: config.json is not valid JSON ({error}); "
                         "restore it from a checkpoint's meta.json (its \"config\") or start a new run") from None
    missing = [k for k in CONFIG_REQUIRED if not isinstance(config, dict) or k not in config]
    if missing:
        raise UsageError(f"--resume {run_dir}: config.json lacks {missing}; it was not written by this train.py, "
                         "pass the --out folder of a train.py run")
    return config


def resume_run(args, log, given):
    run_dir = args.resume
    fixed = [k for k in RESUME_FIXED if k in given]
    if args.out is not None and pathlib.Path(args.out).resolve() != pathlib.Path(run_dir).resolve():
        fixed.append("out")
    if fixed:
        flags = ", ".join("--" + k.replace("_", "-") for k in fixed)
        raise UsageError(f"--resume continues a run with its own settings, so {flags} cannot be given; allowed with "
                         "--resume: " + ", ".join("--" + k.replace("_", "-") for k in RESUME_CHANGEABLE + RUN_OPTIONS)
                         + ", --device, --skip-nonfinite, --no-progress")
    config = read_run_config(run_dir)
    changed = {k: getattr(args, k) for k in RESUME_CHANGEABLE + RUN_OPTIONS
               if k in given and getattr(args, k) != config.get(k)}
    for name in RUN_OPTIONS:  # the run's own values unless given again
        if name not in given and name in config:
            setattr(args, name, config[name])
    if changed:
        if any(k in changed for k in ("max_steps", "epochs", "max_minutes")):
            for key in ("max_steps", "epochs", "max_minutes"):  # a new length replaces the old one
                config[key] = getattr(args, key)
        config.update(changed)
    saved_config = dict(config)
    config["skip_nonfinite"] = args.skip_nonfinite  # for this invocation only
    config.setdefault("precision", "fp32")  # runs from before --precision existed
    setup_precision(config["precision"], args.device)
    backend.set_device(args.device)
    for key, digest in config.get("data_sha256", {}).items():
        data_file = config["data"].get(key)
        if data_file and pathlib.Path(data_file).is_file() and ckpt.file_sha256(data_file) != digest:
            log(f"warning: {data_file} changed since the run started: the resumed run will not repeat an "
                "uninterrupted one (restore the original file for an exact resume)")
    tokenizer = Tokenizer(run_dir / "tokenizer.model")
    corpus = Corpus(tokenizer, config["data"], log)
    trainer = Trainer(config, run_dir, tokenizer, corpus, log, progress=not args.no_progress)
    for stale in ckpt.recover_checkpoints(run_dir):
        log(f"removed {stale.name}, left by an interrupted checkpoint write")
    state, path, errors = ckpt.latest_valid_checkpoint(run_dir, check=trainer.check_fits)
    if state is None and errors:
        raise ckpt.CheckpointError(f"--resume {run_dir}: none of its {len(errors)} checkpoints is usable, the newest "
                                   f"because: {errors[0][1]}; restore a good checkpoint or start a new run")
    if changed:  # written only now: a refused --resume changes nothing
        write_json_atomic(run_dir / "config.json", saved_config)
        recipe = sorted(set(changed) & {"max_tokens", "lr_scale", "clip_norm"})
        if recipe:
            log("warning: changed " + ", ".join(f"--{k.replace('_', '-')} to {changed[k]}" for k in recipe)
                + ": from here on the run departs from an uninterrupted one (config.json now holds the new values)")
    for bad, error in errors:
        aside = bad.with_name(bad.name + ".bad")
        n = 1
        while aside.exists():
            n, aside = n + 1, bad.with_name(f"{bad.name}.bad{n}")
        os.rename(bad, aside)
        log(f"warning: skipping a bad checkpoint, moved aside to {aside.name}: {error}")
    if state is not None:
        trainer.restore(state)
        trainer.last_checkpoint = path
        log(f"resumed from {path} at step {trainer.step} (epoch {trainer.epoch + 1})")
    else:
        log(f"no checkpoint in {run_dir} yet: starting from step 0")
    dropped = trainer.metrics.truncate(trainer.step)
    if dropped:
        log(f"metrics.jsonl: dropped {dropped} records written after step {trainer.step} (they are redone)")
    return train_and_report(trainer, args, log)


def train_and_report(trainer, args, log):
    config, run_dir = trainer.config, trainer.run_dir

    def request_stop(signum, frame):
        trainer.stop_requested = signum
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        log(f"{name}: saving a checkpoint after this step (Ctrl-C again to abort without saving)")
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        trainer.run(args.eval_every, args.save_every, args.bleu_sentences, args.beam, args.alpha)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    final = trainer.save()
    if trainer.stop_requested:
        log(f"stopped at step {trainer.step}; checkpoint {final}; continue with: python train.py --resume {run_dir}")
        return 128 + int(trainer.stop_requested)  # 130 after Ctrl-C, 143 after SIGTERM
    summary = dict(step=trainer.step, train_minutes=round(trainer.elapsed / 60, 2))
    trainer.metrics.write(kind="done", **summary)
    log(f"trained {trainer.step} steps in {trainer.elapsed / 60:.1f} min; checkpoint {final}")
    checkpoints = ckpt.list_checkpoints(run_dir)[-args.average:] if args.average > 1 else []
    candidates = [("last", trainer.model.state_dict())]
    if len(checkpoints) > 1:
        averaged = ckpt.average_checkpoints(checkpoints, run_dir / "checkpoints" / "averaged")
        candidates.append((f"average of last {len(checkpoints)}", ckpt.read_checkpoint(averaged)["params"]))
    trainer.model.eval()
    best = None
    for name, params in candidates:  # pick on validation BLEU (greedy, quick), report test with beam
        trainer.model.load_state_dict(params)
        record = trainer.validate(args.bleu_sentences or 200, beam=1, alpha=args.alpha, samples=0, model_name=name)
        log(f"  ({name})")
        if best is None or record.get("bleu", 0) > best[1].get("bleu", 0):
            best = (name, record, params)
    trainer.model.load_state_dict(best[2])
    # relative to the run folder, so that the run can be moved or used from another working directory
    write_json_atomic(run_dir / "best.json", {"model": best[0], "checkpoint": str(
        pathlib.Path("checkpoints") / ("averaged" if best[0].startswith("average") else final.name))})
    if "test" in trainer.corpus.text:
        start = time.perf_counter()
        record = trainer.validate(len(trainer.corpus.text["test"][0]), beam=args.beam, alpha=args.alpha,
                                  split="test", samples=5)
        log(f"test BLEU {record['bleu']:.2f} with the {best[0]} model (beam {args.beam}, alpha {args.alpha}, "
            f"{time.perf_counter() - start:.0f} s to translate {record['bleu_sentences']} sentences)")
    log(f"translate with: python -m minitf.translate --checkpoint {run_dir}")
    return 0


def main(argv=None):
    """Entry point: runs training; bad input gives one error line and a non-zero exit."""
    try:
        return run(argv)
    except (UsageError, DataError, ckpt.CheckpointError, DeviceError, FloatingPointError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2 if isinstance(error, UsageError) else 1
    except MemoryError as error:
        detail = str(error) if str(error).startswith("out of memory at step") else \
            f"out of memory ({error or 'MemoryError'}); use a smaller --max-tokens"
        print(f"train.py: error: {detail}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("train.py: error: interrupted; nothing after the last checkpoint was saved "
              "(continue with --resume RUN_DIR if the run had written config.json)", file=sys.stderr)
        return 130
    except OSError as error:
        print(f"train.py: error: {error.strerror or error}: {error.filename or ''}", file=sys.stderr)
        return 1
