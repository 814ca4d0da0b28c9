"""Hugging Face model folders, whatever the model: ``config.json`` read with every value minitf uses
checked for presence, type and range (naming the key), and the weights read by minitf's own safetensors
reader (no torch, no pickle, no package needed: :func:`read_weights`) from ``model.safetensors`` or from
the shards a ``model.safetensors.index.json`` names, in float64, float32, float16 or bfloat16 (widened
exactly to float32), every tensor checked finite. They are written through the ``safetensors`` package's
NumPy API. GPT-2 folders (``minitf.lm.gpt2``) and the translation model's Marian folders both read through
here, so a folder is refused in one line, naming the file and the key or tensor, before any model is built.

Errors are ``ValueError`` (a folder that does not fit) or ``ImportError`` (a missing extra, for writing).
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
#: A folder's weights: one file, or (sharded) an index naming the shard of each tensor
WEIGHTS, SHARD_INDEX = "model.safetensors", "model.safetensors.index.json"


def safetensors_numpy():
    """The ``safetensors.numpy`` module, or an ImportError saying how to install it."""
    try:
        import safetensors.numpy
    except ImportError:
        raise ImportError("reading and writing Hugging Face folders needs the safetensors package: "
                          'pip install -e ".[hf]"') from None
    return safetensors.numpy


def read_config(folder, model_types, what, weights=WEIGHTS):
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
    if not (folder / weights).is_file() and not (weights == WEIGHTS and (folder / SHARD_INDEX).is_file()):
        extra = (" (pytorch_model.bin is not read here: it is a pickle)" if (folder / "pytorch_model.bin").is_file()
                 else "")
        sharded = f" (or {SHARD_INDEX} and its shards)" if weights == WEIGHTS else ""
        raise ValueError(f"{folder} has no {weights}; a {what} has config.json and {weights}{sharded}{extra}")
    return hf


def weights_path(folder):
    """The weights file of a Hugging Face folder: ``model.safetensors``, else the ``model.safetensors.index.json``
    of sharded weights (as transformers prefers them); ``model.safetensors`` where neither is there (the
    reader names it missing). :func:`read_weights` reads either."""
    folder = pathlib.Path(folder)
    return folder / SHARD_INDEX if not (folder / WEIGHTS).is_file() and (folder / SHARD_INDEX).is_file() \
        else folder / WEIGHTS


#: Hugging Face's ``activation_function`` -> minitf's activation (``minitf.layers.ACTIVATIONS``), one table for every
#: format that names its activation so (Marian, GPT-2): ACT2FN's "swish" and "silu" are both x sigmoid(x), its
#: "gelu_new" and "gelu_pytorch_tanh" both GELU's tanh form. A new activation's Hugging Face name goes here.
HF_ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh",
                  "gelu_pytorch_tanh": "gelu_tanh"}
#: minitf's activation -> the name a config.json minitf writes gives it (the one the original folders use)
HF_NAME_OF_ACTIVATION = {"silu": "swish", "relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new"}
#: The model dtypes a folder is read into (backend.set_default_dtype's)
MODEL_DTYPES = ("float32", "float64", "float16")


def model_dtype(dtype):
    """``dtype`` (None: minitf's default float dtype) as the NumPy type a model read from a folder is built in;
    a one-line ValueError for bfloat16 (NumPy computes no bfloat16: such weights are widened as they are read)
    or any other dtype than :data:`MODEL_DTYPES`, before any file is read."""
    if dtype is None:
        return backend.get_default_dtype()
    if "bfloat16" in str(dtype):  # "bfloat16", torch.bfloat16, ml_dtypes' bfloat16
        raise ValueError(f"dtype {str(dtype)!r}: minitf computes in {', '.join(MODEL_DTYPES)} (NumPy has no "
                         "bfloat16 arithmetic); a folder's bfloat16 weights are widened exactly to the model's "
                         "dtype as they are read: give dtype='float32' (or leave it out)")
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in MODEL_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one minitf computes in; give one of {', '.join(MODEL_DTYPES)}")
    return np.dtype(name).type


def is_hugging_face_folder(path):
    """Whether ``path`` is a folder with a config.json that is no minitf run's (no meta.json, no checkpoints/)."""
    path = pathlib.Path(path)
    return (path.is_dir() and (path / "config.json").is_file() and not (path / "meta.json").is_file()
            and not (path / "checkpoints").is_dir())


def model_type(folder):
    """The ``model_type`` of a Hugging Face folder's config.json (a string), or None for anything else: no
    folder, no or unreadable config.json, or a minitf run or checkpoint folder (their config.json is a run's).
    The commands use it to send a folder of the other kind of model to the command that reads it."""
    folder = pathlib.Path(folder)
    if not is_hugging_face_folder(folder):
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


#: safetensors dtypes read: the NumPy dtype of their bytes (little-endian; BF16's bits, widened to float32)
FLOAT_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}
#: The format's other dtypes, in bits per element: their spans are checked, the tensors refused (not weights)
OTHER_DTYPES = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
                "I32": 32, "U32": 32, "I64": 64, "U64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
#: The largest header the format allows (the safetensors package's own limit)
MAX_HEADER = 100_000_000


class _Damaged(ValueError):
    """A fault of a safetensors file's layout (its message is the detail, the caller adds the file)."""


def _unique_keys(pairs):
    """A JSON object's dict, refusing a name given twice (json keeps the last one silently)."""
    values = dict(pairs)
    if len(values) < len(pairs):  # a set, not counts: a hostile header of a million names stays linear
        seen = set()
        raise _Damaged(f"its header names {next(name for name, _ in pairs if name in seen or seen.add(name))!r} twice")
    return values


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _header(file, size):
    """``([(begin, end, name, dtype, shape)] in file order, where the data starts)`` of an open safetensors
    file of ``size`` bytes, every entry checked against the file before anything is allocated: the header
    within the file, each dtype known, each shape's bytes its span, the spans contiguous from the data's
    start to the file's end. A _Damaged naming the tensor otherwise."""
    if size < 8:
        raise _Damaged(f"{size} bytes, fewer than the 8 of the header's length")
    length = int.from_bytes(file.read(8), "little")
    if length > size - 8:
        raise _Damaged(f"its header length {length} runs past the end of the file ({size} bytes): truncated or "
                       "not safetensors")
    if length > MAX_HEADER:
        raise _Damaged(f"its header length {length} is beyond the format's {MAX_HEADER}")
    text = file.read(length)
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _Damaged(f"its header is not JSON: {error}") from None
    if not text.startswith(b"{") or not isinstance(header, dict):
        raise _Damaged("its header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _Damaged("its __metadata__ is not an object of strings")
    data = size - 8 - length
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise _Damaged(f"tensor {name}: {info!r} is not an object of dtype, shape and data_offsets")
        dtype, shape, span = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in FLOAT_DTYPES and dtype not in OTHER_DTYPES:
            raise _Damaged(f"tensor {name}: dtype {dtype!r} is not a safetensors dtype")
        if not isinstance(shape, list) or not all(map(_is_count, shape)):
            raise _Damaged(f"tensor {name}: shape {shape!r} is not a list of sizes")
        if not (isinstance(span, list) and len(span) == 2 and all(map(_is_count, span)) and span[0] <= span[1]):
            raise _Damaged(f"tensor {name}: data_offsets {span!r} is not [begin, end]")
        bits = math.prod(shape) * OTHER_DTYPES.get(dtype, 8 * np.dtype(FLOAT_DTYPES.get(dtype, "u1")).itemsize)
        if bits != 8 * (span[1] - span[0]):
            raise _Damaged(f"tensor {name}: shape {shape} of {dtype} is {bits / 8:g} bytes, its data_offsets "
                           f"{span} span {span[1] - span[0]}")
        if span[1] > data:
            raise _Damaged(f"tensor {name}: its data_offsets {span} run past the end of the file's {data} bytes "
                           "of data: truncated")
        entries.append((span[0], span[1], name, dtype, tuple(shape)))
    entries.sort()
    end, previous = 0, None
    for begin, stop, name, _, _ in entries:
        if begin < end:
            raise _Damaged(f"tensor {name}: its data_offsets [{begin}, {stop}] overlap tensor {previous[2]}'s "
                           f"[{previous[0]}, {previous[1]}]")
        if begin > end:
            raise _Damaged(f"bytes [{end}, {begin}] of the data belong to no tensor (before tensor {name})")
        end, previous = stop, (begin, stop, name)
    if end != data:
        raise _Damaged(f"{data - end} bytes after the last tensor's data belong to no tensor")
    return entries, 8 + length


def _read_file(path, buffers):
    weights = {}
    try:
        with open(path, "rb") as file:
            entries, start = _header(file, os.fstat(file.fileno()).st_size)
            refused = [(name, dtype) for _, _, name, dtype, _ in entries
                       if dtype not in FLOAT_DTYPES and not name.endswith(buffers)]
            if refused:
                name, dtype = refused[0]
                raise ValueError(f"{path}: tensor {name} is {dtype}, not floating-point weights (minitf reads "
                                 f"{', '.join(FLOAT_DTYPES)}); the file is not a model's weights or is damaged")
            for begin, stop, name, dtype, shape in entries:
                if name.endswith(buffers):  # not a weight: left out whatever its dtype
                    continue
                try:  # within the file's size (checked above), but a shape NumPy cannot hold may remain
                    array = np.empty(shape, dtype=FLOAT_DTYPES[dtype])
                except (ValueError, OverflowError, MemoryError) as error:
                    raise _Damaged(f"tensor {name}: shape {list(shape)} is not an array NumPy can hold ({error})") \
                        from None
                file.seek(start + begin)
                if file.readinto(array.reshape(-1).view(np.uint8)) != stop - begin:
                    raise _Damaged(f"tensor {name}: the file ended inside its data (it changed while read)")
                if dtype == "BF16":  # bfloat16 is float32's upper half: exact in float32
                    array = (array.astype(np.uint32) << 16).view(np.float32)
                finite = np.isfinite(array)
                if not finite.all():
                    bad = int(array.size - finite.sum())
                    raise ValueError(f"{path}: tensor {name} holds {bad} NaN or infinite value(s) of {array.size}; "
                                     "the weights are damaged (a diverged or corrupted save): use another copy")
                weights[name] = array.astype(array.dtype.newbyteorder("="), copy=False)
    except _Damaged as error:
        raise ValueError(f"{path} is not a readable safetensors file ({error}); download or write it again") from None
    except OSError as error:
        raise ValueError(f"{path} cannot be read ({error.strerror or error})") from None
    return weights


def _read_sharded(index, buffers):
    """The weights of the shards ``index`` (a model.safetensors.index.json) names, each shard a plain file name
    in its folder, each tensor in the shard the index places it in and in no other."""
    try:
        hf = json.loads(index.read_text(encoding="utf-8"), object_pairs_hook=_unique_keys)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, _Damaged) as error:
        raise ValueError(f"{index} is not readable JSON ({error}); download it again") from None
    places = hf.get("weight_map") if isinstance(hf, dict) else None
    if not isinstance(places, dict) or not all(isinstance(shard, str) for shard in places.values()):
        raise ValueError(f"{index} has no \"weight_map\" of tensor names to shard files; download it again")
    for name, shard in places.items():
        if shard in ("", ".", "..") or pathlib.PurePosixPath(shard).name != shard or "\\" in shard \
                or not shard.endswith(".safetensors"):
            raise ValueError(f"{index}: tensor {name} is placed in {shard!r}, not a .safetensors file's name: "
                             "shards are read from the index's own folder only")
    weights = {}
    for shard in sorted(set(places.values())):
        path = index.parent / shard
        if not path.is_file():
            names = [name for name, s in places.items() if s == shard]
            raise ValueError(f"{index}: its shard {shard} (holding {len(names)} tensor(s), {names[0]} first) is not "
                             "in the folder; download it")
        for name, array in _read_file(path, buffers).items():
            if places.get(name) != shard:
                raise ValueError(f"{path}: tensor {name} is here but {index.name} places it "
                                 + (f"in {places[name]}" if name in places else "nowhere")
                                 + "; the shards and the index are of different saves: download them again")
            weights[name] = array
    missing = [name for name in places if name not in weights and not name.endswith(buffers)]
    if missing:
        raise ValueError(f"{index.parent / places[missing[0]]} has no tensor {missing[0]}, which {index.name} places "
                         "there; the shards and the index are of different saves: download them again")
    return weights


def read_weights(path, buffers=()):
    """``{name: host array}`` of a safetensors file, or of the shards a ``model.safetensors.index.json`` names
    (:func:`weights_path`), read by minitf's own reader (no package needed): F64, F32 and F16 tensors in their
    dtype, BF16 widened exactly to float32, every tensor checked finite. Tensors whose name ends with one of
    ``buffers`` (constants such as GPT-2's attention masks) are left out, whatever their dtype. Before
    anything is allocated, the header is checked against the file (its length, each span within the data,
    the spans contiguous, each shape's bytes its span, no name twice): arrays are at most the file's size
    (twice that for BF16's widening). A one-line ValueError names the file and the tensor: a damaged or
    foreign file, a tensor of another dtype (an integer, FP8), a NaN or infinity, a shard the index names
    outside its folder, missing, or disagreeing with it."""
    path, buffers = pathlib.Path(path), tuple(buffers)
    return _read_sharded(path, buffers) if path.name.endswith(".index.json") else _read_file(path, buffers)


def check_dtype_range(weights, dtype, path):
    """A ValueError naming the first floating tensor of ``weights`` with a value beyond the largest finite one of
    ``dtype`` (a float64 file read into a float32 model, a float32 one into float16): cast, it would turn infinite."""
    limit = float(np.finfo(dtype).max)
    for name, array in weights.items():
        # float(): a float16 array's largest against float32's would overflow in a float16 comparison
        if array.dtype.kind == "f" and array.size and float(np.finfo(array.dtype).max) > limit:
            largest = float(np.abs(array).max())
            if largest > limit:
                raise ValueError(f"{path}: tensor {name} holds values beyond {np.dtype(dtype).name}'s range (up to "
                                 f"{largest:.3g}, the largest {np.dtype(dtype).name} is {limit:.3g}); they would be "
                                 f"infinite in a {np.dtype(dtype).name} model: read it in a wider dtype")


def read_state(folder, config, convert, buffers=(), dtype=None):
    """``{minitf name: host array}`` of ``folder``'s weights (model.safetensors or its shards) for a model of
    ``config``: :func:`read_weights` (every tensor finite; ``buffers`` left out), then ``convert(weights, config,
    path)`` (the kind's names and layouts, each tensor checked); with ``dtype`` (the model's), a tensor beyond that
    dtype's range is refused too. A ValueError names the file and the tensor."""
    path = weights_path(folder)
    weights = read_weights(path, buffers=buffers)
    state = convert(weights, config, path)
    if dtype is not None:
        check_dtype_range(weights, dtype, path)
    return state


def check_layer_counts(weights, declared, path):
    """Refuse a config.json declaring more layers than the weights hold, before anything per layer is made (10**7
    layers would take the machine's memory, or hours, before any tensor was found missing): ``declared`` is
    ``{config key: (its value, the regular expression of a layer's tensor names with the layer number as its
    group)}``. A ValueError naming the key, its value and the layers the file holds."""
    for key, (count, pattern) in declared.items():
        layers = {int(m.group(1)) for name in weights if (m := re.match(pattern, name))}
        if count > len(layers):
            raise ValueError(f"{path}: config.json declares {key} {count}, but the weights hold {len(layers)} such "
                             "layers; the config.json does not belong to these weights: use the folder's own")


def check_names(weights, names, path):
    """A ValueError naming ``path`` unless ``weights`` holds exactly the tensors ``names`` (the first five missing
    and the first five unknown named), each floating-point."""
    known = set(names)
    missing, unknown = sorted(known - set(weights)), sorted(set(weights) - known)
    if missing or unknown:
        raise ValueError(f"{path}: the weights do not fit the model of its config.json: "
                         + "; ".join(filter(None, [missing and f"missing {missing[:5]}"
                                                   + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""),
                                                   unknown and f"not parameters of it {unknown[:5]}"
                                                   + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")])))
    for name, array in weights.items():
        if array.dtype.kind != "f":
            raise ValueError(f"{path}: tensor {name} is {array.dtype}; expected floating-point weights")


def state_of_pairs(weights, pairs, expected, path):
    """``{minitf name: array}`` of a folder's ``weights`` for a model whose parameters are ``pairs``
    ``[(Hugging Face name, minitf name, transposed)]`` (an nn.Linear's (out, in) turned to minitf's (in, out)),
    after :func:`check_names` and :func:`check_shapes` (``expected``: ``{Hugging Face name: shape}``)."""
    check_names(weights, [hf for hf, _, _ in pairs], path)
    check_shapes(weights, expected, path)
    return {ours: (weights[hf].T if transposed else weights[hf]) for hf, ours, transposed in pairs}


def hf_state_of_pairs(state, pairs):
    """``{Hugging Face name: array}`` of a model's ``state_dict()``: :func:`state_of_pairs` the other way."""
    return {hf: (np.ascontiguousarray(state[ours].T) if transposed else state[ours]) for hf, ours, transposed in pairs}


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
