"""The T5 kind (the registry's "t5"): Hugging Face T5 and mT5 folders (t5 v1.0, v1.1, flan-t5, mT5) read whole by
``minitf.load(FOLDER)`` (:meth:`T5Kind.load_folder`): the model, its tokenizer and the folder's task prefixes
(config.json's ``task_specific_params``: "translate English to German: " ...). It translates (``python -m
minitf.translate``: :meth:`T5Kind.translator`, the decoders of the translation kind it extends); ``train.py --model
t5`` fine-tunes a folder on parallel text (:mod:`minitf.t5.task`). What it read is written back as such a folder by ``minitf.save_pretrained`` (:meth:`T5Kind.write_folder`; a bare model: :meth:`T5Kind.write_model`)."""
import dataclasses
import pathlib

from minitf.t5 import hf
from minitf.t5.config import PRESETS, T5RunConfig
from minitf.t5.prefix import choose_prefix, task_prefixes
from minitf.training.kind import TRANSLATION_PAGE, Kind, Loaded

#: The inspection page of a T5: the translation page's (a source and its target, the attentions of an
#: encoder-decoder), scored by plain cross-entropy; a run's validation score its BLEU where it has one.
T5_PAGE = dataclasses.replace(TRANSLATION_PAGE, loss_name="cross-entropy", text_label="input")


def generate_settings(folder, hf_config):
    """The decoding settings of transformers' ``generate`` for a T5 folder: its generation_config.json (else
    config.json's entries, else generate()'s defaults: greedy, 20 new tokens) as a Marian folder's are read
    (:func:`minitf.nmt.marian_tokenizer.read_generation_config`), with T5's rule that pad, its decoder start, may be
    generated (``HuggingFaceRules.generates_pad``). A config.json's task_specific_params are not applied (generate
    does not; transformers' pipelines do)."""
    from minitf.nmt.decode import DecodingSettings
    from minitf.nmt.marian_tokenizer import read_generation_config
    settings = read_generation_config(folder, hf_config)
    return DecodingSettings(beam_size=settings.num_beams, alpha=settings.rules.length_penalty,
                            max_len=settings.max_len, min_len=settings.min_len,
                            rules=dataclasses.replace(settings.rules, generates_pad=True))


class T5Kind(Kind):
    name = "t5"
    title = "text-to-text model"
    extends = ("transformer", "gpt")  # the translation kind's decoding and trainer; the language models' text
    translates = True
    answers = True  # python -m minitf.generate: the prompt in, the answer out (answerer)
    hf_model_types = hf.FAMILY
    hf_what = hf.T5_FOLDER
    presets = PRESETS
    run_config = T5RunConfig
    page = T5_PAGE  # the translation page's source and target, with the position bias by distance (page_parts)
    use_a_run = ("answer a prompt with python -m minitf.generate --checkpoint RUN --prompt TEXT, translate with "
                 "python -m minitf.translate --checkpoint RUN, or look inside with python -m minitf.inspect "
                 "--checkpoint RUN --text TEXT")

    def task(self):
        from minitf.t5.task import T5Task
        return T5Task()

    def validate(self, config):
        from minitf.t5.config import validate_run
        validate_run(config)

    def read_tokenizer(self, data, origin="tokenizer.model"):
        """A T5 run's tokenizer.model (:func:`minitf.t5.tokenizer.run_bytes`), as the run's batches saw it (its
        sha256 the run's; no prefix: the run's config.json holds it)."""
        from minitf.t5.tokenizer import PrefixedTokenizer, from_run_bytes
        return PrefixedTokenizer(from_run_bytes(data, origin), "")

    def build_model(self, config, vocab_size):
        from minitf.t5.trainer import run_model_config
        from minitf.t5.model import T5
        return T5(run_model_config(config))

    def min_parameters(self, config, vocab_size):
        d, f = config.d_model, config.d_ff  # the embedding, each block's attentions and feed-forward
        return (vocab_size * d + config.num_encoder_layers * (4 * d * d + 2 * d * f)
                + config.num_decoder_layers * (8 * d * d + 2 * d * f))

    def loaded_run(self, model, tokenizer, config, source, checkpoint, meta, run_dir):
        """A T5 run's checkpoint: its model, its folder's tokenizer, ``generate``'s decoding with the run's --beam,
        and its folder's config.json whose task prefix is the run's (translate and an export read it there)."""
        from minitf.t5.trainer import run_decoding
        hf_config = dict(config.t5, task_specific_params={"translation": {"prefix": config.prefix or ""}})
        positions = config.t5.get("n_positions")
        return Loaded(model, tokenizer.tokenizer, self, pathlib.Path(source), run_decoding(config.beam), run_dir,
                      checkpoint, meta, positions, "its n_positions" if positions else "", hf_config=hf_config)

    def translator(self, loaded, prefix=None):
        """The model, its tokenizer putting the task prefix before each sentence (:func:`choose_prefix` of
        ``--prefix`` and the folder's task_specific_params), and generate()'s settings (:func:`generate_settings`)
        holding its n_positions: a longer source, prefix and eos included, is refused naming its line."""
        from minitf.t5.tokenizer import PrefixedTokenizer
        chosen = choose_prefix(task_prefixes(loaded.hf_config), prefix, loaded.source)
        tokenizer = PrefixedTokenizer(loaded.tokenizer, chosen) if chosen else loaded.tokenizer
        return loaded.model, tokenizer, dataclasses.replace(loaded.decoding, max_positions=loaded.context)

    def answerer(self, loaded, beam=None, max_new_tokens=None):
        """The translator's model, tokenizer and settings (:meth:`translator`) with no task prefix: the prompt is
        the encoder's whole input (flan-t5 reads any instruction), answered one at a time by the translation kind's
        decoders (:func:`minitf.nmt.decode.translate_texts`: greedy, or ``beam``), as ``generate`` does by the
        folder's generation_config.json where no flag is given."""
        import types
        from minitf.nmt.decode import translate_texts
        from minitf.nmt.translate import decoding
        model, tokenizer, settings = self.translator(loaded, prefix="")
        flags = types.SimpleNamespace(beam=beam, alpha=None, max_new_tokens=max_new_tokens)
        settings = decoding(settings, flags, loaded.context_why)
        return lambda prompts, where: translate_texts(model, tokenizer, prompts, batch_size=1, settings=settings,
                                                      where=where, why=loaded.context_why)

    def load_folder(self, folder, warn=None):
        """A T5 or mT5 folder: config.json checked, then the tokenizer (its presence and its ids against the model's
        vocabulary, before the weights are read), then the weights. ``Loaded.hf_config`` carries config.json (its
        task prefixes: :func:`task_prefixes`); ``context`` its n_positions where it names one."""
        from minitf.t5.model import T5
        from minitf.t5.tokenizer import read_tokenizer
        folder = pathlib.Path(folder)
        config, hf_config = hf.pretrained_config(folder)
        task_prefixes(hf_config)
        tokenizer = read_tokenizer(folder, config)
        decoding = generate_settings(folder, hf_config)
        model = T5.from_pretrained(folder).eval()
        return Loaded(model, tokenizer, self, folder, decoding, context=config.n_positions,
                      context_why="its n_positions" if config.n_positions else "", hf_config=hf_config)

    def write_folder(self, loaded, folder):
        """``loaded`` written as a Hugging Face T5 folder: config.json (the entries of the one it was read from kept:
        its task prefixes), generation_config.json and model.safetensors (:func:`minitf.t5.hf.save_pretrained`), then
        its tokenizer's files (spiece.model and tokenizer_config.json's extra_ids, or tokenizer.json)."""
        hf.save_pretrained(loaded.model, folder, loaded.hf_config)
        loaded.tokenizer.save(folder)

    def writes(self, model):
        from minitf.t5.model import T5
        return isinstance(model, T5)

    def write_model(self, model, folder, hf_config=None):
        hf.save_pretrained(model, folder, hf_config)

    def describe_model(self, model):
        c = model.config
        feed_forward = f"gated {c.activation}" if c.gated else c.activation
        output = f"{'tied' if c.tie_word_embeddings else 'own'} output"
        output += " x d_model^-0.5" if c.scale_decoder_outputs else ""
        return ("T5", "pre-norm RMSNorm",
                f"T5 (encoder-decoder), {c.num_layers} + {c.num_decoder_layers} blocks, d_model {c.d_model}, "
                f"{c.num_heads} heads of {c.d_kv}, {feed_forward} d_ff {c.d_ff}, relative positions "
                f"({c.relative_attention_num_buckets} buckets to {c.relative_attention_max_distance}), {output}")

    def page_parts(self, model):
        from minitf.t5.study import page_parts
        return page_parts(model)

    def trace_loaded(self, loaded, text):
        """The text as source and target, the decoder starting from the model's start id and ending with its eos,
        as transformers' T5 is trained (the encoder's own eos is what the tokenizer leaves for the caller)."""
        from minitf.study.tracer import translation_example
        config = loaded.model.config
        return translation_example(loaded, text, config.decoder_start_token_id, config.eos_token_id)


KIND = T5Kind()
