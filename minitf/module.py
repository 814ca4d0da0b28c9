"""Parameters, modules and the forward/backward protocol.

Every layer is a :class:`Module` with a ``forward`` that returns its output and
saves what ``backward`` needs, and a ``backward`` that takes dL/d(output), adds
dL/d(parameter) into ``p.grad`` (``+=``, so a tied weight collects every use)
and returns dL/d(input).

Saved tensors go on a per-module stack: a module called twice in one forward
pass (a shared embedding, say) keeps both caches, and backward pops them in
reverse order. Nothing is ever overwritten silently.
"""
import contextlib

from minitf import backend
from minitf.backend import xp

_grad_state = {"enabled": True}


@contextlib.contextmanager
def no_grad():
    """Run forwards without saving anything for backward (evaluation, decoding)."""
    previous = _grad_state["enabled"]
    _grad_state["enabled"] = False
    try:
        yield
    finally:
        _grad_state["enabled"] = previous


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

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    def backward(self, *args, **kwargs):
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # -- the cache stack ---------------------------------------------------
    def save_for_backward(self, *tensors):
        """Push what backward will need; nothing is kept under ``no_grad()``."""
        if _grad_state["enabled"]:
            self.__dict__.setdefault("_saved", []).append(tensors)

    def saved_tensors(self):
        """Pop the cache of the most recent forward that has not been backpropagated."""
        stack = self.__dict__.get("_saved")
        if not stack:
            raise RuntimeError(
                f"{type(self).__name__}.backward called without a matching forward "
                "(or the forward ran under no_grad()); call forward first.")
        return stack.pop()

    def clear_saved(self):
        """Drop every cache of this module and its children (after an aborted step)."""
        for module in self.modules():
            module.__dict__.pop("_saved", None)

    # -- traversal ---------------------------------------------------------
    def named_children(self):
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value

    def modules(self):
        """This module and every descendant, each once."""
        seen, order = set(), []

        def visit(module):
            if id(module) in seen:
                return
            seen.add(id(module))
            order.append(module)
            for _, child in module.named_children():
                visit(child)

        visit(self)
        return order

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
    operations instead of one small kernel per parameter.
    """

    def __init__(self, params, data, grad):
        self.params, self.data, self.grad = list(params), data, grad

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
        total = sum(int(p.size) for p in params)
        data = xp.empty(total, dtype=dtypes.pop())
        grad = xp.zeros_like(data)
        flat = cls(params, data, grad)
        offset = 0
        for p in params:
            n = int(p.size)
            data[offset:offset + n] = p.data.ravel()
            grad[offset:offset + n] = p.grad.ravel()
            p.data = data[offset:offset + n].reshape(p.shape)
            p.grad = grad[offset:offset + n].reshape(p.shape)
            p._flat = flat
            offset += n
        return flat
