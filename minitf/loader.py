"""The one loader: ``minitf.load(path)`` reads a run folder of ``train.py`` (its best.json's choice, else its
newest good checkpoint), one of its checkpoint folders, or a Hugging Face folder of any model kind minitf reads
(:mod:`minitf.kinds`: Marian, GPT-2), and returns a :class:`minitf.training.kind.Loaded`: the model, its
tokenizer and its decoding settings. Every command (``translate``, ``generate``, ``inspect``, ``export``,
``trace``) loads through here, so each takes ``--checkpoint PATH`` for all of them, and a damaged folder is named
by the reader of its kind (a broken config.json is "config.json is not readable JSON: ...")."""
import json
import pathlib

from minitf import kinds
from minitf.pretrained import is_hugging_face_folder, model_type
from minitf.training import checkpoint as ckpt
from minitf.training.errors import CheckpointError, DataError, UsageError

WHAT_TO_GIVE = ("a run folder of train.py, one of its checkpoints/step-NNNNNNNN folders, or a Hugging Face folder "
                f"({', '.join(kinds.hf_model_types())})")


def hugging_face_config(folder):
    """The config.json of a Hugging Face folder; a one-line DataError naming the file if it is not readable."""
    where = pathlib.Path(folder) / "config.json"
    try:
        values = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise DataError(f"{where} is not readable JSON: {error}; download or write the folder again") from None
    if not isinstance(values, dict):
        raise DataError(f"{where} holds a JSON {type(values).__name__}, not an object of settings; download or "
                        "write the folder again")
    return values


def refuse_other_kind(folder, found, wanted):
    """A one-line UsageError: the Hugging Face ``folder`` holds a model of the kind ``found``, the command reads
    ``wanted``'s."""
    return UsageError(f"{folder} is a {found.hf_what} (a {found.title}), not a {wanted.title}: "
                      f"{found.use_a_run.replace('RUN', str(folder))}")


def save_pretrained(loaded_or_model, folder):
    """Write ``loaded_or_model`` as a Hugging Face folder into the new or empty ``folder``: a
    :class:`minitf.training.kind.Loaded` (:func:`load`'s: a run, a checkpoint or a folder) by its kind's writer
    (:meth:`Kind.write_folder`: model, config.json with a folder's other entries kept, generation settings,
    tokenizer); a bare model by the kind whose model it is (:meth:`Kind.write_model`: config.json and weights).
    A one-line error before anything is written for a folder in use or a model no format holds. Returns ``folder``."""
    from minitf.training.kind import Loaded
    folder = pathlib.Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UsageError(f"{folder} {'is a file' if not folder.is_dir() else 'is not empty'}; give a new or empty "
                         "folder for the Hugging Face files (nothing was written)")
    if isinstance(loaded_or_model, Loaded):
        loaded_or_model.kind.write_folder(loaded_or_model, folder)
        return folder
    kind = next((kind for kind in kinds.every() if kind.writes(loaded_or_model)), None)
    if kind is None:
        raise UsageError(f"save_pretrained writes what minitf.load returns or a model of "
                         f"{', '.join(kinds.names())}, got {type(loaded_or_model).__name__}")
    kind.write_model(loaded_or_model, folder)
    return folder


def kind_of(path):
    """The kind of the model at ``path`` without reading it: a Hugging Face folder's (its config.json's model_type)
    or a run or checkpoint folder's (its newest meta.json's); None where neither names one (the loader then says
    what is wrong). The commands that read several kinds (translate, generate) pick their reader by it."""
    found = kinds.for_model_type(model_type(path))
    if found is not None:
        return found
    try:
        meta = json.loads((ckpt.resolve_checkpoint(path) / "meta.json").read_text(encoding="utf-8"))
        return ckpt.recorded_kind(meta)
    except (OSError, ValueError, CheckpointError):
        return None


def load(path, warn=None, kind=None, hugging_face=False):
    """The :class:`minitf.training.kind.Loaded` model of ``path`` (module doc); ``kind``: the one kind the
    caller reads (a :class:`minitf.training.kind.Kind`; a model of another kind is refused in one line saying
    which command reads it), None for any; ``hugging_face``: ``path`` must be a Hugging Face folder (read by
    ``kind``'s reader, which names what is missing). ``warn(message)`` hears of skipped damaged checkpoints."""
    path = pathlib.Path(path)
    if hugging_face or is_hugging_face_folder(path):
        return load_hugging_face_folder(path, warn, kind)
    model, tokenizer, meta, config, checkpoint = ckpt.load_run(path, warn, kind=kind)
    run = checkpoint.parent.parent
    run_dir = path if (path / "metrics.jsonl").is_file() else run if (run / "metrics.jsonl").is_file() else None
    return kinds.get(config.model).loaded_run(model, tokenizer, config, path, checkpoint, meta, run_dir)


def load_hugging_face_folder(folder, warn=None, kind=None):
    """A Hugging Face folder, read by the kind of its config.json's ``model_type`` (without a config.json: by
    ``kind``'s reader, which says what such a folder holds)."""
    if kind is not None and not (pathlib.Path(folder) / "config.json").is_file():
        return _read_folder(kind, folder, warn)
    hf = hugging_face_config(folder)
    if "schema_version" in hf and "model_type" not in hf:  # a run's config.json: started, not yet saved
        raise DataError(f"{folder} is a run folder of train.py without a checkpoint yet (it stopped before its "
                        f"first save): resume it with python train.py --resume {folder}, or give {WHAT_TO_GIVE}")
    model_type = hf.get("model_type")
    found = kinds.for_model_type(model_type)
    if found is None:
        raise DataError(f"{folder} is a Hugging Face folder of model_type {model_type!r}; minitf reads "
                        f"{', '.join(kinds.hf_model_types())} folders, minitf runs and their checkpoints")
    if kind is not None and found is not kind:
        raise refuse_other_kind(folder, found, kind)
    return _read_folder(found, folder, warn)


def _read_folder(kind, folder, warn):
    try:
        return kind.load_folder(folder, warn)
    except ValueError as error:
        raise DataError(str(error)) from None
