"""Translate with a trained checkpoint or a pretrained model: ``python -m minitf.translate --checkpoint
RUN_OR_CHECKPOINT_OR_MARIAN_FOLDER``.

Reads source sentences from stdin (or ``--src FILE``), one per line, and writes one translation
per line on stdout: on a terminal each line as it is typed, from a pipe or file in batches. ``--reference
FILE`` also prints corpus BLEU (sacrebleu) on stderr. A run's model decodes with the paper's rules:
beam search by default (beam 4, alpha 0.6, at most input length + 50 tokens); ``--beam 1`` is greedy.
A Hugging Face Marian folder (an opus-mt model: config.json, model.safetensors, source.spm, target.spm,
vocab.json) decodes as transformers' ``generate`` does, with its generation_config.json's beam size, length
limit and length penalty unless ``--beam``, ``--max-new-tokens`` or ``--alpha`` say otherwise. A T5 folder or run (any kind
that translates: ``Kind.translates``) decodes as its kind says (``Kind.translator``): T5's task prefix before each
sentence (``--prefix``), ``generate``'s rules. A sentence longer than
the model's context (a run's --max-len, a Marian folder's max_position_embeddings) is refused naming its line,
and no output passes the context less the decoder's start token (docs/decoding.md, "Positions and padding").
"""
import pathlib
import sys

from minitf import backend
from minitf.loader import kind_of, load
from minitf.nmt.config import MAX_ALPHA
from minitf.nmt.decode import translate_texts
from minitf.nmt.kind import KIND
from minitf.training.errors import (DataError, OneLineParser, UsageError, add_renamed, number_in, positive,
                                   report_errors)
from minitf.training.text import answer_each_line, decode_lines, read_lines


def load_translator(path, warn=None, prefix=None):
    """(model, tokenizer, :class:`minitf.nmt.decode.DecodingSettings`, why) of ``--checkpoint``: a run or
    checkpoint folder, or a Hugging Face folder, of a kind that translates (``Kind.translates``: a translation run,
    a Marian folder, a T5 folder or run) (:func:`minitf.loader.load`); a model of another kind is refused in one line
    naming the command that reads it. The kind gives the three (``Kind.translator``, with ``prefix``: --prefix);
    the settings hold the model's context, ``why`` says where it comes from."""
    loaded = load(path, warn, kind=translating_kind(path))
    model, tokenizer, settings = loaded.kind.translator(loaded, prefix)
    return model, tokenizer, settings, loaded.context_why


def translating_kind(path):
    """The kind that reads ``path`` here: its own where its models translate, else the translation kind, whose
    reader refuses a model of another kind in one line naming the command that reads it."""
    found = kind_of(path)
    return found if found is not None and found.translates else KIND


def decoding(settings, args, why=""):
    """The decoding settings with the user's flags in place of the model's; a --max-new-tokens whose output would not
    fit the model's context with its start token is refused."""
    positions = settings.max_positions
    if args.max_new_tokens is not None and positions is not None and args.max_new_tokens > positions - 1:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens} does not fit the model's context of {positions} "
                         f"({why}) with the decoder's start token; use at most {positions - 1}")
    return settings.with_flags(beam=args.beam, alpha=args.alpha, max_len=args.max_new_tokens)


def translate_interactively(model, tokenizer, settings, stdin=None, stdout=None, stderr=None, why=""):
    """Answer each line typed in a terminal with its translation as soon as it ends (an empty line
    gives an empty line; a line longer than the model's context an error line, and the session goes on).
    ``settings``: a :class:`minitf.nmt.decode.DecodingSettings`."""
    def answer(text, number):
        return translate_texts(model, tokenizer, [text], batch_size=1, settings=settings,
                               where=lambda i: "that line", why=why)[0] if text else ""
    return answer_each_line(answer, "a sentence", "--src FILE or a pipe", stdin, stdout, stderr)


def build_parser():
    p = OneLineParser(prog="python -m minitf.translate", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, type=pathlib.Path,
                   help="run folder, checkpoint folder, or Hugging Face Marian (opus-mt) or T5 folder")
    p.add_argument("--beam", type=positive(int), default=None,
                   help="beam size, 1 = greedy (default: 4 for a run, generation_config.json's num_beams for a "
                        "Marian folder)")
    p.add_argument("--alpha", type=number_in(0, MAX_ALPHA), default=None,
                   help=f"length penalty exponent, 0 to {MAX_ALPHA:g} (a run: GNMT's, default 0.6; a Marian "
                        "folder: Hugging Face's length_penalty, default generation_config.json's)")
    add_renamed(p, "--max-new-tokens", "--max-len", type=positive(int), default=None,
                help="most tokens of a translation counting its end (default: source length + 50 for a run, "
                     "generation_config.json's max_length - 1 for a Marian folder)")
    p.add_argument("--prefix", default=None,
                   help="a T5 folder's task prefix put before each sentence: one of its config.json's "
                        "task_specific_params, by task name (translation_en_to_fr) or text (default: its first "
                        "translation_* task's)")
    p.add_argument("--batch-size", type=positive(int), default=64)
    p.add_argument("--src", type=pathlib.Path, help="source file (default: stdin)")
    add_renamed(p, "--reference", "--ref", type=pathlib.Path, metavar="FILE",
                help="reference translations, one a line: print BLEU on stderr")
    p.add_argument("--device", choices=["cpu", "gpu"], default=None)
    return p


def run(argv=None):
    args = build_parser().parse_args(argv)
    if args.device:
        backend.set_device(args.device)
    else:
        backend.check_environment()  # a bad MINITF_DEVICE: one line, not a traceback
    warn = lambda message: print(message, file=sys.stderr)  # noqa: E731
    if args.src is None and args.reference is None and sys.stdin.isatty():  # a person typing: answer each line
        model, tokenizer, options, why = load_translator(args.checkpoint, warn, args.prefix)
        return translate_interactively(model, tokenizer, decoding(options, args, why), why=why)
    if args.src is not None:
        sources, origin = read_lines(args.src, "--src"), f"--src {args.src}"
    else:
        sources, origin = decode_lines(sys.stdin.buffer.read(), "standard input"), "standard input"
    references = read_lines(args.reference, "--reference") if args.reference is not None else None
    if references is not None and len(references) != len(sources):
        raise DataError(f"--reference has {len(references)} lines but the source has {len(sources)}; "
                        "they must match line by line")
    model, tokenizer, options, why = load_translator(args.checkpoint, warn, args.prefix)
    numbers = [number for number, s in enumerate(sources, start=1) if s]  # the line of each sentence translated
    translated = iter(translate_texts(model, tokenizer, [s for s in sources if s], batch_size=args.batch_size,
                                      settings=decoding(options, args, why),
                                      where=lambda i: f"{origin}: line {numbers[i]}", why=why))
    hypotheses = [next(translated) if s else "" for s in sources]  # an empty line gives an empty line
    sys.stdout.write("".join(h + "\n" for h in hypotheses))
    sys.stdout.flush()
    if references is not None:
        import sacrebleu
        bleu = sacrebleu.corpus_bleu(hypotheses, [references])
        print(f"BLEU {bleu.score:.2f} ({bleu})", file=sys.stderr)
    return 0


#: The flag of each setting that can drive decoding's memory (minitf.nmt.decode.DecodingOutOfMemory.driver).
MEMORY_FLAGS = {"max_len": "--max-new-tokens", "beam": "--beam", "batch_size": "--batch-size"}


def memory_hint(error):
    """What to lower after running out of memory: the flag of the setting that drove decoding's arrays, or
    --batch-size or --beam when none stands out (or the memory ran out elsewhere)."""
    flag = MEMORY_FLAGS.get(getattr(error, "driver", None))
    return f"use a smaller {flag}" if flag else "use a smaller --batch-size or --beam"


def main(argv=None):
    backend.keep_freed_memory()  # decoding's temporaries reuse freed memory (see train.py)
    return report_errors("minitf.translate", run, argv, memory_hint=memory_hint)


if __name__ == "__main__":
    sys.exit(main())
