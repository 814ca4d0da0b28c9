"""The language model's part of the ``train.py`` command (``--model gpt``): its options, a new run on the default
text (the World English Bible, fetched once), on the user's text or on a prepared text (``--corpus-dir``), a
GPT-2 folder to fine-tune (``--init-from``), a resumed run's data, and :class:`LanguageModelTrainer`. The
interface is :class:`minitf.training.task.Task`."""
import importlib.util
import os
import pathlib

from minitf import backend
from minitf.pretrained import model_type, weights_path
from minitf.lm.gpt2 import pretrained_config, read_pretrained_state
from minitf.lm.corpus import default_text_splits
from minitf.lm.data import (CharTokenizer, TextCorpus, load_tokenizer, pretrained_eos_id, read_pretrained_tokenizer,
                            tokenizer_files, tokenizer_kind)
from minitf.lm.prepare import open_prepared_text, prepare_text_corpus
from minitf.lm.trainer import LanguageModelTrainer
from minitf.training import files
from minitf.lm.config import GROUP
from minitf.training.errors import DataError, UsageError
from minitf.training.files import file_sha256
from minitf.training.task import (RunData, Task, before_training, log, new_run_folder, prepare_tokenizer,
                                  refuse_with_init_from, start_prepared_run)
from minitf.training.text import read_text

#: The language model's text files (``--train-text`` ...).
TEXT_SPLITS = ("train", "valid", "test")
#: --init-from's learning-rate factor unless --lr-scale is given: fine-tuning moves a trained model a little
#: (a peak of 1.8e-4 for GPT-2 small at the preset's warmup, where the preset's 0.5 would give 9e-4).
FINE_TUNE_LR_SCALE = 0.1
#: The flags that would contradict --init-from's folder (it fixes the model's shape and the tokenizer).
PRETRAINED_FIXED = ("d_model", "num_heads", "num_layers", "num_encoder_layers", "num_decoder_layers", "d_ff",
                    "pre_norm", "vocab_size", "tokenizer")


class LanguageModelTask(Task):
    name = "gpt"
    title = "the language model"
    description = "a decoder-only language model (on the World English Bible by default, or --train-text)"
    summary = ("a decoder-only language model (minitf.GPT) trained on the World English Bible (fetched once) or "
               "--train-text")
    presets_help = "--model gpt: tiny"
    trainer = LanguageModelTrainer
    pretrained = "GPT"
    init_from_help = ("fine-tune a pretrained GPT-2: a Hugging Face folder (config.json, model.safetensors, "
                      "tokenizer.json or vocab.json and merges.txt) gives the model's shape, its weights and its "
                      f"byte-level tokenizer (needs pip install -e '.[hf]'; --lr-scale {FINE_TUNE_LR_SCALE:g} "
                      "unless given)")

    def add_arguments(self, parser):
        """The text flags (its run config's fields declare the rest: minitf.lm.config.LanguageModelRunConfig)."""
        g = parser.add_argument_group(GROUP)
        for split in TEXT_SPLITS:
            g.add_argument(f"--{split}-text", type=pathlib.Path, metavar="FILE",
                           help=f"the {split} text (UTF-8)" + (" (optional)" if split == "test" else ""))

    def foreign_flags_error(self, flags, owner):
        return f"{', '.join(flags)} belong to {owner.title}; --model gpt trains on --train-text FILE --valid-text " \
               "FILE (and optionally --test-text FILE)"

    def pretrained_fields(self, args):
        refuse_with_init_from(args, PRETRAINED_FIXED)
        missing = [name for name in ("safetensors", "tokenizers") if importlib.util.find_spec(name) is None]
        if missing:
            raise UsageError(f"--init-from needs the {' and '.join(missing)} package{'s' * (len(missing) > 1)}, not "
                             "installed here: pip install -e '.[hf]'")
        if model_type(args.init_from) == "marian":
            raise UsageError(f"--init-from {args.init_from} is a Hugging Face Marian folder (a translation model): "
                             "fine-tune it without --model gpt (--model transformer, the default)")
        try:
            model, _ = pretrained_config(args.init_from)
        except ValueError as error:
            raise UsageError(f"--init-from {args.init_from}: {error}") from None
        tokenizer_files(args.init_from)  # a folder without a tokenizer is refused before anything starts
        if not model.tie_embeddings:
            raise UsageError(f"--init-from {args.init_from}: its output projection is not tied to the embedding "
                             "(tie_word_embeddings false); train.py fine-tunes GPT-2's tied shape only")
        try:  # damaged weights (truncated, a NaN): refused here, before any run folder; the trainer gets these
            self.read_once(weights_path(args.init_from), lambda: read_pretrained_state(args.init_from, model))
        except ValueError as error:
            raise DataError(f"--init-from {args.init_from}: {error}") from None
        return dict(d_model=model.d_model, num_heads=model.num_heads, num_decoder_layers=model.num_layers,
                    d_ff=model.d_ff, pre_norm=model.pre_norm, n_positions=model.max_len,
                    activation=model.activation, layer_norm_eps=float(model.layer_norm_eps),
                    vocab_size=model.vocab_size, tokenizer="pretrained", init_from=str(args.init_from.resolve()),
                    lr_scale=args.lr_scale or FINE_TUNE_LR_SCALE)

    def new_run(self, args, given, config, run_dir, world):
        if args.corpus_dir is not None:
            return new_prepared_text_run(args, config, run_dir, world)
        if args.prepare_again:
            raise UsageError("--prepare-again prepares a text into memory-mapped arrays: it needs --corpus-dir DIR "
                             "(with --train-text etc.)")
        with before_training(run_dir):
            return new_text_data(args, config, run_dir, world)

    def reopen(self, config, run_dir):
        tokenizer = load_tokenizer(run_dir / "tokenizer.model")
        if "prepared" in config.data:  # memory-mapped ids: the run's tokenizer must be theirs
            theirs, corpus = open_prepared_text(config.data["prepared"], config.block_size)
            if theirs.sha256 != tokenizer.sha256:
                raise DataError(f"--resume {run_dir}: the prepared text {config.data['prepared']} has another "
                                "tokenizer than the run (it was prepared again); restore it or start a new run")
        else:
            corpus = TextCorpus(tokenizer, read_texts(config.data), config.block_size)
        return RunData(tokenizer, corpus)

    def describe(self, trainer, data, run_dir):
        config = trainer.config
        where = f" (prepared in {data.prepared})" if data.prepared is not None else ""
        if config.init_from is not None:
            where += f"; fine-tuned from {config.init_from}"
        return (f"{self.name} {config.preset} model: {trainer.model.num_parameters():,} parameters, "
                f"d_model {config.d_model}, "
                f"{config.num_decoder_layers} layers, block {config.block_size}, {config.tokenizer} vocabulary of "
                f"{data.tokenizer.vocab_size}, on {backend.get_device()}; {data.corpus.tokens['train'].size:,} "
                f"training tokens{where}; run folder {run_dir}")


def text_paths(args):
    """{"train_text": path, "valid_text": ..., "test_text": path or None}, absolute (--resume from anywhere)."""
    given = {f"{s}_text": getattr(args, f"{s}_text") for s in TEXT_SPLITS}
    if all(path is None for path in given.values()):  # the default text, fetched once into the cache
        splits = default_text_splits(args.cache_dir, progress=not args.no_progress, log=log)
        return {f"{s}_text": str(splits[s]) for s in TEXT_SPLITS}
    if given["train_text"] is None:
        raise UsageError("--valid-text and --test-text go with --train-text FILE (or give none of them for the "
                         "default text, the World English Bible)")
    if given["valid_text"] is None:
        raise UsageError("--train-text needs --valid-text FILE too (validation loss, perplexity and bits per "
                         "character are measured on it)")
    return {k: (os.path.abspath(v) if v is not None else None) for k, v in given.items()}


def read_texts(paths):
    """{"train": text, "valid": ..., "test": ...} of the paths given (each checked: one line if bad)."""
    return {split: read_text(paths[f"{split}_text"], f"--{split}-text") for split in TEXT_SPLITS
            if paths.get(f"{split}_text") is not None}


def run_texts(args, world):
    """(paths, texts) of a new run's text (:func:`text_paths`, :func:`read_texts`): the default text fetched once by
    rank 0, the others finding it in the cache; every rank has read and checked it before anything is written."""
    if not world.is_root:  # rank 0 fetches the default text once; the others then find it in the cache
        world.barrier()
    paths = text_paths(args)
    if world.is_root:
        world.barrier()
    texts = read_texts(paths)  # fail on bad data before writing anything
    world.barrier()
    return paths, texts


def new_text_data(args, config, run_dir, world, init_tokenizer=None, load=load_tokenizer):
    """A new language-model run's text (--train-text ..., or the default text, fetched once by rank 0), its
    tokenizer (made by rank 0: BPE, characters or --init-from's, ``init_tokenizer(config)``: default
    :func:`read_init_tokenizer`, GPT-2's) and config.json; the other ranks read rank 0's with ``load(path)``."""
    paths, texts = run_texts(args, world)
    config.data = paths
    if world.is_root:
        with new_run_folder(run_dir):
            if config.tokenizer in ("char", "pretrained"):
                tokenizer = (CharTokenizer(texts["train"]) if config.tokenizer == "char" else
                             (init_tokenizer or read_init_tokenizer)(config))
                files.write_atomic(run_dir / "tokenizer.model", tokenizer.model_bytes())
            else:
                tokenizer = prepare_tokenizer(run_dir, texts["train"].split("\n"), config.vocab_size, log)
            corpus = TextCorpus(tokenizer, texts, config.block_size)  # e.g. a text shorter than a block
    config.data_sha256 = {key: file_sha256(path) for key, path in paths.items() if path is not None}
    if world.is_root:
        config.vocab_size = tokenizer.vocab_size
        config.write(run_dir)
    world.barrier()
    if not world.is_root:
        tokenizer = load(run_dir / "tokenizer.model")
        config.vocab_size = tokenizer.vocab_size
        corpus = TextCorpus(tokenizer, texts, config.block_size)
    return RunData(tokenizer, corpus)


def read_init_tokenizer(config):
    """The tokenizer of --init-from's folder, with the model's end-of-text id; refused unless it has the
    model's vocabulary."""
    _, hf = pretrained_config(config.init_from)
    tokenizer = read_pretrained_tokenizer(config.init_from, pretrained_eos_id(hf, config.vocab_size))
    if tokenizer.vocab_size != config.vocab_size:
        raise DataError(f"--init-from {config.init_from}: its tokenizer has {tokenizer.vocab_size} tokens and its "
                        f"model {config.vocab_size}; they do not belong together: copy the model's own tokenizer")
    return tokenizer


def new_prepared_text_run(args, config, run_dir, world):
    """A new language-model run on a text prepared once into memory-mapped token arrays (--corpus-dir): with
    --train-text etc., rank 0 prepares them into DIR first (a folder of the same sources and settings is
    reused); without, DIR must hold a prepared text. Every rank then maps the same files."""
    given = args.train_text is not None
    if args.prepare_again and not given:
        raise UsageError(f"--prepare-again prepares --corpus-dir {args.corpus_dir} from the texts it was made from: "
                         "give them too (--train-text ... --valid-text ...)")
    folder = pathlib.Path(args.corpus_dir)
    pretrained = read_init_tokenizer(config) if config.init_from else None  # --init-from's: the ids must be its
    if world.is_root:
        if given:
            paths = text_paths(args)
            prepare_text_corpus(folder, {split: paths[f"{split}_text"] for split in TEXT_SPLITS},
                                config.tokenizer, config.vocab_size, rebuild=args.prepare_again, log=log,
                                tokenizer=pretrained)
        elif not (folder / "manifest.json").is_file():
            raise UsageError(f"--corpus-dir {folder} holds no prepared text (no manifest.json); prepare one with "
                             "--model gpt --train-text ... --valid-text ... --corpus-dir DIR")
    world.barrier()
    tokenizer, corpus = open_prepared_text(folder, config.block_size)
    kind = tokenizer_kind(tokenizer)
    if (kind == "pretrained") != (pretrained is not None) or (pretrained and tokenizer.sha256 != pretrained.sha256):
        raise UsageError(f"--corpus-dir {folder} holds the ids of another tokenizer than this run's ({kind} there, "
                         f"{config.tokenizer} here): prepare the text for this run into another --corpus-dir (with "
                         "--train-text ...)")
    config.vocab_size = tokenizer.vocab_size
    config.tokenizer = kind
    start_prepared_run(config, run_dir, tokenizer, folder, world)
    return RunData(tokenizer, corpus, prepared=folder)
