"""Checkpoints that are written atomically and load without running code.

A checkpoint is a folder ``step-00001234/`` holding

- ``model.npz``      every parameter by its dotted name (``np.savez``; loaded with ``allow_pickle=False``)
- ``optimizer.npz``  Adam's first and second moments (absent in averaged checkpoints)
- ``tokenizer.model`` the sentencepiece model the run uses
- ``meta.json``      config, step, epoch, position in the epoch, seeds, and the
                     sha256 of every other file

It is built in a temporary folder beside its final place, flushed to disk, and
renamed into place in one step: a crash or a kill leaves either the complete
checkpoint or none, never half of one (a kill can leave a hidden ``.step-*.tmp-*``
folder, which is ignored and removed by the next save or ``--resume``). Loading
checks every checksum and never unpickles: a file that would need pickle is refused.

For tests only: ``MINITF_TEST_SLOW_CHECKPOINT=SECONDS`` sleeps that long after each
file written into the temporary folder, so a test can kill a process mid-write.
"""
import json
import os
import pathlib
import re
import shutil
import tempfile
import time
import zipfile

from minitf.backend import host as np
from minitf.nmt.errors import CheckpointError
from minitf.nmt.files import file_sha256, fsync_dir

CHECKPOINT_PATTERN = re.compile(r"^step-(\d{8})$")
FORMAT_VERSION = 1
FILES = ("model.npz", "optimizer.npz", "tokenizer.model")  # what meta.json may list (no other path is read)


def _slow_for_tests():
    """Test hook: widen the window in which a kill lands mid-write (see the module doc)."""
    delay = os.environ.get("MINITF_TEST_SLOW_CHECKPOINT")
    if delay:
        time.sleep(float(delay))


def _write_npz(path, arrays):
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)
        handle.flush()
        os.fsync(handle.fileno())
    _slow_for_tests()


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
        _slow_for_tests()
        meta = dict(meta, format_version=FORMAT_VERSION,
                    sha256={name: file_sha256(tmp / name) for name in files})
        with open(tmp / "meta.json", "w", encoding="utf-8") as handle:
            json.dump(meta, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        fsync_dir(tmp)
        if path.exists():  # re-saving the same step: move the old one aside first
            old = path.with_name(f".{path.name}.old")  # restored by recover_checkpoints() after a kill
            shutil.rmtree(old, ignore_errors=True)
            os.rename(path, old)
            os.rename(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
        fsync_dir(path.parent)
    except OSError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"could not write checkpoint {path}: {error.strerror or error}; "
                              "the previous checkpoints are intact (free disk space, then --resume)") from None
    except BaseException:  # KeyboardInterrupt, SystemExit: leave nothing half-written behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def read_checkpoint(path, load_optimizer=True):
    """Load and verify a checkpoint folder. Returns a dict with ``params``,
    ``optimizer`` (or None), ``meta`` and ``tokenizer_bytes``.

    Raises CheckpointError naming the problem: missing folder or file,
    checksum mismatch, unreadable archive, or an archive that would need pickle.
    """
    path = pathlib.Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} is not a folder; expected a step-NNNNNNNN folder or a run folder")
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise CheckpointError(f"checkpoint {path} has no meta.json: it is incomplete or not a checkpoint; "
                              "use another checkpoint of the run")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise CheckpointError(f"checkpoint {path}: meta.json is not valid JSON ({error}); "
                              "use another checkpoint of the run") from None
    if not (isinstance(meta, dict) and isinstance(meta.get("sha256"), dict) and isinstance(meta.get("config"), dict)):
        raise CheckpointError(f"checkpoint {path}: meta.json lacks its checksums or config; "
                              "it was not written by minitf, use another checkpoint")
    listed = set(meta["sha256"])
    if not {"model.npz", "tokenizer.model"} <= listed or not listed <= set(FILES):
        raise CheckpointError(f"checkpoint {path}: meta.json lists files {sorted(listed)}, expected model.npz, "
                              "tokenizer.model and optionally optimizer.npz; use another checkpoint")
    for name, expected in sorted(meta["sha256"].items()):
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is missing {name} (deleted or copied incompletely); "
                                  "use another checkpoint of the run")
        if file_sha256(file) != expected:
            raise CheckpointError(f"checkpoint {path}: {name} does not match its checksum (sha256 in meta.json): "
                                  "corrupted, truncated or replaced; use another checkpoint of the run")
    result = {"meta": meta, "params": _read_npz(path / "model.npz"),
              "tokenizer_bytes": (path / "tokenizer.model").read_bytes(), "optimizer": None}
    if load_optimizer and (path / "optimizer.npz").is_file() and "optimizer.npz" in meta["sha256"]:
        result["optimizer"] = _read_npz(path / "optimizer.npz")
    return result


def _read_npz(path):
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except ValueError as error:  # an object array needs pickle (which can run code): refused
        if "pickle" in str(error).lower():
            raise CheckpointError(f"{path} holds data that would need pickle to load (and pickle can run code); "
                                  "refused: expected plain numeric arrays, use a checkpoint written by minitf"
                                  ) from None
        raise CheckpointError(f"{path} is not a readable .npz archive ({error}); use another checkpoint") from None
    except (OSError, zipfile.BadZipFile, EOFError, KeyError) as error:
        raise CheckpointError(f"{path} is not a readable .npz archive ({error}); use another checkpoint") from None


def list_checkpoints(run_dir, complete_only=True):
    """The ``<run>/checkpoints/step-NNNNNNNN`` folders of a run, oldest first.

    ``complete_only`` keeps those with a meta.json (written last, so a folder
    without one is not a checkpoint); False lists every step folder, for
    ``--resume`` to check and set aside the damaged ones."""
    folder = pathlib.Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := CHECKPOINT_PATTERN.match(p.name))
             and p.is_dir() and (not complete_only or (p / "meta.json").is_file())]
    return [p for _, p in sorted(found)]


def latest_valid_checkpoint(run_dir, check=None):
    """The newest checkpoint of a run that passes its checks, and the errors of
    newer ones that did not (a corrupted latest falls back to the one before).

    ``check(state, path)`` may raise CheckpointError to refuse a checkpoint that
    reads fine but does not fit (another model size or tokenizer).
    Returns ``(state, path, [(path, message), ...])``; state and path are None
    when no checkpoint passes."""
    errors = []
    for path in reversed(list_checkpoints(run_dir, complete_only=False)):
        try:
            state = read_checkpoint(path)
            if check is not None:
                check(state, path)
            return state, path, errors
        except CheckpointError as error:
            errors.append((path, str(error)))
    return None, None, errors


def recover_checkpoints(run_dir):
    """Repair what a kill can leave in ``<run>/checkpoints``: put back a checkpoint
    that was moved aside to be re-saved (``.step-N.old`` without ``step-N``) and
    delete temporary and half-deleted folders. Returns the paths it removed."""
    folder = pathlib.Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    for old in folder.glob(".*.old"):
        final = folder / old.name[1:-len(".old")]
        if not final.exists() and (old / "meta.json").is_file():
            os.rename(old, final)
    removed = [p for pattern in (".*.tmp-*", ".*.old", ".*.deleting") for p in folder.glob(pattern)]
    for stale in removed:
        shutil.rmtree(stale, ignore_errors=True)
    return removed


def checkpoint_path(run_dir, step):
    return pathlib.Path(run_dir) / "checkpoints" / f"step-{step:08d}"


def prune_checkpoints(run_dir, keep):
    """Delete all but the newest ``keep`` checkpoints (and stale temporary folders)."""
    checkpoints = list_checkpoints(run_dir)
    for path in checkpoints[:-keep] if keep > 0 else []:
        doomed = path.with_name(f".{path.name}.deleting")  # one rename: a kill never leaves half a checkpoint listed
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    folder = pathlib.Path(run_dir) / "checkpoints"
    for pattern in (".*.tmp-*", ".*.deleting") if folder.is_dir() else ():
        for stale in folder.glob(pattern):
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
