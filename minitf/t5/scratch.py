"""``python train.py --model t5`` without ``--init-from``: T5 from scratch on the language models' text (the World
English Bible, or ``--train-text FILE --valid-text FILE``) with span corruption (:mod:`minitf.t5.spans`): each line,
cut to ``--max-len`` tokens, loses 15% of its tokens in spans of mean length 3, each span one sentinel in the input
and spelled out after it in the target, drawn anew every step from (seed, step, line). A sentencepiece unigram
vocabulary of the training text (T5's ids: pad 0, eos 1, unk 2) with 100 sentinels after its pieces; the model is
v1.1's layout (gated GELU, its own lm_head) of the run's sizes. The trainer (:class:`T5SpanTrainer`) is the T5
trainer with these batches, validated by the loss of a fixed draw."""
import io
import pathlib

from minitf.backend import host as np
from minitf.lm.task import read_texts, run_texts
from minitf.nmt.data import make_target_io, pad_batch
from minitf.t5 import hf
from minitf.t5.config import T5Config
from minitf.t5.spans import span_corruption, span_counts
from minitf.t5.tokenizer import EXTRA_IDS, PrefixedTokenizer, T5Tokenizer
from minitf.t5.trainer import T5Trainer
from minitf.training import files
from minitf.training.errors import DataError
from minitf.training.files import file_sha256, write_json_atomic
from minitf.training.task import RunData, log, new_run_folder
from minitf.training.tokenizer import _spm

#: The step whose spans every validation draws (the same tokens at every validation: comparable numbers).
VALIDATION_STEP = 2 ** 62


def train_spiece(lines, vocab_size):
    """A T5 tokenizer of ``lines``: a sentencepiece unigram model of at most ``vocab_size - 100`` pieces (pad 0, eos
    1, unk 2, no bos) and 100 sentinels after them; a one-line DataError for a vocabulary the text cannot fill."""
    spm, model = _spm(), io.BytesIO()
    pieces = vocab_size - EXTRA_IDS
    if pieces < 8:
        raise DataError(f"--vocab-size {vocab_size} leaves {pieces} pieces after T5's {EXTRA_IDS} sentinels; give "
                        f"at least {EXTRA_IDS + 8}")
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=pieces,
                                       pad_id=0, eos_id=1, unk_id=2, bos_id=-1, model_type="unigram",
                                       character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
    except RuntimeError as error:
        raise DataError(f"a sentencepiece vocabulary of {pieces} pieces could not be made from the training text "
                        f"({str(error).strip()}); give a smaller --vocab-size") from None
    return T5Tokenizer(model.getvalue(), EXTRA_IDS, "the run's spiece model")


def model_hf_config(config, vocab_size):
    """config.json (a dict) of the T5 a from-scratch run of ``config`` trains: v1.1's layout of the run's sizes."""
    model = T5Config(vocab_size=vocab_size, d_model=config.d_model, d_kv=config.d_model // config.num_heads,
                     d_ff=config.d_ff, num_layers=config.num_encoder_layers,
                     num_decoder_layers=config.num_decoder_layers, num_heads=config.num_heads,
                     dropout_rate=config.dropout, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    return hf.hf_config_of(model, {}, "float32")


class SpanCorpus:
    """The text as sequences (each non-empty line's ids, cut to ``block`` tokens), per split, corrupted by spans
    when a batch is made (:meth:`batch`). ``text`` is empty: no BLEU (the targets are spans, not translations)."""

    def __init__(self, tokenizer, texts, block, seed):
        self.tokenizer, self.seed, self.text, self.ids = tokenizer, int(seed), {}, {}
        for split, text in texts.items():
            lines = [line for line in text.split("\n") if line.strip()]
            self.ids[split] = [ids[:block] for ids in tokenizer.encode(lines) if len(ids) >= 2]
            if not self.ids[split]:
                raise DataError(f"the {split} text has no line of two tokens or more; span corruption needs them")

    def set_bpe_dropout(self, p):
        """Nothing (the run's tokenizer is sentencepiece's; --bpe-dropout is refused)."""

    def start_epoch(self, seed, epoch):
        """Nothing: the spans are drawn per step (:meth:`batch`)."""

    def lengths(self, split):
        """(inputs, targets) host int arrays (N,): each sequence's tokens after corruption, eos and start counted (a
        function of its length only: :func:`minitf.t5.spans.span_counts`)."""
        counts = np.array([span_counts(len(ids)) for ids in self.ids[split]])  # (N, 2) noise, spans
        lengths = np.array([len(ids) for ids in self.ids[split]])
        return lengths - counts[:, 0] + counts[:, 1] + 1, counts.sum(axis=1) + 1

    def batch(self, split, index, step=VALIDATION_STEP):
        """Host int arrays (src (B, S), tgt_in (B, T), tgt_out (B, T)) of the sequences ``index`` with ``step``'s
        spans: the inputs and eos; T5's start and the targets; the targets and eos."""
        t = self.tokenizer
        inputs, targets = span_corruption([self.ids[split][i] for i in index], index, self.seed, step, t.sentinel)
        tgt_in, tgt_out = make_target_io(targets, t.pad_id, t.bos_id, t.eos_id)
        return pad_batch(inputs, t.pad_id, eos_id=t.eos_id), tgt_in, tgt_out


class T5SpanTrainer(T5Trainer):
    """A from-scratch run: the T5 trainer on a :class:`SpanCorpus` (each step's own spans), validated by loss."""

    def forward_loss(self, share):
        src, tgt_in, tgt_out = self.corpus.batch("train", share, self.step)
        return self.loss_fn(self.logits(src, tgt_in), tgt_out)

    def finish(self, final):
        """The end of a run: best.json names the last checkpoint, the test split's loss is reported."""
        if self.world.is_root:
            write_json_atomic(self.run_dir / "best.json", {"model": "last", "checkpoint": str(
                pathlib.Path("checkpoints") / final.name)})
        if "test" in self.corpus.ids:
            record = self.validate(split="test", bleu_sentences=0, samples=0)
            if self.world.is_root:
                self.log(f"test loss {record['loss']:.3f} (ppl {record['ppl']:.2f}) of the span targets with the "
                         "last model")


def run_tokenizer(tokenizer, config):
    """The tokenizer of a from-scratch run's batches: no prefix, T5's start (pad)."""
    return PrefixedTokenizer(tokenizer, "", bos_id=config.t5.get("decoder_start_token_id", 0))


def new_scratch_run(args, config, run_dir, world):
    """A new from-scratch run's text, tokenizer (rank 0's, trained on the training text), model config.json and
    run config."""
    paths, texts = run_texts(args, world)
    config.data, config.bleu_sentences = paths, 0
    if world.is_root:
        with new_run_folder(run_dir):
            tokenizer = train_spiece([line for line in texts["train"].split("\n") if line.strip()],
                                     config.vocab_size)
            log(f"made a sentencepiece vocabulary of {tokenizer.pieces} pieces and {EXTRA_IDS} sentinels from the "
                "training text")
            config.vocab_size, config.t5 = tokenizer.vocab_size, model_hf_config(config, tokenizer.vocab_size)
            files.write_atomic(run_dir / "tokenizer.model", run_tokenizer(tokenizer, config).model_bytes())
    config.data_sha256 = {key: file_sha256(path) for key, path in paths.items() if path is not None}
    if world.is_root:
        config.write(run_dir)
    world.barrier()
    if not world.is_root:
        from minitf.t5.tokenizer import from_run_bytes
        tokenizer = from_run_bytes((run_dir / "tokenizer.model").read_bytes(), str(run_dir / "tokenizer.model"))
        config.vocab_size, config.t5 = tokenizer.vocab_size, model_hf_config(config, tokenizer.vocab_size)
    tokenizer = run_tokenizer(tokenizer, config)
    return RunData(tokenizer, SpanCorpus(tokenizer, texts, config.max_len, config.seed))


def reopen_scratch(tokenizer, config):
    """A resumed from-scratch run's data: its text (config.data) with its tokenizer."""
    tokenizer = run_tokenizer(tokenizer, config)
    return RunData(tokenizer, SpanCorpus(tokenizer, read_texts(config.data), config.max_len, config.seed))
