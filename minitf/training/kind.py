"""What a model kind tells the shared machinery (:class:`Kind`), and what the one loader returns
(:class:`Loaded`). A kind's package defines one ``KIND`` (its module is named in :mod:`minitf.kinds`); the
run config, the checkpoint reader, the ``train.py`` command, :func:`minitf.loader.load` and the study tools ask
it, and branch on nothing else. Its ``train.py`` part is its :class:`minitf.training.task.Task` (``task()``)."""
import dataclasses
import pathlib

from minitf.training.config import RunConfig, own_options


@dataclasses.dataclass(frozen=True)
class Page:
    """What ``python -m minitf.inspect`` draws for a kind and what it calls things: a kind's :attr:`Kind.page`.
    ``layout``: the page's drawing ("translation": a source, its translation and cross-attention; "gpt": one text,
    each next token); ``pairs``: it reads a sentence and its translation (a ``--reference`` may be given); the run's
    curves' ``loss_name`` and validation ``score`` (a metrics.jsonl key) with its name and caption; ``text_label``:
    the page's text box; ``no_reference``: why a reference is refused where the page takes none."""
    layout: str
    pairs: bool = False
    loss_name: str = "cross-entropy"
    score: str = "ppl"
    score_name: str = "perplexity (validation)"
    score_caption: str = "exp(validation cross-entropy): lower is better."
    text_label: str = "text"
    no_reference: str = ""


#: The page of a model that continues one text (the GPT, the Llama family).
NEXT_TOKEN_PAGE = Page("gpt", no_reference="a language model scores the text's own next tokens")
#: The page of a translation model.
TRANSLATION_PAGE = Page("translation", pairs=True, loss_name="label-smoothed cross-entropy", score="bleu",
                        score_name="BLEU (validation)", text_label="sentence",
                        score_caption="Corpus BLEU of the run's validation sentences, translated by the model of that "
                                      "step.")


@dataclasses.dataclass
class Loaded:
    """A model ready to use, from any folder the loader reads: ``model`` (in eval mode), its ``tokenizer``, its
    ``decoding`` settings (the kind's: a translation model's :class:`minitf.nmt.decode.DecodingSettings`, a
    language model's None), ``kind`` (the :class:`Kind`), where it came from (``source``; ``run_dir`` the run
    folder whose metrics.jsonl holds its curves, or None for a Hugging Face folder; ``checkpoint`` the folder read
    and its ``meta``, or None), ``context``: its longest input in tokens and why (for the study tools), and ``hf_config``: a Hugging Face
    folder's config.json as read (None for a run)."""
    model: object
    tokenizer: object
    kind: object
    source: pathlib.Path
    decoding: object = None
    run_dir: pathlib.Path | None = None
    checkpoint: pathlib.Path | None = None
    meta: dict | None = None
    context: int | None = None
    context_why: str = ""
    #: A Hugging Face folder's config.json as read (its entries minitf does not compute are written back by an
    #: export), or None for a minitf run.
    hf_config: dict | None = None

    @property
    def step(self):
        """The training step of the checkpoint read (None for a Hugging Face folder)."""
        return None if self.meta is None else self.meta.get("step")


class Kind:
    """One model kind: the class attributes describe it, the methods build and read it. Subclasses:
    :class:`minitf.nmt.kind.TranslationKind`, :class:`minitf.lm.kind.LanguageModelKind`."""
    #: ``train.py --model``'s value and the registry's key.
    name = None
    #: What it is called in a sentence ("translation model").
    title = None
    #: The kinds (their names) whose packages this kind's package builds on (the Llama family on the language
    #: model's task and trainer); every other kind's package it never imports (tests/test_architecture.py).
    extends = ()
    #: The ``model_type`` values of Hugging Face config.json files it reads (``minitf.load(FOLDER)``).
    hf_model_types = ()
    #: What its Hugging Face folders are called in a sentence ("Hugging Face Marian folder").
    hf_what = ""
    #: The presets of ``--preset`` for this kind: {name: {RunConfig field: value}}.
    presets = {}
    #: Its run config: :class:`minitf.training.config.RunConfig` and its own fields, each declared once with its
    #: flag, help, resume rule and whether it shapes the model (:func:`minitf.training.config.option`); the
    #: parser, --resume's rules, config.json and the refusal of another kind's flags derive from it.
    run_config = RunConfig

    @property
    def config_fields(self):
        """The run-config fields only this kind has: its config.json records them, another kind's never does."""
        return tuple(own_options(self.run_config))

    @property
    def model_fields(self):
        """Of those, the fields that shape its model (a checkpoint fits a run only if they agree)."""
        return tuple(name for name, f in own_options(self.run_config).items() if f.metadata["model"])
    #: What ``python -m minitf.inspect`` draws for it and what the page calls things (a :class:`Page`), or None.
    page = None
    #: The command that uses a run of this kind (said when another command is given one).
    use_a_run = ""
    #: Whether its models continue text (``python -m minitf.generate`` samples them with
    #: :func:`minitf.sampling.generate`: ``model(ids, cache=, start=)``, ``vocab_size``, ``position_limit``).
    generates = False
    #: Whether its models translate (``python -m minitf.translate`` decodes them as :meth:`translator` says).
    translates = False
    #: Whether its models answer a prompt with an encoder-decoder (``python -m minitf.generate``: the encoder reads
    #: the prompt, the decoder writes the answer, as :meth:`answerer` says), where :attr:`generates` is False.
    answers = False

    def task(self):
        """Its part of the ``train.py`` command (a :class:`minitf.training.task.Task`)."""
        raise NotImplementedError

    def translator(self, loaded, prefix=None):
        """(model, tokenizer, decoding settings) with which ``python -m minitf.translate`` translates ``loaded`` (a
        kind that :attr:`translates`); ``prefix``: its ``--prefix`` (None: not given), refused in one line where
        this kind's models take none or the model does not name it."""
        raise NotImplementedError

    def answerer(self, loaded, beam=None, max_new_tokens=None):
        """``answer(prompts, where) -> answers`` with which ``python -m minitf.generate`` answers prompts with
        ``loaded`` (a kind that :attr:`answers`): each prompt is the encoder's whole input, each answer the
        decoder's text; ``beam``, ``max_new_tokens``: its flags (None: the model's own settings); ``where(i)`` names
        prompt i in a one-line error (every prompt is checked before the first is answered)."""
        raise NotImplementedError

    def validate(self, config):
        """Refuse (a one-line UsageError naming the flag or key) what does not fit in ``config``'s own fields."""

    def read_tokenizer(self, data, origin="tokenizer.model"):
        """The tokenizer kept in a checkpoint's tokenizer.model (``data``: its bytes)."""
        raise NotImplementedError

    def build_model(self, config, vocab_size):
        """The model a run of ``config`` trains, for a tokenizer of ``vocab_size`` ids."""
        raise NotImplementedError

    def min_parameters(self, config, vocab_size):
        """A lower bound of the parameters of :meth:`build_model`'s model (weights only), computed without
        building it: a checkpoint whose model.npz is too small for them is refused before any memory is asked."""
        raise NotImplementedError

    def loaded_run(self, model, tokenizer, config, source, checkpoint, meta, run_dir):
        """The :class:`Loaded` of a checkpoint of this kind (model and tokenizer read and checked)."""
        raise NotImplementedError

    # -- what the study tools ask (they import no kind: python -m minitf.trace and minitf.inspect find it here)
    def walk(self, tracer, model):
        """The backward walk of ``model`` (a :class:`minitf.study.walk.Walk`) from the records of ``tracer``."""
        raise NotImplementedError(f"no backward walk for a --model {self.name} model")

    def page_parts(self, model):
        """What the inspection page reads of ``model``: a :class:`minitf.study.inspection.numbers.Parts` (its walk,
        its attention modules, its embedding), for the page :attr:`page` names."""
        raise NotImplementedError(f"no inspection page for a --model {self.name} model")

    def describe_model(self, model):
        """(its name on the page, its layout, its shape in one line) for the inspection page's header."""
        raise NotImplementedError

    def trace_example(self):
        """``python -m minitf.trace --model NAME``'s example (a :class:`minitf.study.tracer.Example`), or None
        where this kind has none."""
        return None

    def trace_loaded(self, loaded, text):
        """``python -m minitf.trace --checkpoint PATH``'s example of ``loaded`` (a model of this kind, widened to
        float64): a :class:`minitf.study.tracer.Example` of one forward and backward of ``text`` (tokenized by
        ``loaded.tokenizer``, cut to a few tokens); a kind without one refuses in one line."""
        from minitf.training.errors import UsageError
        raise UsageError(f"{loaded.source} holds a --model {self.name} model, which python -m minitf.trace does "
                         f"not trace yet; {self.use_a_run.replace('RUN', str(loaded.source))}")

    def write_folder(self, loaded, folder):
        """Write ``loaded`` (a run, checkpoint or Hugging Face folder of this kind, :class:`Loaded`) as a Hugging Face
        folder into the new or empty ``folder``: its model, config.json (a folder's other entries kept), generation
        settings and tokenizer (:func:`minitf.save_pretrained`, ``python -m minitf.export``); what cannot be one
        is refused in one line before anything is written."""
        from minitf.training.errors import UsageError
        raise UsageError(f"{loaded.source} is a --model {self.name} run, which minitf does not export to a Hugging "
                         f"Face folder: {self.use_a_run}")

    def writes(self, model):
        """Whether ``model`` is one of this kind's models (:meth:`write_model` writes it)."""
        return False

    def write_model(self, model, folder, hf_config=None):
        """Write the bare ``model`` (no tokenizer) as a Hugging Face folder: config.json (``hf_config``'s other
        entries kept) and its weights, through its format's ``save_pretrained``."""
        raise NotImplementedError

    def load_folder(self, folder, warn=None):
        """The :class:`Loaded` of a Hugging Face folder of one of :attr:`hf_model_types`: every value checked
        before the model is built; a one-line ValueError, DataError or UsageError names the file and key."""
        raise NotImplementedError
