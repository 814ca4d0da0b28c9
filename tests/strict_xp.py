"""A strict, CuPy-like stand-in array module for the tests (runs on NumPy, no GPU needed).

CuPy differs from NumPy in ways that only show on a GPU machine: a device array
refuses to become a host array implicitly, refuses arithmetic with a host array,
and every read of a device scalar (``float(a)``, ``int(a)``, ``a.item()``, ``if a:``)
waits for the device. :class:`StrictArray` wraps a NumPy array and behaves like that:

* ``numpy.asarray(a)`` / ``numpy.array(a)`` / any NumPy function that would convert it
  raise ``TypeError`` (``__array__`` refuses, as CuPy's does); ``a.get()`` and
  ``backend.to_numpy(a)`` are the explicit way, counted as ``to_host``.
* a ufunc or function mixing a StrictArray with a plain ``numpy.ndarray`` raises
  ``TypeError`` (NumPy *scalars* and Python numbers are fine, as in CuPy), and so does
  indexing with a host index array or assigning a host array into a StrictArray.
* ``float()``, ``int()``, ``bool()``, ``operator.index()``, ``.item()`` and ``.tolist()``
  work but are counted as ``scalar_reads`` (synchronising reads on a GPU).
* full reductions return 0-d StrictArrays, not NumPy scalars (as CuPy does).
* ``xp.asarray(host_array)`` is the explicit host-to-device copy, counted as ``to_device``.
* with ``COUNTS.watch_float64`` set, every float64 array an operation produces is
  counted in ``float64_results`` (to find accidental promotion in float32 training).

:func:`active` swaps it in as the backend's array module for a ``with`` block; the
whole suite can run on it with ``MINITF_STRICT=1 python -m pytest`` (see conftest.py).
"""
import contextlib
import traceback

import numpy
from numpy.lib.mixins import NDArrayOperatorsMixin

from minitf import backend


class Counts:
    """Counters of host/device traffic; ``reset()`` before the code under test."""

    def __init__(self):
        self.watch_float64 = False
        self.reset()

    def reset(self):
        self.scalar_reads = 0        # float(a), int(a), bool(a), a.item(), a.tolist()
        self.to_host = 0             # a.get() / backend.to_numpy(a): explicit device -> host copies
        self.to_device = 0           # xp.asarray(host array): explicit host -> device copies
        self.float64_results = 0     # float64 arrays produced while watch_float64 is set
        self.float64_where = []      # where the first few came from

    def as_dict(self):
        return dict(scalar_reads=self.scalar_reads, to_host=self.to_host, to_device=self.to_device)


COUNTS = Counts()


def _refuse(what):
    raise TypeError(f"strict backend: {what} (CuPy refuses this too; convert explicitly with "
                    "backend.asarray(host_array) or backend.to_numpy(device_array))")


def _unwrap(obj, where):
    """StrictArray -> its NumPy array; a plain host ndarray -> TypeError; containers recursively."""
    if isinstance(obj, StrictArray):
        return obj._a
    if isinstance(obj, numpy.ndarray):
        _refuse(f"{where} got a host numpy.ndarray {obj.shape} mixed with device arrays")
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unwrap(o, where) for o in obj)
    if isinstance(obj, dict):
        return {k: _unwrap(v, where) for k, v in obj.items()}
    return obj


def _wrap(obj):
    """NumPy results -> StrictArray (scalars as 0-d arrays, as CuPy returns them)."""
    if isinstance(obj, numpy.ndarray):
        if COUNTS.watch_float64 and obj.dtype == numpy.float64:
            COUNTS.float64_results += 1
            if len(COUNTS.float64_where) < 5:
                COUNTS.float64_where.append("".join(traceback.format_stack(limit=6)[:-2]))
        return StrictArray(obj)
    if isinstance(obj, numpy.generic):
        return _wrap(numpy.asarray(obj))
    if isinstance(obj, tuple):
        return tuple(_wrap(o) for o in obj)
    if isinstance(obj, list):
        return [_wrap(o) for o in obj]
    return obj


def _wrapped_call(function, name):
    def call(*args, **kwargs):
        return _wrap(function(*_unwrap(args, name), **_unwrap(kwargs, name)))
    call.__name__ = name
    return call


class StrictArray(NDArrayOperatorsMixin):
    """A "device" array: a NumPy array behind CuPy's rules (see the module docstring)."""

    __slots__ = ("_a",)

    def __init__(self, array):
        self._a = array

    # -- NumPy protocols: ufuncs and functions run on the wrapped arrays ------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        name = f"numpy.{ufunc.__name__}.{method}" if method != "__call__" else f"numpy.{ufunc.__name__}"
        return _wrap(getattr(ufunc, method)(*_unwrap(inputs, name), **_unwrap(kwargs, name)))

    def __array_function__(self, func, types, args, kwargs):
        name = f"numpy.{func.__name__}"
        return _wrap(func(*_unwrap(args, name), **_unwrap(kwargs, name)))

    def __array__(self, dtype=None, copy=None):
        _refuse("implicit conversion of a device array to a NumPy array (use .get())")

    # -- explicit transfer and synchronising scalar reads -----------------------------
    def get(self):
        COUNTS.to_host += 1
        return self._a.copy()

    def _scalar_read(self):
        COUNTS.scalar_reads += 1
        return self._a

    def __float__(self):
        return float(self._scalar_read())

    def __int__(self):
        return int(self._scalar_read())

    def __index__(self):
        return self._scalar_read().__index__()

    def __bool__(self):
        return bool(self._scalar_read())

    def item(self, *args):
        return self._scalar_read().item(*args)

    def tolist(self):
        return self._scalar_read().tolist()

    # -- indexing ------------------------------------------------------------------
    def __getitem__(self, key):
        return _wrap(self._a[_unwrap(key, "indexing")])

    def __setitem__(self, key, value):
        self._a[_unwrap(key, "indexing")] = _unwrap(value, "assignment")

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (_wrap(row) for row in self._a)

    def __repr__(self):
        return f"StrictArray({self._a!r})"

    @property
    def data(self):
        """CuPy's ``a.data``: a memory pointer whose ``.ptr`` is the address of the first
        element (what NCCL's calls take); here the host address of the NumPy data."""
        return _MemoryPointer(self._a.ctypes.data)

    # -- everything else (shape, dtype, reshape, sum, astype, T ...) from the array --
    def __getattr__(self, name):
        if name.startswith("__"):        # e.g. __array_interface__: NumPy would read the data through it
            raise AttributeError(name)
        value = getattr(self._a, name)
        return _wrapped_call(value, name) if callable(value) else _wrap(value)


class _MemoryPointer:
    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr


class _Ufunc:
    """``xp.add`` etc.: callable, with ``.at``, ``.reduce``... also checked and wrapped."""

    def __init__(self, ufunc):
        self._u = ufunc

    def __call__(self, *args, **kwargs):
        return _wrapped_call(self._u, f"numpy.{self._u.__name__}")(*args, **kwargs)

    def __getattr__(self, name):
        value = getattr(self._u, name)
        return _wrapped_call(value, f"numpy.{self._u.__name__}.{name}") if callable(value) else value


class _Generator:
    """``xp.random.default_rng(seed)``: a NumPy Generator whose draws are device arrays."""

    def __init__(self, generator):
        self._g = generator

    def __getattr__(self, name):
        return _wrapped_call(getattr(self._g, name), f"Generator.{name}")


class _Random:
    def default_rng(self, seed=None):
        return _Generator(numpy.random.default_rng(seed))


class StrictModule:
    """NumPy's namespace, returning StrictArrays; ``asarray`` is the explicit upload."""

    __name__ = "strict_xp"
    ndarray = StrictArray
    random = _Random()

    def asarray(self, a, dtype=None):
        if isinstance(a, StrictArray):
            return a if dtype is None or a.dtype == numpy.dtype(dtype) else a.astype(dtype)
        COUNTS.to_device += 1
        return _wrap(numpy.array(a, dtype=dtype))

    def array(self, a, dtype=None, copy=True):
        if isinstance(a, StrictArray):
            return StrictArray(numpy.array(a._a, dtype=dtype, copy=copy))
        return self.asarray(a, dtype)

    def __getattr__(self, name):
        value = getattr(numpy, name)
        if isinstance(value, numpy.ufunc):
            return _Ufunc(value)
        if isinstance(value, type) or not callable(value):
            return value                 # dtypes (xp.float32), constants (xp.inf), classes (xp.finfo)
        return _wrapped_call(value, f"numpy.{name}")


xp = StrictModule()


@contextlib.contextmanager
def active():
    """Use the strict module as the backend's array module for the duration (seed 0)."""
    with backend.array_module(xp, "strict"):
        COUNTS.reset()
        yield COUNTS
