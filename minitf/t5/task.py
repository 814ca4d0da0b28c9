"""``train.py --model t5``: a Hugging Face T5 folder fine-tuned on parallel text (``--init-from FOLDER --train-src S
--train-tgt T --valid-src ... --valid-tgt ...``, the translation task's files), the task prefix put before each
source (``--prefix``, default the folder's first translation task's). The folder's config.json and tokenizer are
kept in the run (it needs the folder no more); the trainer is :class:`minitf.t5.trainer.T5Trainer`. Without
--init-from: T5 from scratch with span corruption on the language models' text (:mod:`minitf.t5.scratch`)."""
from minitf import backend, kinds
from minitf.nmt.data import Corpus, read_splits
from minitf.nmt.task import TranslationTask, given_files, new_run_data
from minitf.pretrained import model_type, weights_path
from minitf.t5 import hf
from minitf.t5.prefix import choose_prefix, task_prefixes
from minitf.t5.tokenizer import PrefixedTokenizer, from_run_bytes, read_tokenizer
from minitf.t5.trainer import T5Trainer
from minitf.training.errors import DataError, UsageError
from minitf.training.task import RunData, Task, before_training, log, refuse_with_init_from

#: The flags that would contradict --init-from's folder (it fixes the model's shape and the tokenizer).
PRETRAINED_FIXED = ("d_model", "num_heads", "num_layers", "num_encoder_layers", "num_decoder_layers", "d_ff",
                    "pre_norm", "vocab_size")


def run_tokenizer(tokenizer, config):
    """The tokenizer a T5 run's batches and validation use: the prefix before each source, T5's start token."""
    start = config.t5.get("decoder_start_token_id", config.t5.get("pad_token_id", 0))
    return PrefixedTokenizer(tokenizer, config.prefix or "", bos_id=start)


class T5Task(TranslationTask):
    name = "t5"
    title = "T5"
    description = "T5 fine-tuned on parallel text (its task prefix before each source)"
    summary = "T5 (minitf.t5): a Hugging Face T5 folder fine-tuned on parallel text (--init-from)"
    presets_help = "--model t5: tiny (fine-tuning on a CPU)"
    trainer = T5Trainer
    pretrained = "T5"
    init_from_help = ("fine-tune a Hugging Face T5, flan-t5 or mT5 folder (config.json, model.safetensors, spiece.model "
                      "or tokenizer.json) on --train-src ...: its model, weights and tokenizer kept in the run")

    def add_arguments(self, parser):
        """The translation task's files (fine-tuning) and the language models' text flags (from scratch)."""
        from minitf.lm.task import LanguageModelTask
        super().add_arguments(parser)
        LanguageModelTask.add_arguments(self, parser)

    def make_trainer(self, config, run_dir, data, log, progress=True):
        """:class:`T5Trainer` for a fine-tuning run, :class:`minitf.t5.scratch.T5SpanTrainer` from scratch."""
        if config.init_from is None:
            from minitf.t5.scratch import T5SpanTrainer
            return T5SpanTrainer(config, run_dir, data.tokenizer, data.corpus, log, progress=progress)
        return super().make_trainer(config, run_dir, data, log, progress)

    def foreign_flags_error(self, flags, owner):
        return Task.foreign_flags_error(self, flags, owner)

    def default_run_dir(self, preset):
        return Task.default_run_dir(self, preset)

    def pretrained_fields(self, args):
        """A T5 folder's model (checked key by key), its tokenizer, its task prefix and its weights (read and
        checked once), before any run folder is made."""
        folder = args.init_from
        refuse_with_init_from(args, PRETRAINED_FIXED)
        other = kinds.for_model_type(model_type(folder))
        if other is not None and other.name != self.name:
            raise UsageError(f"--init-from {folder} is a {other.hf_what} (a {other.title}), not a T5 folder: to "
                             f"fine-tune it, use --model {other.name}")
        try:
            config, hf_config = hf.pretrained_config(folder)
            prefix = choose_prefix(task_prefixes(hf_config), args.prefix, folder)
        except ValueError as error:
            raise UsageError(f"--init-from {folder}: {error}") from None
        self.init_tokenizer = read_tokenizer(folder, config)  # before the weights: a missing file is named first
        try:  # damaged weights (truncated, a NaN): refused here, before any run folder; the trainer gets these
            state = self.read_once(weights_path(folder), lambda: hf.read_pretrained(folder)[1])
        except ValueError as error:
            raise DataError(f"--init-from {folder}: {error}") from None
        config = config.replace(tie_word_embeddings="lm_head.weight" not in state)  # as its weights say
        return dict(d_model=config.d_model, num_heads=config.num_heads, num_encoder_layers=config.num_layers,
                    num_decoder_layers=config.num_decoder_layers, d_ff=config.d_ff, pre_norm=True,
                    vocab_size=config.vocab_size, tokenizer="pretrained", init_from=str(folder.resolve()),
                    t5=dict(hf_config, tie_word_embeddings=config.tie_word_embeddings), prefix=prefix,
                    lr_scale=args.lr_scale or 0.1)

    def check_command(self, args, config):
        texts = [f"--{split}-text" for split in ("train", "valid", "test") if getattr(args, f"{split}_text")]
        if args.init_from is None:
            if given_files(args):
                raise UsageError("--model t5 from scratch trains on text (--train-text FILE --valid-text FILE, or the "
                                 "default text) with span corruption; parallel files (--train-src ...) go with "
                                 "--init-from FOLDER")
            if self.uses_prepared(args) or args.phrases:
                raise UsageError("--model t5 from scratch reads its text as lines (--train-text ...), not a prepared "
                                 "corpus (--corpus-dir, --corpus) nor the Ding phrases")
            return
        if texts:
            raise UsageError(f"{', '.join(texts)} are the text of T5 from scratch; a fine-tuning run (--init-from) "
                             "reads parallel files: --train-src S --train-tgt T --valid-src ... --valid-tgt ...")
        if self.uses_prepared(args) or args.phrases:
            raise UsageError("--model t5 reads its parallel text as --train-src ... files with its folder's "
                             "tokenizer, not a prepared corpus (--corpus-dir, --corpus) nor the Ding phrases")
        if not given_files(args):
            raise UsageError("--model t5 needs the parallel text: --train-src S --train-tgt T --valid-src ... "
                             "--valid-tgt ... (the task prefix goes before each source)")
        super().check_command(args, config)

    def new_run(self, args, given, config, run_dir, world):
        self.check_command(args, config)
        if config.init_from is None:
            from minitf.t5.scratch import new_scratch_run
            with before_training(run_dir):
                return new_scratch_run(args, config, run_dir, world)
        with before_training(run_dir):
            return new_run_data(args, config, run_dir, world, run_tokenizer(self.init_tokenizer, config))

    def reopen(self, config, run_dir):
        path = run_dir / "tokenizer.model"
        try:
            data = path.read_bytes()
        except OSError as error:
            raise DataError(f"cannot read the run's tokenizer {path} ({error.strerror or error}); restore it from a "
                            "checkpoint's tokenizer.model") from None
        if config.init_from is None:
            from minitf.t5.scratch import reopen_scratch
            return reopen_scratch(from_run_bytes(data, str(path)), config)
        tokenizer = run_tokenizer(from_run_bytes(data, str(path)), config)
        return RunData(tokenizer, Corpus(tokenizer, read_splits(config.data), log, bos_id=tokenizer.bos_id))

    def describe(self, trainer, data, run_dir):
        config = trainer.config
        if config.init_from is None:
            return (f"T5 from scratch, span corruption: {trainer.model.num_parameters():,} parameters, d_model "
                    f"{config.d_model}, {config.num_encoder_layers}+{config.num_decoder_layers} blocks, a vocabulary "
                    f"of {data.tokenizer.vocab_size} (100 sentinels), lines of up to {config.max_len} tokens, on "
                    f"{backend.get_device()}; {len(data.corpus.ids['train']):,} training lines; run folder {run_dir}")
        return (f"T5 fine-tuned from {config.init_from}: {trainer.model.num_parameters():,} parameters, d_model "
                f"{config.d_model}, {config.num_encoder_layers}+{config.num_decoder_layers} blocks, prefix "
                f"{config.prefix!r}, on {backend.get_device()}; {len(data.corpus.ids['train'][0]):,} training pairs; "
                f"run folder {run_dir}")
