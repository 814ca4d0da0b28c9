"""Preparing a large text once into memory-mapped token arrays (``--model gpt --corpus-dir DIR``), so that a
run, and every rank of it, maps the ids instead of reading and encoding the text. The folder:

    manifest.json   what was prepared from what: the sources' sha256, the tokenizer's kind and size, the counts
    tokenizer.model the tokenizer the ids belong to (sentencepiece BPE, or characters or a pretrained model's as JSON)
    {split}.bin     the ids of the whole split, one after another (raw little-endian uint16, or int32)

It is written into a locked temp folder beside DIR and renamed into place when whole; a folder whose
manifest records the same sources and settings is reused (after the checks of :func:`open_prepared_text`),
another is refused, and ``rebuild`` (train.py's ``--prepare-again``) replaces it, or a damaged one."""
import hashlib
import os
import pathlib
import reprlib
import shutil

from minitf.backend import host as np
from minitf.training.download import sigterm_raises
from minitf.training.errors import DataError
from minitf.training.files import file_sha256, fsync_dir, write_atomic, write_json_atomic
from minitf.training.text import (check_ids, damaged_file, inside_folder, map_array, move_into_place,
                                  load_manifest, read_text, start_preparation, token_dtype)
from minitf.training.tokenizer import train_tokenizer
from minitf.lm.data import CharTokenizer, TextCorpus, encode_text, tokenizer_from_bytes

#: Bumped whenever the layout or the manifest's meaning changes; a folder of another version is refused.
FORMAT_VERSION = 1
KIND = "minitf-text"
SPLITS = ("train", "valid", "test")
#: Lines of the training text the BPE tokenizer is trained on (the first ones).
SAMPLE_LINES = 1_000_000
#: Lines encoded at a time: memory stays bounded whatever the text's size.
CHUNK_LINES = 100_000


def _lines(path, what):
    """The lines of a UTF-8 text file with their line breaks, read a line at a time (one line if bad)."""
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            first = handle.readline()
            yield first.removeprefix("\ufeff")  # as read_text reads it
            yield from handle
    except UnicodeDecodeError:
        read_text(path, what)  # the one-line error that names the line
        raise
    except OSError as error:
        raise DataError(f"cannot read {what} file {str(path)!r} ({error.strerror or error}); check the path") from None


def _encode_into(handle, tokenizer, path, what, dtype):
    """Append the ids of the text at ``path`` to ``handle``, CHUNK_LINES lines at a time; returns (ids, characters)."""
    n_ids = n_chars = 0
    chunk = []

    def flush():
        nonlocal n_ids
        ids = encode_text(tokenizer, "".join(chunk))
        handle.write(ids.astype(dtype).tobytes())
        n_ids += int(ids.size)
        chunk.clear()

    for line in _lines(path, what):
        chunk.append(line)
        n_chars += len(line)
        if len(chunk) >= CHUNK_LINES:
            flush()
    if chunk:
        flush()
    return n_ids, n_chars


def _recipe(sources, tokenizer_kind, vocab_size, tokenizer=None):
    recipe = dict(sources={split: file_sha256(path) for split, path in sources.items()}, tokenizer=tokenizer_kind,
                  vocab_size=int(vocab_size) if tokenizer_kind == "bpe" else None)
    if tokenizer is not None:  # a pretrained model's: the very one
        recipe["tokenizer_sha256"] = tokenizer.sha256
    return recipe


def prepare_text_corpus(out_dir, sources, tokenizer_kind, vocab_size, rebuild=False, log=print, tokenizer=None):
    """Prepare (or reuse) ``out_dir`` from ``sources`` (``{"train": path, "valid": path, "test": path}``, test
    optional) and return it; ``tokenizer_kind`` "bpe" trains a tokenizer of ``vocab_size``, "char" makes one,
    "pretrained" uses ``tokenizer`` (a pretrained model's). A DataError for bad input or a folder made from other
    sources or settings."""
    out_dir = pathlib.Path(out_dir)
    for split in ("train", "valid"):
        if sources.get(split) is None:
            raise DataError(f"preparing a text needs --{split}-text FILE")
    sources = {split: path for split, path in sources.items() if path is not None}
    for split, path in sources.items():
        read_text_head(path, f"--{split}-text")
    recipe = _recipe(sources, tokenizer_kind, vocab_size, tokenizer)
    started = start_preparation(out_dir, lambda: _reusable(out_dir, recipe, rebuild, log), "prepared text", log)
    if started is None:
        return out_dir
    work, held = started
    try:
        with sigterm_raises():  # SIGTERM too runs the finally below: no temp folder is left
            if tokenizer_kind == "pretrained":
                write_atomic(work / "tokenizer.model", tokenizer.model_bytes())
            elif tokenizer_kind == "char":
                chars = set()
                for line in _lines(sources["train"], "--train-text"):
                    chars.update(line)
                tokenizer = CharTokenizer(chars)
                write_atomic(work / "tokenizer.model", tokenizer.model_bytes())
            else:
                sample = []
                for line in _lines(sources["train"], "--train-text"):
                    sample.append(line.rstrip("\r\n"))
                    if len(sample) >= SAMPLE_LINES:
                        break
                tokenizer = train_tokenizer(sample, work / "tokenizer.model", vocab_size)
            dtype = token_dtype(tokenizer.vocab_size)
            splits = {}
            for split, path in sources.items():
                with open(work / f"{split}.bin", "wb") as handle:
                    tokens, chars = _encode_into(handle, tokenizer, path, f"--{split}-text",
                                                 np.dtype(dtype).newbyteorder("<"))
                    handle.flush()
                    os.fsync(handle.fileno())
                splits[split] = dict(tokens=tokens, chars=chars)
                log(f"prepared {split}: {tokens:,} tokens from {chars:,} characters of {path}")
            manifest = dict(format_version=FORMAT_VERSION, kind=KIND, recipe=recipe,
                            tokenizer_sha256=tokenizer.sha256, vocab_size=tokenizer.vocab_size, dtype=dtype,
                            splits=splits)
            write_json_atomic(work / "manifest.json", manifest)  # last: its presence marks a complete folder
            fsync_dir(work)
            move_into_place(work, out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if held is not None:
            os.close(held)
    return out_dir


def read_text_head(path, what):
    """Refuse a missing, empty or non-file source before anything is written (its whole text is read later)."""
    path = pathlib.Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        read_text(path, what)  # the one-line error: missing, a directory, empty


def _reusable(out_dir, recipe, rebuild, log):
    if not out_dir.exists():
        return False
    if not out_dir.is_dir():
        raise DataError(f"{str(out_dir)!r} is a file, not a prepared text folder; choose another --corpus-dir")
    if not (out_dir / "manifest.json").is_file():
        if any(out_dir.iterdir()):
            raise DataError(f"{str(out_dir)!r} is not empty and holds no prepared text (no manifest.json); "
                            "choose another --corpus-dir")
        return False
    try:
        manifest = read_manifest(out_dir)
        if manifest["recipe"] == recipe:
            open_prepared_text(out_dir, block_size=1)  # every check
            return True
    except DataError as error:
        if rebuild:
            log(f"preparing {out_dir} again: {error}")
            return False
        raise
    if rebuild:
        return False
    theirs = manifest["recipe"]
    differ = sorted(k for k in set(recipe) | set(theirs) if recipe.get(k) != theirs.get(k))
    raise DataError(f"prepared text {str(out_dir)!r} was made from other {', '.join(differ)}; choose another "
                    "--corpus-dir, or replace it: train.py --prepare-again with these data flags")


def _is_count(value, least=0):
    return type(value) is int and value >= least  # noqa: E721 (JSON's true and 1.0 are not counts)


def read_manifest(folder):
    """The manifest of a prepared text folder, every field checked; a one-line DataError for anything else."""
    path, manifest = load_manifest(folder, "prepared text",
                                   "train.py --model gpt --train-text ... --valid-text ... --corpus-dir DIR")

    def refuse(field, value, expected):
        raise damaged_file(path, f"has {field} = {reprlib.repr(value)}, expected {expected}")

    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        refuse("kind", manifest.get("kind") if isinstance(manifest, dict) else manifest,
               f"{KIND!r} (a language model's prepared text, not a translation corpus)")
    if manifest.get("format_version") != FORMAT_VERSION:
        refuse("format_version", manifest.get("format_version"), FORMAT_VERSION)
    if not isinstance(manifest.get("recipe"), dict):
        refuse("recipe", manifest.get("recipe"), "an object")
    if not _is_count(manifest.get("vocab_size"), 1):
        refuse("vocab_size", manifest.get("vocab_size"), "a positive integer")
    if manifest.get("dtype") != token_dtype(manifest["vocab_size"]):
        refuse("dtype", manifest.get("dtype"), repr(token_dtype(manifest["vocab_size"])))
    splits = manifest.get("splits")
    if not isinstance(splits, dict) or not {"train", "valid"} <= set(splits) or not set(splits) <= set(SPLITS):
        refuse("splits", splits, "train, valid and optionally test")
    for split, counts in splits.items():
        if not (isinstance(counts, dict) and _is_count(counts.get("tokens"), 2) and _is_count(counts.get("chars"), 1)):
            refuse(f"splits.{split}", counts, "{\"tokens\": at least 2, \"chars\": at least 1}")
    if not isinstance(manifest.get("tokenizer_sha256"), str):
        refuse("tokenizer_sha256", manifest.get("tokenizer_sha256"), "64 hexadecimal digits")
    return manifest


def open_prepared_text(folder, block_size):
    """(tokenizer, :class:`TextCorpus` over the memory-mapped ids) of a prepared folder, after checking the
    manifest, the tokenizer's sha256, every array's size and every id (in bounded chunks)."""
    folder = pathlib.Path(folder)
    manifest = read_manifest(folder)
    path = inside_folder(folder, "tokenizer.model")
    model = path.read_bytes() if path.is_file() else None
    if model is None or hashlib.sha256(model).hexdigest() != manifest["tokenizer_sha256"]:
        raise damaged_file(path, "is missing" if model is None else "is not the tokenizer its manifest names")
    tokenizer = tokenizer_from_bytes(model, str(path))
    if tokenizer.vocab_size != manifest["vocab_size"]:
        raise damaged_file(path, f"has {tokenizer.vocab_size} ids, its manifest says {manifest['vocab_size']}")
    dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
    tokens, chars = {}, {}
    for split, counts in manifest["splits"].items():
        tokens[split] = map_array(folder, f"{split}.bin", dtype, counts["tokens"])
        check_ids(tokens[split], tokenizer.vocab_size, folder / f"{split}.bin")
        chars[split] = counts["chars"]
    return tokenizer, TextCorpus.from_tokens(tokenizer, tokens, chars, block_size)
