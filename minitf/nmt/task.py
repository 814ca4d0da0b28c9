"""Translation's part of the ``train.py`` command (``--model transformer``, the default): its data options, a new
run on the default corpus (the Ding dictionary, fetched once), on the user's parallel files or on a prepared
corpus (WMT 2014 or ``--corpus-dir``), a Hugging Face Marian folder to fine-tune (``--init-from``), a resumed
run's data, and :class:`TranslationTrainer`. The interface is :class:`minitf.training.task.Task`."""
import os
import pathlib

from minitf import backend, kinds
from minitf.pretrained import model_type
from minitf.nmt import corpora, marian, prepare
from minitf.nmt.corpora import default_corpus_splits
from minitf.nmt.config import DATA_GROUP, model_config
from minitf.nmt.data import Corpus, IndexedCorpus, read_splits
from minitf.nmt.marian_tokenizer import (MarianTokenizer, check_tokenizer, read_generation_config,
                                        read_generation_json)
from minitf.nmt.translation_trainer import TranslationTrainer, load_tokenizer
from minitf.training import files
from minitf.training.errors import DataError, UsageError
from minitf.training.files import file_sha256
from minitf.training.task import (RunData, Task, before_training, log, new_run_folder, prepare_tokenizer,
                                  refuse_with_init_from, start_prepared_run)

#: The parallel files' splits (--train-src ... --test-tgt).
SPLITS = ("train", "valid", "test")
#: --init-from's learning-rate factor unless --lr-scale is given (docs/training.md, "Fine-tuning a Marian
#: model": the paper's schedule at 1 moves a trained model as far as a new one; measured there).
FINE_TUNE_LR_SCALE = 0.1
#: The flags that would contradict --init-from's folder (it fixes the model's shape and the tokenizer).
PRETRAINED_FIXED = ("d_model", "num_heads", "num_layers", "num_encoder_layers", "num_decoder_layers", "d_ff",
                    "pre_norm", "vocab_size")
#: A --train-src of more lines than this (without --corpus-dir) is read into memory after a note that says
#: --corpus-dir keeps memory flat (about 3 GB were measured for a million pairs, on every rank).
LARGE_CORPUS_LINES = 200_000


def given_files(args):
    """Whether any of --train-src ... --test-tgt was given."""
    return any(getattr(args, f"{s}_{side}") is not None for s in SPLITS for side in ("src", "tgt"))


class TranslationTask(Task):
    name = "transformer"
    title = "translation"
    description = ("a Transformer translation model (German to English on the Ding dictionary's example sentences "
                   "by default)")
    summary = "the paper's translation model (default)"
    presets_help = "tiny (CPU default), base and big (paper, Table 3)"
    trainer = TranslationTrainer
    pretrained = "Marian (opus-mt) translation model"
    init_from_help = ("fine-tune a pretrained translation model: a Hugging Face Marian folder (an opus-mt model: "
                      "config.json, model.safetensors, source.spm, target.spm, vocab.json) gives the model's shape, "
                      "its weights and its tokenizer, kept in the run (--lr-scale "
                      f"{FINE_TUNE_LR_SCALE:g} unless given; the data must be the folder's language pair)")

    def add_arguments(self, parser):
        """The data flags (its run config's fields declare the rest: minitf.nmt.config.TranslationRunConfig)."""
        g = parser.add_argument_group(DATA_GROUP)
        for split in SPLITS:
            g.add_argument(f"--{split}-src", type=pathlib.Path)
            g.add_argument(f"--{split}-tgt", type=pathlib.Path)
        g.add_argument("--phrases", action="store_true",
                       help="also train on the dictionary's 64,832 phrase sub-entries (default: whole sentences only; "
                       "docs/results.md, 'Recipe arms': at the CPU budget the phrases did not help)")
        g.add_argument("--corpus", choices=["ding", "wmt14-en-de"], default="ding",
                       help="ding: the Ding dictionary's sentences (default); wmt14-en-de: the paper's WMT 2014 "
                       "English-German (about 4.5 million pairs, fetched and prepared once into --cache-dir; "
                       "docs/paper.md)")

    def foreign_flags_error(self, flags, owner):
        return f"{', '.join(flags)} belong to {owner.title}: add --model {owner.name} (or use --train-src ... for " \
               "translation)"

    def default_run_dir(self, preset):
        return pathlib.Path("runs") / preset

    #: --init-from's tokenizer, as :meth:`pretrained_fields` read and checked it (for :meth:`new_run`).
    init_tokenizer = None

    def pretrained_fields(self, args):
        folder = args.init_from
        refuse_with_init_from(args, PRETRAINED_FIXED)
        if args.bpe_dropout:
            raise UsageError("--bpe-dropout cannot go with --init-from: it samples minitf's own BPE merges, and the "
                             f"run keeps the sentencepiece tokenizer of {folder}; leave it out")
        if self.uses_prepared(args):
            raise UsageError("--init-from reads the training text with its folder's tokenizer: give the files as "
                             "--train-src ... (or none, for the default corpus), not a prepared corpus "
                             "(--corpus-dir, --corpus wmt14-en-de: minitf's own tokenizer's ids)")
        other = kinds.for_model_type(model_type(folder))
        if other is not None and other.name != self.name:
            raise UsageError(f"--init-from {folder} is a {other.hf_what} (a {other.title}), not a translation "
                             f"model: to fine-tune it, add --model {other.name}")
        try:
            hf, model, weights = marian.read_folder_config(folder, training=True)
            generation = read_generation_json(folder)  # kept in the run: an export writes it again
        except ValueError as error:
            raise UsageError(f"--init-from {folder}: {error}") from None
        self.init_tokenizer = check_tokenizer(folder, model)  # before the weights: a missing file is named first
        try:  # every generation entry checked now, not first at translate or export (after the tokenizer's ids)
            read_generation_config(folder, hf)
        except ValueError as error:
            raise UsageError(f"--init-from {folder}: {error}") from None
        try:  # damaged weights (truncated, a NaN): refused here, before any run folder; the trainer gets these
            self.read_once(weights, lambda: marian.read_state(folder)[2])
        except ValueError as error:
            raise DataError(f"--init-from {folder}: {error}") from None
        return dict(d_model=model.d_model, num_heads=model.num_heads,
                    num_encoder_layers=model.num_encoder_layers, num_decoder_layers=model.num_decoder_layers,
                    d_ff=model.d_ff, pre_norm=False, vocab_size=model.src_vocab_size, tokenizer="pretrained", init_from=str(folder.resolve()),
                    marian={"config": hf, "generation": generation},
                    lr_scale=args.lr_scale or FINE_TUNE_LR_SCALE)

    def check_config(self, args, config):
        if args.corpus != "ding" or args.corpus_dir is not None or given_files(args) or args.phrases:
            if args.lexicon:  # the lexicon is the Ding dictionary's, sampled instead of every phrase
                raise UsageError("--lexicon mixes in the Ding dictionary's lexicon: it needs the default corpus "
                                 "(not --train-src, --corpus wmt14-en-de or --corpus-dir) and excludes --phrases")
            config.lexicon = 0.0  # a preset's lexicon: off for other data

    def uses_prepared(self, args):
        return args.corpus != "ding" or args.corpus_dir is not None

    def check_command(self, args, config):
        super().check_command(args, config)
        if given_files(args):
            data_paths(args)  # the corpus flags go together

    def new_run(self, args, given, config, run_dir, world):
        if self.uses_prepared(args):  # not with --init-from (pretrained_fields)
            return new_prepared_run(args, given, config, run_dir, world)
        if args.prepare_again:
            raise UsageError("--prepare-again prepares a corpus of memory-mapped arrays: it needs --corpus-dir DIR "
                             "(with --train-src etc.) or --corpus wmt14-en-de")
        if args.train_src is not None and world.is_root:
            warn_if_large(args.train_src)
        with before_training(run_dir):
            return new_run_data(args, config, run_dir, world, self.init_tokenizer if config.init_from else None)

    def reopen(self, config, run_dir):
        tokenizer = load_tokenizer(run_dir / "tokenizer.model")  # minitf's, or a Marian folder's (--init-from)
        if (config.init_from is not None) != isinstance(tokenizer, MarianTokenizer):
            raise DataError(f"--resume {run_dir}: its tokenizer.model is {'not ' * (config.init_from is not None)}"
                            "a Marian folder's tokenizer, but config.json says the run was "
                            f"{'not ' * (config.init_from is None)}fine-tuned from one; restore tokenizer.model "
                            "from a checkpoint or start a new run")
        if "prepared" in config.data:  # memory-mapped token arrays: the run's tokenizer must be theirs
            corpus = IndexedCorpus(config.data["prepared"])
            if corpus.tokenizer.sha256 != tokenizer.sha256:
                raise DataError(f"--resume {run_dir}: the prepared corpus {config.data['prepared']} has another "
                                "tokenizer than the run (it was prepared again); restore it or start a new run")
        else:
            corpus = Corpus(tokenizer, read_splits(config.data), log, bos_id=start_id(config))
        return RunData(tokenizer, corpus)

    def describe(self, trainer, data, run_dir):
        config, corpus = trainer.config, data.corpus
        where = f" (prepared in {data.prepared})" if data.prepared is not None else ""
        if config.lexicon:
            where += (f", and {config.lexicon:g} lexicon pairs per sentence each epoch "
                      f"(from {len(corpus.text['lexicon'][0]):,})")
        model = f"{config.preset} model"
        if config.init_from is not None:
            model = (f"Marian model fine-tuned from {config.init_from} (its tokenizer of {data.tokenizer.vocab_size} "
                     f"ids; learning rate x {config.lr_scale:g} of the paper's schedule)")
        return (f"{model}: {trainer.model.num_parameters():,} parameters, d_model {config.d_model}, "
                f"{config.num_encoder_layers}+{config.num_decoder_layers} layers, on {backend.get_device()}; "
                f"{len(corpus.ids['train'][0]):,} training pairs{where}; run folder {run_dir}")


def start_id(config):
    """The decoder's start token of a run's model: a Marian folder's decoder_start_token_id (its pad in opus-mt,
    minitf's BOS in an exported minitf run), else None (the tokenizer's BOS)."""
    return model_config(config, 1).decoder_start_id if config.marian is not None else None


def data_paths(args, lexicon=0.0):
    """The six corpus files, from the flags or from the default corpus (fetched once; with
    ``lexicon``, also its lexicon's two files)."""
    given = {f"{s}_{side}": getattr(args, f"{s}_{side}") for s in SPLITS for side in ("src", "tgt")}
    if any(v is not None for v in given.values()):
        for split in ("train", "valid"):
            if given[f"{split}_src"] is None or given[f"{split}_tgt"] is None:
                raise UsageError(f"a custom corpus needs --{split}-src and --{split}-tgt "
                                 "(and optionally --test-src/--test-tgt)")
        if (given["test_src"] is None) != (given["test_tgt"] is None):
            raise UsageError("--test-src and --test-tgt go together")
        # absolute, so that --resume works from any working directory
        return {k: (os.path.abspath(v) if v is not None else None) for k, v in given.items()}
    if {args.src_lang, args.tgt_lang} != {"de", "en"}:
        raise UsageError(f"the default corpus is German-English: --src-lang/--tgt-lang must be de/en, "
                         f"got {args.src_lang}/{args.tgt_lang}; pass --train-src etc. for another corpus")
    return default_corpus_splits(args.cache_dir, args.src_lang, args.tgt_lang, phrases=args.phrases,
                                 lexicon=lexicon > 0)


def new_run_data(args, config, run_dir, world, init_tokenizer=None):
    """A new run's data (the default corpus, fetched once, or --train-src ...), its tokenizer (trained by rank
    0, or ``init_tokenizer``: --init-from's) and config.json."""
    if not world.is_root:  # rank 0 fetches the default corpus once; the others then find it in the cache
        world.barrier()
    paths = data_paths(args, config.lexicon)
    if world.is_root:
        world.barrier()
    splits = read_splits(paths)  # fail on bad data before writing anything
    train_pairs = splits["train"]
    world.barrier()  # every rank has checked its input before rank 0 writes anything
    config.data = paths
    if world.is_root:  # rank 0 makes the run folder, holds its lock and trains the tokenizer; the others wait
        with new_run_folder(run_dir):
            if init_tokenizer is not None:  # --init-from: the folder's, kept in the run (it needs it no more)
                tokenizer = init_tokenizer
                files.write_atomic(run_dir / "tokenizer.model", tokenizer.model_bytes())
            else:
                tokenizer = prepare_tokenizer(run_dir, [s for s, _ in train_pairs] + [t for _, t in train_pairs],
                                              config.vocab_size, log)
    config.data_sha256 = {key: file_sha256(path) for key, path in paths.items() if path is not None}
    if world.is_root:
        config.write(run_dir)
    world.barrier()
    if not world.is_root:  # --init-from's: every rank read it from the folder (a kind's own class: T5's)
        tokenizer = init_tokenizer if init_tokenizer is not None else load_tokenizer(run_dir / "tokenizer.model")
    return RunData(tokenizer, Corpus(tokenizer, splits, log, bos_id=start_id(config)))


def count_lines(path, stop_after):
    """The newlines of ``path``, counted in 1 MiB blocks, and no further once over ``stop_after``
    (0 for a file that cannot be read: reading it reports that)."""
    count = 0
    try:
        with open(path, "rb") as handle:
            while count <= stop_after:
                block = handle.read(1 << 20)
                if not block:
                    break
                count += block.count(b"\n")
    except OSError:
        return 0
    return count


def warn_if_large(train_src):
    """Before a large --train-src is read into memory: say once that --corpus-dir keeps memory flat."""
    if count_lines(train_src, LARGE_CORPUS_LINES) > LARGE_CORPUS_LINES:
        log(f"note: --train-src has over {LARGE_CORPUS_LINES:,} lines and is read into memory on every rank (about "
            "3 GB a million pairs); add --corpus-dir DIR to prepare it once into memory-mapped arrays and keep "
            "memory flat")


def new_prepared_run(args, given, config, run_dir, world):
    """A new run on a prepared corpus (memory-mapped token arrays, :class:`minitf.nmt.data.IndexedCorpus`):
    WMT 2014 English-German, or a user's files prepared into --corpus-dir. Rank 0 prepares (once: a
    prepared folder is reused); every rank then maps the same files."""
    if config.bpe_dropout > 0:
        raise UsageError("--bpe-dropout needs the text of every epoch; a prepared corpus holds token ids only")
    if args.prepare_again and args.corpus != "wmt14-en-de" and args.train_src is None:
        raise UsageError(f"--prepare-again prepares --corpus-dir {args.corpus_dir} from the files it was made "
                         "from: give them too (--train-src ... --valid-tgt ...)")
    if args.corpus == "wmt14-en-de" and config.preset in ("base", "big") and not {"max_steps", "epochs",
                                                                                  "max_minutes"} & given:
        config.max_steps, config.epochs = 100_000, None  # the paper's length (section 5.2)
    with before_training(run_dir):
        if world.is_root:
            folder = prepare_data(args, given, config)
        world.barrier()
        if not world.is_root:
            folder = prepare_data(args, given, config, reuse_only=True)
    corpus = IndexedCorpus(folder)
    tokenizer = corpus.tokenizer
    config.vocab_size = tokenizer.vocab_size
    config.src_lang, config.tgt_lang = corpus.manifest["recipe"]["languages"]
    start_prepared_run(config, run_dir, tokenizer, folder, world, corpus=args.corpus)
    return RunData(tokenizer, corpus, prepared=folder)


def prepare_data(args, given, config, reuse_only=False):
    """The prepared folder of this run: WMT 2014 (fetched and prepared once into the cache), an
    existing --corpus-dir, or the --train-src ... files prepared into --corpus-dir."""
    vocab = config.vocab_size if "vocab_size" in given else None
    if args.corpus == "wmt14-en-de":
        src, tgt = (args.src_lang, args.tgt_lang) if {"src_lang", "tgt_lang"} & given else ("en", "de")
        vocab = vocab or corpora.WMT14_VOCAB_SIZE
        if reuse_only:  # the other ranks: the folder rank 0 has just prepared
            return corpora.wmt14_prepared_folder(args.cache_dir, src, tgt, vocab)
        return corpora.prepare_wmt14(args.cache_dir, src_lang=src, tgt_lang=tgt, vocab_size=vocab,
                                     progress=not args.no_progress, rebuild=args.prepare_again, log=log)
    if not given_files(args) or reuse_only:
        if not (args.corpus_dir / "manifest.json").is_file():
            raise UsageError(f"--corpus-dir {args.corpus_dir} holds no prepared corpus (no manifest.json); "
                             "prepare one with --train-src ... --valid-tgt ... --corpus-dir DIR")
        return args.corpus_dir
    paths = data_paths(args)
    sources = {split: (paths[f"{split}_src"], paths[f"{split}_tgt"]) for split in SPLITS
               if paths.get(f"{split}_src") is not None}
    return prepare.prepare_corpus(args.corpus_dir, sources, vocab or config.vocab_size,
                                  languages=(args.src_lang, args.tgt_lang), rebuild=args.prepare_again, log=log)
