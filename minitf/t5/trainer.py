"""Fine-tuning T5 with the shared trainer: :class:`T5Trainer` is the translation kind's trainer
(:class:`minitf.nmt.translation_trainer.TranslationTrainer`: token-count batches of sentence pairs, validation loss,
perplexity and BLEU, the end of the run) with T5's model: the sources (the task prefix before each, the eos after)
read under their padding mask, the decoder fed T5's start (its pad, id 0) and the target, the loss plain
cross-entropy over the target tokens and their eos (teacher forcing; pad ignored), and validation's translations
decoded as transformers' ``generate`` does (:func:`run_decoding`)."""
from minitf.nmt.decode import DecodingSettings, HuggingFaceRules
from minitf.nmt.translation_trainer import TranslationTrainer
from minitf.t5 import hf
from minitf.training.errors import UsageError


def run_decoding(beam, max_positions=None):
    """A T5 run's decoding settings: ``generate``'s rules (length_penalty 1, pad allowed: it is T5's decoder start)
    with ``beam``, up to the source's length + 50 tokens."""
    return DecodingSettings(beam_size=beam, alpha=1.0, min_len=0, rules=HuggingFaceRules(generates_pad=True),
                            max_positions=max_positions)


def run_model_config(config):
    """The :class:`T5Config` of a ``--model t5`` run: its folder's (config.json kept as ``t5``) with the run's
    dropout."""
    if config.t5 is None:
        raise UsageError("a --model t5 run starts from a T5 folder (--init-from FOLDER); its config.json holds none")
    return hf.config_from_hf(config.t5, "config.json's \"t5\"").replace(
        dropout_rate=config.dropout, tie_word_embeddings=config.t5.get("tie_word_embeddings", True) is not False)


def read_run_pretrained(config, model):
    """``{minitf name: host array}`` of a run's --init-from folder (the model's shape is the run's: ``model``)."""
    return hf.read_pretrained(config.init_from)[1]


class T5Trainer(TranslationTrainer):
    """A run of ``python train.py --model t5``: ``corpus`` is a :class:`minitf.nmt.data.Corpus` whose tokenizer puts
    the run's prefix before each source (:class:`minitf.t5.tokenizer.PrefixedTokenizer`)."""

    def build_model(self):
        from minitf.t5.model import T5
        return T5(run_model_config(self.config))

    def read_pretrained(self):
        return read_run_pretrained(self.config, self.model)

    def logits(self, src, tgt_in):
        """T5 reads its sources under their padding mask (True: pad after the eos), not from the ids."""
        return self.model(src, tgt_in, key_padding_mask=src == self.tokenizer.pad_id)

    def decoding(self, beam):
        return run_decoding(beam, self.config.max_len)
