"""The ``train.py`` command: a new run, or ``--resume`` of an earlier one. A kill costs the steps
since the last checkpoint (docs/reliability.md): ``--resume`` takes the newest checkpoint that
passes its checks (checksums, model shape, tokenizer), moves newer bad ones aside with a warning,
and cuts metrics.jsonl back to that checkpoint's step."""
import contextlib
import importlib.util
import io
import os
import pathlib
import re
import shutil
import signal
import sys
import time

from minitf import backend
from minitf.nmt import corpora, prepare
from minitf.training import checkpoint as ckpt, files, trainer as training
from minitf.training.config import (INVOCATION_OPTIONS, LM_PRESETS, MODELS, PRECISIONS, PRESETS, RESUME_CHANGEABLE,
                                    RUN_OPTIONS, TOKENIZERS, RunConfig)
from minitf.lm.corpus import default_text_splits
from minitf.gpt import pretrained_config
from minitf.lm.data import (CharTokenizer, TextCorpus, load_tokenizer, pretrained_eos_id, read_pretrained_tokenizer,
                            tokenizer_files, tokenizer_kind)
from minitf.lm.prepare import open_prepared_text, prepare_text_corpus
from minitf.lm.trainer import LanguageModelTrainer
from minitf.nmt.translation_trainer import TranslationTrainer
from minitf.nmt.corpora import DEFAULT_CACHE, default_corpus_splits
from minitf.nmt.data import Corpus, IndexedCorpus, read_splits
from minitf.training.distributed import get_world, launched_by_mpi
from minitf.training.download import sigterm_raises
from minitf.training.errors import (CheckpointError, DataError, Interrupted, OneLineParser, UsageError, non_negative,
                                   pause_for_tests, positive, report_errors)
from minitf.training.files import check_output_folder, check_resumable, file_sha256
from minitf.training.text import read_text
from minitf.training.tokenizer import Tokenizer, train_tokenizer

#: The flags that name the model, recipe or data of a run: refused with --resume.
RESUME_FIXED = ("d_model", "num_heads", "num_layers", "num_encoder_layers", "num_decoder_layers", "d_ff", "dropout",
                "pre_norm", "vocab_size", "max_len", "warmup", "label_smoothing", "bpe_dropout", "seed", "src_lang",
                "tgt_lang", "preset", "precision", "train_src", "train_tgt", "valid_src", "valid_tgt", "test_src",
                "test_tgt", "phrases", "lexicon", "corpus", "corpus_dir", "prepare_again", "model", "block_size",
                "tokenizer", "train_text", "valid_text", "test_text", "init_from")
#: --init-from's learning-rate factor unless --lr-scale is given: fine-tuning moves a trained model a little
#: (a peak of 1.8e-4 for GPT-2 small at the preset's warmup, where the preset's 0.5 would give 9e-4).
FINE_TUNE_LR_SCALE = 0.1
#: The flags that would contradict --init-from's folder (it fixes the model's shape and the tokenizer).
PRETRAINED_FIXED = ("d_model", "num_heads", "num_layers", "num_encoder_layers", "num_decoder_layers", "d_ff",
                    "pre_norm", "vocab_size", "tokenizer")
#: The language model's text files (``--model gpt``).
TEXT_SPLITS = ("train", "valid", "test")
#: A --train-src of more lines than this (without --corpus-dir) is read into memory after a note that says
#: --corpus-dir keeps memory flat (about 3 GB were measured for a million pairs, on every rank).
LARGE_CORPUS_LINES = 200_000


def default(name):
    """'default: X', from RunConfig and the presets: the one place that holds the defaults."""
    field = RunConfig.__dataclass_fields__[name].default
    value = PRESETS[RunConfig.preset].get(name, field)              # the default preset's value
    other = [f"{v.get(name, field)} with --preset {p}" for p, v in PRESETS.items() if v.get(name, field) != value]
    return f"default: {value}" + (f"; {', '.join(other)}" if other else "")


def build_parser():
    p = OneLineParser(prog="train.py", description="Train a Transformer translation model (German to English "
                      "on the Ding dictionary's example sentences by default), or with --model gpt a decoder-only "
                      "language model (on the World English Bible by default, or --train-text).")
    p.add_argument("--model", choices=MODELS, default="transformer",
                   help="transformer: the paper's translation model (default); gpt: a decoder-only language model "
                   "(minitf.GPT) trained on the World English Bible (fetched once) or --train-text")
    p.add_argument("--preset", choices=sorted(set(PRESETS) | set(LM_PRESETS)), default="tiny",
                   help="model size and recipe: tiny (CPU default), base and big (paper, Table 3); --model gpt: tiny")
    g = p.add_argument_group("model (override the preset)")
    g.add_argument("--d-model", type=positive(int))
    g.add_argument("--num-heads", type=positive(int))
    g.add_argument("--num-layers", type=positive(int), help="encoder and decoder layers")
    g.add_argument("--num-encoder-layers", type=positive(int))
    g.add_argument("--num-decoder-layers", type=positive(int))
    g.add_argument("--d-ff", type=positive(int))
    g.add_argument("--dropout", type=float)
    g.add_argument("--pre-norm", action="store_true", help="pre-LN blocks instead of the paper's post-LN")
    g = p.add_argument_group("recipe")
    g.add_argument("--vocab-size", type=positive(int), help="joint BPE vocabulary size")
    g.add_argument("--max-tokens", type=positive(int), help="padded tokens per batch and side (paper: ~25000)")
    g.add_argument("--max-len", type=positive(int), help=f"skip longer sentences (in BPE tokens; {default('max_len')})")
    g.add_argument("--warmup", type=positive(int), help="warmup steps of the learning-rate schedule")
    g.add_argument("--lr-scale", type=positive(float), help="factor on d_model^-0.5 * min(step^-0.5, step*warmup^-1.5)")
    g.add_argument("--label-smoothing", type=float, help=default("label_smoothing"))
    g.add_argument("--bpe-dropout", type=float, help="BPE-dropout on the training side: probability of "
                   "dropping a merge, sampled anew each epoch from (seed, epoch) (0 = off; the preset's value)")
    g.add_argument("--clip-norm", type=float, help=f"global gradient-norm clipping (0 = off; {default('clip_norm')})")
    g.add_argument("--accumulate", type=positive(int), metavar="K",
                   help=f"batches of --max-tokens per update (gradient accumulation; {default('accumulate')})")
    g.add_argument("--zero", type=int, choices=[0, 1],
                   help=f"1: shard Adam's moments over the mpiexec ranks (ZeRO-1); same parameters as 0 "
                   f"({default('zero')})")
    g.add_argument("--skip-nonfinite", action="store_true",
                   help="skip (and count) a step whose loss is not finite instead of stopping")
    g = p.add_argument_group("run")
    g.add_argument("--device", choices=["cpu", "gpu"], default=None, help="default: MINITF_DEVICE, else cpu")
    g.add_argument("--precision", choices=PRECISIONS,
                   help=f"{default('precision')}: fp32; tf32 (GPU: TF32 tensor-core matmuls via CUPY_TF32=1); "
                   "fp16 (float16 model, "
                   "float32 master weights and Adam moments, dynamic loss scaling)")
    g.add_argument("--seed", type=int, help=default("seed"))
    g.add_argument("--max-steps", type=positive(int))
    g.add_argument("--epochs", type=positive(int))
    g.add_argument("--max-minutes", type=positive(float),
                   help="wall time of the whole command: training stops early enough for validation, "
                   "checkpoints and the end-of-run evaluation to end within it")
    g.add_argument("--out", type=pathlib.Path, help="run folder (default runs/<preset>)")
    g.add_argument("--resume", type=pathlib.Path, metavar="RUN_DIR", help="continue the run in RUN_DIR exactly")
    g.add_argument("--eval-every", type=positive(int), help=f"steps between validations ({default('eval_every')})")
    g.add_argument("--save-every", type=positive(int), help=f"steps between checkpoints ({default('save_every')})")
    g.add_argument("--keep", type=positive(int), help=f"checkpoints kept ({default('keep')})")
    g.add_argument("--average", type=int, help=f"average the last N checkpoints at the end (0/1 = off; "
                   f"{default('average')})")
    g.add_argument("--bleu-sentences", type=int,
                   help=f"validation sentences decoded for BLEU ({default('bleu_sentences')})")
    g.add_argument("--beam", type=positive(int), help=f"beam size ({default('beam')})")
    g.add_argument("--alpha", type=non_negative, help=f"length penalty exponent ({default('alpha')})")
    g.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    g = p.add_argument_group("language model (--model gpt)")
    g.add_argument("--block-size", type=positive(int), help="tokens per training block, the model's context "
                   f"(default: {LM_PRESETS['tiny']['block_size']})")
    g.add_argument("--tokenizer", choices=TOKENIZERS, help="bpe: sentencepiece BPE of --vocab-size (default); "
                   "char: one id per character of the training text")
    g.add_argument("--init-from", type=pathlib.Path, metavar="FOLDER",
                   help="fine-tune a pretrained GPT-2: a Hugging Face folder (config.json, model.safetensors, "
                   "tokenizer.json or vocab.json and merges.txt) gives the model's shape, its weights and its "
                   f"byte-level tokenizer (needs pip install -e '.[hf]'; --lr-scale {FINE_TUNE_LR_SCALE:g} "
                   "unless given)")
    for split in TEXT_SPLITS:
        g.add_argument(f"--{split}-text", type=pathlib.Path, metavar="FILE",
                       help=f"the {split} text (UTF-8)" + (" (optional)" if split == "test" else ""))
    g = p.add_argument_group("data (default: the Ding de-en example sentences, fetched with apt)")
    for split in ("train", "valid", "test"):
        g.add_argument(f"--{split}-src", type=pathlib.Path)
        g.add_argument(f"--{split}-tgt", type=pathlib.Path)
    g.add_argument("--src-lang", default="de")
    g.add_argument("--tgt-lang", default="en")
    g.add_argument("--phrases", action="store_true",
                   help="also train on the dictionary's 64,832 phrase sub-entries (default: whole sentences only; "
                   "docs/results.md, 'Recipe arms': at the CPU budget the phrases did not help)")
    g.add_argument("--lexicon", type=non_negative, metavar="RATIO",
                   help="mix the dictionary's headwords and phrases into each epoch, RATIO pairs per training "
                   "sentence, a new sample every epoch; the tokenizer is trained on the sentences alone "
                   f"({default('lexicon')}; 0 = sentences only; the preset's value is for the default corpus "
                   "only; docs/results.md, 'Recipe arms')")
    g.add_argument("--corpus", choices=["ding", "wmt14-en-de"], default="ding",
                   help="ding: the Ding dictionary's sentences (default); wmt14-en-de: the paper's WMT 2014 "
                   "English-German (about 4.5 million pairs, fetched and prepared once into --cache-dir; "
                   "docs/paper.md)")
    g.add_argument("--corpus-dir", type=pathlib.Path, metavar="DIR",
                   help="a prepared corpus (memory-mapped token arrays): train from DIR; with --train-src etc., "
                   "prepare those files into DIR first (once; a changed source is refused)")
    g.add_argument("--prepare-again", action="store_true",
                   help="prepare the corpus of --corpus-dir (with its --train-src etc.) or of --corpus wmt14-en-de "
                   "again: replaces one made from other files or settings, or damaged (a whole one is reused)")
    g.add_argument("--cache-dir", type=pathlib.Path, default=DEFAULT_CACHE)
    return p


def given_options(argv):
    """The dests of the options written on the command line (abbreviations and ``--flag=value``
    included), told apart from defaults by parsing twice."""
    parser = build_parser()
    unset = object()
    parser.set_defaults(**{name: unset for name in vars(parser.parse_args(argv))})
    return {name for name, value in vars(parser.parse_args(argv)).items() if value is not unset}


def config_from_args(args):
    """The run config of a new run: the preset, overridden by the flags given."""
    layers = dict(num_encoder_layers=args.num_encoder_layers or args.num_layers,
                  num_decoder_layers=args.num_decoder_layers or args.num_layers)
    flags = ("d_model", "num_heads", "d_ff", "dropout", "pre_norm", "vocab_size", "warmup", "lr_scale", "max_tokens",
             "max_minutes", "max_steps", "epochs", "max_len", "seed", "label_smoothing", "bpe_dropout", "clip_norm",
             "lexicon", "src_lang", "tgt_lang", "skip_nonfinite", "precision", "accumulate", "zero", "model",
             "block_size", "tokenizer") + RUN_OPTIONS
    values = {name: getattr(args, name) for name in flags}
    values["pre_norm"] = args.pre_norm or None  # not given: the preset's (a GPT's is pre-LN, GPT-2's choice)
    if args.init_from is not None:
        values.update(pretrained_fields(args))
        layers = {}
    config = RunConfig.from_preset(args.preset, **layers, **values)
    other_data = args.corpus != "ding" or args.corpus_dir is not None or any(
        getattr(args, f"{s}_{side}") is not None for s in ("train", "valid", "test") for side in ("src", "tgt"))
    if other_data or args.phrases:  # the lexicon is the Ding dictionary's, sampled instead of every phrase
        if args.lexicon:
            raise UsageError("--lexicon mixes in the Ding dictionary's lexicon: it needs the default corpus "
                             "(not --train-src, --corpus wmt14-en-de or --corpus-dir) and excludes --phrases")
        config.lexicon = 0.0  # a preset's lexicon: off for other data
    return config


def pretrained_fields(args):
    """The run config's fields that --init-from FOLDER fixes: the model's shape from its config.json, the
    pretrained tokenizer, --lr-scale (unless given); a one-line UsageError for a folder that cannot be
    read or a flag that contradicts it."""
    if args.model != "gpt":
        raise UsageError("--init-from FOLDER fine-tunes a pretrained GPT: add --model gpt")
    contradicting = [f"--{name.replace('_', '-')}" for name in PRETRAINED_FIXED if getattr(args, name)]
    if contradicting:
        raise UsageError(f"{', '.join(contradicting)} cannot go with --init-from: the model's shape and tokenizer "
                         f"are those of {args.init_from}; leave them out")
    missing = [name for name in ("safetensors", "tokenizers") if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"--init-from needs the {' and '.join(missing)} package{'s' * (len(missing) > 1)}, not "
                         "installed here: pip install -e '.[hf]'")
    try:
        model, _ = pretrained_config(args.init_from)
    except ValueError as error:
        raise UsageError(f"--init-from {args.init_from}: {error}") from None
    tokenizer_files(args.init_from)  # a folder without a tokenizer is refused before anything starts
    if not model["tie_embeddings"]:
        raise UsageError(f"--init-from {args.init_from}: its output projection is not tied to the embedding "
                         "(tie_word_embeddings false); train.py fine-tunes GPT-2's tied shape only")
    return dict(d_model=model["d_model"], num_heads=model["num_heads"], num_decoder_layers=model["num_layers"],
                d_ff=model["d_ff"], pre_norm=model["pre_norm"], n_positions=model["max_len"],
                activation=model["activation"], layer_norm_eps=float(model["layer_norm_eps"]),
                vocab_size=model["vocab_size"], tokenizer="pretrained", init_from=str(args.init_from.resolve()),
                lr_scale=args.lr_scale or FINE_TUNE_LR_SCALE)


def setup_device(precision, device):
    """Select ``device`` (None: MINITF_DEVICE, checked here). TF32 is CuPy's CUPY_TF32, read when CuPy
    first picks a float32 matmul mode: so it is set before ``backend.set_device``."""
    if device is None:
        backend.check_environment()  # a bad MINITF_DEVICE: one line, not a traceback at import
        device = backend.get_device()
    if precision == "tf32":
        if device != "gpu":
            raise UsageError("--precision tf32 needs --device gpu (TF32 is a tensor-core mode of NVIDIA GPUs)")
        os.environ["CUPY_TF32"] = "1"
    backend.set_device(device)


def data_paths(args, lexicon=0.0):
    """The six corpus files, from the flags or from the default corpus (fetched once; with
    ``lexicon``, also its lexicon's two files)."""
    given = {f"{s}_{side}": getattr(args, f"{s}_{side}") for s in ("train", "valid", "test") for side in ("src", "tgt")}
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


def prepare_tokenizer(run_dir, train_texts, vocab_size, log):
    """Train a new run's tokenizer, also over a tokenizer.model left by a run killed before it wrote
    config.json (it may come from other flags); a resumed run reads its own instead."""
    path = pathlib.Path(run_dir) / "tokenizer.model"
    start = time.perf_counter()
    pause_for_tests("tokenize")
    tokenizer = train_tokenizer(train_texts, path, vocab_size)
    log(f"trained a joint BPE vocabulary of {tokenizer.vocab_size} on {len(train_texts)} sentences "
        f"in {time.perf_counter() - start:.1f} s")
    return tokenizer


def log(message):
    if get_world().is_root:  # under mpiexec only rank 0 reports
        print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def before_training(run_dir):
    """Ctrl-C or SIGTERM while a new run reads, fetches, prepares or tokenizes its data: one line saying
    what is kept and what the next command does (a download or a preparation says it itself)."""
    try:
        yield
    except KeyboardInterrupt as stop:
        if isinstance(stop, Interrupted):
            raise
        kept = (f"the run has no checkpoint yet: continue with python train.py --resume {run_dir}"
                if (pathlib.Path(run_dir) / "config.json").is_file() else
                "stopped before training: nothing to keep, the same command starts again")
        raise Interrupted(getattr(stop, "signum", signal.SIGINT), kept) from None


def run(argv=None):
    args = build_parser().parse_args(argv)
    if args.resume is not None:
        return resume_run(args, given_options(argv))
    check_model_flags(args)
    config = config_from_args(args)
    run_dir = args.out or pathlib.Path("runs") / (args.preset if args.model == "transformer" else f"gpt-{args.preset}")
    world = get_world()
    check_output_folder(run_dir)
    setup_device(config.precision, args.device)
    if args.model == "gpt":
        return new_text_run(args, config, run_dir, world)
    if args.corpus != "ding" or args.corpus_dir is not None:
        return new_prepared_run(args, given_options(argv), config, run_dir, world)
    if args.prepare_again:
        raise UsageError("--prepare-again prepares a corpus of memory-mapped arrays: it needs --corpus-dir DIR "
                         "(with --train-src etc.) or --corpus wmt14-en-de")
    if args.train_src is not None and world.is_root:
        warn_if_large(args.train_src)
    with before_training(run_dir):
        tokenizer, corpus = new_run_data(args, config, run_dir, world)
    return train_new_run(config, run_dir, tokenizer, corpus, args)


@contextlib.contextmanager
def new_run_folder(run_dir):
    """Rank 0's start of a new run folder: made, and locked before anything is written (one process per run
    folder), then checked again under the lock (another run may have started meanwhile). A DataError inside
    (e.g. a --vocab-size too large for the text) leaves no half-made run behind: the folder is released, its
    tokenizer removed and the folder too if this call made it."""
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    files.lock_run_folder(run_dir)
    check_output_folder(run_dir)
    try:
        yield
    except DataError:
        if created:  # a tokenizer of a refused run is no use to anyone
            (run_dir / "tokenizer.model").unlink(missing_ok=True)
        files.release(run_dir)
        if created and not any(run_dir.iterdir()):
            run_dir.rmdir()
        raise


def new_run_data(args, config, run_dir, world):
    """A new run's data (the default corpus, fetched once, or --train-src ...), its tokenizer (trained
    by rank 0) and config.json."""
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
            tokenizer = prepare_tokenizer(run_dir, [s for s, _ in train_pairs] + [t for _, t in train_pairs],
                                          config.vocab_size, log)
    config.data_sha256 = {key: file_sha256(path) for key, path in paths.items() if path is not None}
    if world.is_root:
        config.write(run_dir)
    world.barrier()
    if not world.is_root:
        tokenizer = Tokenizer(run_dir / "tokenizer.model")
    return tokenizer, Corpus(tokenizer, splits, log)


def check_model_flags(args):
    """One line for a data flag of the other model (--train-src with --model gpt, --train-text without it)."""
    translation = [f"--{s}-{side}" for s in TEXT_SPLITS for side in ("src", "tgt") if getattr(args, f"{s}_{side}")]
    translation += [flag for flag, given in (("--corpus", args.corpus != "ding"), ("--phrases", args.phrases),
                                             ("--lexicon", args.lexicon)) if given]
    text = [f"--{s}-text" for s in TEXT_SPLITS if getattr(args, f"{s}_text")]
    text += [flag for flag, given in (("--block-size", args.block_size), ("--tokenizer", args.tokenizer)) if given]
    if args.model == "gpt" and translation:
        raise UsageError(f"{', '.join(translation)} belong to translation; --model gpt trains on --train-text FILE "
                         "--valid-text FILE (and optionally --test-text FILE)")
    if args.model != "gpt" and text:
        raise UsageError(f"{', '.join(text)} belong to the language model: add --model gpt (or use --train-src "
                         "... for translation)")


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


def new_text_run(args, config, run_dir, world):
    """A new language-model run (--model gpt) on --train-text: rank 0 makes the run folder and the
    tokenizer (BPE or characters), every rank reads the text, then the shared trainer."""
    if args.corpus_dir is not None:
        return new_prepared_text_run(args, config, run_dir, world)
    if args.prepare_again:
        raise UsageError("--prepare-again prepares a text into memory-mapped arrays: it needs --corpus-dir DIR "
                         "(with --train-text etc.)")
    with before_training(run_dir):
        tokenizer, corpus = new_text_data(args, config, run_dir, world)
    return train_text_run(config, run_dir, tokenizer, corpus, args)


def new_text_data(args, config, run_dir, world):
    """A new language-model run's text (--train-text ..., or the default text, fetched once by rank 0), its
    tokenizer (made by rank 0) and config.json."""
    if not world.is_root:  # rank 0 fetches the default text once; the others then find it in the cache
        world.barrier()
    paths = text_paths(args)
    if world.is_root:
        world.barrier()
    texts = read_texts(paths)  # fail on bad data before writing anything
    world.barrier()
    config.data = paths
    if world.is_root:
        with new_run_folder(run_dir):
            if config.tokenizer in ("char", "pretrained"):
                tokenizer = (CharTokenizer(texts["train"]) if config.tokenizer == "char" else
                             read_init_tokenizer(config))
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
        tokenizer = load_tokenizer(run_dir / "tokenizer.model")
        config.vocab_size = tokenizer.vocab_size
        corpus = TextCorpus(tokenizer, texts, config.block_size)
    return tokenizer, corpus


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
    return train_text_run(config, run_dir, tokenizer, corpus, args, where=f" (prepared in {folder})")


def train_text_run(config, run_dir, tokenizer, corpus, args, where=""):
    """The language model's trainer of a new run, one line saying what it trains, then the run."""
    trainer = LanguageModelTrainer(config, run_dir, tokenizer, corpus, log, progress=not args.no_progress)
    if config.init_from is not None:
        where += f"; fine-tuned from {config.init_from}"
    log(f"gpt {config.preset} model: {trainer.model.num_parameters():,} parameters, d_model {config.d_model}, "
        f"{config.num_decoder_layers} layers, block {config.block_size}, {config.tokenizer} vocabulary of "
        f"{tokenizer.vocab_size}, on {backend.get_device()}; {corpus.tokens['train'].size:,} training tokens"
        f"{where}; run folder {run_dir}")
    return trainer.train_and_finish()


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


def train_new_run(config, run_dir, tokenizer, corpus, args, where=""):
    """The trainer of a new run, one line saying what it trains, then the run."""
    trainer = TranslationTrainer(config, run_dir, tokenizer, corpus, log, progress=not args.no_progress)
    if config.lexicon:
        where += (f", and {config.lexicon:g} lexicon pairs per sentence each epoch "
                  f"(from {len(corpus.text['lexicon'][0]):,})")
    log(f"{config.preset} model: {trainer.model.num_parameters():,} parameters, d_model {config.d_model}, "
        f"{config.num_encoder_layers}+{config.num_decoder_layers} layers, on {backend.get_device()}; "
        f"{len(corpus.ids['train'][0]):,} training pairs{where}; run folder {run_dir}")
    return trainer.train_and_finish()


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
    return train_new_run(config, run_dir, tokenizer, corpus, args, where=f" (prepared in {folder})")


def start_prepared_run(config, run_dir, tokenizer, folder, world, **data):
    """A new run on the prepared ``folder`` (either model): its config names the folder and its manifest's
    sha256; rank 0 makes the run folder under its lock and writes the tokenizer and config.json."""
    folder = pathlib.Path(folder)
    config.data = {"prepared": str(folder.resolve()), **data}
    config.data_sha256 = {"manifest": file_sha256(folder / "manifest.json")}
    if world.is_root:
        with new_run_folder(run_dir):
            files.write_atomic(run_dir / "tokenizer.model", tokenizer.model_bytes())
            config.write(run_dir)
    world.barrier()


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
    given_files = any(getattr(args, f"{s}_{side}") is not None for s in ("train", "valid", "test")
                      for side in ("src", "tgt"))
    if not given_files or reuse_only:
        if not (args.corpus_dir / "manifest.json").is_file():
            raise UsageError(f"--corpus-dir {args.corpus_dir} holds no prepared corpus (no manifest.json); "
                             "prepare one with --train-src ... --valid-tgt ... --corpus-dir DIR")
        return args.corpus_dir
    paths = data_paths(args)
    sources = {split: (paths[f"{split}_src"], paths[f"{split}_tgt"]) for split in ("train", "valid", "test")
               if paths.get(f"{split}_src") is not None}
    return prepare.prepare_corpus(args.corpus_dir, sources, vocab or config.vocab_size,
                                  languages=(args.src_lang, args.tgt_lang), rebuild=args.prepare_again, log=log)


def check_resume_flags(args, given):
    """Refuse the flags that belong to the run being resumed."""
    fixed = [k for k in RESUME_FIXED if k in given]
    if args.out is not None and pathlib.Path(args.out).resolve() != pathlib.Path(args.resume).resolve():
        fixed.append("out")
    if fixed:
        flags = ", ".join("--" + k.replace("_", "-") for k in fixed)
        raise UsageError(f"--resume continues a run with its own settings, so {flags} cannot be given; allowed with "
                         "--resume: " + ", ".join("--" + k.replace("_", "-") for k in RESUME_CHANGEABLE + RUN_OPTIONS)
                         + ", --device, --skip-nonfinite, --no-progress")


def resume_run(args, given):
    run_dir = args.resume
    check_resume_flags(args, given)
    config = RunConfig.read(run_dir)
    world = get_world()
    if world.is_root:  # before anything is written; refused while another process trains here
        files.lock_run_folder(run_dir)
    check_resumable(run_dir)
    changed = {k: getattr(args, k) for k in RESUME_CHANGEABLE + RUN_OPTIONS
               if k in given and getattr(args, k) != getattr(config, k)}
    lengths = ("max_steps", "epochs", "max_minutes")
    if changed.keys() & set(lengths):  # a new length replaces the old one
        changed.update({key: getattr(args, key) for key in lengths})
    for name, value in changed.items():
        setattr(config, name, value)
    config.validate()
    for name in INVOCATION_OPTIONS:  # for this invocation only: not given means RunConfig's default
        value = getattr(args, name)
        setattr(config, name, RunConfig.__dataclass_fields__[name].default if value is None else value)
    setup_device(config.precision, args.device)
    for key, digest in config.data_sha256.items():
        data_file = config.data.get(key) if key != "manifest" else pathlib.Path(config.data["prepared"]) / "manifest.json"
        if data_file and pathlib.Path(data_file).is_file() and file_sha256(data_file) != digest:
            log(f"warning: {data_file} changed since the run started: the resumed run will not repeat an "
                "uninterrupted one (restore the original file for an exact resume)")
    tokenizer = (load_tokenizer if config.model == "gpt" else Tokenizer)(run_dir / "tokenizer.model")
    trainer_class = LanguageModelTrainer if config.model == "gpt" else TranslationTrainer
    if config.model == "gpt" and "prepared" in config.data:  # memory-mapped ids: the run's tokenizer must be theirs
        theirs, corpus = open_prepared_text(config.data["prepared"], config.block_size)
        if theirs.sha256 != tokenizer.sha256:
            raise DataError(f"--resume {run_dir}: the prepared text {config.data['prepared']} has another "
                            "tokenizer than the run (it was prepared again); restore it or start a new run")
    elif config.model == "gpt":
        corpus = TextCorpus(tokenizer, read_texts(config.data), config.block_size)
    elif "prepared" in config.data:  # memory-mapped token arrays: the run's tokenizer must be theirs
        corpus = IndexedCorpus(config.data["prepared"])
        if corpus.tokenizer.sha256 != tokenizer.sha256:
            raise DataError(f"--resume {run_dir}: the prepared corpus {config.data['prepared']} has another "
                            "tokenizer than the run (it was prepared again); restore it or start a new run")
    else:
        corpus = Corpus(tokenizer, read_splits(config.data), log)
    trainer = trainer_class(config, run_dir, tokenizer, corpus, log, progress=not args.no_progress)
    if not world.is_root:
        world.barrier()  # rank 0 recovers and checks the checkpoints (moving bad ones aside) first
    for stale in ckpt.recover_checkpoints(run_dir):
        log(f"removed {stale.name}, left by an interrupted checkpoint write")
    state, path, errors = ckpt.latest_valid_checkpoint(run_dir, expect=trainer.expected_arrays)
    if state is None and errors:
        raise CheckpointError(f"--resume {run_dir}: none of its {len(errors)} checkpoints is usable, the newest "
                              f"because: {errors[0][1]}; restore a good checkpoint or start a new run")
    if state is not None:  # in memory only: a checkpoint that does not load changes nothing on disk
        trainer.restore(state)
        trainer.last_checkpoint = path
    if world.is_root:  # the folder is usable: from here on it changes (metrics first: if the disk refuses,
        dropped = trainer.metrics.truncate(trainer.step)  # nothing else has)
        if dropped:
            log(f"metrics.jsonl: dropped {dropped} records written after step {trainer.step} (they are redone)")
        if state is not None:  # records a full disk refused before this checkpoint was saved
            trainer.metrics.append_unwritten(state["meta"].get("unwritten_metrics"))
    if changed and world.is_root:  # written only now: a refused --resume changes nothing
        config.write(run_dir)
        recipe = sorted(set(changed) & {"max_tokens", "lr_scale", "clip_norm"})
        if recipe:
            log("warning: changed " + ", ".join(f"--{k.replace('_', '-')} to {changed[k]}" for k in recipe)
                + ": from here on the run departs from an uninterrupted one (config.json now holds the new values)")
    for bad, error in errors:
        log(f"warning: skipping a bad checkpoint, moved aside to {ckpt.set_aside(bad).name}: {error}")
    if world.is_root:
        world.barrier()
    trainer.valid_ppl = trainer.metrics.validations()  # the run's validations so far (end-of-run candidates)
    if state is not None:
        log(f"resumed from {path} at step {trainer.step} (epoch {trainer.epoch + 1})")
    else:
        log(f"no checkpoint in {run_dir} yet: starting from step 0")
    return trainer.train_and_finish()


def check_command(args, argv):
    """What every rank would refuse at once, checked before ``mpiexec`` starts them: the run's config
    from the flags, --out (or the folder of --resume) and the corpus flags. Raises the rank's error."""
    if args.resume is not None:
        check_resume_flags(args, given_options(argv))
        with contextlib.redirect_stderr(io.StringIO()):  # its notes: said once, by rank 0
            RunConfig.read(args.resume)
        check_resumable(args.resume)
        return 0
    config = config_from_args(args)
    check_output_folder(args.out or pathlib.Path("runs") / args.preset)
    if args.corpus != "ding" or args.corpus_dir is not None:
        if config.bpe_dropout > 0:
            raise UsageError("--bpe-dropout needs the text of every epoch; a prepared corpus holds token ids only")
    if any(getattr(args, f"{s}_{side}") is not None for s in ("train", "valid", "test") for side in ("src", "tgt")):
        data_paths(args)  # the corpus flags go together
    return 0


def wanted_ranks():
    """``MINITF_RANKS`` (None: unset, one rank per core); anything but a positive whole number is refused."""
    wanted = os.environ.get("MINITF_RANKS")
    if wanted is None:
        return None
    if not re.fullmatch(r"\s*[0-9]+\s*", wanted) or int(wanted) < 1:
        raise UsageError(f"MINITF_RANKS must be a positive whole number of processes, got {wanted!r}; "
                         "MINITF_RANKS=1 runs one process, unset it for one rank per core")
    return int(wanted)


def every_core_command(argv, device=None):
    """(the ``mpiexec`` command running this command with one rank per core and one BLAS thread each
    (one process leaves a core idle in NumPy's elementwise work), its first line) or (None, a note or
    None): one core, a GPU (``device``, else MINITF_DEVICE), no MPI, ``MINITF_RANKS=1``.
    ``MINITF_RANKS=N`` sets the ranks; the global batch and the recipe are the same at any number of
    ranks, only the speed changes."""
    wanted = wanted_ranks()
    if wanted == 1:
        return None, None
    if (device or os.environ.get("MINITF_DEVICE", "cpu")) == "gpu":
        return None, None  # on GPUs the ranks are GPUs: mpiexec -n <GPUs> python train.py --device gpu
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ranks = wanted or cores
    if ranks < 2:
        return None, None
    import importlib.util
    beside = pathlib.Path(sys.executable).parent / "mpiexec"  # the mpich wheel's, in this environment
    mpiexec = str(beside) if beside.is_file() else shutil.which("mpiexec")
    if importlib.util.find_spec("mpi4py") is None or mpiexec is None:
        return None, (f"note: one process on {cores} cores; pip install -e '.[mpi]' runs one rank per core "
                      "(data parallel, faster on the CPU)")
    if wanted is None:
        how = "one per core"
    elif ranks <= cores:
        how = f"MINITF_RANKS={ranks}, on {cores} usable cores"
    else:
        how = (f"MINITF_RANKS={ranks}, more ranks than the {cores} usable cores: they share them and each "
               "runs slower")
    line = f"train.py: {ranks} ranks through mpiexec, {how} (MINITF_RANKS=1 runs one process)"
    return [mpiexec, "-n", str(ranks), sys.executable, str(pathlib.Path(sys.argv[0]).resolve()), *argv], line


def launch(argv, started):
    """The command ``python train.py``, before any rank starts: the flags and the run's config are checked
    here (one line and the exit status of a rank's refusal, without starting ``mpiexec``); then this
    process becomes ``mpiexec`` with one rank per core (not returning), or returns None to run here."""
    args = build_parser().parse_args(argv)  # --help, an unknown or bad flag: here, as argparse reads them
    status = report_errors("train.py", lambda _: check_command(args, argv), argv, memory_hint="")
    if status:
        return status
    try:
        command, line = every_core_command(argv, args.device)
    except UsageError as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2
    if command is None:
        if line:
            print(line, file=sys.stderr, flush=True)
        return None
    print(line, file=sys.stderr, flush=True)
    env = dict(os.environ, MINITF_COMMAND_START=repr(started),  # the ranks count the whole command from here
               **{name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")})
    os.execve(command[0], command, env)  # mpiexec takes this process's place: signals reach it, and the ranks


def command_start(started):
    """When the command started (``time.time()``): a rank's, from the launcher (MINITF_COMMAND_START)."""
    if launched_by_mpi():
        try:
            return float(os.environ["MINITF_COMMAND_START"])
        except (KeyError, ValueError):
            pass
    return started


def main(argv=None, started=None):
    """Entry point: bad input gives one error line and a non-zero exit. Under ``mpiexec`` every rank
    runs it (data parallelism); as the command on several CPU cores with MPI installed it checks the
    command line and restarts itself under ``mpiexec`` with one rank per core (``MINITF_RANKS=1``: one
    process). ``started``: ``time.time()`` at the command's start (train.py's first line), which the
    wall time of the whole command and --max-minutes count from."""
    started = command_start(started)
    training.mark_command_start(started)
    if argv is None and pathlib.Path(sys.argv[0]).name == "train.py" and not launched_by_mpi():
        status = launch(sys.argv[1:], time.time() if started is None else started)
        if status is not None:
            return status
    backend.keep_freed_memory()  # a step's large temporaries reuse freed memory: no page faults (~20% on CPU)
    with files.released_on_exit(), sigterm_raises():  # SIGTERM before training: cleanup runs, one line, 143
        if launched_by_mpi():
            from minitf.training import distributed
            return distributed.main(run, argv, "train.py", memory_hint="use a smaller --max-tokens",
                                    interrupt_message="interrupted; nothing after the last checkpoint was saved")
        return report_errors("train.py", run, argv, memory_hint="use a smaller --max-tokens",
                             interrupt_message="interrupted; nothing after the last checkpoint was saved "
                             "(continue with --resume RUN_DIR if the run had written config.json)")
