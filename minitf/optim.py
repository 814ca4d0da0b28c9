"""Adam (Kingma & Ba 2015) with the paper's warmup schedule (paper 5.3), and
global gradient-norm clipping. All of them work on the flat parameter and
gradient buffers: a handful of whole-buffer operations per step (on the GPU,
Adam is one fused kernel)."""
from minitf import backend
from minitf.backend import xp
from minitf.module import FlatBuffers


class WarmupSchedule:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)   (paper eq. 3)

    Rises linearly for ``warmup`` steps, peaks at step = warmup, then decays as 1/sqrt(step).
    """

    def __init__(self, d_model, warmup=4000, scale=1.0):
        if warmup < 1 or d_model < 1:
            raise ValueError(f"warmup and d_model must be positive, got warmup={warmup}, d_model={d_model}")
        self.d_model, self.warmup, self.scale = d_model, warmup, scale

    def __call__(self, step):
        step = max(int(step), 1)
        return self.scale * self.d_model ** -0.5 * min(step ** -0.5, step * self.warmup ** -1.5)


def grad_norm(params):
    """The global L2 norm of all gradients, one reduction over the flat buffer.

    Returns a 0-d device array (no host sync); inf or NaN if any gradient is."""
    g = FlatBuffers.flatten(params).grad
    return xp.sqrt(xp.dot(g, g))


def clip_grad_norm(params, max_norm):
    """Scale all gradients so that their global L2 norm is at most ``max_norm``.

    Returns the norm before clipping as a 0-d device array (no host sync)."""
    flat = FlatBuffers.flatten(params)
    norm = grad_norm(params)
    flat.grad *= xp.minimum(1.0, max_norm / (norm + 1e-6)).astype(flat.grad.dtype)
    return norm


class Adam:
    """m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
    p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)

    ``lr`` is a number or a callable ``step -> lr`` (e.g. :class:`WarmupSchedule`).
    Defaults are the paper's: beta1 0.9, beta2 0.98, eps 1e-9.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.98), eps=1e-9, fused=True):
        params = list(params)
        if not params:
            raise ValueError("Adam got an empty parameter list")
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.fused = fused                                 # GPU only: one CuPy kernel (see _fused_adam)
        self.flat = FlatBuffers.flatten(params)          # every p.data / p.grad becomes a view
        self.m = xp.zeros_like(self.flat.data)
        self.v = xp.zeros_like(self.flat.data)
        self._scratch = None                               # one reused buffer (made at the first step)
        self.step_count = 0

    def current_lr(self, step=None):
        step = self.step_count if step is None else step
        return self.lr(step) if callable(self.lr) else self.lr

    def zero_grad(self):
        self.flat.grad.fill(0)

    def step(self):
        self.step_count += 1
        t, (b1, b2) = self.step_count, self.betas
        lr = self.current_lr(t)
        g, m, v = self.flat.grad, self.m, self.v
        # bias corrections folded into the step size and eps (one fewer pass over the buffer)
        step_size = lr * (1 - b2 ** t) ** 0.5 / (1 - b1 ** t)
        eps_hat = self.eps * (1 - b2 ** t) ** 0.5
        if self.fused and backend.get_device() == "gpu":
            # the very same update as the lines below, in one pass: see _fused_adam
            _fused_adam()(g, b1, b2, 1 - b1, 1 - b2, step_size, eps_hat, self.flat.data, m, v)
            return
        if self._scratch is None:
            self._scratch = xp.empty_like(self.flat.data)
        tmp = self._scratch                                # no new buffer in any step
        # every line below is one in-place pass over the whole flat buffer
        m *= b1
        m += xp.multiply(g, 1 - b1, out=tmp)               # m = b1 m + (1-b1) g       first moment
        v *= b2
        g2 = xp.multiply(g, g, out=tmp)
        g2 *= 1 - b2
        v += g2                                            # v = b2 v + (1-b2) g^2     second moment
        denom = xp.sqrt(v, out=tmp)
        denom += eps_hat                                   # sqrt(v) + eps, in the scratch buffer
        update = xp.divide(m, denom, out=tmp)
        update *= step_size
        self.flat.data -= update                           # p -= step_size * m / (sqrt(v) + eps)

    def state_dict(self):
        return {"m": self.m, "v": self.v, "step": self.step_count}

    def load_state_dict(self, state):
        for key in ("m", "v"):
            if tuple(state[key].shape) != tuple(self.m.shape):
                raise ValueError(f"optimizer state {key!r} has shape {tuple(state[key].shape)}, "
                                 f"expected {tuple(self.m.shape)}")
            getattr(self, key)[...] = xp.asarray(state[key])
        self.step_count = int(state["step"])


# --------------------------------------------------------------------------- #
# GPU only: Adam as one fused CuPy kernel
# --------------------------------------------------------------------------- #
_kernels = {}


def _fused_adam():
    """One CUDA kernel doing Adam.step's update for every element of the flat buffers:
    one read of g, p, m, v and one write of p, m, v, instead of about ten whole-buffer
    passes. The NumPy lines in :meth:`Adam.step` are the reference.

    Written for CuPy (``xp.ElementwiseKernel``; ``T`` is the buffers' float type, the
    Python floats are cast to it) and used only when the device is 'gpu'. It has NOT
    been run on this repository's CPU-only development machine: ``tests/test_gpu.py``
    (run by ``scripts/gpu_check.sh`` on a GPU machine) compares it with the NumPy path.
    """
    if "adam" not in _kernels:
        _kernels["adam"] = xp.ElementwiseKernel(
            "T g, T b1, T b2, T one_minus_b1, T one_minus_b2, T step_size, T eps_hat",   # read
            "T p, T m, T v",                                                             # read and written
            """
            m = b1 * m + one_minus_b1 * g;                     // first moment
            v = b2 * v + one_minus_b2 * g * g;                 // second moment
            p -= step_size * m / (sqrt(v) + eps_hat);
            """,
            "minitf_fused_adam")
    return _kernels["adam"]
