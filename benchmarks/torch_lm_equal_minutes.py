"""PyTorch at equal minutes, the language model: ``python train.py --model gpt``'s default run done by
Hugging Face's GPT-2 in PyTorch on the same text, for the same wall-clock minutes, scored as minitf scores it.

    pip install -e ".[bench,hf]"      # torch, transformers
    python benchmarks/torch_lm_equal_minutes.py --max-minutes 9 --out runs/torch-gpt
    python benchmarks/torch_lm_equal_minutes.py --tokenizer runs/gpt-tiny/tokenizer.model   # minitf run's own

What is the same as ``python train.py --model gpt`` (the tiny language-model preset): the text (the default
text, the World English Bible, from ``--cache-dir``), the BPE vocabulary of 4096 trained the same way
(minitf's ``train_tokenizer`` on the training text's lines, or ``--tokenizer PATH``), the training blocks
and their order for the same seed (minitf's ``TextCorpus.epoch_batches`` and ``batch``: 16 blocks of 128
tokens a step), the model (``transformers.GPT2LMHeadModel`` with the GPT-2 config minitf writes for its GPT:
d_model 192, 4 heads, 4 layers, d_ff 768, pre-LN, tanh GELU, learned positions, tied output, dropout 0.1,
none on the attention weights) starting from the weights of minitf's GPT built with the same seed, the
next-token cross-entropy (no label smoothing), Adam (0.9, 0.98, 1e-9) with minitf's ``WarmupSchedule``
(warmup 400, lr_scale 0.5) in a ``LambdaLR``, a validation every 200 steps, and the budget:
``--max-minutes`` is the wall time of the whole script, training stopping when two validations (the
last one timed) and a margin no longer fit, as minitf's trainer stops. Validation and test use
``TextCorpus.eval_batches`` (every token of the split once): loss, perplexity and bits per character
(the summed nll in bits over the split's characters) as ``LanguageModelTrainer.validate`` computes them.

Not the same: no checkpoints and no samples; torch uses its own kernels and all the CPU threads it
likes (``--threads`` to pin them).
"""
import argparse
import math
import os
import pathlib
import sys
import time
import warnings

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import minitf  # noqa: E402
from minitf.backend import keep_freed_memory  # noqa: E402
from minitf.lm.corpus import default_text_splits  # noqa: E402
from minitf.lm.data import TextCorpus, load_tokenizer  # noqa: E402
from minitf.lm.trainer import gpt_from_run_config  # noqa: E402
from minitf.nmt.corpora import DEFAULT_CACHE  # noqa: E402
from minitf.optim import WarmupSchedule  # noqa: E402
from minitf.training.config import RunConfig  # noqa: E402
from minitf.training.text import read_text  # noqa: E402
from minitf.training.tokenizer import train_tokenizer  # noqa: E402
from minitf.training.trainer import perplexity  # noqa: E402
from benchmarks.common import hf_gpt_from_minitf, write_result  # noqa: E402

try:
    import torch
    import transformers  # noqa: F401
except ImportError:
    sys.exit("torch_lm_equal_minutes.py needs PyTorch and transformers: pip install -e \".[bench,hf]\"")


@torch.no_grad()
def evaluate(model, corpus, split, max_tokens):
    """(mean loss, perplexity, bits per character) over every token of ``split``, as minitf's validate."""
    model.eval()
    nll, tokens = 0.0, 0
    for inputs, targets in corpus.eval_batches(split, max_tokens):
        logits = model(torch.from_numpy(inputs)).logits
        nll += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.from_numpy(targets).reshape(-1), reduction="sum").item()
        tokens += targets.size
    model.train()
    tokens = max(tokens, 1)
    return nll / tokens, perplexity(nll / tokens), nll / math.log(2) / max(corpus.chars[split], 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-minutes", type=float, default=None,
                   help="wall time of the whole script, as train.py's --max-minutes (default: the preset's 9)")
    p.add_argument("--max-steps", type=int, help="stop after this many steps instead")
    p.add_argument("--cache-dir", type=pathlib.Path, default=DEFAULT_CACHE)
    p.add_argument("--tokenizer", type=pathlib.Path, help="a tokenizer.model to use (e.g. runs/gpt-tiny's) "
                   "instead of training one")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, help="torch.set_num_threads")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "runs" / "torch-gpt")
    p.add_argument("--allocator", choices=["retain", "system"], default="retain",
                   help="retain: glibc malloc keeps freed memory, as train.py sets it for minitf")
    args = p.parse_args()
    if args.allocator == "retain":
        keep_freed_memory()
    warnings.filterwarnings("ignore", message=".*loss_type=None.*")
    start = time.monotonic()
    config = RunConfig.from_preset("tiny", model="gpt", seed=args.seed, max_minutes=args.max_minutes)
    limit = None if args.max_steps else 60 * config.max_minutes
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    splits = default_text_splits(args.cache_dir)  # the default run's text, fetched once
    texts = {split: read_text(path, f"the {split} text") for split, path in splits.items()}
    if args.tokenizer:
        tokenizer = load_tokenizer(args.tokenizer)
    else:  # as train.py's prepare_tokenizer: BPE on the training text's lines
        tokenizer = train_tokenizer(texts["train"].split("\n"), args.out / "tokenizer.model", config.vocab_size)
    corpus = TextCorpus(tokenizer, texts, config.block_size)
    minitf.manual_seed(config.seed)  # minitf's GPT as its trainer builds it, copied into GPT-2
    model = hf_gpt_from_minitf(gpt_from_run_config(config.to_dict(), tokenizer.vocab_size)).train()
    torch.manual_seed(config.seed)  # dropout masks
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    warmup = WarmupSchedule(config.d_model, config.warmup, config.lr_scale)  # the lr of step s + 1 (from 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup(s + 1))
    # the end: a last validation and the test split, timed by the last validation, as minitf's end_reserve
    validation_seconds = None
    reserve = lambda: (0.08 * limit if validation_seconds is None else 2 * validation_seconds) + 10  # noqa: E731
    step, epoch, done, train_seconds = 0, 0, False, 0.0
    print(f"{sum(p.numel() for p in model.parameters())} parameters, {corpus.tokens['train'].size} training tokens, "
          f"{torch.get_num_threads()} threads", flush=True)
    while not done:
        batches, _ = corpus.epoch_batches(config.seed, epoch, config.max_tokens)
        for index in batches:
            if (args.max_steps and step >= args.max_steps) or (
                    limit and time.monotonic() - start + reserve() >= limit):
                done = True
                break
            timed = time.monotonic()
            inputs, targets = (torch.from_numpy(a) for a in corpus.batch("train", index))
            optimizer.zero_grad()
            logits = model(inputs).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            train_seconds += time.monotonic() - timed
            if step % config.eval_every == 0:
                timed = time.monotonic()
                valid = evaluate(model, corpus, "valid", config.max_tokens)
                validation_seconds = time.monotonic() - timed
                print(f"step {step} train loss {loss.item():.3f} valid loss {valid[0]:.3f} "
                      f"{(time.monotonic() - start) / 60:.1f} min", flush=True)
        epoch += 1
    tokens_per_step = config.max_tokens // config.block_size * config.block_size  # 16 blocks of 128
    results = {"steps": step, "epochs_started": epoch,
               "tokens_per_second": round(step * tokens_per_step / max(train_seconds, 1e-9), 1),
               "train_minutes": round((time.monotonic() - start) / 60, 2),
               "threads": torch.get_num_threads(), "torch": torch.__version__, "init": "minitf GPT, seed "
               f"{config.seed}"}
    for split in ("valid", "test"):
        loss, ppl, bpc = evaluate(model, corpus, split, config.max_tokens)
        results.update({f"{split}_loss": round(loss, 4), f"{split}_ppl": round(ppl, 2), f"{split}_bpc": round(bpc, 4)})
    results["whole_minutes"] = round((time.monotonic() - start) / 60, 2)
    return write_result(args.out, results)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
