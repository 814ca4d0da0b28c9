"""PyTorch at equal minutes, the masked language model: ``python train.py --model bert``'s default run done by
transformers' BertForMaskedLM in PyTorch on the same text with the same masked batches, for the same wall-clock
minutes, and both models' validation masked-token loss measured by one function on the same validation set.

    pip install -e ".[bench]"      # torch, transformers, safetensors
    # the real run (the lead's, on a quiet machine), one after the other, nothing else running:
    python train.py --model bert --out runs/bert-tiny
    python benchmarks/torch_bert_equal_minutes.py --minitf-run runs/bert-tiny --threads 2 --out runs/torch-bert

``--minitf-run RUN`` takes the run's own vocabulary (RUN/tokenizer.model), text (its config.json's paths) and
settings (its config.json: preset, seed, ``--max-minutes``; the flags below must then be left out), and at the end
scores the run's last checkpoint with this script's evaluation next to PyTorch's (``minitf_valid_loss``...).
Without it the script trains the WordPiece vocabulary as train.py does and runs the preset's settings on
``--train-text``/``--valid-text`` (default: the World English Bible from ``--cache-dir``): a run of its own.

What is the same as ``python train.py --model bert`` (the ``tiny`` masked-LM preset: d_model 128, 4 heads, 2 layers,
d_ff 512, post-LN, exact GELU, learned positions, two token types, tied decoder, dropout 0.1 on the embeddings, every
residual branch and the attention weights, 128-token sequences, 16 a step
(``--max-tokens 2048``), 15% of the tokens masked): the text, split into lines, each ``[CLS] line [SEP]`` cut to
128 tokens (minitf's ``SentenceCorpus``); the WordPiece vocabulary (``train_wordpiece`` of the training lines, or
the run's); the order of the sequences and the batches (``SentenceCorpus.epoch_batches`` for the seed and epoch);
the masks (:mod:`minitf.bert.masking`'s ``mask_inputs``: a function of (seed, step, sequence, position), so step s
of both masks the same positions the same way: 80% [MASK], 10% a random id, 10% kept); the model, transformers'
``BertForMaskedLM`` from the config.json minitf writes for its model (``minitf.bert.hf.save_pretrained``) starting
from the weights of minitf's model built with the same seed, its dropouts the run's; the loss, the mean
cross-entropy over the masked positions (no label smoothing); Adam (0.9, 0.98, 1e-9) with minitf's
``WarmupSchedule`` (d_model 128, warmup 400, lr_scale 0.5) in a ``LambdaLR``; a validation every 200 steps; and the
budget: ``--max-minutes`` is the wall time of the whole script, training stopping when two validations (the last
one timed) and a margin no longer fit, as minitf's trainer stops. Validation and test: every sequence of the split
once, 16 a batch, masked by the draws of ``VALIDATION_STEP`` (the trainer's validation masks): the masked-token
loss (the summed nll over the masked tokens' count), its perplexity, the accuracy of the argmax, as
``BertTrainer.evaluate`` computes them.

Not the same: minitf runs the masked-LM head at the masked positions only (``scored``: the same loss and
gradients), transformers' ``BertForMaskedLM`` at every position, as its users train it (run_mlm.py); no
checkpoints; the dropout masks are torch's own draws; torch uses its own kernels and the threads ``--threads``
gives it (default: torch's own choice).
"""
import argparse
import json
import os
import pathlib
import sys
import tempfile
import time
import warnings

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import minitf  # noqa: E402
from minitf.backend import host as np, keep_freed_memory  # noqa: E402
from minitf.bert import hf  # noqa: E402
from minitf.bert.config import build_run_model  # noqa: E402
from minitf.bert.masking import mask_inputs  # noqa: E402
from minitf.bert.tokenizer import from_bytes, train_wordpiece  # noqa: E402
from minitf.bert.trainer import IGNORE, VALIDATION_STEP, SentenceCorpus  # noqa: E402
from minitf.lm.corpus import default_text_splits  # noqa: E402
from minitf.lm.task import read_texts  # noqa: E402
from minitf.module import no_grad  # noqa: E402
from minitf.nmt.corpora import DEFAULT_CACHE  # noqa: E402
from minitf.optim import WarmupSchedule  # noqa: E402
from minitf.training.config import RunConfig  # noqa: E402
from minitf.training.trainer import perplexity  # noqa: E402
from benchmarks.common import write_result  # noqa: E402

try:
    import torch
    import transformers
except ImportError:
    sys.exit("torch_bert_equal_minutes.py needs PyTorch and transformers: pip install -e \".[bench]\"")


def masked_batch(corpus, tokenizer, config, split, index, step):
    """(inputs, targets, key_padding_mask) host arrays (B, T) of the sequences ``index`` of ``split`` with ``step``'s
    masks: the trainer's ``BertTrainer.masked_batch``, the same draws."""
    ids, lengths = corpus.batch(split, index)
    inputs, targets = mask_inputs(ids, index, lengths, config.seed, step, config.mask_prob, tokenizer.mask_id,
                                  tokenizer.vocab_size, IGNORE)
    return inputs, targets, np.arange(ids.shape[1])[None, :] >= lengths[:, None]               # (B, T) True: pad


def evaluate(logits_of, corpus, tokenizer, config, split):
    """(masked-token loss, perplexity, accuracy, masked tokens) over every sequence of ``split``, ``max_tokens //
    block_size`` a batch, with the validation masks; ``logits_of(inputs, padding)`` -> host float64 logits (B, T, V)
    (either framework's model)."""
    n = corpus.lengths[split].size
    rows = max(1, config.max_tokens // config.block_size)
    nll, count, correct = 0.0, 0, 0
    for start in range(0, n, rows):
        index = np.arange(start, min(start + rows, n))
        inputs, targets, padding = masked_batch(corpus, tokenizer, config, split, index, VALIDATION_STEP)
        scored = targets != IGNORE
        logits = logits_of(inputs, padding)[scored]                                              # (M, V)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        nll -= float(np.take_along_axis(log_probs, targets[scored][:, None], axis=-1).sum())
        correct += int((logits.argmax(-1) == targets[scored]).sum())
        count += int(scored.sum())
    count = max(count, 1)
    return nll / count, perplexity(nll / count), correct / count, count


def torch_logits(model):
    """``logits_of`` of a transformers masked LM (evaluation mode, no gradients)."""
    @torch.no_grad()
    def logits_of(inputs, padding):
        out = model(torch.from_numpy(inputs), attention_mask=torch.from_numpy(~padding).long()).logits
        return out.double().numpy()
    return logits_of


def minitf_logits(model):
    """``logits_of`` of a minitf masked LM (evaluation mode, no caches)."""
    def logits_of(inputs, padding):
        with no_grad():
            return minitf.backend.to_numpy(model(inputs, key_padding_mask=padding)).astype(np.float64)
    return logits_of


def hf_model_from_minitf(model, folder):
    """transformers' BertForMaskedLM holding minitf ``model``'s weights (written by minitf's own writer into
    ``folder``, with its dropouts: ``hidden_dropout_prob`` and ``attention_probs_dropout_prob``), in training mode."""
    hf.save_pretrained(model, folder)
    return transformers.BertForMaskedLM.from_pretrained(folder, dtype=torch.float32).train()


def run_settings(args):
    """(config, texts, tokenizer) of the run to match: ``--minitf-run``'s, or the preset's on the given text."""
    if args.minitf_run is not None:
        if args.train_text or args.max_minutes is not None or args.max_steps is not None or args.tokenizer:
            sys.exit("with --minitf-run the run's own text, vocabulary and budget are used: leave out --train-text, "
                     "--max-minutes, --max-steps and --tokenizer")
        saved = json.loads((args.minitf_run / "config.json").read_text())
        if saved.get("model") != "bert" or saved.get("labels") or saved.get("init_from"):
            sys.exit(f"--minitf-run {args.minitf_run} is not a from-scratch run of train.py --model bert")
        config = RunConfig.from_preset(saved["preset"], model="bert", **{
            k: saved[k] for k in ("seed", "max_minutes", "max_steps", "epochs", "d_model", "num_heads",
                                  "num_encoder_layers", "d_ff", "dropout", "block_size", "warmup", "lr_scale",
                                  "max_tokens", "mask_prob", "eval_every", "vocab_size") if saved.get(k) is not None})
        for key in ("label_smoothing", "optimizer", "clip_norm", "precision", "accumulate"):  # what it does not copy
            if key in saved and saved[key] != getattr(config, key):
                sys.exit(f"--minitf-run {args.minitf_run} ran with {key} {saved[key]!r}; this script trains as the "
                         f"preset does ({key} {getattr(config, key)!r}): compare a run made without that flag")
        texts = read_texts(saved["data"])
        path = args.minitf_run / "tokenizer.model"
        return config, texts, from_bytes(path.read_bytes(), str(path))
    config = RunConfig.from_preset("tiny", model="bert", seed=args.seed, max_minutes=args.max_minutes,
                                   max_steps=args.max_steps)
    if args.train_text:
        paths = {"train_text": args.train_text, "valid_text": args.valid_text, "test_text": args.test_text}
    else:  # the default run's text, fetched once
        paths = {f"{split}_text": path for split, path in default_text_splits(args.cache_dir).items()}
    texts = read_texts(paths)
    if args.tokenizer:
        return config, texts, from_bytes(args.tokenizer.read_bytes(), str(args.tokenizer))
    return config, texts, train_wordpiece(texts["train"].split("\n"), config.vocab_size)  # as train.py makes it


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minitf-run", type=pathlib.Path, metavar="RUN",
                   help="a run of train.py --model bert: its text, vocabulary and settings, and its model scored too")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="wall time of the whole script, as train.py's --max-minutes (default: the preset's 9)")
    p.add_argument("--max-steps", type=int, help="stop after this many steps instead")
    p.add_argument("--train-text", type=pathlib.Path)
    p.add_argument("--valid-text", type=pathlib.Path)
    p.add_argument("--test-text", type=pathlib.Path)
    p.add_argument("--cache-dir", type=pathlib.Path, default=DEFAULT_CACHE)
    p.add_argument("--tokenizer", type=pathlib.Path, help="a run's tokenizer.model instead of training one")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, help="torch.set_num_threads")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "runs" / "torch-bert")
    p.add_argument("--allocator", choices=["retain", "system"], default="retain",
                   help="retain: glibc malloc keeps freed memory, as train.py sets it for minitf")
    args = p.parse_args(argv)
    if args.train_text and not args.valid_text:
        p.error("--train-text needs --valid-text")
    if args.allocator == "retain":
        keep_freed_memory()
    warnings.filterwarnings("ignore")
    transformers.utils.logging.disable_progress_bar()
    start = time.monotonic()
    config, texts, tokenizer = run_settings(args)
    limit = None if config.max_minutes is None else 60 * config.max_minutes
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = SentenceCorpus(tokenizer, texts, config.block_size)
    minitf.manual_seed(config.seed)  # minitf's model as its trainer builds it, copied into transformers'
    with tempfile.TemporaryDirectory(prefix="torch_bert_") as tmp:
        model = hf_model_from_minitf(build_run_model(config, tokenizer.vocab_size, tokenizer.pad_id), tmp)
    torch.manual_seed(config.seed)  # dropout masks
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    warmup = WarmupSchedule(config.d_model, config.warmup, config.lr_scale)  # the lr of step s + 1 (from 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup(s + 1))
    score = lambda split: evaluate(torch_logits(model.eval()), corpus, tokenizer, config, split)  # noqa: E731
    # the end: a last validation and the test split, timed by the last validation, as minitf's end_reserve
    validation_seconds = None
    reserve = lambda: (0.08 * limit if validation_seconds is None else 2 * validation_seconds) + 10  # noqa: E731
    step, epoch, done, train_seconds, masked = 0, 0, False, 0.0, 0
    print(f"{sum(p.numel() for p in model.parameters()):,} parameters, {corpus.lengths['train'].size:,} training "
          f"sequences, vocabulary {tokenizer.vocab_size}, {torch.get_num_threads()} threads", flush=True)
    while not done and (config.epochs is None or epoch < config.epochs):
        batches, _ = corpus.epoch_batches(config.seed, epoch, config.max_tokens)
        for index in batches:
            if (config.max_steps is not None and step >= config.max_steps) or (
                    limit and time.monotonic() - start + reserve() >= limit):
                done = True
                break
            timed = time.monotonic()
            inputs, targets, padding = (torch.from_numpy(a) for a in
                                        masked_batch(corpus, tokenizer, config, "train", index, step))
            optimizer.zero_grad()
            logits = model(inputs, attention_mask=(~padding).long()).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                     ignore_index=IGNORE)
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            masked += int((targets != IGNORE).sum())
            train_seconds += time.monotonic() - timed
            if step % config.eval_every == 0:
                timed = time.monotonic()
                valid = score("valid")
                model.train()
                validation_seconds = time.monotonic() - timed
                print(f"step {step} train loss {loss.item():.3f} valid masked-token loss {valid[0]:.3f} "
                      f"{(time.monotonic() - start) / 60:.1f} min", flush=True)
        epoch += 1
    results = {"steps": step, "epochs_started": epoch, "masked_tokens_per_second": round(masked / max(train_seconds,
                                                                                                         1e-9), 1),
               "train_minutes": round((time.monotonic() - start) / 60, 2), "threads": torch.get_num_threads(),
               "torch": torch.__version__, "transformers": transformers.__version__,
               "init": f"minitf's BertForMaskedLM, seed {config.seed}", "max_minutes": config.max_minutes}
    for split in ("valid", "test"):
        if split in corpus.lengths:
            loss, ppl, accuracy, count = score(split)
            results |= {f"{split}_loss": round(loss, 4), f"{split}_ppl": round(ppl, 2),
                        f"{split}_accuracy": round(accuracy, 4), f"{split}_masked_tokens": count}
    results["whole_minutes"] = round((time.monotonic() - start) / 60, 2)
    if args.minitf_run is not None:  # the run's last model, scored by the same function on the same masks
        ours = minitf.load(args.minitf_run).model
        ours.eval()
        metrics = [json.loads(line) for line in (args.minitf_run / "metrics.jsonl").read_text().splitlines() if line]
        results["minitf_steps"] = max((m.get("step", 0) for m in metrics), default=0)
        for split in ("valid", "test"):
            if split in corpus.lengths:
                loss, ppl, accuracy, _ = evaluate(minitf_logits(ours), corpus, tokenizer, config, split)
                results |= {f"minitf_{split}_loss": round(loss, 4), f"minitf_{split}_ppl": round(ppl, 2),
                            f"minitf_{split}_accuracy": round(accuracy, 4)}
    return write_result(args.out, results)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
