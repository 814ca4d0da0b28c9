"""Translate with a trained checkpoint: ``python -m minitf.translate --checkpoint RUN_OR_CHECKPOINT``.

Reads source sentences from stdin (or ``--src FILE``), one per line, and writes
one translation per line on stdout; on a terminal each line is answered as it is
typed, from a pipe or a file the sentences are translated in batches. With ``--ref FILE`` it also prints the
corpus BLEU (sacrebleu) on stderr. Beam search by default (paper: beam 4,
length penalty alpha 0.6, at most input length + 50 tokens); ``--beam 1`` is greedy.
"""
import json
import pathlib
import sys

from minitf import backend
from minitf.transformer import Transformer
from minitf.nmt import checkpoint as ckpt
from minitf.nmt.cli import OneLineParser, non_negative, positive, report_errors
from minitf.nmt.config import RunConfig
from minitf.nmt.data import decode_lines, read_lines
from minitf.nmt.errors import CheckpointError, DataError, UsageError
from minitf.nmt.evaluate import translate_texts
from minitf.nmt.interactive import translate_interactively
from minitf.nmt.tokenizer import Tokenizer


def best_checkpoint(run_dir):
    """(the checkpoint best.json names, None) or (None, why it is not used). best.json
    must name, relative to the run folder, a checkpoint inside it (after resolving
    links): ``{"checkpoint": "../elsewhere/ck"}`` is refused."""
    run_dir = pathlib.Path(run_dir)
    best = run_dir / "best.json"
    if not best.is_file():
        return None, None
    try:
        chosen = json.loads(best.read_text(encoding="utf-8"))["checkpoint"]
        if not isinstance(chosen, str) or not chosen:
            raise TypeError
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, OSError, RecursionError):
        return None, f"{best} is not valid (expected {{\"checkpoint\": \"checkpoints/...\"}})"
    resolved = (run_dir / chosen).resolve()
    if not resolved.is_relative_to(run_dir.resolve()):
        return None, f"{best} names {chosen!r}, outside the run folder"
    if not (resolved / "meta.json").is_file():
        return None, f"{best} names {chosen!r}, which is not a checkpoint"
    return run_dir / chosen, None


def resolve_checkpoint(path, warn=None):
    """A checkpoint folder, or a run folder (its best.json choice, else its newest checkpoint)."""
    path = pathlib.Path(path)
    if (path / "meta.json").is_file():
        return path
    chosen, problem = best_checkpoint(path)
    if problem and warn is not None:
        warn(f"warning: ignoring best.json: {problem}; using the newest good checkpoint")
    if chosen is not None:
        return chosen
    checkpoints = ckpt.list_checkpoints(path)
    if checkpoints:
        return checkpoints[-1]
    if not path.exists():
        raise CheckpointError(f"--checkpoint {path} does not exist; pass the --out folder of train.py "
                                   "or one of its checkpoints/step-NNNNNNNN folders")
    raise CheckpointError(f"{path} is neither a checkpoint folder (with meta.json) nor a run folder "
                               "with checkpoints/; pass the --out folder of train.py or one of its checkpoints")


def _candidates(path, warn=None):
    """Checkpoints to try for ``path``: the one it names; for a run folder, its
    chosen one first, then every other checkpoint, newest first."""
    first = resolve_checkpoint(path, warn)
    path = pathlib.Path(path)
    if first == path:  # an explicit checkpoint folder: that one or nothing
        return [first]
    others = [p for p in reversed(ckpt.list_checkpoints(path)) if p != first]
    return [first] + others


def load_checkpoint_model(folder):
    """(model in eval mode, tokenizer, meta) from one checkpoint folder; a CheckpointError
    if it is damaged or its parts do not fit together."""
    built = {}

    def expect(state, path):  # meta.json and the tokenizer first, then a model, then the arrays' headers
        tokenizer = Tokenizer.from_bytes(state["tokenizer_bytes"])
        meta = state["meta"]
        if meta.get("tokenizer_sha256") not in (None, tokenizer.sha256):
            raise CheckpointError(f"{folder}: its tokenizer.model is not the one the model was trained with "
                                  "(tokenizer_sha256 in meta.json differs); use another checkpoint of the run")
        if meta.get("vocab_size") not in (None, tokenizer.vocab_size):
            raise CheckpointError(f"{folder}: the model was trained for a vocabulary of {meta['vocab_size']} but "
                                  f"its tokenizer has {tokenizer.vocab_size}; use another checkpoint of the run")
        try:
            config = RunConfig.from_dict(meta["config"], where=f"{folder}: meta.json's config")
        except UsageError as error:
            raise CheckpointError(f"{error}; use a checkpoint written by this train.py") from None
        check_model_fits_file(config, tokenizer.vocab_size, path / "model.npz")
        try:
            model = Transformer.from_config(config.model_config(tokenizer.vocab_size))
        except (ValueError, TypeError) as error:
            raise CheckpointError(f"{folder}: meta.json's config does not describe a model: {error}") from None
        built.update(model=model, tokenizer=tokenizer)
        return {"model.npz": {name: (tuple(p.shape), backend.host.dtype(p.data.dtype))
                              for name, p in model.named_parameters()}}

    state = ckpt.read_checkpoint(folder, load_optimizer=False, expect=expect)
    model = built["model"]
    try:
        model.load_state_dict(state["params"])
    except (ValueError, TypeError) as error:
        raise CheckpointError(f"{folder}: the parameters do not fit the saved config: {error}") from None
    return model.eval(), built["tokenizer"], state["meta"]


def check_model_fits_file(config, vocab_size, model_file):
    """Refuse, before a model is built, a config that declares more parameters than
    ``model_file`` can hold (a crafted meta.json with d_model 10**9 would otherwise
    ask for terabytes). Counts a lower bound: embeddings, attention and feed-forward
    weights, at 2 bytes each (the smallest float a checkpoint may hold)."""
    d, f = config.d_model, config.d_ff
    at_least = (vocab_size * d + config.num_encoder_layers * (4 * d * d + 2 * d * f)
                + config.num_decoder_layers * (8 * d * d + 2 * d * f))
    size = model_file.stat().st_size
    if 2 * at_least > size:
        raise CheckpointError(f"{model_file.parent}: meta.json's config and model.npz do not fit together: the "
                              f"config declares at least {at_least:,} parameters (d_model {d}, d_ff {f}), more "
                              f"than model.npz ({size:,} bytes) can hold; use another checkpoint of the run")


def load_model(path, warn=None):
    """(model in eval mode, tokenizer, meta) from a checkpoint or run folder.

    An explicit checkpoint folder must pass every check. For a run folder, a
    damaged checkpoint is skipped for the next newest, with ``warn(message)``."""
    errors = []
    for folder in _candidates(path, warn):
        try:
            result = load_checkpoint_model(folder)
        except (CheckpointError, DataError) as error:
            errors.append(str(error))
            continue
        for error in errors:
            (warn or (lambda m: None))(f"warning: skipping a bad checkpoint: {error}; using {folder}")
        return result
    if len(errors) == 1:
        raise CheckpointError(errors[0])
    raise CheckpointError(f"none of the {len(errors)} checkpoints in {path} is usable; the newest: {errors[0]}")


def build_parser():
    p = OneLineParser(prog="python -m minitf.translate", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, type=pathlib.Path, help="run folder or checkpoint folder")
    p.add_argument("--beam", type=positive(int), default=4, help="beam size (1 = greedy)")
    p.add_argument("--alpha", type=non_negative, default=0.6, help="length penalty exponent")
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
    nonempty = [i for i, s in enumerate(sources) if s]
    translated = translate_texts(model, tokenizer, [sources[i] for i in nonempty], args.beam, args.alpha,
                                 args.batch_size)
    hypotheses = [""] * len(sources)
    for i, text in zip(nonempty, translated):
        hypotheses[i] = text
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
