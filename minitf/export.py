"""``python -m minitf.export RUN FOLDER``: a run of ``train.py`` (its ``best.json`` choice, else its newest good
checkpoint) or one checkpoint folder, written as the Hugging Face folder of its kind (a Marian folder for
translation, GPT-2, the Llama family's) into FOLDER (new, or empty): :func:`minitf.save_pretrained`, the one writer,
whose kind writes the model, config.json, generation settings and tokenizer."""
import pathlib
import sys

from minitf import pretrained
from minitf.loader import load, save_pretrained
from minitf.pretrained import is_hugging_face_folder
from minitf.training.errors import OneLineParser, UsageError, report_errors


def build_parser():
    p = OneLineParser(prog="python -m minitf.export", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", type=pathlib.Path, nargs="+", metavar="[RUN] FOLDER",
                   help="the run folder or checkpoint folder of train.py (unless given as --checkpoint), then the "
                        "Hugging Face folder to write (new or empty)")
    p.add_argument("--checkpoint", type=pathlib.Path, metavar="RUN",
                   help="the run folder or checkpoint folder, as the other commands take it")
    return p


def parse_args(argv=None):
    """RUN and FOLDER from ``RUN FOLDER`` or ``--checkpoint RUN FOLDER``; a one-line usage error otherwise."""
    parser = build_parser()
    args = parser.parse_args(argv)
    wanted = 1 if args.checkpoint is not None else 2
    if len(args.paths) != wanted:
        parser.error(f"expected {'FOLDER after --checkpoint RUN' if wanted == 1 else 'RUN FOLDER'}, got "
                     f"{len(args.paths)} path{'s' * (len(args.paths) != 1)}")
    args.run = args.checkpoint if args.checkpoint is not None else args.paths[0]
    args.folder = args.paths[-1]
    return args


def export(run, folder, warn=None):
    """Write the model and tokenizer of ``run`` (a run or checkpoint folder) as a Hugging Face ``folder`` (new or
    empty) of its kind; a one-line error (UsageError, CheckpointError, ValueError) before anything is written for a
    folder in use or a model its format cannot hold. Returns the :class:`minitf.training.kind.Loaded` run."""
    run, folder = pathlib.Path(run), pathlib.Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UsageError(f"{folder} {'is a file' if not folder.is_dir() else 'is not empty'}; give a new or empty "
                         "folder for the Hugging Face files (nothing was written)")
    try:  # the missing extra: one line before the run is read (minitf reads safetensors without it)
        pretrained.safetensors_numpy()
    except ImportError:
        raise UsageError("python -m minitf.export writes model.safetensors with the safetensors package, not "
                         "installed here: pip install -e '.[hf]' (nothing was written)") from None
    if is_hugging_face_folder(run):
        raise UsageError(f"{run} is already a Hugging Face folder, not a run of train.py: there is nothing to "
                         "export (use it as it is, or copy it; minitf.save_pretrained(minitf.load(FOLDER), OTHER) "
                         "writes it again)")
    loaded = load(run, warn)
    save_pretrained(loaded, folder)
    return loaded


def run(argv=None):
    args = parse_args(argv)
    loaded = export(args.run, args.folder, warn=lambda message: print(message, file=sys.stderr))
    print(f"wrote {args.folder}: a {loaded.kind.hf_what} of step {loaded.step if loaded.step is not None else '?'} "
          f"(load it with transformers' from_pretrained, or "
          f"{loaded.kind.use_a_run.replace('RUN', str(args.folder))})", file=sys.stderr)
    return 0


def main(argv=None):
    return report_errors("minitf.export", run, argv, memory_hint="export on a machine with more memory")


if __name__ == "__main__":
    sys.exit(main())
