"""The BERT kind (the registry's "bert"): Hugging Face BERT, DistilBERT and RoBERTa folders read whole by
``minitf.load(FOLDER)`` (:meth:`BertKind.load_folder`: the model their config.json's architecture names and their
tokenizer), used by ``python -m minitf.fill_mask`` (a masked LM) and ``python -m minitf.classify`` (a sequence
classifier); ``train.py --model bert`` trains the masked LM on the language models' text (:mod:`minitf.bert.task`)
and its runs load as the folders do; a run or a folder is written back as such a folder by ``python -m
minitf.export`` (:meth:`write_folder`)."""
import pathlib

from minitf.bert import hf
from minitf.bert.config import PRESETS, BertRunConfig, build_run_model, validate
from minitf.bert.model import BertForMaskedLM, BertForSequenceClassification
from minitf.training.errors import DataError, UsageError
from minitf.training.kind import Kind, Loaded, Page


class BertKind(Kind):
    name = "bert"
    title = "BERT encoder"
    hf_model_types = hf.FAMILY
    hf_what = hf.BERT_FOLDER
    extends = ("gpt",)  # its runs read the language models' text (minitf.lm.task's flags, files, default text)
    presets = PRESETS
    run_config = BertRunConfig
    #: One text with [MASK]: attention in both directions, each mask's candidates, the gradient to every token.
    page = Page("encoder", loss_name="masked-token cross-entropy", text_label="text with [MASK]",
                score_caption="exp(validation masked-token cross-entropy): lower is better.",
                no_reference="a masked LM scores the text's own masks on its top candidates")
    use_a_run = ("fill its masks with python -m minitf.fill_mask --checkpoint RUN --text '... [MASK] ...' (a "
                 "classifier: python -m minitf.classify --checkpoint RUN --text '...')")

    def task(self):
        from minitf.bert.task import BertTask
        return BertTask()

    def validate(self, config):
        validate(config)

    def read_tokenizer(self, data, origin="tokenizer.model"):
        from minitf.bert.tokenizer import from_bytes
        return from_bytes(data, origin)

    def build_model(self, config, vocab_size):
        return build_run_model(config, vocab_size)

    def min_parameters(self, config, vocab_size):
        d, f = config.d_model, config.d_ff  # the word embeddings, each layer's attention (4 D x D) and feed-forward
        return vocab_size * d + config.num_encoder_layers * (4 * d * d + 2 * d * f)

    def loaded_run(self, model, tokenizer, config, source, checkpoint, meta, run_dir):
        """A run's masked LM (a fine-tuned folder's config.json travels in ``hf_config``: an export writes its other
        entries back)."""
        return Loaded(model, tokenizer, self, pathlib.Path(source), None, run_dir, checkpoint, meta,
                      model.config.positions, "its positions", hf_config=config.bert)

    def writes(self, model):
        from minitf.bert.model import BertModel
        return isinstance(model, (BertModel, BertForMaskedLM, BertForSequenceClassification))

    def write_model(self, model, folder, hf_config=None):
        hf.save_pretrained(model, folder, hf_config)

    def command_for(self, model):
        """The command that uses ``model``: fill_mask for a masked LM, classify for a classifier."""
        if isinstance(model, BertForSequenceClassification):
            return "python -m minitf.classify"
        if isinstance(model, BertForMaskedLM):
            return "python -m minitf.fill_mask"
        return None

    def load_folder(self, folder, warn=None):
        """A BERT, DistilBERT or RoBERTa folder: config.json first (every value checked), then the tokenizer's
        files (:func:`minitf.bert.tokenizer.read_tokenizer`), then the weights, read as the model its
        architectures names (:func:`minitf.bert.hf.from_pretrained`)."""
        folder = pathlib.Path(folder)
        config, _, hf_config = hf.pretrained_config(folder)   # every config value checked first
        try:
            from minitf.bert.tokenizer import read_tokenizer
        except ImportError as error:
            raise DataError(f"reading a {hf.BERT_FOLDER}'s tokenizer needs minitf.bert.tokenizer, which this minitf "
                            f"does not have ({error})") from None
        tokenizer = read_tokenizer(folder, hf_config)          # then the tokenizer, before the weights are read
        model = hf.from_pretrained(folder).eval()
        if tokenizer.vocab_size > config.vocab_size:
            raise ValueError(f"{folder}: its tokenizer has {tokenizer.vocab_size} tokens and its model "
                             f"{config.vocab_size}; they do not belong together: copy the model's own tokenizer")
        return Loaded(model, tokenizer, self, folder, None, context=config.positions,
                      context_why="its max_position_embeddings", hf_config=hf_config)

    # -- what the study tools ask (python -m minitf.trace and minitf.inspect find them here: minitf.bert.study)
    def walk(self, tracer, model):
        from minitf.bert.study import bert_walk
        return bert_walk(tracer, model)

    def page_parts(self, model):
        from minitf.bert.study import page_parts
        return page_parts(model)

    def describe_model(self, model):
        from minitf.bert.study import describe
        return describe(model)

    def trace_loaded(self, loaded, text):
        from minitf.bert.study import trace_loaded
        return trace_loaded(loaded, text)

    def trace_example(self):
        from minitf.bert.study import trace_example
        return trace_example()

    def write_folder(self, loaded, folder):
        """``loaded`` written as a Hugging Face folder (config.json, model.safetensors: :func:`minitf.bert.hf.
        save_pretrained`, keeping the entries of the config.json it was read from) and its tokenizer's files."""
        if not hasattr(loaded.tokenizer, "save"):
            raise UsageError(f"{loaded.source}: its tokenizer ({type(loaded.tokenizer).__name__}) has no Hugging Face "
                             "files to write (nothing was written)")
        hf.save_pretrained(loaded.model, folder, loaded.hf_config)
        loaded.tokenizer.save(folder)


KIND = BertKind()


def load_bert(path, model_class, command, device=None):
    """The :class:`Loaded` BERT-family model of a command's ``--checkpoint PATH`` on ``--device`` (None:
    MINITF_DEVICE, checked) (:func:`minitf.loader.load`, this kind only: another kind's model is refused naming its
    command) whose model is a ``model_class``; a model of the other head is refused in one line naming
    ``command``'s counterpart. Skipped damaged checkpoints are said on stderr."""
    import sys
    from minitf import backend
    from minitf.loader import load
    if device:
        backend.set_device(device)
    else:
        backend.check_environment()  # a bad MINITF_DEVICE: one line, not a traceback
    loaded = load(path, lambda message: print(message, file=sys.stderr), kind=KIND)
    if not isinstance(loaded.model, model_class):
        other = KIND.command_for(loaded.model)
        what = {"python -m minitf.classify": "a sequence classifier", "python -m minitf.fill_mask": "a masked "
                "language model"}.get(other, f"a {type(loaded.model).__name__} (no head)")
        raise UsageError(f"{path} holds {what}, which {command} does not use"
                         + (f": give it to {other} --checkpoint {path}" if other else
                            "; give a folder whose architectures is a masked LM or a sequence classifier"))
    return loaded
