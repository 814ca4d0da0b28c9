"""Hugging Face model folders, whatever the model: ``config.json`` read with every value minitf uses
checked for presence, type and range (naming the key), and ``model.safetensors`` read and written
through the ``safetensors`` package's NumPy API (no torch, no pickle), every tensor checked finite.
``minitf.gpt`` (GPT-2 folders) and the translation model's Marian folders both read through here, so
a folder is refused in one line, naming the file and the key or tensor, before any model is built.

Errors are ``ValueError`` (a folder that does not fit) or ``ImportError`` (a missing extra).
"""
import json
import math
import os
import pathlib
import re
import stat

from minitf import backend
from minitf.atomic import kind_of, write_atomic

np = backend.host  # files are read and written on the host

#: ``config_value(..., default=REQUIRED)``: the key must be in config.json.
REQUIRED = object()


def safetensors_numpy():
    """The ``safetensors.numpy`` module, or an ImportError saying how to install it."""
    try:
        import safetensors.numpy
    except ImportError:
        raise ImportError("reading and writing Hugging Face folders needs the safetensors package: "
                          'pip install -e ".[hf]"') from None
    return safetensors.numpy


def read_config(folder, model_types, what, weights="model.safetensors"):
    """The config.json dict of a Hugging Face folder whose ``model_type`` is one of ``model_types``
    (``what`` names such a folder in the messages, e.g. "Hugging Face GPT-2 folder"). A ValueError for a
    path that is not a folder, a missing config.json or ``weights`` file, unreadable JSON, or another
    model type."""
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder; give a {what} (config.json, {weights})")
    if not (folder / "config.json").is_file():
        hint = (" (it looks like a minitf run folder: give it as --checkpoint/--resume, not as a Hugging Face folder)"
                if (folder / "meta.json").is_file() or (folder / "train.lock").exists()
                or any(folder.glob("checkpoint*")) else "")
        raise ValueError(f"{folder} has no config.json; a {what} has config.json and {weights}{hint}")
    try:
        hf = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{folder / 'config.json'} is not readable JSON ({error})") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{folder / 'config.json'} holds a JSON {type(hf).__name__}, not an object of settings; "
                         f"give a {what}")
    kind = hf.get("model_type")
    if kind not in model_types:
        raise ValueError(f"{folder / 'config.json'} describes model_type {kind!r}, not "
                         f"{' or '.join(map(repr, model_types))}; give a {what}")
    if not (folder / weights).is_file():
        extra = (" (pytorch_model.bin is not read here: it is a pickle)" if (folder / "pytorch_model.bin").is_file()
                 else "")
        raise ValueError(f"{folder} has no {weights}; a {what} has config.json and {weights}{extra}")
    return hf


def model_type(folder):
    """The ``model_type`` of a Hugging Face folder's config.json (a string), or None for anything else: no
    folder, no or unreadable config.json, or a minitf run or checkpoint folder (their config.json is a run's).
    The commands use it to send a folder of the other kind of model to the command that reads it."""
    folder = pathlib.Path(folder)
    if not (folder / "config.json").is_file() or (folder / "meta.json").is_file() or (folder / "checkpoints").is_dir():
        return None
    try:
        hf = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # the model's own reader names what is wrong
    kind = hf.get("model_type") if isinstance(hf, dict) else None
    return kind if isinstance(kind, str) else None


def config_value(hf, key, kind, default=REQUIRED, low=None, high=None, low_open=False, choices=None,
                 where="config.json", high_open=False):
    """``hf[key]`` checked: of ``kind`` ("int", "float", "bool" or "str"; an int is a float too, a bool is
    neither, a float is finite), within [``low``, ``high``] (``low_open``: strictly above ``low``;
    ``high_open``: strictly below ``high``), one of ``choices``. A key that is absent gives ``default``
    (``REQUIRED``: a ValueError naming the key); the default itself is not checked. ``None`` counts as
    absent only where the default is ``None``. A ValueError names the key, the value and what fits."""
    if key not in hf or (hf[key] is None and default is None):
        if default is REQUIRED:
            raise ValueError(f"{where} has no {key!r}, which the model needs; "
                             f"add it (a{'n' if kind == 'int' else ''} {kind})")
        return default
    value = hf[key]
    fits = {"int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool)
            and (isinstance(value, int) or math.isfinite(value)),  # JSON's ints may not fit a float
            "bool": isinstance(value, bool),
            "str": isinstance(value, str)}[kind]
    if not fits:
        raise ValueError(f"{where}: {key} is {value!r}; it must be a{'n' if kind == 'int' else ''} {kind}"
                         + (" (a finite number)" if kind == "float" else ""))
    if choices is not None and value not in choices:
        raise ValueError(f"{where}: {key} is {value!r}; minitf computes {', '.join(map(repr, choices))}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{where}: {key} is {value!r}; it must be {'above' if low_open else 'at least'} {low}")
    if high is not None and (value >= high if high_open else value > high):
        raise ValueError(f"{where}: {key} is {value!r}; it must be {'below' if high_open else 'at most'} {high}")
    return value


def read_weights(path):
    """``{name: host array}`` of a safetensors file, every tensor checked finite. A ValueError for a
    damaged or foreign file, or a tensor holding NaN or infinity (naming the tensor)."""
    path = pathlib.Path(path)
    reader = safetensors_numpy()
    try:
        weights = reader.load_file(str(path))
    except Exception as error:  # safetensors' own error type: a damaged, truncated or foreign file
        raise ValueError(f"{path} is not a readable safetensors file ({type(error).__name__}: {error}); "
                         "download or write it again") from None
    for name, array in weights.items():
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = int(array.size - np.isfinite(array).sum())
            raise ValueError(f"{path}: tensor {name} holds {bad} NaN or infinite value(s) of {array.size}; "
                             "the weights are damaged (a diverged or corrupted save): use another copy")
    return weights


def check_dtype_range(weights, dtype, path):
    """A ValueError naming the first floating tensor of ``weights`` with a value beyond the largest finite one of
    ``dtype`` (a float64 file read into a float32 model, a float32 one into float16): cast, it would turn infinite."""
    limit = float(np.finfo(dtype).max)
    for name, array in weights.items():
        if array.dtype.kind == "f" and array.size and np.finfo(array.dtype).max > limit:
            largest = float(np.abs(array).max())
            if largest > limit:
                raise ValueError(f"{path}: tensor {name} holds values beyond {np.dtype(dtype).name}'s range (up to "
                                 f"{largest:.3g}, the largest {np.dtype(dtype).name} is {limit:.3g}); they would be "
                                 f"infinite in a {np.dtype(dtype).name} model: read it in a wider dtype")


def check_shapes(weights, expected, path):
    """A ValueError naming every tensor of ``weights`` whose shape is not ``expected[name]`` (a tuple)."""
    wrong = [f"{name} {tuple(weights[name].shape)} (expected {shape})"
             for name, shape in expected.items() if name in weights and tuple(weights[name].shape) != tuple(shape)]
    if wrong:
        raise ValueError(f"{path}: tensors of the wrong shape for its config.json: {'; '.join(wrong)}")


def check_save_folder(folder):
    """A ValueError, before anything is written, for a ``folder`` to save a model into that cannot be one: a
    file, device or FIFO at it or at a folder above it, or a link to nothing. A missing folder is fine (the
    writers make it); what the OS refuses (permissions) is the write's error."""
    folder = pathlib.Path(folder)
    for path in (folder, *folder.parents):
        try:
            mode = os.stat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            if os.path.islink(path):
                raise ValueError(f"cannot save the model into {folder}: {path} is a symbolic link to nothing "
                                 f"({os.readlink(path)}); give a folder (it is made if missing)") from None
            continue  # missing: made by the writers (a file further up is found there)
        except OSError:
            return
        if not stat.S_ISDIR(mode):
            raise ValueError(f"cannot save the model into {folder}: {path} is {kind_of(mode)}, not a folder; "
                             "give a folder (it is made if missing)")
        return


def write_weights(path, tensors):
    """Write ``{name: array}`` as a safetensors file (contiguous host arrays, metadata format "pt", as
    transformers writes it), atomically. A ValueError naming the first tensor holding NaN or infinity (which
    :func:`read_weights` refuses) before anything is written, the file's folder included."""
    host = {name: np.ascontiguousarray(backend.to_numpy(array)) for name, array in tensors.items()}
    for name, array in host.items():
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = int(array.size - np.isfinite(array).sum())
            raise ValueError(f"cannot write {path}: tensor {name} holds {bad} NaN or infinite value(s) of "
                             f"{array.size}, which from_pretrained would refuse; nothing was written (save the "
                             "weights of an earlier checkpoint)")
    write_atomic(path, safetensors_numpy().save(host, metadata={"format": "pt"}))


def write_json(path, values):
    """Write a JSON file as Hugging Face does (indented, sorted keys), atomically."""
    write_atomic(path, json.dumps(values, indent=2, sort_keys=True) + "\n")


#: Terminal escape sequences a library may put in its messages (torch's bold, colours, links): CSI (ESC [ or its
#: one-character form), OSC (ESC ] ... up to BEL or ESC \\), the two-character escapes, and other control characters.
_TERMINAL_CODES = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]?"
                             r"|[\x00-\x08\x0e-\x1f\x7f]")


def quoted_message(error):
    """``Type: first line`` of a library's ``error`` for quoting in a one-line error, without terminal escape
    sequences (printed to a log or a page they are noise: ``[1m...[0m``); ``Type`` alone if it says nothing."""
    lines = _TERMINAL_CODES.sub("", str(error)).strip().splitlines()
    return f"{type(error).__name__}: {lines[0].strip()}" if lines else type(error).__name__
