"""Training BERT's masked language model with the shared trainer: :class:`BertTrainer` is
:class:`minitf.training.trainer.Trainer` (the same update for any world size, --accumulate, --zero 1, the loop,
budget, checkpoints, resume and signals) with what a masked LM needs: sequences of text ([CLS] line [SEP]) as
batches, the loss over the masked positions only (:mod:`minitf.bert.masking`: their count is the update's mean's
denominator, :meth:`BertTrainer.loss_tokens`), validation by masked-token loss and accuracy."""
import pathlib

from minitf import backend
from minitf.backend import host as np
from minitf.bert.config import build_run_model, read_run_pretrained
from minitf.bert.masking import chosen, mask_inputs
from minitf.lm.trainer import LanguageModelTrainer
from minitf.loss import LabelSmoothedCrossEntropy
from minitf.module import no_grad
from minitf.training import trainer as base
from minitf.training.errors import DataError
from minitf.training.files import write_json_atomic
from minitf.training.trainer import Trainer, perplexity

#: Targets of the positions that carry no loss.
IGNORE = -1
#: The step whose masks every validation draws (the same positions at every validation: comparable numbers).
VALIDATION_STEP = 2 ** 62


class SentenceCorpus:
    """The text as sequences: each non-empty line ``[CLS] line [SEP]``, cut to ``block_size`` tokens (its [SEP]
    kept), stored flat per split (``ids``, ``starts``, ``lengths``); ``cut``: {split: how many lines were cut}."""

    def __init__(self, tokenizer, texts, block_size):
        self.tokenizer, self.block_size = tokenizer, int(block_size)
        self.ids, self.starts, self.lengths, self.cut = {}, {}, {}, {}
        for split, text in texts.items():
            self.store(split, [line for line in text.split("\n") if line.strip()])

    def store(self, split, lines):
        """Encode ``lines`` (once, when the run starts) as ``split``'s sequences, each cut to ``block_size``."""
        encoded = [self.tokenizer.encode(line)[0] for line in lines]
        self.cut[split] = sum(len(ids) > self.block_size for ids in encoded)
        encoded = [ids if len(ids) <= self.block_size else ids[:self.block_size - 1] + [self.tokenizer.sep_id]
                   for ids in encoded]
        lengths = np.asarray([len(ids) for ids in encoded], dtype=np.int64)
        if lengths.size == 0:
            raise DataError(f"the {split} text has no non-empty line; a masked LM trains on lines of text")
        self.lengths[split] = lengths
        self.starts[split] = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self.ids[split] = np.asarray([i for ids in encoded for i in ids], dtype=np.int64)

    def epoch_batches(self, seed, epoch, max_tokens):
        """(batches, lengths): this epoch's order of the training sequences, ``max_tokens // block_size`` a batch,
        and their lengths (twice: the trainer's (input, target) sizes that weigh the ranks' shares)."""
        lengths = self.lengths["train"]
        order = np.random.default_rng([int(seed), int(epoch), 0x424552]).permutation(lengths.size)  # "BER"
        rows = max(1, int(max_tokens) // self.block_size)
        return [order[i:i + rows] for i in range(0, order.size, rows)], (lengths, lengths)

    def batch(self, split, index):
        """(ids (B, T) padded with [PAD], lengths (B,)) of the sequences ``index`` of ``split`` (host int64)."""
        index = np.asarray(index, dtype=np.int64)
        lengths = self.lengths[split][index]
        width = int(lengths.max())
        grid = self.starts[split][index][:, None] + np.arange(width)[None, :]                    # (B, T)
        inside = np.arange(width)[None, :] < lengths[:, None]                                     # (B, T)
        ids = np.where(inside, self.ids[split][np.minimum(grid, self.ids[split].size - 1)], self.tokenizer.pad_id)
        return ids, lengths


class LabelledCorpus(SentenceCorpus):
    """Labelled lines as sequences (``[CLS] text [SEP]``, cut to ``block_size`` tokens as :class:`SentenceCorpus`
    cuts them) and their label ids: ``splits`` {split: (texts, label ids)} (:func:`minitf.bert.tsv.read_labelled`);
    ``labels`` {split: (N,) int64}."""

    def __init__(self, tokenizer, splits, block_size):
        self.tokenizer, self.block_size = tokenizer, int(block_size)
        self.ids, self.starts, self.lengths, self.cut, self.labels = {}, {}, {}, {}, {}
        for split, (texts, label_ids) in splits.items():
            self.store(split, texts)
            self.labels[split] = np.asarray(label_ids, dtype=np.int64)


class BertTrainer(Trainer):
    """A run of ``python train.py --model bert``: ``corpus`` is a :class:`SentenceCorpus`."""

    def build_model(self):
        return build_run_model(self.config, self.tokenizer.vocab_size, self.tokenizer.pad_id)

    def read_pretrained(self):
        return read_run_pretrained(self.config, self.model)

    def start_from_pretrained(self, pretrained):
        """The folder's part of the model (:func:`minitf.bert.config.pretrained_state`, as the command's checks read
        it), the rest at its new values (a new head), loaded whole."""
        if pretrained is not None:
            pretrained = dict(self.model.state_dict(), **pretrained)
        return super().start_from_pretrained(pretrained)

    def build_loss(self):
        return LabelSmoothedCrossEntropy(self.config.label_smoothing, ignore_index=IGNORE)

    def epoch_batches(self):
        return self.corpus.epoch_batches(self.config.seed, self.epoch, self.config.max_tokens)

    def loss_tokens(self, index, lengths):
        """The masked positions of the batch ``index`` (every rank draws the whole batch's: the same count)."""
        index = np.asarray(index, dtype=np.int64)
        seq = lengths[0][index]
        return int(chosen(self.config.seed, self.step, index, seq, int(seq.max()), self.config.mask_prob).sum())

    def masked_batch(self, split, index, step):
        """(inputs, targets, key_padding_mask) of the sequences ``index`` with ``step``'s masks."""
        ids, lengths = self.corpus.batch(split, index)
        inputs, targets = mask_inputs(ids, index, lengths, self.config.seed, step, self.config.mask_prob,
                                      self.tokenizer.mask_id, self.tokenizer.vocab_size, IGNORE)
        return inputs, targets, np.arange(ids.shape[1])[None, :] >= lengths[:, None]             # (B, T) True: pad

    def forward_loss(self, share):
        inputs, targets, padding = self.masked_batch("train", share, self.step)
        scored = targets != IGNORE                                  # (B, T): the head runs at these positions only
        logits = self.model(inputs, key_padding_mask=padding, scored=scored)                  # (1, N, V)
        return self.loss_fn(logits, targets[scored][None])                                   # (1, N)

    # the language models' out-of-memory line and end-of-run reserve (this kind extends theirs: minitf.lm)
    BATCH_ROWS = "sequences of up to"
    _out_of_memory = LanguageModelTrainer._out_of_memory
    end_reserve = LanguageModelTrainer.end_reserve

    #: What carries the loss (metrics.jsonl's count key, the log's words), what the loss is called.
    counted, counted_words, loss_words = "tokens", "masked tokens", "masked-token loss"

    def evaluation_terms(self, split, index):
        """(loss x count, nll summed, count, correct predictions) of the sequences ``index`` of ``split`` with the
        validation masks (the masked positions count)."""
        inputs, targets, padding = self.masked_batch(split, index, VALIDATION_STEP)
        scored = targets != IGNORE
        targets = targets[scored][None]                                                      # (1, N)
        logits = self.model(inputs, key_padding_mask=padding, scored=scored)                  # (1, N, V)
        loss = self.loss_fn(logits, targets)
        guess = backend.to_numpy(logits.argmax(-1))
        return (loss * self.loss_fn.num_tokens, self.loss_fn.nll_sum, self.loss_fn.num_tokens,
                float((guess == targets).sum()))

    def evaluate(self, split):
        """(loss, nll summed, count, accuracy) over ``split``'s sequences (:meth:`evaluation_terms`); every rank takes
        a share of the batches."""
        totals = np.zeros(4)
        n = self.corpus.lengths[split].size
        rows = max(1, self.config.max_tokens // self.config.block_size)
        batches = [np.arange(i, min(i + rows, n)) for i in range(0, n, rows)]
        training = self.model.training
        self.model.eval()
        try:
            with no_grad():
                for index in batches[self.world.rank::self.world.size]:
                    totals += self.evaluation_terms(split, index)
        finally:
            self.model.train(training)
        if self.world.size > 1:
            totals = self.world.sum_host(totals)
        count = max(float(totals[2]), 1.0)
        return float(totals[0]) / count, float(totals[1]), count, float(totals[3]) / count

    def validate(self, bar=None, split="valid", samples=0, model_name=None):
        """Loss, perplexity and accuracy on ``split``, logged and written to metrics.jsonl (``ppl`` picks the best
        checkpoint); rank 0 returns the record, the others {}."""
        started = base.clock()
        loss, nll, count, accuracy = self.evaluate(split)
        ppl = perplexity(nll / count)
        record = dict(kind=split, step=self.step, loss=round(loss, 5), ppl=round(ppl, 3),
                      accuracy=round(accuracy, 4), **{self.counted: int(count)})
        if model_name is not None:
            record["model"] = model_name
        if split == "valid" and model_name is None:
            self.valid_ppl[self.step] = ppl
            self.budget.note_validation(base.clock() - started, 1)
        if not self.world.is_root:
            return {}
        self.metrics.write(**record)
        (bar.write if bar is not None else self.log)(
            f"step {self.step} {split}: {self.loss_words} {loss:.3f}  ppl {ppl:.2f}  accuracy {accuracy:.3f} "
            f"({int(count)} {self.counted_words})")
        return record

    def finish(self, final):
        """The end of a run: best.json names the last checkpoint, the test split's loss and accuracy are reported."""
        if self.world.is_root:
            write_json_atomic(self.run_dir / "best.json", {"model": "last", "checkpoint": str(
                pathlib.Path("checkpoints") / final.name)})
        if "test" in self.corpus.lengths:
            record = self.validate(split="test")
            if self.world.is_root:
                self.log(f"test {self.loss_words} {record['loss']:.3f} (accuracy {record['accuracy']:.3f}) with the "
                         "last model")
        if self.world.is_root:
            self.log(f"use it: {self.use_command} --checkpoint {self.run_dir} --text '...'")

    #: The command that uses the run (said at its end).
    use_command = "python -m minitf.fill_mask"


class SequenceCrossEntropy(LabelSmoothedCrossEntropy):
    """The cross-entropy of one label a sequence: ``loss_fn(logits, labels)``, logits (B, C), labels (B,) ints; the
    token loss's computation on one position a sequence (``num_tokens``: the sequences). ``backward()`` -> dL/dlogits
    (B, C)."""

    def __init__(self, smoothing=0.0):
        super().__init__(smoothing, ignore_index=IGNORE)

    def forward(self, logits, labels):
        return super().forward(logits[:, None, :], labels[:, None])          # (B, C) -> (B, 1, C), (B,) -> (B, 1)

    def backward(self, dloss=1.0):
        dlogits = super().backward(dloss)                                     # (B, 1, C)
        return dlogits.reshape(dlogits.shape[0], dlogits.shape[-1])          # (B, 1, C) -> (B, C)


class BertClassifierTrainer(BertTrainer):
    """A run of ``python train.py --model bert --train-tsv T --valid-tsv V``: a sequence classifier
    (:class:`minitf.bert.model.BertForSequenceClassification`, the run's ``labels``) on a :class:`LabelledCorpus`;
    the loss is the cross-entropy of each sequence's [CLS] logits, averaged over the sequences (the update's mean's
    denominator, :meth:`loss_tokens`); validation by loss and accuracy."""

    def build_loss(self):
        return SequenceCrossEntropy(self.config.label_smoothing)

    def loss_tokens(self, index, lengths):
        """Every sequence of the batch ``index`` carries one loss term."""
        return int(len(index))

    def classify_loss(self, split, index):
        """(loss, logits (B, C)) of the sequences ``index`` of ``split`` against their labels."""
        ids, lengths = self.corpus.batch(split, index)
        padding = np.arange(ids.shape[1])[None, :] >= lengths[:, None]                    # (B, T) True: pad
        logits = self.model(ids, key_padding_mask=padding)                                  # (B, C)
        targets = self.corpus.labels[split][np.asarray(index, dtype=np.int64)]              # (B,)
        return self.loss_fn(logits, targets), logits

    def forward_loss(self, share):
        return self.classify_loss("train", share)[0]

    counted, counted_words, loss_words = "sequences", "texts", "loss"
    use_command = "python -m minitf.classify"

    def evaluation_terms(self, split, index):
        """(loss x sequences, nll summed, sequences, correct predictions) of the sequences ``index`` of ``split``."""
        loss, logits = self.classify_loss(split, index)
        guess = backend.to_numpy(logits.argmax(-1))
        return (loss * self.loss_fn.num_tokens, self.loss_fn.nll_sum, self.loss_fn.num_tokens,
                float((guess == self.corpus.labels[split][index]).sum()))
