"""Translate with a trained checkpoint: ``python -m minitf.translate --checkpoint RUN_OR_CHECKPOINT``.

Reads source sentences from stdin (or ``--src FILE``), one per line, and writes one translation
per line on stdout: on a terminal each line as it is typed, from a pipe or file in batches. ``--ref
FILE`` also prints corpus BLEU (sacrebleu) on stderr. Beam search by default (paper: beam 4, alpha
0.6, at most input length + 50 tokens); ``--beam 1`` is greedy.
"""
import pathlib
import sys

from minitf import backend
from minitf.training.checkpoint import load_model
from minitf.training.config import MAX_ALPHA
from minitf.training.text import answer_each_line, decode_lines, read_lines
from minitf.nmt.decode import translate_texts
from minitf.training.errors import DataError, OneLineParser, number_in, positive, report_errors


def translate_interactively(model, tokenizer, beam, alpha, stdin=None, stdout=None, stderr=None):
    """Answer each line typed in a terminal with its translation as soon as it ends (an empty line
    gives an empty line)."""
    def answer(text, number):
        return translate_texts(model, tokenizer, [text], beam, alpha, batch_size=1)[0] if text else ""
    return answer_each_line(answer, "a sentence", "--src FILE or a pipe", stdin, stdout, stderr)


def build_parser():
    p = OneLineParser(prog="python -m minitf.translate", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, type=pathlib.Path, help="run folder or checkpoint folder")
    p.add_argument("--beam", type=positive(int), default=4, help="beam size (1 = greedy)")
    p.add_argument("--alpha", type=number_in(0, MAX_ALPHA), default=0.6,
                   help=f"length penalty exponent (0 to {MAX_ALPHA:g})")
    p.add_argument("--batch-size", type=positive(int), default=64)
    p.add_argument("--src", type=pathlib.Path, help="source file (default: stdin)")
    p.add_argument("--ref", type=pathlib.Path, help="reference translations: print BLEU on stderr")
    p.add_argument("--device", choices=["cpu", "gpu"], default=None)
    return p


def run(argv=None):
    args = build_parser().parse_args(argv)
    if args.device:
        backend.set_device(args.device)
    else:
        backend.check_environment()  # a bad MINITF_DEVICE: one line, not a traceback
    if args.src is None and args.ref is None and sys.stdin.isatty():  # a person typing: answer each line
        model, tokenizer, _ = load_model(args.checkpoint, warn=lambda message: print(message, file=sys.stderr))
        return translate_interactively(model, tokenizer, args.beam, args.alpha)
    if args.src is not None:
        sources = read_lines(args.src, "--src")
    else:
        sources = decode_lines(sys.stdin.buffer.read(), "standard input")
    references = read_lines(args.ref, "--ref") if args.ref is not None else None
    if references is not None and len(references) != len(sources):
        raise DataError(f"--ref has {len(references)} lines but the source has {len(sources)}; "
                        "they must match line by line")
    model, tokenizer, _ = load_model(args.checkpoint, warn=lambda message: print(message, file=sys.stderr))
    translated = iter(translate_texts(model, tokenizer, [s for s in sources if s], args.beam, args.alpha,
                                      args.batch_size))
    hypotheses = [next(translated) if s else "" for s in sources]  # an empty line gives an empty line
    sys.stdout.write("".join(h + "\n" for h in hypotheses))
    sys.stdout.flush()
    if references is not None:
        import sacrebleu
        bleu = sacrebleu.corpus_bleu(hypotheses, [references])
        print(f"BLEU {bleu.score:.2f} ({bleu})", file=sys.stderr)
    return 0


def main(argv=None):
    backend.keep_freed_memory()  # decoding's temporaries reuse freed memory (see train.py)
    return report_errors("minitf.translate", run, argv, memory_hint="use a smaller --batch-size or --beam")


if __name__ == "__main__":
    sys.exit(main())
