"""Checkpoints that are written atomically and load without running code.

A checkpoint is a folder ``step-00001234/`` holding ``model.npz`` (every parameter by its
dotted name), ``optimizer.npz`` (Adam's moments; absent in averaged checkpoints),
``tokenizer.model`` and ``meta.json`` (config, step, epoch, position in the epoch, seeds,
the sha256 of every other file). It is built in a temporary folder beside its final place,
flushed to disk and renamed into place in one step: a kill leaves the complete checkpoint or
none (perhaps a hidden ``.step-*.tmp-*`` folder, removed by the next save or ``--resume``).
Loading checks every checksum and never unpickles: a file that would need pickle is refused.

The checkpoint a command uses: a run folder's ``best.json`` choice, else its newest good
checkpoint (:func:`load_model`); ``--resume`` takes the newest good one and sets newer
damaged ones aside (:func:`set_aside`). For tests only: ``MINITF_TEST_SLOW_CHECKPOINT=SECONDS``
sleeps after each file written into the temporary folder, so a test can kill mid-write.
"""
import json
import math
import os
import pathlib
import re
import shutil
import tempfile
import time
import zipfile

from minitf import backend, kinds
from minitf.backend import host as np
from minitf.training.config import RunConfig
from minitf.training.errors import CheckpointError, DataError, UsageError
from minitf.training.files import file_sha256, fsync_dir

CHECKPOINT_PATTERN = re.compile(r"^step-(\d{8})$")
FORMAT_VERSION = 1
FILES = ("model.npz", "optimizer.npz", "tokenizer.model")  # what meta.json may list (no other path is read)


def _write_synced(path, write):
    """``write(handle)`` into a new binary file, flushed to disk; then the test hook's sleep (module doc)."""
    with open(path, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    delay = os.environ.get("MINITF_TEST_SLOW_CHECKPOINT")
    if delay:
        time.sleep(float(delay))


def write_checkpoint(path, params, meta, tokenizer_bytes, optimizer=None):
    """Write one checkpoint folder at ``path`` atomically from ``params`` ({name: host array}),
    ``meta`` (a JSON-able dict), the tokenizer's bytes and ``optimizer`` (its state by name, Adam's
    {"m", "v"}, or None).
    CheckpointError (with the reason) if the disk refuses; nothing is left behind."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        _write_synced(tmp / "model.npz", lambda handle: np.savez(handle, **params))
        files = ["model.npz", "tokenizer.model"]
        if optimizer is not None:
            _write_synced(tmp / "optimizer.npz", lambda handle: np.savez(handle, **optimizer))
            files.append("optimizer.npz")
        _write_synced(tmp / "tokenizer.model", lambda handle: handle.write(tokenizer_bytes))
        meta = dict(meta, format_version=FORMAT_VERSION, sha256={name: file_sha256(tmp / name) for name in files})
        meta_bytes = json.dumps(meta, indent=1, sort_keys=True).encode("utf-8")
        _write_synced(tmp / "meta.json", lambda handle: handle.write(meta_bytes))
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
    except BaseException as error:  # KeyboardInterrupt and SystemExit too: leave nothing half-written behind
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, OSError):
            raise CheckpointError(f"could not write checkpoint {path}: {error.strerror or error}; "
                                  "the previous checkpoints are intact (free disk space, then --resume)") from None
        raise
    return path


def read_checkpoint(path, load_optimizer=True, expect=None):
    """Load and verify a checkpoint folder: {"params", "optimizer" (or None), "meta", "tokenizer_bytes"}.

    ``expect(partial_state, path)``, if given, sees ``meta`` and ``tokenizer_bytes`` (checksums
    verified, no array read) and returns ``{"model.npz": {name: (shape, dtype)}, "optimizer.npz":
    {...}}``, compared with every array header before any data is read, and optionally
    ``"non_negative": {"optimizer.npz": names}`` (the optimizer's state that is never negative:
    Adam's ``v``; without ``expect``, ``v``); it may raise itself.
    CheckpointError names the problem: a missing folder or file, a checksum mismatch, an
    unreadable archive or one that would need pickle, an array that does not fit, non-finite
    parameters or moments, a negative second moment."""
    path = pathlib.Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} is not a folder; expected a step-NNNNNNNN folder or a run folder")
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise CheckpointError(f"checkpoint {path} has no meta.json: it is incomplete or not a checkpoint; "
                              "use another checkpoint of the run")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
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
    result = {"meta": meta, "tokenizer_bytes": (path / "tokenizer.model").read_bytes(), "optimizer": None}
    expected = expect(dict(result), path) if expect is not None else {}
    result["params"] = read_npz(path / "model.npz", expected.get("model.npz"))
    check_finite(path / "model.npz", result["params"])
    if load_optimizer and (path / "optimizer.npz").is_file() and "optimizer.npz" in meta["sha256"]:
        result["optimizer"] = read_npz(path / "optimizer.npz", expected.get("optimizer.npz"))
        never_negative = expected.get("non_negative", {"optimizer.npz": ("v",)}).get("optimizer.npz", ())
        check_finite(path / "optimizer.npz", result["optimizer"], non_negative=never_negative)
    return result


def _damaged(path, what):
    return CheckpointError(f"{path}: {what}; use another checkpoint of the run")


def _npy_header(path, archive, info):
    """(shape, dtype, data offset) of one ``.npy`` member, from its header alone."""
    with archive.open(info) as member:
        try:
            readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            version = np.lib.format.read_magic(member)
            if version not in readers:
                raise ValueError(f"npy format version {version} (minitf writes 1.0)")
            shape, fortran, dtype = readers[version](member)
        except ValueError as error:
            if "pickle" in str(error).lower() or "object" in str(error).lower():
                raise _pickle_refused(path) from None
            raise _damaged(path, f"member {info.filename} has no valid npy header ({error})") from None
        offset = member.tell()
    if dtype.hasobject:
        raise _pickle_refused(path)
    if fortran:
        raise _damaged(path, f"member {info.filename} is stored in Fortran order; minitf writes C order")
    if dtype.kind != "f" or dtype.itemsize not in (2, 4, 8) or dtype.byteorder not in ("<", "=", "|"):
        raise _damaged(path, f"member {info.filename} holds {dtype} data ({dtype.str}); expected little-endian "
                       "float16, float32 or float64")
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise _damaged(path, f"member {info.filename} declares an impossible shape {shape}")
    nbytes = math.prod(shape) * dtype.itemsize
    if offset + nbytes != info.file_size:
        raise _damaged(path, f"member {info.filename} declares shape {shape} of {dtype} ({nbytes:,} bytes) but "
                       f"holds {max(info.file_size - offset, 0):,} bytes of data")
    return tuple(shape), dtype, offset


def _pickle_refused(path):
    return CheckpointError(f"{path} holds data that would need pickle to load (and pickle can run code); "
                           "refused: expected plain numeric arrays, use a checkpoint written by minitf")


def read_npz(path, expected=None):
    """The arrays of an ``.npz`` archive written by minitf (``np.savez``); a hostile file costs
    no more memory than its size on disk. Every member must be uncompressed, with an npy header
    declaring C order, a little-endian float dtype and exactly the bytes it holds; with
    ``expected`` ({name: (shape, dtype)}) names, shapes and dtypes must equal it. All headers are
    checked before any array is allocated; anything else is a one-line CheckpointError (no pickle)."""
    path = pathlib.Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            headers = {}
            for info in archive.infolist():
                name = info.filename[:-len(".npy")] if info.filename.endswith(".npy") else None
                if not name or name in headers:
                    raise _damaged(path, f"unexpected member {info.filename!r} (expected one NAME.npy per array)")
                if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
                    raise _damaged(path, f"member {info.filename} is compressed; minitf writes uncompressed "
                                   "archives (a small compressed member can declare gigabytes)")
                headers[name] = (info, *_npy_header(path, archive, info))
            if expected is not None:
                _compare(path, headers, expected)
            return {name: _read_member(path, archive, *header) for name, header in headers.items()}
    except CheckpointError:
        raise
    except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, KeyError, ValueError, RuntimeError,
            NotImplementedError) as error:
        raise CheckpointError(f"{path} is not a readable .npz archive ({error}); use another checkpoint") from None


def _compare(path, headers, expected):
    missing, unknown = sorted(set(expected) - set(headers)), sorted(set(headers) - set(expected))
    if missing or unknown:
        raise _damaged(path, f"holds arrays that do not fit (missing {missing[:3]}, unexpected {unknown[:3]})")
    for name, (shape, dtype) in sorted(expected.items()):
        _, got_shape, got_dtype, _ = headers[name]
        if got_shape != tuple(shape) or got_dtype != np.dtype(dtype):
            raise _damaged(path, f"array {name!r} is {got_dtype} of shape {got_shape}, "
                           f"expected {np.dtype(dtype)} of shape {tuple(shape)}")


def _read_member(path, archive, info, shape, dtype, offset):
    array = np.empty(shape, dtype=dtype)  # no larger than the member itself (checked in _npy_header)
    buffer = memoryview(array.reshape(-1).view(np.uint8))
    with archive.open(info) as member:
        member.read(offset)
        done = 0
        while done < len(buffer):
            chunk = member.read(min(1 << 20, len(buffer) - done))
            if not chunk:
                raise _damaged(path, f"member {info.filename} ends early")
            buffer[done:done + len(chunk)] = chunk
            done += len(chunk)
        if member.read(1):  # also makes zipfile verify the member's CRC
            raise _damaged(path, f"member {info.filename} holds more data than its header declares")
    return array


def check_finite(path, arrays, non_negative=()):
    """CheckpointError unless every array is finite and those in ``non_negative`` (Adam's ``v``) are >= 0."""
    for name, array in sorted(arrays.items()):
        if not bool(np.isfinite(array).all()):
            raise _damaged(path, f"array {name!r} holds NaN or inf")
        if name in non_negative and bool((array < 0).any()):
            raise _damaged(path, f"array {name!r} (an optimizer state that is never negative: Adam's second "
                           "moment) holds negative values")


def checkpoint_step(path):
    """The step of a ``step-NNNNNNNN`` checkpoint folder."""
    return int(CHECKPOINT_PATTERN.match(pathlib.Path(path).name).group(1))


def list_checkpoints(run_dir, complete_only=True):
    """The ``<run>/checkpoints/step-NNNNNNNN`` folders of a run, oldest first; ``complete_only``:
    those with a meta.json (written last), else every step folder (for ``--resume`` to check)."""
    folder = pathlib.Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := CHECKPOINT_PATTERN.match(p.name))
             and p.is_dir() and (not complete_only or (p / "meta.json").is_file())]
    return [p for _, p in sorted(found)]


def latest_valid_checkpoint(run_dir, expect=None):
    """``(state, path, [(newer path, error), ...])``: the newest checkpoint that passes
    :func:`read_checkpoint` with ``expect``, and the errors of newer ones (None, None if none passes)."""
    errors = []
    for path in reversed(list_checkpoints(run_dir, complete_only=False)):
        try:
            return read_checkpoint(path, expect=expect), path, errors
        except CheckpointError as error:
            errors.append((path, str(error)))
    return None, None, errors


def set_aside(bad):
    """Rename a damaged checkpoint to ``<name>.bad`` (``.bad2``, ... if taken) and return that path:
    kept for a person to look at, never listed again."""
    aside, n = bad.with_name(bad.name + ".bad"), 1
    while aside.exists():
        n, aside = n + 1, bad.with_name(f"{bad.name}.bad{n}")
    os.rename(bad, aside)
    return aside


def recover_checkpoints(run_dir):
    """Repair what a kill can leave in ``<run>/checkpoints``: put back a checkpoint moved aside to be
    re-saved (``.step-N.old`` without ``step-N``), delete temporary and half-deleted folders (returned)."""
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


def prune_checkpoints(run_dir, keep, protect=()):
    """Delete all but the newest ``keep`` checkpoints and those in ``protect`` (the run's best
    validation so far: an end-of-run candidate), and stale temporary folders."""
    checkpoints = list_checkpoints(run_dir)
    protect = {pathlib.Path(p).name for p in protect}
    for path in [p for p in checkpoints[:-keep] if p.name not in protect] if keep > 0 else []:
        doomed = path.with_name(f".{path.name}.deleting")  # one rename: a kill never leaves half a checkpoint listed
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    folder = pathlib.Path(run_dir) / "checkpoints"
    for pattern in (".*.tmp-*", ".*.deleting") if folder.is_dir() else ():
        for stale in folder.glob(pattern):
            shutil.rmtree(stale, ignore_errors=True)


def average_checkpoints(paths, out_path):
    """Average the parameters of checkpoints of one run (paper: the last 5; same model shapes and
    tokenizer) into a new checkpoint at ``out_path``, and return it."""
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


def best_checkpoint(run_dir):
    """(the checkpoint best.json names, None) or (None, why it is not used). It must name, relative
    to the run folder, a checkpoint inside it after resolving links (not ``"../elsewhere/ck"``)."""
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
    checkpoints = list_checkpoints(path)
    if checkpoints:
        return checkpoints[-1]
    if not path.exists():
        raise CheckpointError(f"--checkpoint {path} does not exist; pass the --out folder of train.py "
                              "or one of its checkpoints/step-NNNNNNNN folders")
    raise CheckpointError(f"{path} is neither a checkpoint folder (with meta.json) nor a run folder "
                          "with checkpoints/; pass the --out folder of train.py or one of its checkpoints")


def _candidates(path, warn=None):
    """Checkpoints to try for ``path``: the one it names; for a run folder, its chosen one first,
    then every other checkpoint, newest first."""
    first = resolve_checkpoint(path, warn)
    if first == pathlib.Path(path):  # an explicit checkpoint folder: that one or nothing
        return [first]
    return [first] + [p for p in reversed(list_checkpoints(path)) if p != first]


def recorded_kind(meta):
    """The kind a checkpoint's meta.json names (its config's ``model``; "transformer" in runs older than GPT),
    or None if it names none minitf has."""
    config = meta.get("config") if isinstance(meta, dict) else None
    name = config.get("model", "transformer") if isinstance(config, dict) else None
    return kinds.get(name) if isinstance(name, str) and name in kinds.names() else None


def load_checkpoint_model(folder, kind=None):
    """(model in eval mode, tokenizer, meta) from one checkpoint folder of a run of ``kind`` (a
    :class:`minitf.training.kind.Kind`; None: the kind its meta.json names); CheckpointError if it is damaged, of
    another kind, or its parts do not fit together. The kind reads the tokenizer and builds the model."""
    built = {}

    def expect(state, path):  # meta.json and the tokenizer first, then a model, then the arrays' headers
        meta = state["meta"]
        recorded = recorded_kind(meta)
        if kind is not None and recorded is not None and recorded is not kind:
            raise AnotherKind(folder, recorded, kind)
        reader = kind or recorded
        if reader is None:
            raise CheckpointError(f"{folder}: meta.json's config names no model kind minitf has "
                                  f"({', '.join(kinds.names())}); use a checkpoint written by this train.py")
        tokenizer = reader.read_tokenizer(state["tokenizer_bytes"])
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
        check_model_fits_file(reader.min_parameters(config, tokenizer.vocab_size), config, path / "model.npz")
        try:
            model = reader.build_model(config, tokenizer.vocab_size)
        except (ValueError, TypeError) as error:
            raise CheckpointError(f"{folder}: meta.json's config does not describe a model: {error}") from None
        built.update(model=model, tokenizer=tokenizer)
        return {"model.npz": {name: (tuple(p.shape), backend.host.dtype(p.data.dtype))
                              for name, p in model.named_parameters()}}

    state = read_checkpoint(folder, load_optimizer=False, expect=expect)
    model = built["model"]
    try:
        model.load_state_dict(state["params"])
    except (ValueError, TypeError) as error:
        raise CheckpointError(f"{folder}: the parameters do not fit the saved config: {error}") from None
    return model.eval(), built["tokenizer"], state["meta"]


class AnotherKind(CheckpointError):
    """A checkpoint of another kind (``recorded``) than the command reads (``wanted``): the whole run is, so no
    other checkpoint is tried."""

    def __init__(self, where, recorded, wanted, what="a checkpoint of a"):
        super().__init__(f"{where} is {what} --model {recorded.name} run, not of a --model {wanted.name} run: "
                         f"{recorded.use_a_run.replace('RUN', str(where))}")
        self.recorded, self.wanted = recorded, wanted


def check_model_fits_file(at_least, config, model_file):
    """Refuse, before a model is built, a config declaring more parameters than ``model_file`` can
    hold (a crafted d_model 10**9 would ask for terabytes). ``at_least``: the kind's lower bound of its
    weights (``Kind.min_parameters``), at 2 bytes each (the smallest float a checkpoint may hold)."""
    d, f = config.d_model, config.d_ff
    size = model_file.stat().st_size
    if 2 * at_least > size:
        raise CheckpointError(f"{model_file.parent}: meta.json's config and model.npz do not fit together: the "
                              f"config declares at least {at_least:,} parameters (d_model {d}, d_ff {f}), more "
                              f"than model.npz ({size:,} bytes) can hold; use another checkpoint of the run")


def load_model(path, warn=None, rounds=10, kind=None):
    """(model in eval mode, tokenizer, meta) from a checkpoint folder (which must pass every check) or
    a run folder (a damaged checkpoint is skipped for the next newest, with ``warn(message)``) of a run of
    ``kind`` (None: the kind its checkpoints name). A run folder's checkpoint that disappears while it is read
    (a run saving beside us deleted it for a newer one, ``--keep``) is not damaged: the folder is listed again
    and the newest taken (``rounds`` times). :func:`load_run` gives the same with the run's config and folder."""
    return load_run(path, warn, rounds, kind)[:3]


def load_run(path, warn=None, rounds=10, kind=None):
    """(model, tokenizer, meta, RunConfig, the checkpoint folder read) of :func:`load_model`."""
    errors, tried = [], set()
    for _ in range(rounds):
        vanished = False
        for folder in [f for f in _candidates(path, warn) if f not in tried]:
            tried.add(folder)
            try:
                result = load_checkpoint_model(folder, kind)  # meta.json's config passed its checks there:
                result += (RunConfig.from_dict(result[2]["config"]), folder)
            except AnotherKind as error:  # the run's kind, not a damaged checkpoint: said once, of the whole run
                if folder == pathlib.Path(path):
                    raise
                raise AnotherKind(path, error.recorded, error.wanted, "the run folder of a") from None
            except (CheckpointError, DataError, OSError) as error:
                if folder != pathlib.Path(path) and not folder.exists():  # pruned under us: list again
                    vanished = True
                    break
                if isinstance(error, OSError):
                    raise
                errors.append(str(error))
                continue
            for error in errors:
                (warn or (lambda m: None))(f"warning: skipping a bad checkpoint: {error}; using {folder}")
            return result
        if not vanished:
            break
    if not errors:
        raise CheckpointError(f"the checkpoints of {path} were deleted {rounds} times while being read (a run "
                              "saving often with a small --keep?); try again")
    if len(errors) == 1:
        raise CheckpointError(errors[0])
    raise CheckpointError(f"none of the {len(errors)} checkpoints in {path} is usable; the newest: {errors[0]}")
