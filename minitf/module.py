"""Parameters, modules and the forward/backward protocol.

Every layer is a :class:`Module` with a ``forward`` that returns its output and
saves what ``backward`` needs, and a ``backward`` that takes dL/d(output), adds
dL/d(parameter) into ``p.grad`` (``+=``, so a tied weight collects every use)
and returns dL/d(input).

Saved tensors go on a per-module stack: a module called twice in one forward
pass (a shared embedding, say) keeps both caches, and backward pops them in
reverse order. Nothing is ever overwritten silently, and a cache that backward
never pops is reported where it would do harm, not kept forever: at the next
outermost forward with gradients on over it (the stacks would grow by a whole set
of activations every step) and at the optimizer's step (the gradients would not be
that forward's). ``zero_grad`` only zeroes, so PyTorch's order (forward, zero_grad,
backward, step) works. A forward that raises drops what it pushed.
"""
import collections
import contextlib
import functools
import types
import weakref

from minitf import backend
from minitf.backend import xp

# enabled: forwards save caches (False inside no_grad()); depth: forwards running now, so that only the
# outermost one checks for stale caches; stacked: inside stacked_forwards()
_grad_state = {"enabled": True, "depth": 0, "stacked": False}
# every module holding a cache that no backward has popped yet (weak: a dropped model leaves)
_unconsumed = weakref.WeakSet()


@contextlib.contextmanager
def no_grad():
    """Run forwards without saving anything for backward (evaluation, decoding)."""
    previous = _grad_state["enabled"]
    _grad_state["enabled"] = False
    try:
        yield
    finally:
        _grad_state["enabled"] = previous


@contextlib.contextmanager
def stacked_forwards():
    """Allow outermost forwards with gradients on over caches that no backward has consumed yet:
    several forwards of one layer before their backwards, popped in reverse order (the gradient
    check's cache rule does this, as a shared layer does within one forward). Outside it, such a
    forward raises (:meth:`Module.check_saved_consumed`'s names)."""
    previous = _grad_state["stacked"]
    _grad_state["stacked"] = True
    try:
        yield
    finally:
        _grad_state["stacked"] = previous


def is_grad_enabled():
    """False inside ``no_grad()``: forwards save nothing for a backward."""
    return _grad_state["enabled"]


class Parameter:
    """A trainable array ``data`` and its gradient ``grad`` (same shape, same dtype)."""

    def __init__(self, data):
        self.data = data
        self.grad = xp.zeros_like(data)

    @property
    def shape(self):
        return self.data.shape

    @property
    def size(self):
        return self.data.size

    def __repr__(self):
        return f"Parameter(shape={tuple(self.data.shape)}, dtype={self.data.dtype})"


class Module:
    """Base class: parameters and sub-modules are found from the attributes, in
    the order they were assigned, which gives stable dotted names."""

    training = True

    def __init_subclass__(cls, **kwargs):
        """Every subclass's own ``forward`` is entered through :func:`_outermost_checked`."""
        super().__init_subclass__(**kwargs)
        forward = cls.__dict__.get("forward")
        if callable(forward) and not hasattr(forward, "__minitf_checked__"):
            cls.forward = _outermost_checked(forward)

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    def backward(self, *args, **kwargs):
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # -- the cache stack ---------------------------------------------------
    def save_for_backward(self, *tensors, **named):
        """Push what backward will need; nothing is kept under ``no_grad()``.

        Positional tensors come back from :meth:`saved_tensors` as a tuple
        (``(x,) = self.saved_tensors()``); keyword tensors as attributes of one
        namespace (``saved = self.saved_tensors(); saved.x``), for longer caches."""
        if _grad_state["enabled"]:
            self.__dict__.setdefault("_saved", []).append(types.SimpleNamespace(**named) if named else tensors)
            _unconsumed.add(self)

    def saved_tensors(self):
        """Pop the cache of the most recent forward that has not been backpropagated."""
        stack = self.__dict__.get("_saved")
        if not stack:
            raise RuntimeError(
                f"{type(self).__name__}.backward called without a matching forward "
                "(or the forward ran under no_grad()); call forward first.")
        if len(stack) == 1:
            _unconsumed.discard(self)
        return stack.pop()

    def clear_saved(self):
        """Drop every cache of this module and its children (after an aborted step)."""
        for module in self.modules():
            module.__dict__.pop("_saved", None)
            _unconsumed.discard(module)

    def pending_caches(self):
        """``[(dotted name, module)]`` of every module of this model (this one named "") whose forward ran
        with gradients on and whose cache no backward has consumed yet."""
        if not _unconsumed:  # the usual case: one cheap test
            return []
        return [(name, module) for name, module in self.named_modules() if module in _unconsumed]

    def check_saved_consumed(self):
        """Raise RuntimeError naming (by dotted name) every module of this model whose
        forward ran with gradients on and whose cache no backward has consumed."""
        pending = [f"{name + ' ' if name else ''}({type(module).__name__}, {len(module._saved)} "
                   f"cache{'s' if len(module._saved) > 1 else ''})" for name, module in self.pending_caches()]
        if pending:
            raise RuntimeError("forward ran with gradients on, but backward never consumed the cache of: "
                               + ", ".join(pending) + ". " + WHAT_TO_DO)

    # -- traversal ---------------------------------------------------------
    def named_children(self):
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value

    def named_modules(self, prefix=""):
        """``(dotted_name, module)`` for this module (name ``prefix``, "" at the root) and
        every descendant, each once, under the first name that reaches it."""
        seen, order = set(), []

        def visit(module, name):
            if id(module) in seen:
                return
            seen.add(id(module))
            order.append((name, module))
            for child_name, child in module.named_children():
                visit(child, f"{name}.{child_name}" if name else child_name)

        visit(self, prefix)
        return order

    def modules(self):
        """This module and every descendant, each once."""
        return [module for _, module in self.named_modules()]

    def named_parameters(self, prefix=""):
        """``(dotted_name, Parameter)`` pairs; a shared parameter appears once,
        under the first name that reaches it."""
        seen = set()

        def visit(module, prefix):
            for name, value in vars(module).items():
                if isinstance(value, Parameter) and id(value) not in seen:
                    seen.add(id(value))
                    yield prefix + name, value
                elif isinstance(value, Module):
                    yield from visit(value, prefix + name + ".")

        yield from visit(self, prefix)

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def num_parameters(self):
        return sum(int(p.size) for p in self.parameters())

    # -- modes and gradients -----------------------------------------------
    def train(self, mode=True):
        for module in self.modules():
            module.training = mode
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        """Set every gradient to 0 (only that: between a forward and its backward too, as in PyTorch)."""
        params = self.parameters()
        flat = FlatBuffers.of(params)
        if flat is not None:
            flat.grad.fill(0)  # one whole-buffer write
        else:
            for p in params:
                p.grad.fill(0)

    # -- state ---------------------------------------------------------------
    def state_dict(self):
        """``{name: host numpy array}``, a copy of every parameter."""
        return {name: backend.to_numpy(p.data).copy() for name, p in self.named_parameters()}

    def load_state_dict(self, state):
        """Copy arrays into the parameters in place (views into flat buffers stay views).

        Raises ValueError naming every missing, unexpected or mis-shaped entry."""
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(state))
        unexpected = sorted(set(state) - set(params))
        wrong = [f"{name}: expected {tuple(p.shape)}, got {tuple(state[name].shape)}"
                 for name, p in params.items() if name in state and tuple(state[name].shape) != tuple(p.shape)]
        if missing or unexpected or wrong:
            raise ValueError("state_dict does not fit this model: "
                             + "; ".join(filter(None, [
                                 missing and f"missing {missing}",
                                 unexpected and f"unexpected {unexpected}",
                                 wrong and "shape mismatch " + ", ".join(wrong)])))
        for name, p in params.items():
            p.data[...] = backend.asarray(state[name], dtype=p.data.dtype)


class ModuleList(Module):
    """A list of modules named ``0, 1, 2, ...``."""

    def __init__(self, modules):
        for index, module in enumerate(modules):
            setattr(self, str(index), module)
        self.length = len(modules)

    def __getitem__(self, index):
        return getattr(self, str(range(self.length)[index]))

    def __iter__(self):
        return (self[i] for i in range(self.length))

    def __len__(self):
        return self.length


class FlatBuffers:
    """One contiguous array for all parameter data and one for all gradients.

    After :meth:`flatten`, every ``p.data`` and ``p.grad`` is a view into these,
    so the optimizer, ``zero_grad`` and the gradient norm are a few whole-buffer
    operations instead of one small kernel per parameter. This is a speed trick
    only: the optimizer (:class:`minitf.optim.Adam`) flattens the parameters it
    is given, and a model that is never trained is never flattened.
    """

    def __init__(self, params, data, grad):
        self.params, self.data, self.grad = list(params), data, grad

    def views(self, buffer):
        """``buffer`` (flat, one entry per parameter element) cut into views shaped
        like ``params``, in order: the one walk over the offsets."""
        views, offset = [], 0
        for p in self.params:
            n = int(p.size)
            views.append(buffer[offset:offset + n].reshape(p.shape))
            offset += n
        return views

    @staticmethod
    def of(params):
        """The FlatBuffers these exact parameters already live in, or None."""
        params = list(params)
        owner = getattr(params[0], "_flat", None) if params else None
        if owner is not None and len(owner.params) == len(params) and all(
                a is b for a, b in zip(owner.params, params)):
            return owner
        return None

    @classmethod
    def flatten(cls, params):
        """Move ``params`` into fresh flat buffers (values kept), or reuse existing ones."""
        params = list(params)
        existing = cls.of(params)
        if existing is not None:
            return existing
        dtypes = {p.data.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"cannot flatten parameters of several dtypes: {sorted(map(str, dtypes))}")
        data = xp.empty(sum(int(p.size) for p in params), dtype=dtypes.pop())
        flat = cls(params, data, xp.zeros_like(data))
        for p, data_view, grad_view in zip(params, flat.views(flat.data), flat.views(flat.grad)):
            data_view[...] = p.data                              # copy the values in ...
            grad_view[...] = p.grad
            p.data, p.grad, p._flat = data_view, grad_view, flat  # ... and make the parameter a view
        return flat


WHAT_TO_DO = ("Call backward once after each forward run with gradients on (zero_grad may come between them, "
              "as in PyTorch), run evaluation and decoding under minitf.no_grad(), or call model.clear_saved() "
              "to drop the caches of an aborted step.")


def _outermost_checked(forward):
    """``forward`` entered through a check done by the outermost forward only (the one a caller runs, not the
    layers it calls): with gradients on, no module it reaches may still hold the cache of an earlier forward
    that no backward consumed (a forgotten backward: every stack would grow by a whole set of activations each
    step). If it raises, it drops every cache it pushed (it found none: nothing else is lost)."""
    @functools.wraps(forward)
    def checked(self, *args, **kwargs):
        state = _grad_state
        outermost = state["depth"] == 0 and state["enabled"] and not state["stacked"]
        if outermost and _unconsumed:
            pending = self.pending_caches()
            if pending:
                names = [f"{name or type(self).__name__} ({type(module).__name__})" for name, module in pending]
                raise RuntimeError(
                    f"{type(self).__name__}.forward ran with gradients on over the cache of an earlier forward that "
                    f"no backward consumed: " + ", ".join(names[:3])
                    + (f" and {len(names) - 3} more modules" if len(names) > 3 else "") + ". " + WHAT_TO_DO)
        state["depth"] += 1
        try:
            return forward(self, *args, **kwargs)
        except BaseException:
            if outermost:
                self.clear_saved()
            raise
        finally:
            state["depth"] -= 1

    checked.__minitf_checked__ = True
    return checked


def check_parameters_saved_consumed(params):
    """For an optimizer's step, which knows only its parameters: raise if a module owning one of ``params``
    holds a cache that no backward consumed (a forgotten backward: the gradients are not that forward's).
    Modules are named by class here: only the model knows the dotted names."""
    if not _unconsumed:  # the usual case: one cheap test
        return
    ids = {id(p) for p in params}
    counts = collections.Counter(
        type(module).__name__ for module in list(_unconsumed)
        if any(isinstance(value, Parameter) and id(value) in ids for value in vars(module).values()))
    if counts:
        raise RuntimeError("optimizer step over gradients that are not a whole step's: a forward ran with "
                           "gradients on and backward never consumed the cache of "
                           + ", ".join(f"{name} x{n}" for name, n in sorted(counts.items())) + " (model."
                           "check_saved_consumed() names each module). " + WHAT_TO_DO)
