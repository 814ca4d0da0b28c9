"""``train.py --model bert``: BERT's masked language model trained by the shared trainer on the language models'
text (``--train-text FILE --valid-text FILE``, or the World English Bible, fetched once): from scratch with a
WordPiece vocabulary made from the training text, or fine-tuned from a Hugging Face BERT, DistilBERT or RoBERTa
folder (``--init-from FOLDER``: its model's config.json is kept in the run, its weights are the start and its
tokenizer the run's). With ``--train-tsv T --valid-tsv V`` (lines of text TAB label, :mod:`minitf.bert.tsv`) the
run fine-tunes a sequence classifier instead (its label names kept as config.json's ``labels``). The trainers are
:class:`minitf.bert.trainer.BertTrainer` and :class:`minitf.bert.trainer.BertClassifierTrainer`; the interface
:class:`minitf.training.task.Task`."""
import pathlib

from minitf import backend, kinds
from minitf.bert import hf
from minitf.bert.config import PRESETS, pretrained_state
from minitf.bert.tokenizer import from_bytes, read_tokenizer, train_wordpiece
from minitf.bert.trainer import BertClassifierTrainer, BertTrainer, LabelledCorpus, SentenceCorpus
from minitf.bert.tsv import TSV_SPLITS, read_labelled, tsv_paths
from minitf.lm.task import LanguageModelTask, read_texts, text_paths
from minitf.pretrained import model_type, weights_path
from minitf.training import files
from minitf.training.errors import DataError, UsageError
from minitf.training.files import file_sha256
from minitf.training.task import RunData, before_training, log, new_run_folder, refuse_with_init_from

#: --init-from's learning-rate factor unless --lr-scale is given: a pretrained encoder moves a little.
FINE_TUNE_LR_SCALE = 0.1
#: The flags that would contradict --init-from's folder (it fixes the model's shape and the tokenizer).
PRETRAINED_FIXED = ("d_model", "num_heads", "num_layers", "num_encoder_layers", "num_decoder_layers", "d_ff",
                    "pre_norm", "vocab_size")


class BertTask(LanguageModelTask):
    name = "bert"
    title = "the masked language model"
    description = "BERT's masked language model (an encoder) on the same text"
    summary = ("BERT's masked language model (minitf.bert): 15%% of tokens masked, on --train-text or the World "
               "English Bible")  # %%: argparse's help
    presets_help = "--model bert: tiny"
    trainer = BertTrainer
    pretrained = "BERT, DistilBERT or RoBERTa"
    init_from_help = ("fine-tune a Hugging Face BERT, DistilBERT or RoBERTa folder's masked LM on the text "
                      f"(config.json, model.safetensors, vocab.txt or tokenizer.json; --lr-scale {FINE_TUNE_LR_SCALE:g}"
                      " unless given)")

    def add_arguments(self, parser):
        """The language models' text flags (the masked LM's) and the classifier's labelled lines."""
        super().add_arguments(parser)
        g = parser.add_argument_group("the sequence classifier (--model bert --train-tsv)")
        for split in TSV_SPLITS:
            g.add_argument(f"--{split}-tsv", type=pathlib.Path, metavar="FILE",
                           help=f"the {split} lines of a classifier: text TAB label (UTF-8)"
                                + (" (optional)" if split == "test" else "; the labels are the training file's"
                                   if split == "train" else ""))

    def make_trainer(self, config, run_dir, data, log, progress=True):
        """The classifier's trainer for a run with labels, else the masked LM's."""
        self.trainer = BertTrainer if config.labels is None else BertClassifierTrainer
        return super().make_trainer(config, run_dir, data, log, progress)

    def pretrained_fields(self, args):
        """A BERT-family folder's model (checked key by key), its tokenizer and its weights (read and checked once),
        before any run folder is made."""
        folder = args.init_from
        refuse_with_init_from(args, PRETRAINED_FIXED)
        if args.corpus_dir is not None:
            raise UsageError(f"--init-from {folder} reads the text with its folder's tokenizer: give --train-text "
                             "... without --corpus-dir")
        other = kinds.for_model_type(model_type(folder))
        if other is not None and other.name != self.name:
            raise UsageError(f"--init-from {folder} is a {other.hf_what}, not a BERT-family folder: to fine-tune "
                             f"it, use --model {other.name}")
        try:
            config, head, hf_config = hf.pretrained_config(folder)
        except ValueError as error:
            raise UsageError(f"--init-from {folder}: {error}") from None
        read_tokenizer(folder, hf_config)  # a missing or unreadable tokenizer: named before the weights
        paths = tsv_paths(args)
        if paths is not None and config.flavour == "distilbert":
            raise UsageError(f"--init-from {folder} is a DistilBERT folder, whose classifier (pre_classifier, ReLU) is "
                             "not minitf's (BERT's pooler and tanh): fine-tune a BERT or RoBERTa folder on --train-tsv")
        labels = read_labelled(paths)[1] if paths is not None else None  # a bad TSV: refused before the weights
        positions = config.positions  # the sequences are cut to the folder's positions, or to --block-size below
        if args.block_size is not None and args.block_size > positions:
            raise UsageError(f"--block-size {args.block_size} is longer than {folder}'s {positions} positions "
                             f"(max_position_embeddings): give at most {positions}, or leave it out")
        try:  # damaged weights (truncated, a NaN): refused here, before any run folder; the trainer gets these
            self.read_once(weights_path(folder), lambda: pretrained_state(folder, labels))
        except ValueError as error:
            raise DataError(f"--init-from {folder}: {error}") from None
        block_size = min(args.block_size or PRESETS.get(args.preset, {}).get("block_size", positions), positions)
        return dict(d_model=config.d_model, num_heads=config.num_heads, num_encoder_layers=config.num_layers,
                    num_decoder_layers=0, d_ff=config.d_ff, vocab_size=config.vocab_size, tokenizer="pretrained",
                    init_from=str(folder.resolve()), bert=hf_config, lr_scale=args.lr_scale or FINE_TUNE_LR_SCALE,
                    block_size=block_size)

    def check_command(self, args, config):
        if args.corpus_dir is not None:
            raise UsageError("--model bert reads its text as lines (--train-text FILE --valid-text FILE), not a "
                             "prepared corpus (--corpus-dir)")
        paths = tsv_paths(args)
        if paths is not None:
            read_labelled(paths)  # every line checked before mpiexec starts the ranks

    def new_run(self, args, given, config, run_dir, world):
        self.check_command(args, config)
        with before_training(run_dir):
            paths = tsv_paths(args)
            if paths is None:
                return self._new_text_run(args, config, run_dir, world)
            if "mask_prob" in given:
                raise UsageError("--mask-prob is the masked LM's; a --train-tsv run trains a classifier, every text "
                                 "scored on its label: leave it out")
            splits, config.labels = read_labelled(paths)  # before anything is written
            config.data = paths
            return self._new_run(config, run_dir, world, paths, splits["train"][0],
                                 lambda tokenizer: LabelledCorpus(tokenizer, splits, config.block_size))

    def _new_text_run(self, args, config, run_dir, world):
        """The text (--train-text ..., or the default text, fetched once by rank 0), its tokenizer and config.json
        (:meth:`_new_run`)."""
        if not world.is_root:
            world.barrier()
        paths = text_paths(args)
        if world.is_root:
            world.barrier()
        texts = read_texts(paths)
        world.barrier()
        config.data = paths
        return self._new_run(config, run_dir, world, paths, texts["train"].split("\n"),
                             lambda tokenizer: SentenceCorpus(tokenizer, texts, config.block_size))

    def _new_run(self, config, run_dir, world, paths, training_lines, corpus_of):
        """A new run's tokenizer (rank 0's: a WordPiece vocabulary of ``training_lines``, or --init-from's), its
        corpus (``corpus_of(tokenizer)``, the lines cut to --block-size said once) and config.json."""
        if world.is_root:
            with new_run_folder(run_dir):
                if config.init_from is not None:
                    tokenizer = read_tokenizer(config.init_from, config.bert)
                else:
                    tokenizer = train_wordpiece(training_lines, config.vocab_size)
                    log(f"made a WordPiece vocabulary of {tokenizer.vocab_size} from the training text")
                files.write_atomic(run_dir / "tokenizer.model", tokenizer.model_bytes())
        config.data_sha256 = {key: file_sha256(path) for key, path in paths.items() if path is not None}
        if world.is_root:
            config.vocab_size = tokenizer.vocab_size if config.init_from is None else config.vocab_size
            config.write(run_dir)
        world.barrier()
        if not world.is_root:
            tokenizer = from_bytes((run_dir / "tokenizer.model").read_bytes(), str(run_dir / "tokenizer.model"))
            config.vocab_size = tokenizer.vocab_size if config.init_from is None else config.vocab_size
        corpus = corpus_of(tokenizer)
        for split, count in corpus.cut.items():
            if count:
                log(f"cut {count} {split} line{'s' * (count > 1)} longer than --block-size {config.block_size} tokens "
                    f"to their first {config.block_size - 1} and [SEP] (the model reads at most {config.block_size})")
        return RunData(tokenizer, corpus)

    def reopen(self, config, run_dir):
        path = run_dir / "tokenizer.model"
        tokenizer = from_bytes(path.read_bytes() if path.is_file() else b"", str(path))
        if config.labels is not None:
            splits, _ = read_labelled(config.data, config.labels)
            return RunData(tokenizer, LabelledCorpus(tokenizer, splits, config.block_size))
        return RunData(tokenizer, SentenceCorpus(tokenizer, read_texts(config.data), config.block_size))

    def describe(self, trainer, data, run_dir):
        config = trainer.config
        where = f"; fine-tuned from {config.init_from}" if config.init_from is not None else ""
        what = (f"{config.mask_prob:.0%} masked" if config.labels is None else
                f"a classifier of {len(config.labels)} labels ({', '.join(config.labels)})")
        return (f"{self.name} {config.preset} model: {trainer.model.num_parameters():,} parameters, d_model "
                f"{config.d_model}, {config.num_encoder_layers} layers, sequences of up to {config.block_size} tokens, "
                f"{what}, a {config.tokenizer} vocabulary of {data.tokenizer.vocab_size}, on "
                f"{backend.get_device()}; {data.corpus.lengths['train'].size:,} training sequences{where}; run "
                f"folder {run_dir}")
