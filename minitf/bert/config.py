"""The BERT kind's part of the run config (``train.py --model bert``): its presets and its own options, each
declared once (:func:`minitf.training.config.option`), their checks, and the model a run's config describes. A masked language model trained from
scratch on the language models' text (``--train-text``, or the World English Bible), or a Hugging Face BERT,
DistilBERT or RoBERTa folder fine-tuned on it (``--init-from``); or a sequence classifier fine-tuned on labelled
lines (``--train-tsv``: text TAB label), its label names kept as ``labels``."""
import dataclasses

from minitf.bert import hf
from minitf.bert.model import BertConfig, BertForMaskedLM, BertForSequenceClassification
from minitf.lm.config import GROUP as TEXT_GROUP
from minitf.training.config import RunConfig, option
from minitf.training.errors import UsageError

#: The masked LM's presets: BERT's choices (post-LN, exact GELU, learned positions and token types) at a CPU size;
#: ``num_encoder_layers`` is its number of layers.
PRESETS = {
    "tiny": dict(d_model=128, num_heads=4, num_encoder_layers=2, num_decoder_layers=0, d_ff=512, dropout=0.1,
                 pre_norm=False, vocab_size=4000, block_size=128, warmup=400, lr_scale=0.5, max_tokens=2048,
                 label_smoothing=0.0, max_minutes=9.0, eval_every=200, save_every=200, keep=5, average=0),
}
GROUP = "the masked language model (--model bert)"


@dataclasses.dataclass
class BertRunConfig(RunConfig):
    """A ``--model bert`` run's config: sequences of at most ``block_size`` tokens, the share of them masked, and
    a fine-tuned folder's config.json (``bert``, from --init-from)."""
    block_size: int = option(128, "tokens per training sequence ([CLS] and [SEP] included), the model's positions",
                             model=True, type="positive int", group=TEXT_GROUP)
    tokenizer: str = option("wordpiece", flag=False)  # a WordPiece vocabulary of the training text, or "pretrained"
    mask_prob: float = option(0.15, "share of each sequence's tokens that carry the loss, drawn anew every step from "
                              "(seed, step, sequence, position): 80%% become [MASK], 10%% a random token, 10%% stay "
                              "({default})", type="float", group=GROUP)  # %% : argparse's help
    # a run written before the option existed computed none: absent means 0
    attention_dropout: float | None = option(None, "dropout on the attention weights (BERT's "
                                             "attention_probs_dropout_prob; default: --dropout's value)",
                                             type="float", group=GROUP, absent=0.0)
    # from a Hugging Face BERT, DistilBERT or RoBERTa folder: its config.json, kept so that the run needs the folder
    # no more (its model is built from it, an export writes it again)
    bert: dict | None = option(None, flag=False, model=True)
    # a sequence classifier's label names, label i's at index i (the training TSV's labels in sorted order: its
    # config.json's id2label); None: the masked LM
    labels: list | None = option(None, flag=False, model=True)


def validate(config):
    """Refuse (one line naming the flag or key) what does not fit in a masked-LM run's own fields."""
    if config.num_encoder_layers < 1:
        raise UsageError(f"--num-encoder-layers must be a positive integer (BERT's layers), got "
                         f"{config.num_encoder_layers!r}")
    if config.tokenizer not in ("wordpiece", "pretrained"):
        raise UsageError(f"a --model bert run's tokenizer is 'wordpiece' or 'pretrained', got {config.tokenizer!r}")
    if config.attention_dropout is not None and not 0.0 <= config.attention_dropout < 1.0:
        raise UsageError(f"--attention-dropout must be in [0, 1), got {config.attention_dropout}")
    if not (isinstance(config.mask_prob, float) and 0.0 < config.mask_prob < 1.0):
        raise UsageError(f"--mask-prob must be a share in (0, 1) (BERT: 0.15), got {config.mask_prob!r}")
    if not (isinstance(config.block_size, int) and config.block_size >= 3):
        raise UsageError(f"--block-size must be at least 3 ([CLS], one token, [SEP]), got {config.block_size!r}")
    labels = config.labels
    if labels is not None and not (isinstance(labels, list) and len(labels) >= 2
                                   and all(isinstance(name, str) and name for name in labels)
                                   and len(set(labels)) == len(labels)):
        raise UsageError(f"a classifier's labels are at least two different non-empty names, got {labels!r}")


def run_model_config(config, vocab_size, pad_id=0):
    """The :class:`BertConfig` of a ``--model bert`` run: a fine-tuned folder's (its config.json, kept in the run as
    ``bert``) with the run's dropouts (``dropout``; ``attention_dropout``, None: dropout's), or the run's sizes:
    ``num_encoder_layers`` layers, ``block_size`` positions, BERT's two token types, [PAD] ``pad_id``; a
    classifier's with its ``labels`` (id2label)."""
    if config.bert is not None:
        model = hf.config_from_hf(config.bert, "config.json's \"bert\"").replace(
            dropout=config.dropout, attention_dropout=config.attention_dropout)
    else:
        model = BertConfig(vocab_size=vocab_size, d_model=config.d_model, num_heads=config.num_heads,
                           num_layers=config.num_encoder_layers, d_ff=config.d_ff,
                           max_position_embeddings=config.block_size, dropout=config.dropout,
                           attention_dropout=config.attention_dropout, pad_token_id=pad_id)
    if config.labels is not None:
        model = model.replace(num_labels=len(config.labels), id2label=tuple(config.labels))
    return model


def build_run_model(config, vocab_size, pad_id=0):
    """The model a ``--model bert`` run trains (:func:`run_model_config`): a sequence classifier where the run has
    ``labels`` (--train-tsv), else the masked LM."""
    model_class = BertForMaskedLM if config.labels is None else BertForSequenceClassification
    return model_class(run_model_config(config, vocab_size, pad_id))


def pretrained_state(folder, labels=None):
    """``{minitf name: host array}`` of what the --init-from ``folder`` gives a run's model: the masked LM's
    (``labels`` None) or a classifier's of ``labels``. Its encoder always; its pooler where it has one; its head
    where it is the run's own (a masked LM's; a classifier's of the same label names): the rest of the model keeps
    its new values, as transformers' from_pretrained leaves a new head."""
    config, head, _ = hf.pretrained_config(folder)
    if labels is None:
        return hf.read_pretrained_state(folder, config, "masked_lm", head)
    if head == "classification":  # the folder's own classifier: kept only where it names the run's labels
        state = hf.read_pretrained_state(folder, config, "classification")
        same = config.labels == tuple(labels)
        return {name: array for name, array in state.items() if same or not name.startswith("classifier.")}
    return hf.read_pretrained_state(folder, config.replace(num_labels=len(labels), id2label=tuple(labels)),
                                    "classification", head)


def read_run_pretrained(config, model):
    """``{minitf name: host array}`` of a fine-tuning run's --init-from folder for its whole ``model``
    (:func:`pretrained_state`; the parts the folder does not give keep ``model``'s new values)."""
    return dict(model.state_dict(), **pretrained_state(config.init_from, config.labels))
