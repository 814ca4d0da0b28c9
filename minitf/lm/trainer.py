"""Training a language model with the shared trainer: :class:`LanguageModelTrainer` is
:class:`minitf.training.trainer.Trainer` (the same update for any world size, --accumulate, --zero 1, fp16,
the same loop, budget, checkpoints, resume and signals) with what a decoder-only model needs instead of
translation's: a :class:`minitf.GPT`, blocks of text as batches, the next-token loss, validation by loss,
perplexity and bits per character with a sample, and test loss at the end."""
import math
import pathlib
import time

from minitf.backend import host as np
from minitf.gpt import GPT, GPTConfig
from minitf.lm.gpt2 import read_pretrained_state
from minitf.loss import LabelSmoothedCrossEntropy
from minitf.module import no_grad
from minitf.sampling import generate
from minitf.training import trainer as base
from minitf.training.config import with_added_fields
from minitf.training.errors import StepOutOfMemory
from minitf.training.files import write_json_atomic
from minitf.training.trainer import Trainer, perplexity
from minitf.lm.data import decode_ids

#: Tokens of the validation text that prompt the sample printed at each validation.
PROMPT_TOKENS = 8
#: Tokens sampled after the prompt (fewer when the block is shorter).
SAMPLE_TOKENS = 64
#: No target is ignored (a character stream has no padding; ids are never negative).
NO_IGNORE = -1


def gpt_config_of_run(config, vocab_size):
    """The :class:`minitf.gpt.GPTConfig` of a ``--model gpt`` run's config (``RunConfig.to_dict()``, or a
    checkpoint's meta.json ``config``): GPT-2's choices, the run's sizes, ``num_decoder_layers`` blocks,
    ``n_positions`` positions (``block_size`` unless the run started from a pretrained model)."""
    config = with_added_fields(config)  # a run of an older minitf: the fields it did not have keep its meaning
    return GPTConfig(vocab_size, max_len=config["n_positions"] or config["block_size"], d_model=config["d_model"],
                     num_heads=config["num_heads"], num_layers=config["num_decoder_layers"], d_ff=config["d_ff"],
                     dropout=config["dropout"], pre_norm=config["pre_norm"], activation=config["activation"],
                     layer_norm_eps=config["layer_norm_eps"])


def gpt_from_run_config(config, vocab_size):
    """The GPT a ``--model gpt`` run trains (:func:`gpt_config_of_run`). For loading a run's checkpoint
    elsewhere (sampling)."""
    return GPT.from_config(gpt_config_of_run(config, vocab_size))


def build_gpt(config, vocab_size):
    """The GPT a ``--model gpt`` checkpoint's config describes (``build`` of minitf.training.checkpoint.load_model)."""
    return gpt_from_run_config(config.to_dict(), vocab_size)


class LanguageModelTrainer(Trainer):
    """A run of ``python train.py --model gpt``: ``corpus`` is a :class:`minitf.lm.data.TextCorpus`."""

    def build_model(self):
        return build_gpt(self.config, self.tokenizer.vocab_size)

    def read_pretrained(self):
        return read_pretrained_state(self.config.init_from, self.model.config)

    def build_loss(self):
        return LabelSmoothedCrossEntropy(self.config.label_smoothing, ignore_index=NO_IGNORE)

    def prepare_corpus(self):
        self.corpus.set_bpe_dropout(self.config.bpe_dropout)

    def epoch_batches(self):
        return self.corpus.epoch_batches(self.config.seed, self.epoch, self.config.max_tokens)

    def forward_loss(self, share):
        inputs, targets = self.corpus.batch("train", share)                # (B, T), (B, T)
        return self.loss_fn(self.model(inputs), targets)

    #: What a batch's rows are, in the out-of-memory line (a masked LM's: "sequences of up to").
    BATCH_ROWS = "blocks of"

    def _out_of_memory(self, update):
        self.model.clear_saved()
        self.loss_fn.clear_saved()
        c = self.config
        return StepOutOfMemory(
            f"out of memory at step {self.step + 1} on a batch of {max(1, c.max_tokens // c.block_size)} "
            f"{self.BATCH_ROWS} {c.block_size} tokens (rank {self.world.rank}, {len(update)} batches per update); use "
            f"a smaller --max-tokens (this run: {c.max_tokens}), e.g. --resume {self.run_dir} --max-tokens "
            f"{max(c.block_size, c.max_tokens // 2)}; last good checkpoint: {self.last_checkpoint or 'none yet'}")

    def end_reserve(self):
        """One more validation and the test split, timed by the last validation (a share before any)."""
        budget = self.budget
        if budget.limit is None:
            return 0.0
        if budget.seconds_per_sentence is None:
            return budget.UNMEASURED_SHARE * budget.limit + budget.MARGIN_SECONDS
        return 2 * budget.validation_seconds + budget.MARGIN_SECONDS

    def evaluate(self, split):
        """(mean loss, nll summed, tokens) over every token of ``split``; every rank takes a share of the batches."""
        totals = [0.0, 0.0, 0.0]
        batches = self.corpus.eval_batches(split, self.config.max_tokens)
        training = self.model.training
        self.model.eval()
        try:
            with no_grad():
                for inputs, targets in batches[self.world.rank::self.world.size]:
                    loss = self.loss_fn(self.model(inputs), targets)
                    totals[0] += loss * self.loss_fn.num_tokens
                    totals[1] += self.loss_fn.nll_sum
                    totals[2] += self.loss_fn.num_tokens
        finally:
            self.model.train(training)
        if self.world.size > 1:
            totals = [float(t) for t in self.world.sum_host(totals)]
        tokens = max(totals[2], 1.0)
        return totals[0] / tokens, totals[1], tokens

    def evaluate_loss(self, split):
        loss, nll, tokens = self.evaluate(split)
        return loss, perplexity(nll / tokens)

    def sample(self):
        """A short continuation of the validation text's first tokens (fixed prompt, fixed seed)."""
        prompt = np.asarray(self.corpus.tokens["valid"][:min(PROMPT_TOKENS, self.config.block_size - 1)],
                            dtype=np.int64)
        new = max(1, min(SAMPLE_TOKENS, self.config.block_size - prompt.size + 1))
        ids = generate(self.model, prompt[None, :], new, temperature=0.8, top_k=40, seed=0)[0]
        return decode_ids(self.tokenizer, prompt), decode_ids(self.tokenizer, ids[prompt.size:])

    def validate(self, bar=None, split="valid", samples=1, model_name=None):
        """Loss, perplexity and bits per character (nll summed / characters of the text, in bits) on
        ``split``, logged and written to metrics.jsonl, with a sample; rank 0 returns the record, the others {}."""
        started = base.clock()
        loss, nll, tokens = self.evaluate(split)
        ppl = perplexity(nll / tokens)
        bpc = nll / math.log(2) / max(self.corpus.chars[split], 1)
        record = dict(kind=split, step=self.step, loss=round(loss, 5), ppl=round(ppl, 3), bpc=round(bpc, 4),
                      tokens=int(tokens))
        if model_name is not None:
            record["model"] = model_name
        if split == "valid" and model_name is None:
            self.valid_ppl[self.step] = ppl
            self.budget.note_validation(base.clock() - started, 1)
        if not self.world.is_root:
            return {}
        self.metrics.write(**record)
        message = f"step {self.step} {split}: loss {loss:.3f}  ppl {ppl:.2f}  bits/char {bpc:.3f}"
        if samples:
            prompt, text = self.sample()
            message += f"\n  sample: {prompt!r} -> {text!r}"
        (bar.write if bar is not None else self.log)(message)
        return record

    def finish(self, final):
        """The end of a run: best.json names the last checkpoint, the test split's loss is reported."""
        if self.world.is_root:
            write_json_atomic(self.run_dir / "best.json", {"model": "last", "checkpoint": str(
                pathlib.Path("checkpoints") / final.name)})
        if "test" in self.corpus.tokens:
            start = time.perf_counter()
            record = self.validate(split="test", samples=0)
            if self.world.is_root:
                self.log(f"test loss {record['loss']:.3f} (ppl {record['ppl']:.2f}, bits/char {record['bpc']:.3f}) "
                         f"with the last model, {time.perf_counter() - start:.0f} s")
        if not self.world.is_root:
            return
        self.log(f"sample with: python -m minitf.generate --checkpoint {self.run_dir}")
        spent = self.budget.elapsed()
        budget = f" (--max-minutes {self.config.max_minutes:g})" if self.config.max_minutes is not None else ""
        self.log(f"whole command: {int(spent // 60)} min {int(spent % 60):02d} s wall time{budget}")
