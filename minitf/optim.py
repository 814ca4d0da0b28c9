"""Adam (Kingma & Ba 2015) with the paper's warmup schedule (paper 5.3), and
global gradient-norm clipping. All of them work on the flat parameter and
gradient buffers: a handful of whole-buffer operations per step (on the GPU,
Adam is one fused kernel). :class:`MixedPrecisionAdam` trains a float16 model
with float32 master weights and dynamic loss scaling (Micikevicius et al. 2018)."""
import threading

from minitf import backend
from minitf.backend import xp
from minitf.module import FlatBuffers, check_parameters_saved_consumed


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


def buffer_norm(g):
    """The L2 norm of one flat gradient buffer: a 0-d device array (no host sync). On NumPy a large buffer's
    sum of squares is added up chunk by chunk on :func:`minitf.backend.threads` threads: equal to one
    ``xp.dot(g, g)`` up to rounding (another order of the terms), the same for any number of threads."""
    # xp.sqrt(xp.dot(g, g)), the dots of the chunks summed
    return xp.sqrt(backend.sum_by_rows(lambda g: xp.dot(g, g), g))


def clip_factor(norm, max_norm, dtype):
    """min(1, max_norm / norm): what the gradients are multiplied by (0-d, ``dtype``)."""
    return xp.minimum(1.0, max_norm / (norm + 1e-6)).astype(dtype)


def clip_buffer_norm(g, max_norm):
    """Scale the flat gradient buffer ``g`` in place so that its L2 norm is at most
    ``max_norm``. Returns the norm before clipping as a 0-d device array."""
    norm = buffer_norm(g)
    factor = clip_factor(norm, max_norm, g.dtype)
    backend.by_rows(_scale_in_place(factor), g)            # g *= factor, chunks on threads
    return norm


def _scale_in_place(factor):
    """``g *= factor`` for a chunk ``g`` (for backend.by_rows: returns nothing)."""
    def scale(g):
        g *= factor
    return scale


def clip_grad_norm(params, max_norm):
    """Scale all gradients so that their global L2 norm is at most ``max_norm``.

    Returns the norm before clipping as a 0-d device array (no host sync)."""
    params = list(params)
    flat = FlatBuffers.of(params)
    if flat is not None:                                   # flattened by the optimizer: one buffer
        return clip_buffer_norm(flat.grad, max_norm)
    g = xp.concatenate([p.grad.ravel() for p in params])   # the same norm, from a copy
    norm = buffer_norm(g)
    factor = clip_factor(norm, max_norm, g.dtype)
    for p in params:
        p.grad *= factor
    return norm


class Optimizer:
    """What the trainer and the checkpoint use of an optimizer, whatever its rule: the parameters moved into one
    flat buffer (:class:`minitf.module.FlatBuffers`: ``self.flat.data`` and ``self.flat.grad``; every ``p.data``
    and ``p.grad`` becomes a view into them, so that a step, ``zero_grad`` and clipping are whole-buffer
    operations: the one place where parameters are flattened), its state as named arrays of the buffer's size
    (:attr:`state_names`; a checkpoint's optimizer.npz holds them by name), its step count, and :meth:`step`.
    A rule is a subclass giving :attr:`state_names` and :meth:`update` (:class:`Adam`); :data:`OPTIMIZERS` names
    them for ``train.py --optimizer``; :func:`mixed_precision` wraps any of them for a float16 model.

    ``lr`` is a number or a callable ``step -> lr`` (e.g. :class:`WarmupSchedule`). ``shard`` (lo, hi): the range
    of the flat buffer this optimizer updates (ZeRO-1: this rank's), after which ``gather(flat.data)`` brings every
    rank's updated shard to every rank; the state covers the range only."""
    #: The state arrays, one element per parameter of the range (Adam: its two moments).
    state_names = ()
    #: Of those, the ones that can never be negative (a checkpoint holding a negative one is damaged).
    non_negative_state = ()

    def __init__(self, params, lr=1e-3, shard=None, gather=None):
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        self.params, self.lr = params, lr
        self.flat = FlatBuffers.flatten(params)            # every p.data / p.grad becomes a view
        n = self.flat.data.size
        self.lo, self.hi = (0, n) if shard is None else (int(shard[0]), int(shard[1]))
        if not 0 <= self.lo <= self.hi <= n:
            raise ValueError(f"shard {shard} is not a range of the {n}-element parameter buffer")
        self.gather = gather
        self.state = self.new_state(self.flat.data.dtype)  # {name: array of the range}
        self.step_count = 0

    def new_state(self, dtype):
        """Zeroed state arrays of the range, of ``dtype``."""
        return {name: xp.zeros(self.hi - self.lo, dtype=dtype) for name in self.state_names}

    def step(self, grad=None):
        """One update of the range ``[lo, hi)`` of the parameters with ``grad`` (default: that range of the flat
        gradient buffer; ZeRO-1 passes the reduce-scattered shard). Raises, before changing anything, if a forward
        over these parameters ran with gradients on and no backward consumed its cache."""
        check_parameters_saved_consumed(self.params)
        self.step_count += 1
        data = self.flat.data[self.lo:self.hi]
        self.update_range(data, self.flat.grad[self.lo:self.hi] if grad is None else grad,
                          self.current_lr(self.step_count))
        if self.gather is not None:                        # ZeRO-1: every rank's shard to every rank
            self.gather(self.flat.data)

    def update_range(self, data, grad, lr):
        """The rule: update ``data`` (the range of the parameters) and :attr:`state` from ``grad`` at rate ``lr``
        (step :attr:`step_count`, already counted)."""
        raise NotImplementedError

    def current_lr(self, step=None):
        step = self.step_count if step is None else step
        return self.lr(step) if callable(self.lr) else self.lr

    def zero_grad(self):
        """Zero every gradient (one whole-buffer write; only that: between a forward and its backward too)."""
        backend.by_rows(_fill_zero, self.flat.grad)        # self.flat.grad.fill(0), chunks on threads

    def state_dict(self):
        return dict(self.state, step=self.step_count)

    def load_state_dict(self, state):
        for key in self.state_names:
            if tuple(state[key].shape) != tuple(self.state[key].shape):
                raise ValueError(f"optimizer state {key!r} has shape {tuple(state[key].shape)}, "
                                 f"expected {tuple(self.state[key].shape)}")
            self.state[key][...] = xp.asarray(state[key])
        self.step_count = int(state["step"])


class Adam(Optimizer):
    """m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
    p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)

    Defaults are the paper's: beta1 0.9, beta2 0.98, eps 1e-9. The state is the two moments ``m`` and ``v``
    (of the range the optimizer updates); the rest is :class:`Optimizer`'s.
    """
    state_names = ("m", "v")
    non_negative_state = ("v",)

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.98), eps=1e-9, fused=True, shard=None, gather=None):
        super().__init__(params, lr, shard, gather)
        self.betas, self.eps = betas, eps
        self.fused = fused                                 # GPU only: one CuPy kernel (see _fused_adam)
        self._scratch = {}                                 # a reused chunk per thread (made at its first chunk)

    @property
    def m(self):
        return self.state["m"]

    @property
    def v(self):
        return self.state["v"]

    def update_range(self, data, g, lr):
        t, (b1, b2) = self.step_count, self.betas
        m, v = self.m, self.v
        # bias corrections folded into the step size and eps (one fewer pass over the buffer)
        step_size = lr * (1 - b2 ** t) ** 0.5 / (1 - b1 ** t)
        eps_hat = self.eps * (1 - b2 ** t) ** 0.5
        if self.fused and backend.get_device() == "gpu" and g.dtype in (xp.float32, xp.float64):
            # the very same update as _update below, in one pass: see _fused_adam
            _fused_adam(g, data, m, v, b1, b2, step_size, eps_hat)
        else:
            # speed only: the chunks below on backend.threads() threads (each chunk's arithmetic is the same)
            backend.by_rows(lambda g, m, v, data: self._update_chunks(g, m, v, data, b1, b2, step_size, eps_hat),
                            g, m, v, data)

    #: elements per chunk of :meth:`step` (64K float32: its five arrays take about 1.3 MB of cache)
    CHUNK = 1 << 16

    def _update_chunks(self, g, m, v, data, b1, b2, step_size, eps_hat):
        """:meth:`_update` over a stretch of the flat buffers, a chunk at a time, with this thread's scratch."""
        scratch = self._scratch.get(threading.get_ident())
        if scratch is None or scratch.dtype != data.dtype:
            scratch = self._scratch[threading.get_ident()] = xp.empty(self.CHUNK, dtype=data.dtype)
        # speed only: the same passes, one cache-sized chunk at a time, so that they run from cache
        for start in range(0, data.size, self.CHUNK):
            end = start + self.CHUNK
            self._update(g[start:end], m[start:end], v[start:end], data[start:end],
                         scratch[:min(end, data.size) - start], b1, b2, step_size, eps_hat)

    @staticmethod
    def _update(g, m, v, p, tmp, b1, b2, step_size, eps_hat):
        """The update of :meth:`step` on one stretch of the flat buffers; ``tmp`` is scratch."""
        # every line below is one in-place pass over the stretch
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
        p -= update                                        # p -= step_size * m / (sqrt(v) + eps)


class MixedPrecision:
    """Any :class:`Optimizer` for a float16 model (:func:`mixed_precision` makes the class: ``MixedPrecisionAdam
    = mixed_precision(Adam)``), with float32 master weights and dynamic loss scaling
    (Micikevicius et al. 2018, "Mixed Precision Training").

    The model's parameters and gradients are float16 (build it under
    ``backend.default_dtype("float16")``); this optimizer keeps a float32 copy of the
    whole flat parameter buffer (the *master* weights) and float32 optimizer state. One step:

    1. the caller back-propagates ``loss * scale`` in float16 (``loss_fn.backward(opt.scale)``),
       so that small gradients do not flush to zero;
    2. :meth:`unscale_grads` converts the float16 gradient buffer to float32 and divides
       it by ``scale`` (in ``self.flat.grad``, which clipping and norms then work on);
    3. :meth:`update` with the finiteness of those gradients: if finite, Adam updates the
       master weights and the float16 parameters are refreshed from them (one cast over the
       flat buffer); after ``growth_interval`` finite steps in a row ``scale`` doubles. If not
       finite (the scaled float16 gradients overflowed), nothing is updated, ``scale`` halves
       (never below 1) and ``overflows`` counts the skipped step.

    Parameters
    ----------
    params : list of Parameter
        float16 parameters (they are moved into one flat buffer, as with any :class:`Optimizer`).
    init_scale, growth_interval (keywords), the rest
        the rest as for the wrapped optimizer; its update runs on the float32 master buffer.
    init_scale : float
        the first loss scale, 2**16 by default (a power of two, so unscaling is exact).
    growth_interval : int
        finite steps in a row after which the scale doubles, 2000 by default.

    Attributes
    ----------
    flat : FlatBuffers
        float32 ``data`` (the master weights) and ``grad`` (unscaled gradients).
    model_flat : FlatBuffers
        the model's float16 parameter and gradient buffers.
    scale : float
        the current loss scale.
    good_steps : int
        finite steps since the last change of the scale.
    overflows : int
        steps skipped because the gradients were not finite.
    """

    INIT_SCALE = 2.0 ** 16
    GROWTH_INTERVAL = 2000

    def __init__(self, params, *args, init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL, **kwargs):
        super().__init__(params, *args, **kwargs)
        if init_scale < 1 or growth_interval < 1:
            raise ValueError(f"init_scale and growth_interval must be >= 1, got {init_scale} and {growth_interval}")
        self.model_flat = self.flat                                    # float16 parameters and gradients
        master = self.model_flat.data.astype(xp.float32)               # float32 master weights
        self.flat = FlatBuffers(self.params, master, xp.zeros_like(master))   # what Adam.step updates
        self.state = self.new_state(xp.float32)                        # float32 state (of the range)
        self.scale, self.growth_interval = float(init_scale), int(growth_interval)
        self.good_steps, self.overflows = 0, 0

    def zero_grad(self):
        backend.by_rows(_fill_zero, self.model_flat.grad)  # self.model_flat.grad.fill(0), chunks on threads

    def unscale_grads(self):
        """float16 gradients / scale -> ``self.flat.grad`` (float32, returned); inf or
        NaN stay inf or NaN, so the norm of the result is the finiteness check."""
        g = self.flat.grad
        backend.by_rows(self._unscale, g, self.model_flat.grad)       # chunks on threads
        return g

    def _unscale(self, g, model_grad):
        g[...] = model_grad                                            # one cast, float16 -> float32
        g *= 1.0 / self.scale

    def update(self, finite, grad=None):
        """Step with ``grad`` (``finite`` True) or skip and back off (False). Returns ``finite``."""
        if not finite:
            self.scale = max(self.scale / 2, 1.0)
            self.good_steps = 0
            self.overflows += 1
            return False
        self.step(grad)
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= 2
            self.good_steps = 0
        return True

    def step(self, grad=None):
        """The wrapped rule on the float32 master weights, then the float16 parameters from them."""
        super().step(grad)
        # self.model_flat.data[...] = self.flat.data: one cast, float32 -> float16, chunks on threads
        backend.by_rows(xp.copyto, self.model_flat.data, self.flat.data)

    def master_params(self):
        """float32 views of the master weights shaped like ``params`` (same order)."""
        return self.flat.views(self.flat.data)

    def load_master(self, arrays):
        """Set the master weights (and so the float16 parameters) from float32 arrays,
        one per parameter in the order of ``params``; exact, no rounding to float16 first."""
        self.flat.data[...] = xp.concatenate([backend.asarray(a, dtype=xp.float32).ravel() for a in arrays])
        self.model_flat.data[...] = self.flat.data

    def scaler_state(self):
        """The loss scaler's state, JSON-serialisable (for a checkpoint's meta)."""
        return {"scale": self.scale, "good_steps": self.good_steps, "overflows": self.overflows}

    def load_scaler_state(self, state):
        self.scale, self.good_steps, self.overflows = float(state["scale"]), int(state["good_steps"]), \
            int(state["overflows"])




def mixed_precision(optimizer):
    """The class of ``optimizer`` (an :class:`Optimizer` subclass) for a float16 model: :class:`MixedPrecision`'s
    master weights and loss scaling around its rule."""
    return type(f"MixedPrecision{optimizer.__name__}", (MixedPrecision, optimizer), {})


MixedPrecisionAdam = mixed_precision(Adam)


def _fill_zero(buffer):
    buffer.fill(0)

#: The optimizers ``train.py --optimizer`` offers: another rule is its class above and one line here.
OPTIMIZERS = {"adam": Adam}


# --------------------------------------------------------------------------- #
# GPU only: Adam as one fused CuPy kernel
# --------------------------------------------------------------------------- #
def _fused_adam(g, p, m, v, b1, b2, step_size, eps_hat):
    """One CUDA kernel doing Adam's update for every element of the flat buffers:
    one read of g, p, m, v and one write of p, m, v, instead of about ten passes.
    :meth:`Adam._update` is the reference; the kernel's source is ``adam`` in
    :mod:`minitf.cuda_kernels` (compiled in CI by ``tests/test_cuda_sources.py``).

    Used only when the device is 'gpu'. It has NOT been run on this repository's
    CPU-only development machine: ``tests/test_gpu.py`` (run by ``scripts/gpu_check.sh``
    on a GPU machine) compares it with the NumPy path.
    """
    from minitf import cuda_kernels
    kernel = cuda_kernels.function("adam", "adam" + cuda_kernels.suffix(g.dtype))
    n = g.size
    scalar = g.dtype.type                                  # the kernel's T: float or double
    blocks = (n + cuda_kernels.BLOCK - 1) // cuda_kernels.BLOCK
    # 1 - b1 and 1 - b2 are rounded from the Python floats, as in the NumPy lines
    kernel((blocks,), (cuda_kernels.BLOCK,), (g, p, m, v, scalar(b1), scalar(b2), scalar(1 - b1), scalar(1 - b2),
                                              scalar(step_size), scalar(eps_hat), backend.host.int64(n)))
