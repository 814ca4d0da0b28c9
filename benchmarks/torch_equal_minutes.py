"""PyTorch at equal minutes: the minitf recipe and model in PyTorch (``minitf.pytorch.TorchTransformer``) on the
same split, for the same wall-clock minutes, scored on the same test set with the
same sacrebleu settings.

    pip install -e ".[bench]"      # torch
    python benchmarks/torch_equal_minutes.py --max-minutes 14 --out runs/torch
    torchrun --standalone --nproc-per-node 2 benchmarks/torch_equal_minutes.py --threads 1 --out runs/torch-ddp

What is the same as ``python train.py`` (the tiny preset): the corpus files
(``default_corpus_splits``: the Ding split, whole sentences as the default run), a joint
sentencepiece BPE vocabulary trained the same way (minitf's ``train_tokenizer``), the
text read and encoded by minitf's ``Corpus`` and batched by its ``token_batches`` (same
token budget, same length bucketing and order for the same seed), the model
(``minitf.pytorch.TorchTransformer``: the function minitf computes, post-LN with no final
norms, dropout only where minitf has it, d_model 128, 4 heads, 2+2 layers, d_ff 512,
embeddings scaled by sqrt(d_model) and initialised as minitf's, sinusoidal positions,
source/target/output embeddings tied), label smoothing 0.1, Adam (0.9, 0.98, 1e-9) with
the warmup schedule (minitf's ``WarmupSchedule``, in a ``LambdaLR``), and the budget:
``--max-minutes`` is the wall time of the whole script, training stopping early enough
for the test decoding to fit. The model, the loss, the optimizer and the loop are
PyTorch's, written as a PyTorch user writes them. Decoding: greedy, and beam 4 with the
GNMT length penalty (alpha 0.6), at least one token, at most source length + 50, as
minitf decodes. Scoring: ``sacrebleu.corpus_bleu`` on detokenized text (its defaults,
as minitf).

Under ``torchrun`` (PyTorch's own data parallelism: ``DistributedDataParallel`` with gloo), every rank
builds the same global batches and trains the share of each batch that minitf's ranks take
(``rank_share``), its loss summed and divided by the batch's target tokens over the ranks, so DDP's
mean of the gradients is the gradient of the batch's mean loss, as in minitf; rank 0 decides when
to stop (the others follow it each step) and decodes the test set alone with every core.

Not the same: no periodic validation BLEU and no checkpoint averaging (the last
model is scored); torch uses its own kernels and all the CPU threads it likes
(``--threads`` to pin them). The process's malloc keeps freed memory for reuse, as
train.py's does (``--allocator system`` leaves it as it is).
"""
import argparse
import warnings
import math
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from minitf.backend import keep_freed_memory  # noqa: E402
from minitf.nmt.config import PRESETS, model_config  # noqa: E402
from minitf.training.config import RunConfig  # noqa: E402
from minitf.nmt.corpora import default_corpus_splits  # noqa: E402
from minitf.nmt.data import pad_batch, token_batches  # noqa: E402
from minitf.training.distributed import rank_share  # noqa: E402
from minitf.training.tokenizer import BOS_ID, EOS_ID, PAD_ID  # noqa: E402
from minitf.nmt.corpora import DEFAULT_CACHE  # noqa: E402
from minitf.optim import WarmupSchedule  # noqa: E402
from benchmarks.common import init_embedding_as_minitf, tokenized_corpus, write_result  # noqa: E402

try:
    import torch
    from torch import nn
    from minitf.pytorch import TorchTransformer
except ImportError:
    sys.exit("torch_equal_minutes.py needs PyTorch: pip install -e \".[bench]\"")


class Seq2Seq(TorchTransformer):
    """minitf's model in PyTorch (``minitf.pytorch.TorchTransformer``: no final norms in
    post-LN, dropout only where minitf has it, tied embeddings), initialised as minitf
    initialises its embedding, plus ``encode`` / ``decode`` for the decoders below."""

    def __init__(self, config):
        super().__init__(config)
        init_embedding_as_minitf(self)  # N(0, 1/d_model), as minitf.layers.Embedding

    def embed_positions(self, ids, embed):
        x = embed(ids) * math.sqrt(self.d_model)
        return self.dropout(x + self.positions(ids.shape[1], x.dtype, x.device))

    def encode(self, src):
        mask = src == self.pad_id
        return self.transformer.encoder(self.embed_positions(src, self.src_embed), src_key_padding_mask=mask), mask

    def decode(self, memory, src_mask, tgt_in):
        T = tgt_in.shape[1]
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=tgt_in.device), diagonal=1)  # True = future
        h = self.transformer.decoder(self.embed_positions(tgt_in, self.tgt_embed), memory, tgt_mask=causal,
                                     tgt_key_padding_mask=tgt_in == self.pad_id, memory_key_padding_mask=src_mask,
                                     tgt_is_causal=True)
        return self.generator(h)


@torch.no_grad()
def greedy(model, src_ids):
    src = torch.as_tensor(pad_batch([src_ids], PAD_ID, eos_id=EOS_ID))
    memory, mask = model.encode(src)
    out = [BOS_ID]
    for step in range(len(src_ids) + 51):
        logits = model.decode(memory, mask, torch.tensor([out]))[0, -1]
        if step == 0:
            logits[EOS_ID] = -float("inf")  # at least one token, as minitf (min_len=1)
        token = int(logits.argmax())
        if token == EOS_ID:
            break
        out.append(token)
    return out[1:]


@torch.no_grad()
def beam(model, src_ids, k=4, alpha=0.6):
    src = torch.as_tensor(pad_batch([src_ids], PAD_ID, eos_id=EOS_ID))
    memory, mask = model.encode(src)
    max_len = len(src_ids) + 1 + 50

    def lp(length):
        return ((5 + length) / 6) ** alpha

    live, finished = [([BOS_ID], 0.0)], []
    for step in range(max_len):
        prefixes = torch.tensor([p for p, _ in live])
        logp = torch.log_softmax(model.decode(memory.expand(len(live), -1, -1), mask.expand(len(live), -1),
                                              prefixes)[:, -1], dim=-1)
        if step == 0:
            logp[:, EOS_ID] = -float("inf")
        scores = torch.tensor([s for _, s in live]).unsqueeze(1) + logp
        top = scores.view(-1).topk(2 * k)
        candidates = []
        for score, index in zip(top.values.tolist(), top.indices.tolist()):
            beam_index, token = divmod(index, logp.shape[1])
            candidates.append((live[beam_index][0] + [token], score))
        next_live = []
        for rank, (prefix, score) in enumerate(candidates):
            if (prefix[-1] == EOS_ID and rank < k) or step == max_len - 1:
                finished.append((prefix[1:-1] if prefix[-1] == EOS_ID else prefix[1:], score / lp(len(prefix) - 1)))
            elif prefix[-1] != EOS_ID and len(next_live) < k:
                next_live.append((prefix, score))
        live = next_live
        best = max((s for _, s in finished), default=-float("inf"))
        if not live or (finished and all(s / lp(max_len) < best for _, s in live)):
            break
    return max(finished, key=lambda f: f[1])[0] if finished else live[0][0][1:]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-minutes", type=float, default=PRESETS["tiny"]["max_minutes"],
                   help="wall time of the whole script, as train.py's --max-minutes")
    p.add_argument("--max-steps", type=int, help="stop after this many steps instead")
    p.add_argument("--cache-dir", type=pathlib.Path, default=DEFAULT_CACHE)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lexicon", type=float, default=PRESETS["tiny"].get("lexicon", 0.0),
                   help="dictionary pairs mixed into each epoch per sentence, as train.py's --lexicon")
    p.add_argument("--threads", type=int, help="torch.set_num_threads")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "runs" / "torch")
    p.add_argument("--allocator", choices=["retain", "system"], default="retain",
                   help="retain: glibc malloc keeps freed memory, as train.py sets it for minitf")
    args = p.parse_args()
    if args.allocator == "retain":
        keep_freed_memory()
    warnings.filterwarnings("ignore", message=".*nested tensors.*")
    start = time.monotonic()
    limit = None if args.max_steps else 60 * args.max_minutes
    cfg = PRESETS["tiny"]
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:  # started by torchrun: one process per rank, gloo on the CPU
        torch.distributed.init_process_group("gloo")
    torch.manual_seed(args.seed)  # the same initial model on every rank (DDP also broadcasts rank 0's)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    paths = default_corpus_splits(args.cache_dir, lexicon=args.lexicon > 0)  # the default run's data
    paths["valid_src"] = None                      # no validation here (see above)
    # every rank trains the same tokenizer (deterministic), each into a file of its own
    model_file = args.out / ("tokenizer.model" if rank == 0 else f"tokenizer.rank{rank}.model")
    corpus = tokenized_corpus(paths, cfg["vocab_size"], model_file)  # minitf.nmt.data.Corpus
    tokenizer = corpus.tokenizer
    if args.lexicon:
        corpus.set_lexicon(args.lexicon)  # a new sample of the lexicon each epoch, as train.py's
    model = Seq2Seq(model_config(RunConfig.from_preset("tiny"), tokenizer.vocab_size))
    trained = model if world == 1 else nn.parallel.DistributedDataParallel(model)
    torch.manual_seed(args.seed * 1000 + rank)  # each rank's own dropout masks
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    warmup = WarmupSchedule(cfg["d_model"], cfg["warmup"], cfg["lr_scale"])  # the lr of step s + 1 (counted from 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup(s + 1))
    # summed over this rank's tokens, divided by the batch's tokens per rank: DDP averages over the ranks
    loss_fn = nn.CrossEntropyLoss(ignore_index=PAD_ID, label_smoothing=0.1, reduction="sum")
    encoded_test = corpus.ids["test"][0]
    step, epoch, decode_seconds_per_sentence = 0, 0, 0.05
    # the end: the test set greedy and with beam 4 (about 3x greedy), and a margin
    reserve = lambda: decode_seconds_per_sentence * len(encoded_test) * 4 + 10  # noqa: E731
    done = False
    model.train()
    while not done:
        corpus.start_epoch(args.seed, epoch)
        lengths = corpus.lengths("train")
        batches, _ = token_batches(*lengths, cfg["max_tokens"], args.seed, epoch, 100)
        for index in batches:
            stop = (args.max_steps and step >= args.max_steps) or (
                    limit and time.monotonic() - start + reserve() >= limit)
            if world > 1:  # rank 0's clock decides for every rank
                flag = torch.tensor([float(bool(stop))])
                torch.distributed.broadcast(flag, 0)
                stop = bool(flag.item())
            if stop:
                done = True
                break
            share = rank_share(index, *lengths, world, rank)
            tokens_per_rank = float(lengths[1][index].sum()) / world  # target tokens (with EOS) of the batch
            optimizer.zero_grad()
            if len(share):
                src, tgt_in, tgt_out = (torch.as_tensor(a) for a in corpus.batch("train", share))
                logits = trained(src, tgt_in)
                loss = loss_fn(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1)) / tokens_per_rank
            else:  # an empty share still joins DDP's reduction, with zero gradients
                loss = sum(p.sum() for p in model.parameters()) * 0.0
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            if step % 500 == 0 and rank == 0:
                model.eval()
                timed = time.monotonic()
                for sentence in encoded_test[:20]:
                    greedy(model, sentence)
                decode_seconds_per_sentence = (time.monotonic() - timed) / 20
                model.train()
                print(f"step {step} loss {loss.item():.3f} {(time.monotonic() - start) / 60:.1f} min", flush=True)
        epoch += 1
    if world > 1:
        torch.distributed.destroy_process_group()
        if rank != 0:
            return 0
        torch.set_num_threads(os.cpu_count())  # rank 0 decodes alone
    train_minutes = (time.monotonic() - start) / 60
    model.eval()
    import sacrebleu
    references = corpus.text["test"][1]
    results = {"steps": step, "epochs_started": epoch, "train_minutes": round(train_minutes, 2),
               "threads": args.threads or torch.get_num_threads(), "ranks": world, "torch": torch.__version__}
    for name, decoder in (("greedy", greedy), ("beam4", beam)):
        hypotheses = tokenizer.decode([decoder(model, ids) for ids in encoded_test])
        results[f"test_bleu_{name}"] = round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2)
    results["whole_minutes"] = round((time.monotonic() - start) / 60, 2)
    return write_result(args.out, results)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
