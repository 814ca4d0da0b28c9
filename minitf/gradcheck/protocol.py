"""The rules of the forward/backward protocol (minitf.module) that matching numbers alone do
not enforce: inputs, parameters and the incoming gradient left unchanged, one gradient per float
input of its shape, parameter gradients accumulated in place (+=), and backward using the cache
of its own forward. Each rule broken is one line, naming the array and the fix.
"""
from minitf import backend
from minitf.backend import xp
from minitf.gradcheck.numeric import as_tuple, compare_gradients, gradients_match, run_forward, upstream_gradients
from minitf.module import no_grad


def _is_float_array(value):
    return backend.is_array(value) and value.dtype.kind == "f"


def _changed(before, after):
    """The first index where two arrays differ, as "[i, j]", or None when equal."""
    a, b = backend.to_numpy(before), backend.to_numpy(after)
    if a.shape != b.shape:
        return f"(shape {a.shape} -> {b.shape})"
    differs = ~((a == b) | (backend.host.isnan(a) & backend.host.isnan(b)))
    if not differs.any():
        return None
    index = backend.host.unravel_index(int(differs.argmax()), a.shape)
    return "[" + ", ".join(str(int(i)) for i in index) + "]"


def _same_array(new, old):
    """``new`` is ``old``, or a wrapper of its very memory (an array type whose ``+=`` returns a new
    object around the same buffer): what an optimizer holding ``old`` still sees."""
    if new is old:
        return True
    return getattr(new, "shape", None) == old.shape and getattr(new, "dtype", None) == old.dtype and \
        bool(xp.may_share_memory(new, old))


def _shape_advice(name, shape, got, output_shapes):
    """What to do about a gradient of shape ``got`` for an input of ``shape``: sum the axes that broadcasting
    added only when the forward broadcast the input (it broadcasts to an output's shape, and ``got`` is what
    broadcasting made of it); sum the copies when each axis of ``got`` is a whole multiple of the input's (a
    repeat); else nothing more."""
    if not isinstance(got, tuple):
        return ""

    def broadcasts(to):
        try:
            return backend.host.broadcast_shapes(shape, to) == to != shape
        except ValueError:
            return False

    if broadcasts(got) and any(broadcasts(o) for o in output_shapes):
        return f" (the forward broadcast {name}: sum over the axes that broadcasting added)"
    if len(got) == len(shape) and all(g % s == 0 for g, s in zip(got, shape)):
        axes = [i for i, (g, s) in enumerate(zip(got, shape)) if g != s]
        return (f" (axis {', '.join(map(str, axes))} is {', '.join(str(got[i] // shape[i]) for i in axes)} times "
                f"{name}'s: if the forward used copies of {name} along it (a repeat), each copy's gradient adds "
                f"into the one entry it copies: sum them)")
    return ""


def protocol_problems(forward, backward, inputs, params=(), seed=0, reseed=None, caches=False):
    """The rules of the forward/backward protocol (minitf.module) that matching numbers
    alone do not enforce. Returns one line per broken rule (empty: none broken):

    - forward does not change its inputs or the parameters in place;
    - backward does not change the incoming gradient, its inputs or the parameters;
    - every float input gets a gradient of its own shape (not None, not missing);
    - parameter gradients accumulate: backward on a ``.grad`` that already holds an
      array R must leave R + (this gradient), so that ``=`` instead of ``+=`` fails;
    - backward adds into the ``.grad`` array it found, never replaces it
      (``w.grad = w.grad + g``): an optimizer's flat buffer keeps the old array.

    With ``caches`` (a module's forward and backward, which keep their caches per call;
    not a function pair whose backward reads the inputs from a closure), also
    :func:`cache_problems`: backward uses the cache of its own forward.

    Runs forward and backward twice (the second time on pre-filled gradients) with the
    same upstream gradient G as :func:`compare_gradients`; leaves every ``.grad`` at 0,
    in the array it was before.
    """
    names, arrays = list(inputs), list(inputs.values())
    params = dict(params)
    problems = []
    # the .grad arrays as they were: a backward that rebinds one is reported, then undone
    owned = {name: p.grad for name, p in params.items()}
    rebound = set()

    def check_rebound():
        for name, p in params.items():
            if not _same_array(p.grad, owned[name]):
                if name not in rebound:
                    rebound.add(name)
                    problems.append(
                        f"parameter {name}: backward replaced {name}.grad by a new array ({name}.grad = "
                        f"{name}.grad + ..., or = ...); the optimizer (Adam) holds the old array, a view into "
                        f"its flat buffer, so it never sees this gradient and the weight never moves. Add "
                        f"into the array in place: {name}.grad += ...")
                if getattr(p.grad, "shape", None) == owned[name].shape:
                    owned[name][...] = p.grad  # keep what this backward computed, in the array it found
                p.grad = owned[name]

    def forward_once():
        return run_forward(forward, arrays, reseed)

    if caches:  # first: one rule needs the very first forward of the check to be on other inputs
        problems += cache_problems(forward, backward, inputs, params, seed=seed, reseed=reseed)
        check_rebound()

    def snapshot():
        return ({n: backend.to_numpy(a).copy() for n, a in inputs.items() if backend.is_array(a)},
                {n: backend.to_numpy(p.data).copy() for n, p in params.items()})

    def mutations(before, stage):
        found = []
        for name, old in before[0].items():
            where = _changed(old, inputs[name])
            if where is not None:
                found.append(f"input {name}: {stage} changed it in place (first at {name}{where}); a layer "
                             f"must not write into its inputs: the caller (and the skip path of a residual "
                             f"block) still reads them. Write x = x * m, not x *= m")
        for name, old in before[1].items():
            where = _changed(old, params[name].data)
            if where is not None:
                found.append(f"parameter {name}: {stage} changed its values (first at {name}{where}); only "
                             f"the optimizer may change a parameter, backward only adds into .grad")
        return found

    before = snapshot()
    outputs = forward_once()
    problems += mutations(before, "forward")
    before = snapshot()
    G = upstream_gradients(outputs, seed)
    G_before = [backend.to_numpy(g).copy() for g in G]
    for p in params.values():
        p.grad[...] = 0
    grads = as_tuple(backward(G if len(G) > 1 else G[0]))
    check_rebound()
    for i, (g, old) in enumerate(zip(G, G_before)):
        where = _changed(old, g)
        if where is not None:
            which = f"dy{i}" if len(G) > 1 else "dy"
            problems.append(f"incoming gradient {which}: backward changed it in place (first at {which}{where}); "
                            f"the caller may still need it (a residual block sends the same dy down the skip "
                            f"path and into the sublayer). Compute a new array: dx = dy * m, not dy *= m")
    problems += mutations(before, "backward")
    for i, (name, array) in enumerate(inputs.items()):
        if not _is_float_array(array):
            continue
        if i >= len(grads):
            problems.append(f"input {name}: no gradient; backward returned {len(grads)} value(s) for "
                            f"{len(inputs)} inputs ({', '.join(names)}); return one gradient per input, "
                            f"in order (return dx, dz)")
        elif grads[i] is None:
            problems.append(f"input {name}: backward returned None for it, and it is a float input that "
                            f"needs dL/d{name} (a forgotten `return dx`?)")
        elif getattr(grads[i], "shape", None) != array.shape:
            got = getattr(grads[i], "shape", type(grads[i]).__name__)
            problems.append(f"input {name}: its gradient has shape {tuple(got) if isinstance(got, tuple) else got}, "
                            f"{name} has {tuple(array.shape)}; dL/d{name} has the shape of {name}"
                            + _shape_advice(name, tuple(array.shape), got, [tuple(o.shape) for o in outputs]))
    if params:
        first = {n: backend.to_numpy(p.grad).copy() for n, p in params.items()}
        rng = backend.host_rng([seed, 0xACC])
        held = {n: rng.standard_normal(p.shape) for n, p in params.items()}
        for name, p in params.items():
            p.grad[...] = backend.asarray(held[name], dtype=p.grad.dtype)
        forward_once()
        backward(tuple(backend.asarray(g) for g in G_before) if len(G) > 1 else backend.asarray(G_before[0]))
        check_rebound()
        for name, p in params.items():
            after = backend.to_numpy(p.grad)
            scale = max(float(abs(held[name]).max(initial=0)), float(abs(first[name]).max(initial=0)))
            if float(abs(after - held[name] - first[name]).max(initial=0)) <= 1e-9 * scale:
                continue
            if float(abs(after - first[name]).max(initial=0)) <= 1e-9 * scale:
                problems.append(f"parameter {name}: backward overwrote .grad (= instead of +=): a .grad that "
                                f"already held an array held only this backward's gradient afterwards. A weight "
                                f"used twice (tied embeddings, a layer called twice) or gradients accumulated "
                                f"over micro-batches keep only the last use; write {name}.grad += ...")
            else:
                problems.append(f"parameter {name}: a .grad that already held an array R did not end at "
                                f"R + this backward's gradient; backward must only add into .grad (+=), "
                                f"never scale, clear or overwrite it")
        for p in params.values():
            p.grad[...] = 0
    return problems


def _same(a, b):
    """Equal up to the rounding of a different order of additions."""
    scale = max(float(abs(a).max(initial=0)), float(abs(b).max(initial=0)))
    return float(abs(a - b).max(initial=0)) <= 1e-9 * scale + 1e-300


def cache_problems(forward, backward, inputs, params=(), seed=0, reseed=None, h=1e-6):
    """Two rules that a backward uses the cache of its own forward, one line per broken rule:

    - a forward and backward on other inputs first, then on ``inputs``: if the first call's
      gradients agree with central differences along one random direction and the second's
      do not, and the plain gradient check on the other inputs passes (so backward is right
      there, not simply wrong), backward used a cache kept from an earlier forward
      (``if not hasattr(self, "x")``);
    - two forwards (on ``inputs``, then on other inputs) before their two backwards, the
      last call's first, as minitf's cache stack pops them: each backward must give the
      gradients of that call alone; otherwise the second forward overwrote the first one's
      cache (``self.x = x``).

    The other inputs are ``inputs`` times U(0.5, 1.5), entry by entry (signs, and so a side
    of a kink, kept); integer inputs pass unchanged. Nothing is checked without a float
    input. Every call runs on copies, so ``inputs`` are left as they were; every ``.grad``
    ends at 0. Used by :func:`protocol_problems` with ``caches=True``."""
    names = list(inputs)
    floats = [n for n, a in inputs.items() if _is_float_array(a)]
    params = dict(params)
    if not floats:
        return []
    rng = backend.host_rng([seed, 0xCA])
    other = {n: a * backend.asarray(rng.uniform(0.5, 1.5, a.shape), dtype=a.dtype) if n in floats else a
             for n, a in inputs.items()}
    directions = {n: rng.standard_normal(inputs[n].shape) for n in floats}
    directions |= {"." + n: rng.standard_normal(p.shape) for n, p in params.items()}

    def run(values):
        return run_forward(forward, [values[n].copy() if n in floats else values[n] for n in names], reseed)

    def zero():
        for p in params.values():
            p.grad[...] = 0

    def copies(G):  # backward gets its own copy of the upstream gradient: G is used again
        return tuple(g.copy() for g in G) if len(G) > 1 else G[0].copy()

    def gradients(returned):
        """{input name or "." + parameter name: host array} of one backward, or None when an input's
        gradient is missing or misshapen (the other rules report that)."""
        returned = as_tuple(returned)
        found = {}
        for i, n in enumerate(names):
            if n in floats:
                g = returned[i] if i < len(returned) else None
                if getattr(g, "shape", None) != inputs[n].shape:
                    return None
                found[n] = backend.to_numpy(g).copy()
        return found | {"." + n: backend.to_numpy(p.grad).copy() for n, p in params.items()}

    def alone(values, upstream_seed):
        """forward and backward on ``values`` from zeroed gradients: (G, gradients)."""
        zero()
        G = upstream_gradients(run(values), upstream_seed)
        return G, gradients(backward(copies(G)))

    def along_direction(values, G, grads):
        """(analytic, numeric, whether they agree): dL/dt of L(values + t v, params + t v) at t = 0."""
        saved = {n: p.data.copy() for n, p in params.items()}

        def loss(t):
            for n, p in params.items():
                p.data[...] = saved[n] + t * backend.asarray(directions["." + n], dtype=p.data.dtype)
            moved = {n: a + t * backend.asarray(directions[n], dtype=a.dtype) if n in floats else a
                     for n, a in values.items()}
            with no_grad():
                return sum(float((o * g).sum()) for o, g in zip(run(moved), G))

        try:
            numeric = (loss(h) - loss(-h)) / (2 * h)
        finally:
            for n, p in params.items():
                p.data[...] = saved[n]
        terms = [grads[k] * directions[k] for k in grads]
        analytic = sum(float(t.sum()) for t in terms)
        scale = max(sum(float(abs(t).sum()) for t in terms), abs(numeric))
        return analytic, numeric, abs(analytic - numeric) <= 1e-4 * scale + 1e-7

    def plain_check_passes(values, upstream_seed):
        """The plain gradient check (every entry against central differences, :func:`gradients_match`)
        on ``values``: one random direction can miss a small error that it catches on other inputs,
        and a backward that is simply wrong has not used a stale cache."""
        copied = {n: a.copy() if n in floats else a for n, a in values.items()}  # it perturbs them in place
        report = compare_gradients(forward, backward, copied, params, seed=upstream_seed, h=h, reseed=reseed)
        zero()
        return all(gradients_match(a, n) for _, a, n, _ in report)

    problems = []
    G_other, first = alone(other, seed + 1)
    G, second = alone(inputs, seed)
    if first is None or second is None:
        zero()
        return problems
    if along_direction(other, G_other, first)[2]:
        analytic, numeric, agree = along_direction(inputs, G, second)
        if not agree and plain_check_passes(other, seed + 1):
            zero()
            return [f"backward used the cache of an earlier forward: forward and backward on other inputs "
                    f"first gave the right gradients, then forward on {', '.join(floats)} and its backward gave "
                    f"wrong ones (along a random direction: analytic {analytic:.6g}, central differences "
                    f"{numeric:.6g}). Save what backward needs in every forward, with "
                    f"self.save_for_backward(...), and read it back with self.saved_tensors(); not once "
                    f"(if not hasattr(self, ...)) and not from an earlier call"]
    # two calls, then their two backwards, the last call's first
    zero()
    run(inputs)
    run(other)
    later = gradients(backward(copies(G_other)))
    earlier = gradients(backward(copies(G)))
    zero()
    if later is None or earlier is None:
        return problems
    for n in params:  # the second backward added onto the first one's parameter gradients
        earlier["." + n] = earlier["." + n] - later["." + n]
    differ = [k.lstrip(".") for k in earlier
              if not (_same(later[k], first[k]) and _same(earlier[k], second[k]))]
    if differ:
        problems.append(f"called twice before its backwards (forward on {', '.join(floats)}, forward on other "
                        f"values, then the two backwards, the last call's first), the backwards gave other "
                        f"gradients than each call alone (for {', '.join(differ)}): the second forward "
                        f"overwrote the first one's cache (self.x = x?). Keep caches with "
                        f"self.save_for_backward(...) and read them with self.saved_tensors(): a stack, one "
                        f"cache per call (a shared layer runs twice in one step)")
    return problems
