"""Checkpoints that are written atomically and load without running code.

A checkpoint is a folder ``step-00001234/`` holding

- ``model.npz``      every parameter by its dotted name (``np.savez``; loaded with ``allow_pickle=False``)
- ``optimizer.npz``  Adam's first and second moments (absent in averaged checkpoints)
- ``tokenizer.model`` the sentencepiece model the run uses
- ``meta.json``      config, step, epoch, position in the epoch, seeds, and the
                     sha256 of every other file

It is built in a temporary folder beside its final place, flushed to disk, and
renamed into place in one step: a crash or a kill leaves either the complete
checkpoint or none, never half of one. Loading checks every checksum.
"""
import hashlib
import json
import os
import pathlib
import re
import shutil
import tempfile
import zipfile

from minitf.backend import host as np

CHECKPOINT_PATTERN = re.compile(r"^step-(\d{8})$")
FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupted or does not fit."""


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_npz(path, arrays):
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)
        handle.flush()
        os.fsync(handle.fileno())


def write_checkpoint(path, params, meta, tokenizer_bytes, optimizer=None):
    """Write one checkpoint folder at ``path`` atomically.

    params: {name: host array}; optimizer: {"m": array, "v": array} or None;
    meta: JSON-serialisable dict; tokenizer_bytes: the sentencepiece model.
    Raises CheckpointError (with the reason) if the disk refuses; nothing is left behind.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        _write_npz(tmp / "model.npz", params)
        files = ["model.npz", "tokenizer.model"]
        if optimizer is not None:
            _write_npz(tmp / "optimizer.npz", optimizer)
            files.append("optimizer.npz")
        with open(tmp / "tokenizer.model", "wb") as handle:
            handle.write(tokenizer_bytes)
            handle.flush()
            os.fsync(handle.fileno())
        meta = dict(meta, format_version=FORMAT_VERSION,
                    sha256={name: _sha256(tmp / name) for name in files})
        with open(tmp / "meta.json", "w", encoding="utf-8") as handle:
            json.dump(meta, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        _fsync_dir(tmp)
        if path.exists():  # re-saving the same step: move the old one aside first
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
        _fsync_dir(path.parent)
    except OSError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"could not write checkpoint {path}: {error.strerror or error}; "
                              "the previous checkpoints are intact (free disk space, then --resume)") from None
    return path


def read_checkpoint(path, load_optimizer=True):
    """Load and verify a checkpoint folder. Returns a dict with ``params``,
    ``optimizer`` (or None), ``meta`` and ``tokenizer_bytes``.

    Raises CheckpointError naming the problem: missing folder or file,
    checksum mismatch, unreadable archive, or an archive that would need pickle.
    """
    path = pathlib.Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} is not a folder (expected a step-NNNNNNNN folder or a run folder)")
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise CheckpointError(f"checkpoint {path} has no meta.json: it is incomplete or not a checkpoint")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise CheckpointError(f"checkpoint {path}: meta.json is corrupted ({error})") from None
    if not isinstance(meta, dict) or "sha256" not in meta or "config" not in meta:
        raise CheckpointError(f"checkpoint {path}: meta.json lacks its checksums or config")
    for name, expected in meta["sha256"].items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is missing {name}")
        if _sha256(file) != expected:
            raise CheckpointError(f"checkpoint {path}: {name} does not match its checksum (corrupted or truncated)")
    result = {"meta": meta, "params": _read_npz(path / "model.npz"),
              "tokenizer_bytes": (path / "tokenizer.model").read_bytes(), "optimizer": None}
    if load_optimizer and (path / "optimizer.npz").is_file() and "optimizer.npz" in meta["sha256"]:
        result["optimizer"] = _read_npz(path / "optimizer.npz")
    return result


def _read_npz(path):
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except ValueError as error:  # an object array needs pickle: refused
        raise CheckpointError(f"{path} holds data that would need pickle to load; refused ({error})") from None
    except (OSError, zipfile.BadZipFile, EOFError, KeyError) as error:
        raise CheckpointError(f"{path} is not a readable .npz archive ({error})") from None


def list_checkpoints(run_dir):
    """Complete checkpoint folders of a run (``<run>/checkpoints/step-*``), oldest first."""
    folder = pathlib.Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir()
             if (m := CHECKPOINT_PATTERN.match(p.name)) and (p / "meta.json").is_file()]
    return [p for _, p in sorted(found)]


def latest_valid_checkpoint(run_dir):
    """The newest checkpoint of a run that passes its checks, and the errors of
    newer ones that did not (a corrupted latest falls back to the one before)."""
    errors = []
    for path in reversed(list_checkpoints(run_dir)):
        try:
            return read_checkpoint(path), path, errors
        except CheckpointError as error:
            errors.append(str(error))
    return None, None, errors


def checkpoint_path(run_dir, step):
    return pathlib.Path(run_dir) / "checkpoints" / f"step-{step:08d}"


def prune_checkpoints(run_dir, keep):
    """Delete all but the newest ``keep`` checkpoints (and stale temporary folders)."""
    checkpoints = list_checkpoints(run_dir)
    for path in checkpoints[:-keep] if keep > 0 else []:
        shutil.rmtree(path, ignore_errors=True)
    folder = pathlib.Path(run_dir) / "checkpoints"
    for stale in folder.glob(".step-*.tmp-*") if folder.is_dir() else []:
        shutil.rmtree(stale, ignore_errors=True)


def average_checkpoints(paths, out_path):
    """Average the parameters of several checkpoints of one run (paper: the last 5)
    into a new checkpoint at ``out_path``; returns it. They must share the model
    shapes (``meta["model"]``) and the tokenizer."""
    paths = list(paths)
    if not paths:
        raise CheckpointError("no checkpoints to average")
    loaded = [read_checkpoint(p, load_optimizer=False) for p in paths]
    first = loaded[0]
    for other, p in zip(loaded[1:], paths[1:]):
        if (other["meta"].get("model"), other["tokenizer_bytes"]) != (first["meta"].get("model"), first["tokenizer_bytes"]):
            raise CheckpointError(f"cannot average {paths[0]} with {p}: their model shapes or tokenizer differ")
    params = {name: np.mean([c["params"][name].astype(np.float64) for c in loaded], axis=0).astype(array.dtype)
              for name, array in first["params"].items()}
    meta = dict(loaded[-1]["meta"], averaged_from=[str(p) for p in paths])
    meta.pop("sha256", None)
    return write_checkpoint(out_path, params, meta, first["tokenizer_bytes"])
