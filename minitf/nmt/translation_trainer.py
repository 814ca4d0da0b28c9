"""Training a translation model with the shared trainer: :class:`TranslationTrainer` is
:class:`minitf.training.trainer.Trainer` with what the encoder-decoder Transformer needs: token-count batches
of sentence pairs, the label-smoothed loss, validation by loss, perplexity and BLEU with example translations,
and the end of the run (last, average of the last N, best validation; chosen on validation BLEU, reported on
the test set with beam search). A run fine-tuned from a Hugging Face Marian folder (``--init-from``) starts
from its weights, with its tokenizer (kept in the run's tokenizer.model: :func:`read_tokenizer`)."""
import pathlib
import time

from minitf.loss import LabelSmoothedCrossEntropy
from minitf.transformer import Transformer
from minitf.nmt import marian
from minitf.nmt.config import model_config
from minitf.nmt.data import token_batches
from minitf.nmt.bleu import bleu_from_stats, bleu_stats, bootstrap_wins
from minitf.nmt.decode import DecodingSettings, inference_mode, translate_texts
from minitf.nmt.marian_tokenizer import MarianTokenizer
from minitf.training import checkpoint as ckpt, trainer as base
from minitf.training.errors import DataError, StepOutOfMemory, pause_for_tests
from minitf.training.files import write_json_atomic
from minitf.training.tokenizer import Tokenizer
from minitf.training.trainer import Trainer, perplexity

#: Short everyday German sentences shown at the end of a run whose source language is German.
EVERYDAY_GERMAN = ("Ich habe Hunger.", "Die Tür ist geschlossen.", "Das Wetter ist heute schön.",
                   "Wo ist der Bahnhof?", "Kannst du mir helfen?")
#: Codes of German as --src-lang or a Marian folder's tokenizer_config.json's source_lang give it.
GERMAN = ("de", "deu", "ger")


def read_tokenizer(data, origin="tokenizer.model"):
    """The tokenizer a translation run keeps in tokenizer.model (``data``: its bytes): minitf's sentencepiece
    model (a protobuf), or a Marian folder's tokenizer (a run fine-tuned with --init-from), kept as JSON by
    :meth:`MarianTokenizer.model_bytes`. For ``checkpoint.load_model(..., read_tokenizer=read_tokenizer)``."""
    data = bytes(data)
    if data[:1] == b"{":  # a protobuf's first byte is a field tag, never "{"
        return MarianTokenizer.from_bytes(data, origin)
    return Tokenizer.from_bytes(data)


def load_tokenizer(path):
    """A run's tokenizer.model file (:func:`read_tokenizer`); a one-line DataError if it cannot be read."""
    try:
        return read_tokenizer(pathlib.Path(path).read_bytes(), str(path))
    except OSError as error:
        raise DataError(f"cannot read the run's tokenizer {path} ({error.strerror or error}); restore it from a "
                        "checkpoint's tokenizer.model or start a new run") from None


class TranslationTrainer(Trainer):
    """A run of ``python train.py`` (the default ``--model transformer``): ``corpus`` is a
    :class:`minitf.nmt.data.Corpus` or :class:`minitf.nmt.data.IndexedCorpus`."""
    #: Beam search costs about this many times a greedy decode of the same sentences (the end's time estimate).
    BEAM_FACTOR = 2.0

    def build_model(self):
        """The model of this run (translation: the encoder-decoder Transformer; fine-tuning: the Marian folder's,
        whose weights the base class loads unless the run has a checkpoint to resume from)."""
        return Transformer.from_config(model_config(self.config, self.tokenizer.vocab_size))

    def read_pretrained(self):
        return marian.read_state(self.config.init_from)[2]

    def build_loss(self):
        """The loss over the model's outputs (translation: label-smoothed, pads ignored: the tokenizer's pad,
        a Marian vocabulary's last id)."""
        return LabelSmoothedCrossEntropy(self.config.label_smoothing, ignore_index=self.tokenizer.pad_id)

    def epoch_batches(self):
        """(batches, lengths) of this epoch: the global batch list (index arrays, the same on every rank,
        from (seed, epoch)) and the host arrays (source, target) of tokens per item that weigh the ranks'
        shares and the update's mean."""
        c = self.config
        self.corpus.start_epoch(c.seed, self.epoch)  # BPE-dropout: this epoch's segmentation
        lengths = self.corpus.lengths("train")
        batches, skipped = token_batches(*lengths, c.max_tokens, c.seed, self.epoch, c.max_len)
        if not batches:
            raise DataError(f"every training pair is longer than --max-len {c.max_len} tokens; raise --max-len")
        if self.batch_in_epoch == 0 and skipped:
            self.log(f"epoch {self.epoch + 1}: skipped {skipped} sentence pairs longer than --max-len {c.max_len}")
        return batches, lengths

    def prepare_corpus(self):
        self.corpus.set_bpe_dropout(self.config.bpe_dropout)
        if self.config.lexicon:
            self.corpus.set_lexicon(self.config.lexicon)

    def forward_loss(self, share):
        """The loss of the training items ``share`` (translation: sentence pairs, teacher-forced)."""
        src, tgt_in, tgt_out = self.corpus.batch("train", share)
        return self.loss_fn(self.logits(src, tgt_in), tgt_out)

    def logits(self, src, tgt_in):
        """The model's logits (B, T, V) of a batch, teacher-forced: the sources ``src`` (B, S) and the decoder's
        inputs ``tgt_in`` (B, T), both padded with pad (the paper's Transformer reads its padding from the ids; a
        kind that extends this trainer may pass its model a mask)."""
        return self.model(src, tgt_in)

    def end_reserve(self):
        """Seconds the end of the run needs (:meth:`WallBudget.end_reserve`)."""
        n_valid = len(self.corpus.text["valid"][0]) if "valid" in self.corpus.text else 0
        n_test = len(self.corpus.text["test"][0]) if "test" in self.corpus.text else 0
        # a third candidate model at the end when validation perplexity has turned up
        candidates = 3 if self.valid_ppl and min(self.valid_ppl.values()) < self.valid_ppl[max(self.valid_ppl)] else 2
        test_cost = self.BEAM_FACTOR if self.config.beam > 1 else 1.0
        return self.budget.end_reserve(n_valid, n_test, test_cost, candidates)

    def _out_of_memory(self, update):
        self.model.clear_saved()
        self.loss_fn.clear_saved()  # its (B, T, V) cache too
        src, tgt_in, _ = self.corpus.batch("train", update[0])  # its shape, for the message
        c = self.config
        return StepOutOfMemory(
            f"out of memory at step {self.step + 1} on a batch of {src.shape[0]} sentences padded to "
            f"{src.shape[1]} source and {tgt_in.shape[1]} target tokens (rank {self.world.rank}, "
            f"{len(update)} batches per update); use a smaller --max-tokens (this run: {c.max_tokens}), "
            f"e.g. --resume {self.run_dir} --max-tokens {max(1, c.max_tokens // 2)}; "
            f"last good checkpoint: {self.last_checkpoint or 'none yet'}")

    def evaluate_loss(self, split):
        """Mean per-token loss and perplexity (unsmoothed NLL) over a split; every rank calls it (a share each)."""
        batches, _ = token_batches(*self.corpus.lengths(split), self.config.max_tokens, seed=0, epoch=0)
        total_loss = total_nll = total_tokens = 0.0
        with inference_mode(self.model):
            for index in batches[self.world.rank::self.world.size]:  # this rank's share
                src, tgt_in, tgt_out = self.corpus.batch(split, index)
                loss = self.loss_fn(self.logits(src, tgt_in), tgt_out)
                total_loss += loss * self.loss_fn.num_tokens
                total_nll += self.loss_fn.nll_sum
                total_tokens += self.loss_fn.num_tokens
        if self.world.size > 1:
            total_loss, total_nll, total_tokens = (float(t) for t in self.world.sum_host(
                [total_loss, total_nll, total_tokens]))
        tokens = max(total_tokens, 1.0)
        return total_loss / tokens, perplexity(total_nll / tokens)

    def decoding(self, beam):
        """The run's decoding settings (BLEU, the end's examples): the paper's rules with ``beam`` and --alpha,
        within the positions the run trains (--max-len, what its checkpoints' ``minitf.load`` gives as their
        context): no output passes --max-len - 1 tokens, and a longer sentence is cut to --max-len tokens with
        its </s> (a run cannot stop at its end: :meth:`validate` counts them)."""
        return DecodingSettings(beam_size=beam, alpha=self.config.alpha, max_positions=self.config.max_len)

    def translate_shared(self, sources, beam):
        """``sources`` translated by every rank together (each takes every size-th), in order on rank 0
        (None elsewhere); every rank calls it."""
        world = self.world
        mine = translate_texts(self.model, self.tokenizer, list(sources[world.rank::world.size]),
                               settings=self.decoding(beam), cut_long=True)
        if world.size == 1:
            return mine
        shares = world.gather_objects(mine)
        if not world.is_root:
            return None
        hypotheses = [None] * len(sources)
        for rank, share in enumerate(shares):
            hypotheses[rank::world.size] = share
        return hypotheses

    def validate(self, bar=None, split="valid", samples=3, model_name=None, bleu_sentences=None, beam=1):
        """Loss, perplexity and (``bleu_sentences`` > 0; None: the run's --bleu-sentences) BLEU with ``beam`` on
        ``split``, logged and written to metrics.jsonl. Every rank evaluates and decodes a share; rank 0 returns
        the record, the others {}."""
        if bleu_sentences is None:
            bleu_sentences = self.config.bleu_sentences
        started = base.clock()
        loss, ppl = self.evaluate_loss(split)
        record = dict(kind=split, step=self.step, loss=round(loss, 5), ppl=round(ppl, 3))
        if model_name is not None:  # the end-of-run candidates: "last", "average of last N", "best"
            record["model"] = model_name
        hypotheses = None
        if bleu_sentences > 0:
            sources, references = (t[:bleu_sentences] for t in self.corpus.text[split])
            hypotheses = self.translate_shared(sources, beam)  # in order on rank 0, None elsewhere
        periodic = split == "valid" and model_name is None
        if periodic:  # every rank: the ranks agree on when the time budget ends training
            self.valid_ppl[self.step] = ppl
            if bleu_sentences > 0:  # times the end's estimate
                self.budget.note_validation(base.clock() - started, len(sources))
        if not self.world.is_root:
            return {}
        if hypotheses is not None:  # corpus BLEU from per-sentence counts, which the end's choice resamples
            stats = bleu_stats(hypotheses, references)
            record.update(bleu=round(bleu_from_stats(stats.sum(axis=0)), 2), bleu_sentences=len(sources), beam=beam)
            cut = int((self.corpus.lengths(split)[0][:len(sources)] > self.config.max_len).sum())
            if split == "test" and self.config.data.get("corpus") == "wmt14-en-de":  # as the field reports it
                from minitf.nmt.bleu import report
                record.update(report(hypotheses, references, lang=self.config.tgt_lang))
        self.metrics.write(**record)
        message = f"step {self.step} {split}: loss {loss:.3f}  ppl {ppl:.2f}" + (
            f"  BLEU {record['bleu']:.2f} ({record['bleu_sentences']} sentences, beam {beam})" if "bleu" in record else "")
        if hypotheses is not None and cut:
            message += (f" ({cut} longer than --max-len {self.config.max_len} tokens were cut to it: raise --max-len "
                        "to translate them whole)")
        for i in range(min(samples, len(sources)) if hypotheses is not None else 0):
            message += f"\n  src: {sources[i]}\n  ref: {references[i]}\n  out: {hypotheses[i]}"
        (bar.write if bar is not None else self.log)(message)
        if model_name is not None and hypotheses is not None:  # for choosing between the end's candidates
            record["bleu_stats"] = stats
        return record

    def finish(self, final):
        """The end of a run. Candidates: the last checkpoint, the average of the last --average (paper
        6.1: 5) of the run's second half and, when validation perplexity has turned up, the best periodic
        validation's. The average is kept unless another candidate is clearly better on validation BLEU (greedy,
        whole set; :meth:`_choose`); best.json names the kept one, reported on the test set with beam search.
        Every rank decodes a share; rank 0 decides and writes."""
        config, run_dir, world = self.config, self.run_dir, self.world
        plan = None
        if world.is_root:
            # first: the last checkpoint, so that a signal during the evaluation leaves a valid choice behind
            write_json_atomic(run_dir / "best.json", {"model": "last", "checkpoint": str(pathlib.Path("checkpoints")
                                                                                        / final.name)})
            recent = ckpt.list_checkpoints(run_dir)[-config.keep:]  # not an older best kept beside them
            checkpoints = recent[-config.average:] if config.average > 1 else []
            # never from the first half of the run: a short run's early models only blur the average
            checkpoints = [p for p in checkpoints if 2 * ckpt.checkpoint_step(p) >= self.step]
            plan = [("last", str(final))]
            if len(checkpoints) > 1:
                averaged = ckpt.average_checkpoints(checkpoints, run_dir / "checkpoints" / "averaged")
                plan.append((f"average of last {len(checkpoints)}", str(averaged)))
            elif config.average > 1:  # asked for, but nothing to average: say why, in one line
                self.log(f"no average of the last {config.average} checkpoints: " + self._why_no_average(recent))
            best_valid = self._best_validated_checkpoint()
            if best_valid is not None and best_valid != final and best_valid not in checkpoints:
                plan.append(("best validation perplexity", str(best_valid)))
            pause_for_tests("end")
        plan = world.bcast_object(plan)  # every rank evaluates the same candidates
        last = self.model.state_dict()
        stats = []
        for name, path in plan:  # pick on validation BLEU (greedy, quick), report test with beam
            self.model.load_state_dict(last if name == "last" else ckpt.read_checkpoint(path)["params"])
            # on the whole validation set: on 200 sentences the choice flipped between identical runs
            record = self.validate(bleu_sentences=len(self.corpus.text["valid"][0]), samples=0, model_name=name)
            self.log(f"  ({name})")
            stats.append(record.get("bleu_stats"))
        chosen = world.bcast_object(self._choose([n for n, _ in plan], stats) if world.is_root else None)
        name, path = plan[chosen]
        self.model.load_state_dict(last if name == "last" else ckpt.read_checkpoint(path)["params"])
        if world.is_root:  # relative to the run folder, so that the run can be moved or used elsewhere
            write_json_atomic(run_dir / "best.json", {"model": name, "checkpoint": str(
                pathlib.Path("checkpoints") / pathlib.Path(path).name)})
        if "test" in self.corpus.text:
            start = time.perf_counter()
            record = self.validate(bleu_sentences=len(self.corpus.text["test"][0]), beam=config.beam, split="test",
                                   samples=5)
            if world.is_root:
                self.log(f"test BLEU {record['bleu']:.2f} with the {name} model (beam {config.beam}, alpha "
                         f"{config.alpha}, {time.perf_counter() - start:.0f} s to translate "
                         f"{record['bleu_sentences']} sentences)")
            if "tokenized_bleu" in record:  # WMT 2014: the paper's Table 2 counts tokenized, compound-split BLEU
                self.log(f"  sacreBLEU {record['sacrebleu']:.2f} ({record['sacrebleu_signature']}); tokenized BLEU "
                         f"with compound splitting {record['tokenized_bleu']:.2f} ({record['tokenized_bleu_tokenizer']}"
                         "; the paper's figure; docs/paper.md says why the two differ)")
        if not world.is_root:
            return
        self.log(f"translate with: python -m minitf.translate --checkpoint {run_dir}")
        examples = self.end_examples()
        if examples:
            outputs = translate_texts(self.model, self.tokenizer, examples, settings=self.decoding(config.beam),
                                      cut_long=True)
            width = max(map(len, examples))
            self.log("for example:\n" + "\n".join(f"  {src:<{width}}  ->  {out}"
                                                  for src, out in zip(examples, outputs)))
        spent = self.budget.elapsed()
        budget = f" (--max-minutes {config.max_minutes:g})" if config.max_minutes is not None else ""
        self.log(f"whole command: {int(spent // 60)} min {int(spent % 60):02d} s wall time{budget}")

    def end_examples(self, count=len(EVERYDAY_GERMAN)):
        """The sentences translated at the end of the run: the everyday German ones where the run's source
        language is German (a Marian folder's tokenizer_config.json's source_lang, else --src-lang), else the
        first ``count`` of the run's own test sources (or validation sources): never German sentences to a
        model of another language pair."""
        language = getattr(self.tokenizer, "config", {}).get("source_lang") or self.config.src_lang
        if str(language).lower() in GERMAN:
            return list(EVERYDAY_GERMAN)
        split = "test" if "test" in self.corpus.text else "valid"
        return [text for text in self.corpus.text.get(split, ([],))[0] if text.strip()][:count]

    def _why_no_average(self, recent):
        """Why the end of the run found fewer than two checkpoints to average (``recent``: the kept ones)."""
        if self.config.keep < 2:
            return (f"--keep {self.config.keep} keeps only the last checkpoint (give --keep at least 2, e.g. "
                    f"--keep {self.config.average})")
        half = sum(2 * ckpt.checkpoint_step(p) >= self.step for p in recent[-self.config.average:])
        return (f"{half} of the kept checkpoints {'is' if half == 1 else 'are'} from the run's second half (steps "
                f"{(self.step + 1) // 2} to {self.step}), and an average takes none from its first; save more "
                f"often than --save-every {self.config.save_every} or train longer")

    def _choose(self, names, stats, confidence=0.95):
        """The index of the kept candidate. The paper keeps the average of the last checkpoints (6.1), so that is
        the default (else the last); the candidate with the best validation BLEU replaces it only when it wins
        in ``confidence`` of the paired bootstrap resamples of the sentences: on 500 sentences BLEU differs
        by about 0.5 between models of the same quality, and a noisy pick cost up to 0.8 test BLEU."""
        default = next((i for i, name in enumerate(names) if name.startswith("average")), 0)
        if any(s is None or not len(s) for s in stats):  # no validation BLEU to compare
            return default
        best = max(range(len(names)), key=lambda i: (bleu_from_stats(stats[i].sum(axis=0)), -i))
        if best == default:
            return default
        wins = bootstrap_wins(stats[best], stats[default], samples=1000)
        self.log(f"  the {names[best]} model has the higher validation BLEU in {100 * wins:.0f}% of 1,000 bootstrap "
                 f"resamples of the sentences: {'kept' if wins >= confidence else 'not enough'} "
                 f"(the {names[default]} model is kept unless {100 * confidence:.0f}%)")
        return best if wins >= confidence else default
