"""The translation kind (``train.py --model transformer``, the default): the paper's encoder-decoder
(:class:`minitf.Transformer`) and the Hugging Face Marian (opus-mt) folders it reads. What the shared machinery
asks of a kind (:class:`minitf.training.kind.Kind`): its presets, its own run-config fields and their checks,
its model and tokenizer from a checkpoint, a Marian folder read whole, and its ``train.py`` task."""
import pathlib

from minitf.nmt import config as config_checks, marian
from minitf.nmt.config import PRESETS, TranslationRunConfig
from minitf.training.kind import TRANSLATION_PAGE, Kind, Loaded


class TranslationKind(Kind):
    name = "transformer"
    title = "translation model"
    hf_model_types = marian.MODEL_TYPES
    hf_what = marian.WHAT
    presets = PRESETS
    run_config = TranslationRunConfig
    page = TRANSLATION_PAGE
    use_a_run = "translate with python -m minitf.translate --checkpoint RUN"
    translates = True

    def task(self):
        from minitf.nmt.task import TranslationTask
        return TranslationTask()

    def translator(self, loaded, prefix=None):
        """The model, its tokenizer and its decoding settings holding its context (a Marian folder's positions, a
        run's --max-len); a ``--prefix`` is refused: the sentence alone is its source."""
        import dataclasses
        from minitf.training.errors import UsageError
        if prefix is not None:
            raise UsageError(f"--prefix is a T5 folder's task prefix; {loaded.source} holds a {self.title}, which "
                             "translates the sentence alone: leave --prefix out")
        return loaded.model, loaded.tokenizer, dataclasses.replace(loaded.decoding, max_positions=loaded.context)

    def validate(self, config):
        config_checks.validate(config)

    def model_config(self, config, vocab_size):
        return config_checks.model_config(config, vocab_size)

    def read_tokenizer(self, data, origin="tokenizer.model"):
        from minitf.nmt.translation_trainer import read_tokenizer
        return read_tokenizer(data, origin)

    def build_model(self, config, vocab_size):
        """The Transformer of a run (a run fine-tuned from a Marian folder: that folder's model)."""
        from minitf.transformer import Transformer
        return Transformer.from_config(self.model_config(config, vocab_size))

    def min_parameters(self, config, vocab_size):
        d, f = config.d_model, config.d_ff  # embeddings, each layer's attentions (4 D x D each) and feed-forward
        return (vocab_size * d + config.num_encoder_layers * (4 * d * d + 2 * d * f)
                + config.num_decoder_layers * (8 * d * d + 2 * d * f))

    def loaded_run(self, model, tokenizer, config, source, checkpoint, meta, run_dir):
        from minitf.nmt.decode import DecodingSettings
        # a run fine-tuned from a Marian folder keeps that folder's config.json: an export writes its entries back
        hf = None if config.marian is None else dict(config.marian["config"])
        return Loaded(model, tokenizer, self, pathlib.Path(source), DecodingSettings(), run_dir, checkpoint, meta,
                      config.max_len, "its training's cap, --max-len: longer sentences were skipped", hf_config=hf)

    def load_folder(self, folder, warn=None):
        """A Marian folder: the tokenizer's files first (a missing one is named before the weights are read),
        checked against config.json by the check of ``train.py --init-from`` (:meth:`MarianTokenizer.check_fits`,
        which :func:`minitf.nmt.marian_tokenizer.check_tokenizer` runs), then the model, then
        generation_config.json's decoding settings. The folder's config.json travels in ``Loaded.hf_config`` and
        its path in ``Loaded.source`` (what :func:`minitf.nmt.marian.save_pretrained` takes to write them back)."""
        from minitf.nmt.decode import DecodingSettings
        from minitf.nmt.marian_tokenizer import MarianTokenizer, read_generation_config
        folder = pathlib.Path(folder)
        tokenizer = MarianTokenizer.from_folder(folder)
        tokenizer.check_fits(marian.read_folder_config(folder)[1], folder)  # before the weights are read
        model, hf = marian.read(folder)  # minitf's own safetensors reader: no package needed
        settings = read_generation_config(folder, hf)
        decoding = DecodingSettings(beam_size=settings.num_beams, alpha=settings.rules.length_penalty,
                                    max_len=settings.max_len, min_len=settings.min_len, rules=settings.rules)
        return Loaded(model, tokenizer, self, folder, decoding, context=marian.max_positions(hf),
                      context_why="its position table, max_position_embeddings", hf_config=hf)

    def writes(self, model):
        from minitf.transformer import Transformer
        return isinstance(model, Transformer)

    def write_model(self, model, folder, hf_config=None):
        """A Marian folder's config.json and weights (:func:`minitf.nmt.marian.save_pretrained`; minitf's BOS and EOS
        where the model's config names none)."""
        from minitf.training.tokenizer import BOS_ID, EOS_ID
        marian.save_pretrained(model, folder, hf_config, decoder_start_id=BOS_ID, eos_id=EOS_ID)

    def write_folder(self, loaded, folder):
        """A Marian folder (:func:`minitf.nmt.export.write_folder`): a run's model and tokenizer, or a Marian folder
        read by minitf.load written back."""
        from minitf.nmt.export import write_folder
        write_folder(loaded, folder)

    # -- what the study tools ask (minitf.study: the shared walk and page numbers of the encoder-decoder)
    def walk(self, tracer, model):
        from minitf.study.walk import translation_walk
        return translation_walk(tracer, model)

    def page_parts(self, model):
        from minitf.study.inspection.numbers import translation_parts
        return translation_parts(model)

    def describe_model(self, model):
        from minitf.study.inspection.numbers import describe_translation
        return describe_translation(model)

    def trace_example(self):
        from minitf.study import tracer, walk
        return tracer.Example(tracer.run, tracer.header, walk.print_walk)

    def trace_loaded(self, loaded, text):
        """The text as source and target; the decoder starts and ends with the model's ids (a Marian folder's),
        else the tokenizer's, as translate decodes."""
        from minitf.study.tracer import translation_example
        config, tokenizer = loaded.model.config, loaded.tokenizer
        start = config.decoder_start_id if config.decoder_start_id is not None else tokenizer.bos_id
        end = config.eos_id if config.eos_id is not None else tokenizer.eos_id
        return translation_example(loaded, text, start, end)


KIND = TranslationKind()
