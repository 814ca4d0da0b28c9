"""The one backend seam: the only module that imports numpy or cupy.

Every other module does ``from minitf.backend import xp`` and calls ``xp.exp``,
``xp.matmul``... ``xp`` is a thin proxy that forwards to whichever array module
is active, so the same layer code runs on NumPy (CPU) and CuPy (GPU).

Choose the device with the environment variable ``MINITF_DEVICE=cpu|gpu`` or
in code with :func:`set_device`. Parameters are created with the default float
dtype (float32; the gradient checks switch to float64 with :func:`default_dtype`).
"""
import contextlib
import contextvars
import itertools
import os
import threading

# OpenBLAS's idle threads spin for 2^28 cycles (about 0.1 s) after each product before they sleep, on the very
# cores that by_rows' threads need next: the training step with both ran 5-10% slower than with one thread.
# After 2^16 cycles (tens of microseconds) they still bridge back-to-back products, then give the cores back
# (2^4, OpenBLAS's least, made small products wait for their wake-up: docs/benchmarks.md). A user's own
# setting wins. OpenBLAS reads it once, as NumPy loads it: hence before the import.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "16")

import numpy  # noqa: E402

#: Host-side NumPy, for work that always lives on the CPU (data loading,
#: batching, parameter initialisation before the copy to the device).
host = numpy

_state = {"module": numpy, "device": "cpu", "dtype": numpy.float32, "rng": numpy.random.default_rng(0),
          "init_rng": numpy.random.default_rng(0)}


class _ArrayModuleProxy:
    """Forwards ``xp.name`` to the active array module (numpy or cupy)."""

    def __getattr__(self, name):
        return getattr(_state["module"], name)

    def __repr__(self):
        return f"<minitf array module proxy -> {_state['module'].__name__}>"


xp = _ArrayModuleProxy()


def keep_freed_memory():
    """Ask glibc's malloc to keep freed memory for reuse instead of returning it to the
    system (no mmap for large blocks, no trimming). A training step allocates and frees
    the same large temporaries every step; served fresh by mmap, each costs page faults
    on first touch (measured on 2 cores: a default-preset step 372 -> 297 ms). Never
    trimming matters once a step's temporaries pass 1 GiB (SmolLM2-135M's step: 230,000 page
    faults a step with a 1 GiB trim threshold, none without; 5.2 -> 4.2 s). Called by
    train.py, translate, generate and inspect, not on import. Linux/glibc only; returns True where it
    took effect. The process's memory then stays near its peak."""
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
    # blocks up to 1 GiB from the heap (older glibc caps the threshold at 32 MiB)
    ok = mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1 or mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1
    ok &= mallopt(M_TRIM_THRESHOLD, -1) == 1                 # never give free heap back (man mallopt: -1)
    ok &= mallopt(M_TOP_PAD, 64 << 20) == 1                  # grow the heap 64 MiB at a time
    return bool(ok)


class DeviceError(RuntimeError):
    """The requested device cannot be used on this machine."""


def cuda_failure_reason(error):
    """Which piece is missing, from the error CuPy raised when asked for its devices:
    the NVIDIA driver, a CUDA library, or a device."""
    text = f"{type(error).__name__}: {error}"
    lowered = text.lower()
    if "libcuda.so" in lowered or not _driver_library_loads():
        return (f"no NVIDIA driver was found (libcuda.so.1 does not load; {text}). A GPU machine needs "
                "the driver and nothing else: install it, then check that nvidia-smi runs.")
    if "insufficientdriver" in lowered.replace(" ", "") or "driver version is insufficient" in lowered:
        return (f"the NVIDIA driver is older than this CuPy's CUDA needs ({text}). Update the driver "
                "(nvidia-smi shows its CUDA version), or install the CuPy that matches it.")
    if any(name in lowered for name in ("libcudart", "libcublas", "libnvrtc", "libcurand", "cannot open shared",
                                        "failed to load", "cuda_path")):
        return (f"a CUDA library is missing ({text}). CuPy's wheel does not bring the CUDA libraries; "
                "install them with: pip install -e .[gpu]  (cupy-cuda12x[ctk]).")
    if "nodevice" in lowered.replace(" ", "") or "no cuda-capable device" in lowered:
        return (f"the driver sees no CUDA device ({text}). Check CUDA_VISIBLE_DEVICES and nvidia-smi.")
    return f"CuPy is installed but no CUDA device is usable ({text}). Check the NVIDIA driver with nvidia-smi."


def _driver_library_loads():
    """True when the NVIDIA driver's user-space library (libcuda) can be loaded."""
    import ctypes
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def _import_cupy():
    try:
        import cupy
    except ImportError as error:
        raise DeviceError(
            "device 'gpu' needs CuPy, which is not installed "
            f"({error}). Install it with: pip install -e .[gpu]  (CuPy for CUDA 12 and its CUDA libraries), "
            "or use --device cpu / MINITF_DEVICE=cpu."
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # driver missing or too old, a CUDA library missing, no device
        raise DeviceError(f"device 'gpu': {cuda_failure_reason(error)} Or use --device cpu.") from None
    if count == 0:
        raise DeviceError("device 'gpu': CuPy found no visible CUDA device. "
                          "Check CUDA_VISIBLE_DEVICES and nvidia-smi, or use --device cpu.")
    return cupy


def set_device(name):
    """Switch the active array module: ``'cpu'`` (NumPy) or ``'gpu'`` (CuPy).

    Arrays made before the switch stay where they are; build models after it.
    """
    if name not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {name!r}")
    module = numpy if name == "cpu" else _import_cupy()
    _state["module"], _state["device"] = module, name
    manual_seed(0)


@contextlib.contextmanager
def array_module(module, device_name):
    """Run with another NumPy-compatible array module as ``xp`` for the duration (test
    infrastructure: the strict CuPy stand-in of ``tests/strict_xp.py`` uses it).
    Arrays and models made inside belong to that module; the seed is reset to 0."""
    previous = dict(_state)
    _state["module"], _state["device"] = module, device_name
    manual_seed(0)
    try:
        yield
    finally:
        _state.update(previous)


def get_device():
    """The active device name, ``'cpu'`` or ``'gpu'``."""
    return _state["device"]


def gpu_available():
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        _import_cupy()
    except DeviceError:
        return False
    return True


def get_default_dtype():
    """The float dtype new parameters and activations use (float32 by default)."""
    return _state["dtype"]


def set_default_dtype(dtype):
    dtype = numpy.dtype(dtype)
    if dtype not in (numpy.dtype(numpy.float16), numpy.dtype(numpy.float32), numpy.dtype(numpy.float64)):
        raise ValueError(f"default dtype must be float16, float32 or float64, got {dtype}")
    _state["dtype"] = dtype.type


@contextlib.contextmanager
def default_dtype(dtype):
    """Temporarily change the default float dtype (gradient checks use float64)."""
    previous = _state["dtype"]
    set_default_dtype(dtype)
    try:
        yield
    finally:
        _state["dtype"] = previous


def manual_seed(seed):
    """Seed the device-side random generator (dropout masks)."""
    seed = int(seed)
    _state["rng"] = _state["module"].random.default_rng(seed)
    _state["init_rng"] = numpy.random.default_rng(seed)


def rng():
    """The device-side random generator (``numpy.random.Generator`` or CuPy's)."""
    return _state["rng"]


def init_rng():
    """The host-side generator that parameter initialisation draws from, seeded by
    :func:`manual_seed`: a given seed gives the same model on CPU and GPU."""
    return _state["init_rng"]


def host_rng(seed):
    """A new host-side NumPy generator: parameter init and data order live on the host
    so that a given seed gives the same model on CPU and GPU."""
    return numpy.random.default_rng(seed)


def asarray(array, dtype=None):
    """Copy or view a host array (or list) as an array of the active device."""
    return _state["module"].asarray(array, dtype=dtype)


def to_numpy(array):
    """A NumPy array (on the host) for any array or scalar of either backend."""
    if isinstance(array, numpy.ndarray):
        return array
    if hasattr(array, "get"):  # cupy.ndarray
        return array.get()
    return numpy.asarray(array)


def is_array(value):
    """True for an array of the active backend."""
    return isinstance(value, _state["module"].ndarray)


def finfo(dtype):
    return numpy.finfo(dtype)


# --------------------------------------------------------------------------- #
# Threads for NumPy's elementwise and row-wise work
# --------------------------------------------------------------------------- #
# NumPy releases the GIL inside its ufunc and reduction loops, so blocks of rows of one array can run on
# several threads with NumPy's own functions. A row's result depends on that row only (an elementwise op, or a
# reduction along the last axis, whose pairwise sum runs inside the row), so it is the same bit for bit whichever
# block or thread computed it: :func:`by_rows` gives what the plain call gives.

#: Below this many elements (of the first array) :func:`by_rows` runs the call inline: splitting costs about
#: 30 us a call, more than it saves on smaller arrays (``benchmarks/threads.py --part threshold``).
THREAD_MIN_ELEMENTS = 1 << 17
#: Elements a thread works on at a time (fewer where that leaves a thread without a block): each block's
#: temporaries stay in the cache, and the threads take the interpreter lock once per block (256K float32 = 1 MB).
THREAD_BLOCK_ELEMENTS = 1 << 18
#: The variables of MPI launchers (as minitf.training.distributed.LAUNCHER_ENV): a rank under mpiexec.
_MPI_LAUNCHER_ENV = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
#: The launchers' count of ranks on this machine (Open MPI, MPICH's hydra).
_MPI_LOCAL_SIZE_ENV = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")


def default_threads(environ=None):
    """How many threads :func:`by_rows` uses: ``MINITF_THREADS`` if set; else the BLAS thread setting
    (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``, the first set); else the cores this
    process may run on (``os.sched_getaffinity``) shared among the ranks on this machine when ``mpiexec``
    started it (one rank per core: one thread)."""
    environ = os.environ if environ is None else environ
    value = environ.get("MINITF_THREADS", "").strip()
    if value:
        try:
            count = int(value)
        except ValueError:
            raise ValueError(f"MINITF_THREADS must be a whole number of threads, got {value!r}; "
                             f"set it to 1 or more, or unset it") from None
        if count < 1:
            raise ValueError(f"MINITF_THREADS must be 1 or more threads, got {count}; set it to 1 or more, or unset it")
        return count
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        # OpenMP's form: a list for nested levels ("4,2"), the first the outer one; one that is not read is skipped
        first = environ.get(name, "").split(",")[0].strip()
        if first.isdigit() and int(first) >= 1:
            return int(first)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:                                     # not on Linux
        cores = os.cpu_count() or 1
    if any(name in environ for name in _MPI_LAUNCHER_ENV):
        local = next((int(environ[name]) for name in _MPI_LOCAL_SIZE_ENV if environ.get(name, "").isdigit()), 0)
        return max(1, cores // local) if local else 1          # a rank per core unless the launcher says less
    return max(1, cores)


_threads = {"count": None, "pool": None, "pool_size": 0}
_worker = threading.local()                                    # .busy: this thread runs a block (no nesting)


def threads():
    """The number of threads :func:`by_rows` uses (read from the environment at first use,
    :func:`default_threads`)."""
    if _threads["count"] is None:
        _threads["count"] = default_threads()
    return _threads["count"]


def set_threads(count):
    """Use ``count`` threads from now on (1: every call inline, NumPy's plain path)."""
    count = int(count)
    if count < 1:
        raise ValueError(f"the number of threads must be 1 or more, got {count}")
    _threads["count"] = count


@contextlib.contextmanager
def thread_count(count):
    """Run with ``count`` threads for the duration (tests compare 1 with several)."""
    previous = _threads["count"]
    set_threads(count)
    try:
        yield
    finally:
        _threads["count"] = previous


def _pool(size):
    if _threads["pool"] is None or _threads["pool_size"] != size:
        from concurrent.futures import ThreadPoolExecutor
        if _threads["pool"] is not None:
            _threads["pool"].shutdown(wait=False)
        _threads["pool"] = ThreadPoolExecutor(max_workers=size, thread_name_prefix="minitf-rows")
        _threads["pool_size"] = size
    return _threads["pool"]


def _forget_pool():
    """A forked child has none of its parent's threads: it makes its own pool on first use."""
    _threads["pool"], _threads["pool_size"] = None, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _blocks(arrays, fixed=False):
    """The row blocks of :func:`by_rows`: [(lo, hi)], or None where the call should run inline. ``fixed``: blocks
    of THREAD_BLOCK_ELEMENTS whatever the number of threads (a sum of the blocks' sums then is the same for any)."""
    first = arrays[0]
    count = threads()
    if (count == 1 or getattr(_worker, "busy", False) or first.ndim == 0 or first.size < THREAD_MIN_ELEMENTS
            or not all(type(a) is numpy.ndarray for a in arrays)):   # CuPy's and other arrays: their own path
        return None
    n = first.shape[0]
    if any(a.ndim == 0 or a.shape[0] not in (n, 1) for a in arrays):
        raise ValueError(f"by_rows splits arrays along their first axis, of length {n} (or 1: passed whole); "
                         f"got shapes {[tuple(a.shape) for a in arrays]}")
    rows = max(1, THREAD_BLOCK_ELEMENTS // max(first.size // max(n, 1), 1))
    if not fixed:
        rows = min(rows, -(-n // count))                       # at least a block per thread
    if n < 2 or rows >= n:
        return None
    return [(lo, min(lo + rows, n)) for lo in range(0, n, rows)]


def _run_blocks(work, count, blocks):
    """``work(lo, hi)`` for every block, on ``count`` threads (this one and count - 1 of the pool): each takes
    the next block not yet taken, so that a thread slowed by other processes takes fewer."""
    taken = itertools.count()                                  # next() on it is atomic under the GIL
    failed = []                                                # a block raised (or Ctrl-C): the others stop

    def loop():
        previous, _worker.busy = getattr(_worker, "busy", False), True
        try:
            for i in iter(taken.__next__, None):
                if i >= len(blocks) or failed:
                    return
                work(*blocks[i])
        except BaseException:
            failed.append(True)
            raise
        finally:
            _worker.busy = previous

    helpers = min(count, len(blocks)) - 1
    pool = _pool(threads() - 1)
    # the caller's context (numpy.errstate, in NumPy 2) in every thread
    futures = [pool.submit(contextvars.copy_context().run, loop) for _ in range(helpers)]
    try:
        loop()
    finally:
        for future in futures:
            future.result()                                    # waits; raises a block's error here


def by_rows(fn, *arrays):
    """``fn(*arrays)``, computed on blocks of rows on :func:`threads` threads: the same result, bit for bit, when
    every row of fn's results depends only on the same rows of ``arrays`` (elementwise work, reductions along
    later axes).

    The arrays are split along their first axis (those of length 1 there are passed whole: they broadcast);
    ``fn`` gets blocks of any number of rows (0 included) and returns None (it works in place), an array or a
    tuple of arrays with one row per row of its block, assembled here into arrays of all the rows. Inline (just
    ``fn(*arrays)``) for one thread, small arrays, a call from inside a block, and arrays other than NumPy's
    (CuPy's: the GPU runs its own kernels)."""
    blocks = _blocks(arrays)
    if blocks is None:
        return fn(*arrays)
    n = arrays[0].shape[0]

    def cut(lo, hi):
        return [a[lo:hi] if a.shape[0] == n else a for a in arrays]

    probe = fn(*cut(0, 0))                                     # the results' dtypes and row shapes, from 0 rows
    single = isinstance(probe, numpy.ndarray)
    parts = () if probe is None else (probe,) if single else tuple(probe)
    if not all(isinstance(p, numpy.ndarray) and p.ndim and p.shape[0] == 0 for p in parts):
        raise ValueError("by_rows: fn must return None, an array or a tuple of arrays with one row per row of "
                         "its block")
    outs = [numpy.empty((n,) + p.shape[1:], dtype=p.dtype) for p in parts]

    def work(lo, hi):
        result = fn(*cut(lo, hi))
        for out, part in zip(outs, (result,) if single else result or ()):
            out[lo:hi] = part

    _run_blocks(work, threads(), blocks)
    return None if probe is None else outs[0] if single else tuple(outs)


def sum_by_rows(fn, *arrays):
    """``fn(*arrays)`` for a ``fn`` that returns a sum of its rows' terms (a 0-d array or scalar), computed as
    the sum of fn over blocks of rows on :func:`threads` threads: equal to the plain call up to rounding (the
    terms are added in another order), not bit for bit. The blocks' sums are added in float64 in block order,
    so the result is the same for any number of threads. Inline as :func:`by_rows`."""
    blocks = _blocks(arrays, fixed=True)
    if blocks is None:
        return fn(*arrays)
    n = arrays[0].shape[0]
    partial = [None] * len(blocks)
    index = {block: i for i, block in enumerate(blocks)}

    def work(lo, hi):
        partial[index[(lo, hi)]] = fn(*[a[lo:hi] if a.shape[0] == n else a for a in arrays])

    _run_blocks(work, threads(), blocks)
    dtype = numpy.asarray(partial[0]).dtype
    return numpy.asarray(sum(float(p) for p in partial), dtype=dtype)


def add_at_rows(target, index, values):
    """``numpy.add.at(target, index, values)``: values (N, ...) added to the rows ``index`` (N,) of target, a row
    met twice getting both. On NumPy with several threads and many values, the target's rows are split among the
    threads, each adding its rows' values in their order in ``index``: the same sums, bit for bit."""
    blocks = _blocks((values,))
    if blocks is None or type(target) is not numpy.ndarray or type(index) is not numpy.ndarray:
        _state["module"].add.at(target, index, values)
        return
    index = numpy.where(index < 0, index + target.shape[0], index)   # -1 and V - 1: one row, one thread
    order = numpy.argsort(index, kind="stable")                # each row's values stay in their order
    sorted_index = index[order]
    # cut the sorted values into about len(blocks) parts, each cut moved back to the start of its row's run
    cuts = numpy.searchsorted(sorted_index, sorted_index[[lo for lo, _ in blocks[1:]]], side="left")
    edges = numpy.unique(numpy.concatenate([[0], cuts, [index.size]]))

    def work(lo, hi):
        numpy.add.at(target, sorted_index[lo:hi], values[order[lo:hi]])

    _run_blocks(work, threads(), list(zip(edges[:-1].tolist(), edges[1:].tolist())))


# erf for GELU's exact form. NumPy has none and SciPy is not a dependency, so the CPU path
# evaluates Cephes' rational approximations (S. L. Moshier, ndtr.c; the ones SciPy's erf uses):
# relative error about 1e-16 on every range, i.e. float64 rounding, checked against math.erf in
# tests/test_layers.py. On the GPU, CuPy's own erf (CUDA's, within 2 ulp) is one fused kernel.
_ERF_T = (9.60497373987051638749E0, 9.00260197203842689217E1, 2.23200534594684319226E3,
          7.00332514112805075473E3, 5.55923013010394962768E4)
_ERF_U = (1.0, 3.35617141647503099647E1, 5.21357949780152679795E2, 4.59432382970980127987E3,
          2.26290000613890934246E4, 4.92673942608635921086E4)
_ERFC_P = (2.46196981473530512524E-10, 5.64189564831068821977E-1, 7.46321056442269912687E0,
           4.86371970985681366614E1, 1.96520832956077098242E2, 5.26445194995477358631E2,
           9.34528527171957607540E2, 1.02755188689515710272E3, 5.57535335369399327526E2)
_ERFC_Q = (1.0, 1.32281951154744992508E1, 8.67072140885989742329E1, 3.54937778887819891062E2,
           9.75708501743205489753E2, 1.82390916687909736289E3, 2.24633760818710981792E3,
           1.65666309194161350182E3, 5.57535340817727675546E2)
_ERFC_R = (5.64189583547755073984E-1, 1.27536670759978104416E0, 5.01905042251180477414E0,
           6.16021097993053585195E0, 7.40974269950448939160E0, 2.97886665372100240670E0)
_ERFC_S = (1.0, 2.26052863220117276590E0, 9.39603524938001434673E0, 1.20489539808096656605E1,
           1.70814450747565897222E1, 9.60896809063285878198E0, 3.36907645100081516050E0)


# The single-precision form: Eigen's generic_fast_erf_float coefficients (odd numerator x P(x^2), even
# denominator Q(x^2)); its own error is 6.5e-8 on [-4, 4], under float32's rounding of values near 1.
_ERF_SINGLE_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
                 -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_SINGLE_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
                 -1.42647390514189e-02)


def _erf_single(module, x):
    """erf of a float32/float16 array, in its dtype: x P(x^2) / Q(x^2) by Horner's rule in float64, in place."""
    x = module.clip(x, -4.0, 4.0, dtype=numpy.float64)             # erf(4) = 1 - 1.5e-8: 1 in float32
    z = x * x
    p = z * _ERF_SINGLE_P[0]
    p += _ERF_SINGLE_P[1]
    for c in _ERF_SINGLE_P[2:]:
        p *= z
        p += c
    p *= x                                                         # x P(x^2)
    q = z * _ERF_SINGLE_Q[0]
    q += _ERF_SINGLE_Q[1]
    for c in _ERF_SINGLE_Q[2:]:
        q *= z
        q += c                                                     # Q(x^2)
    p /= q
    return p


def _polynomial(coefficients, z):
    """c[0] z^n + ... + c[n] by Horner's rule."""
    result = coefficients[0] + 0 * z
    for c in coefficients[1:]:
        result = result * z + c
    return result


def erf(x):
    """The error function, elementwise, in the dtype of ``x`` (float arrays of the active backend).

    float64: erf(x) = x T(x^2) / U(x^2) for |x| <= 1; otherwise 1 - erfc(|x|) with the sign of x, where
    erfc(a) = exp(-a^2) P(a) / Q(a) for 1 < a < 8 and exp(-a^2) R(a) / S(a) beyond (Cephes).
    float32 and float16: one rational x P(x^2) / Q(x^2) on x clipped to [-4, 4] (erf is 1 in float32 beyond),
    evaluated in float64 and rounded once: within 1e-7 of erf, for a fraction of the three branches' time (BERT's
    GELU; docs/layers/gelu.md)."""
    module = _state["module"]
    if getattr(module, "__name__", "") == "cupy":
        import cupyx.scipy.special
        return cupyx.scipy.special.erf(x)
    dtype = x.dtype
    if dtype in (numpy.float32, numpy.float16):
        return _erf_single(module, x).astype(dtype)                # rounded once, from float64
    a = module.abs(x)
    x_small = module.clip(x, -1.0, 1.0)                            # the |x| <= 1 branch, finite everywhere
    z = x_small * x_small
    small = x_small * _polynomial(_ERF_T, z) / _polynomial(_ERF_U, z)
    # 1 <= a_big <= 27 keeps the other branches finite (erfc(27) < 1e-318: erf is +-1 beyond)
    a_big = module.clip(a, 1.0, 27.0)
    middle = _polynomial(_ERFC_P, a_big) / _polynomial(_ERFC_Q, a_big)
    far = _polynomial(_ERFC_R, a_big) / _polynomial(_ERFC_S, a_big)
    erfc = module.exp(-a_big * a_big) * module.where(a_big < 8.0, middle, far)  # erfc(|x|), |x| > 1
    return module.where(a <= 1.0, small, module.sign(x) * (1.0 - erfc)).astype(dtype, copy=False)


def synchronize():
    """Wait for queued GPU work (a no-op on the CPU); for honest timings."""
    if _state["device"] == "gpu":
        _state["module"].cuda.get_current_stream().synchronize()


class _Unusable:
    """Stands in for the array module when ``MINITF_DEVICE`` names a device that cannot
    be used: the first use raises the DeviceError, so importing minitf never fails
    and the command-line tools report it as one line (:func:`check_environment`)."""

    def __init__(self, error):
        self.error = error

    def __getattr__(self, name):
        raise self.error


def check_environment():
    """Raise the DeviceError of an unusable ``MINITF_DEVICE`` (no-op otherwise), or the ValueError of a thread
    count that is not a whole number of 1 or more (``MINITF_THREADS``, ``OMP_NUM_THREADS``...);
    :func:`set_device` replaces the environment's choice of device."""
    if isinstance(_state["module"], _Unusable):
        raise _state["module"].error
    threads()


_env_device = os.environ.get("MINITF_DEVICE", "cpu").strip().lower() or "cpu"
try:
    if _env_device not in ("cpu", "gpu"):
        raise DeviceError(f"MINITF_DEVICE must be 'cpu' or 'gpu', got {_env_device!r}; "
                          "set it to cpu or gpu (or unset it)")
    if _env_device == "gpu":
        set_device("gpu")
except DeviceError as _error:
    _state["module"], _state["device"] = _Unusable(_error), _env_device


def nccl():
    """``cupy.cuda.nccl``: NCCL's communicator, for data-parallel training on GPUs
    (imported here, the one module that may import CuPy)."""
    from cupy.cuda import nccl as module
    return module
