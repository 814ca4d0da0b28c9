"""Write a translation run as a Hugging Face Marian folder: ``python -m minitf.export RUN FOLDER``.

RUN is a run folder of ``train.py`` (its ``best.json`` choice, else its newest good checkpoint) or one
checkpoint folder. FOLDER (new, or empty) receives what ``transformers.MarianMTModel.from_pretrained`` and
``MarianTokenizer.from_pretrained`` read: config.json, model.safetensors, generation_config.json and the
tokenizer's files. The model is written exactly (:func:`minitf.nmt.marian.save_pretrained`): the paper's interleaved
sinusoids become Marian's [sin | cos] halves by a fixed permutation of the model axis, minitf's BOS
becomes ``decoder_start_token_id``, its pad and eos ids the config's. minitf's joint sentencepiece
tokenizer becomes ``source.spm`` = ``target.spm`` and a ``vocab.json`` mapping each piece to minitf's id,
so MarianTokenizer gives minitf's ids (and appends the eos, as minitf's batches do).

What transformers computes differently: the decoder's self-attention does not mask target padding (the
logits of positions whose input is pad differ; no loss and no decoding reads them), and its beam search
uses its own length penalty (generation_config.json: length_penalty 1.0), not the paper's (--alpha).
"""
import pathlib
import sys

from minitf import pretrained
from minitf.loader import load
from minitf.pretrained import is_hugging_face_folder
from minitf.nmt import marian
from minitf.nmt.kind import KIND
from minitf.training.errors import OneLineParser, UsageError, report_errors
from minitf.training.tokenizer import BOS_ID, EOS_ID, Tokenizer


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


def tokenizer_files(tokenizer, src_lang, tgt_lang):
    """``{file name: bytes}`` of a Marian tokenizer equal to minitf's joint sentencepiece ``tokenizer``: both
    .spm files are its model, vocab.json maps each of its pieces to its own id (pad "<pad>" 0, unk "<unk>" 1,
    "<s>" 2, eos "</s>" 3: the names MarianTokenizer looks up)."""
    import json
    import sentencepiece
    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_bytes())
    vocab = {processor.id_to_piece(i): i for i in range(processor.get_piece_size())}
    specials = {"pad_token": tokenizer.pad_id, "unk_token": tokenizer.unk_id, "eos_token": tokenizer.eos_id}
    config = {name: processor.id_to_piece(i) for name, i in specials.items()}
    config.update(source_lang=src_lang, target_lang=tgt_lang, separate_vocabs=False, model_max_length=512,
                  tokenizer_class="MarianTokenizer")

    def as_json(values):
        return (json.dumps(values, indent=2, ensure_ascii=False) + "\n").encode("utf-8")

    return {"source.spm": tokenizer.model_bytes(), "target.spm": tokenizer.model_bytes(),
            "vocab.json": as_json(vocab), "tokenizer_config.json": as_json(config)}


def export(run, folder, warn=None):
    """Write the model and tokenizer of ``run`` (a run or checkpoint folder) as a Marian ``folder`` (new or
    empty). A one-line error (UsageError, CheckpointError, ValueError) before
    anything is written for a folder in use, a model Marian cannot hold. A run of another kind is written by its
    kind (:meth:`minitf.training.kind.Kind.write_folder`). Returns the :class:`minitf.training.kind.Loaded` run."""
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
                         "export (use it as it is, or copy it)")
    loaded = load(run, warn)
    if loaded.kind is not KIND:  # a run of another kind: its own folder format (or its one-line refusal)
        loaded.kind.write_folder(loaded, folder)
        return loaded
    model, tokenizer, meta = loaded.model, loaded.tokenizer, loaded.meta
    config = meta.get("config", {})
    generation = None
    if isinstance(tokenizer, Tokenizer):  # minitf's own: one sentencepiece model for both sides
        files = tokenizer_files(tokenizer, config.get("src_lang", "de"), config.get("tgt_lang", "en"))
    elif hasattr(tokenizer, "save"):      # a Marian folder's (a run fine-tuned from one): its own files
        files = None
    else:
        raise UsageError(f"{run}: its tokenizer ({type(tokenizer).__name__}) has no Marian files; "
                         "only translation runs can be exported")
    hf = marian.config_json(model, loaded.hf_config, BOS_ID, EOS_ID)  # a fine-tuned Marian folder's entries kept
    # a run fine-tuned from a Marian folder: that folder's generation_config.json, kept in the run
    generation = ((config.get("marian") or {}).get("generation")
                  or marian.generation_config(hf, num_beams=int(config.get("beam", 4))))
    marian.save_pretrained(model, folder, loaded.hf_config, decoder_start_id=BOS_ID, eos_id=EOS_ID,
                           generation=generation, tokenizer_files=files or {})
    if files is None:
        tokenizer.save(folder)
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
