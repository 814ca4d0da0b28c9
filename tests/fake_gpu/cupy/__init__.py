"""A stand-in for CuPy, for the CPU dry run of scripts/gpu_check.sh only
(tests/test_gpu_check_script.py puts this folder on PYTHONPATH; nothing else imports it).

It stubs only the device: arrays are NumPy arrays, there is "one device", streams and the
memory pool do nothing, and each kernel of minitf/cuda_kernels.py runs as NumPy lines that
do the kernel's arithmetic in the kernel's order, after checking that the launch passes the
kernel's arguments (how many, which are arrays, their dtype) as its CUDA signature says.
The CUDA sources themselves are compiled for real by tests/test_cuda_sources.py.
"""
import re as _re

import numpy as _np
from numpy import *  # noqa: F401,F403  (the array API: cupy mirrors numpy's)
from numpy import fft, linalg, random  # noqa: F401

__version__ = "0.0-dry-run (NumPy stand-in)"
ndarray = _np.ndarray


class _Stream:
    def synchronize(self):
        pass


class _Runtime:
    @staticmethod
    def getDeviceCount():
        return 1

    @staticmethod
    def getDeviceProperties(index):
        return {"name": b"dry run: NumPy stand-in, no GPU"}


class cuda:  # noqa: N801  (cupy.cuda is a module; a namespace is enough here)
    runtime = _Runtime()

    @staticmethod
    def get_current_stream():
        return _Stream()


class _Pool:
    def free_all_blocks(self):
        pass

    def total_bytes(self):
        return 0


def get_default_memory_pool():
    return _Pool()


def asnumpy(array):
    return _np.asarray(array)


# --------------------------------------------------------------------------- kernels
def _adam(g, p, m, v, b1, b2, one_minus_b1, one_minus_b2, step_size, eps_hat, n):
    m[...] = b1 * m + one_minus_b1 * g
    v[...] = b2 * v + one_minus_b2 * g * g
    p -= step_size * m / (_np.sqrt(v) + eps_hat)


def _rows(array, cols):
    return array.reshape(-1, int(cols))


def _masked_softmax_forward(s, keep, P, cols):
    s, keep, out = _rows(s, cols), _rows(keep, cols).astype(bool), _rows(P, cols)
    row_max = _np.where(keep, s, -_np.inf).max(axis=1, keepdims=True)
    e = _np.where(keep, _np.exp(_np.where(keep, s - row_max, 0)), 0)
    total = e.sum(axis=1, keepdims=True)
    out[...] = e * _np.where(total > 0, 1 / _np.where(total > 0, total, 1), 0)


def _masked_softmax_backward(P, dP, dS, cols):
    p, dp = _rows(P, cols), _rows(dP, cols)
    _rows(dS, cols)[...] = p * (dp - (dp * p).sum(axis=1, keepdims=True))


def _layer_norm_forward(x, gamma, beta, y, xhat, rstd, eps, cols):
    x = _rows(x, cols)
    mean = x.mean(axis=1, keepdims=True)
    r = 1 / _np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + eps)
    rstd[...] = r[:, 0]
    _rows(xhat, cols)[...] = (x - mean) * r
    _rows(y, cols)[...] = (x - mean) * r * gamma + beta


def _layer_norm_backward(dy, xhat, rstd, gamma, dx, cols):
    g, h = _rows(dy, cols) * gamma, _rows(xhat, cols)
    r = rstd[:, None]
    _rows(dx, cols)[...] = r * (g - g.mean(axis=1, keepdims=True) - h * (g * h).mean(axis=1, keepdims=True))


def _dropout_residual(x, s, u, y, p, n):
    y[...] = x + _np.where(u >= p, s * x.dtype.type(1.0 / (1.0 - float(p))), 0)


def _label_smoothed_loss(logits, target, p, per_token, nll, eps, V):
    z = _rows(logits, V)
    s = z - z.max(axis=1, keepdims=True)
    e = _np.exp(s)
    total = e.sum(axis=1, keepdims=True)
    lse = _np.log(total[:, 0])
    _rows(p, V)[...] = e / total
    nll[...] = lse - s[_np.arange(z.shape[0]), target.reshape(-1)]
    per_token[...] = (1 - eps) * nll + eps * (lse - s.mean(axis=1))


_EMULATIONS = {"adam": _adam, "masked_softmax_forward": _masked_softmax_forward,
               "masked_softmax_backward": _masked_softmax_backward, "layer_norm_forward": _layer_norm_forward,
               "layer_norm_backward": _layer_norm_backward, "dropout_residual": _dropout_residual,
               "label_smoothed_loss": _label_smoothed_loss}
_CTYPES = {"float": _np.float32, "double": _np.float64, "long long": _np.int64, "unsigned char": _np.uint8}


class _Function:
    def __init__(self, entry, params):
        self.entry, self.params = entry, params

    def __call__(self, grid, block, args):
        if len(args) != len(self.params):
            raise TypeError(f"{self.entry} takes {len(self.params)} arguments, the launch passed {len(args)}")
        for (ctype, pointer), arg in zip(self.params, args):
            expected = _CTYPES[ctype]
            if pointer != isinstance(arg, _np.ndarray):
                raise TypeError(f"{self.entry}: {'an array' if pointer else 'a scalar'} expected for {ctype}"
                                f"{'*' if pointer else ''}, got {type(arg).__name__}")
            if _np.dtype(getattr(arg, "dtype", type(arg))) != _np.dtype(expected):
                raise TypeError(f"{self.entry}: {ctype} expected, got {getattr(arg, 'dtype', type(arg))}")
            if pointer and not arg.flags.c_contiguous:
                raise TypeError(f"{self.entry}: arrays must be C-contiguous")
        _EMULATIONS[self.entry.rsplit("_", 1)[0]](*args)


class RawModule:
    """Parses the extern "C" signatures of the source; get_function returns an emulation."""

    def __init__(self, code, options=()):
        self.signatures = {}
        for name, params in _re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', code):
            parsed = []
            for param in params.split(","):
                param = " ".join(param.replace("const ", "").split())
                ctype, pointer = _re.match(r"(.+?)\s*(\*?)\s*\w+$", param).groups()
                parsed.append((ctype.strip(), bool(pointer)))
            self.signatures[name] = parsed

    def get_function(self, entry):
        return _Function(entry, self.signatures[entry])
