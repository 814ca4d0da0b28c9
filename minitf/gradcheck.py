"""Numerical gradients by central differences, and a side-by-side comparison
with a layer's hand-written backward. The tests use these helpers, and so does
the learner's command ``python -m minitf.gradcheck``.

A scalar loss ``L = sum(forward(inputs) * G)`` with a random upstream gradient
``G`` makes ``backward(G)`` the exact vector-Jacobian product to compare with

    dL/dx_i  ~  (L(x + h e_i) - L(x - h e_i)) / (2 h)        (error O(h^2))

Run it in float64 (``backend.default_dtype('float64')``): in float32 the
rounding error of L swamps the O(h^2) term.
"""
from minitf import backend
from minitf.backend import xp
from minitf.module import no_grad


def numerical_gradient(f, x, h=1e-6):
    """dL/dx of a scalar function ``f()`` that reads the array ``x``, by central
    differences on every entry. ``x`` is changed in place and restored."""
    if not x.flags.c_contiguous:
        raise ValueError("numerical_gradient needs a C-contiguous array (it perturbs x in place)")
    grad = xp.zeros_like(x)
    x_flat, grad_flat = x.reshape(-1), grad.reshape(-1)  # views (x must be contiguous)
    for i in range(x_flat.size):
        old = float(x_flat[i])
        x_flat[i] = old + h
        f_plus = f()
        x_flat[i] = old - h
        f_minus = f()
        x_flat[i] = old
        grad_flat[i] = (f_plus - f_minus) / (2 * h)
    return grad


def relative_error(analytic, numeric):
    """max |a - n| / max(max |a|, max |n|, 1e-12): 0 is perfect, 1e-10 to 1e-8 is typical in float64."""
    a, n = backend.to_numpy(analytic), backend.to_numpy(numeric)
    scale = max(float(abs(a).max(initial=0)), float(abs(n).max(initial=0)), 1e-12)
    return float(abs(a - n).max(initial=0)) / scale


def gradients_match(analytic, numeric, rtol=1e-6, atol=1e-7):
    """The pass criterion of every gradient check:
    max |a - n| <= rtol * max(|a|, |n|) + atol.

    ``atol`` covers the rounding noise of the differences themselves, about
    machine-eps * |L| / h = 1e-16 * |L| / 1e-6, which dominates when a gradient
    is tiny (a saturated softmax, the lower layers of a post-LN stack)."""
    a, n = backend.to_numpy(analytic), backend.to_numpy(numeric)
    scale = max(float(abs(a).max(initial=0)), float(abs(n).max(initial=0)))
    return float(abs(a - n).max(initial=0)) <= rtol * scale + atol


def _as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


def upstream_gradients(outputs, seed):
    """The random upstream gradient G (one array per output, N(0, 1)) that makes
    ``L = sum(forward(inputs) * G)`` a scalar: a stream of its own, so that G does not
    repeat the values the inputs were drawn with."""
    rng = backend.host_rng([seed, 0x5EED])
    return tuple(backend.asarray(rng.standard_normal(o.shape), dtype=o.dtype) for o in outputs)


def compare_gradients(forward, backward, inputs, params=(), seed=0, h=1e-6, reseed=None):
    """Run ``forward(*inputs)`` and ``backward(G)`` once, then every numerical gradient.

    forward: callable on the ``inputs`` arrays; returns an array or a tuple of arrays.
    backward: callable on the upstream gradient(s); returns dL/d(input) for each
        input (an array, None for a non-differentiable input, or a tuple of these).
    inputs: dict name -> array; params: dict name -> Parameter.
    reseed: if set, ``backend.manual_seed(reseed)`` before every forward, so
        that dropout draws the same mask each time.

    Returns a list of ``(name, analytic, numeric, relative_error)``. Inputs without a
    returned gradient are left out here; :func:`protocol_problems` reports them.
    """
    names, arrays = list(inputs), list(inputs.values())
    params = dict(params)

    def run_forward():
        if reseed is not None:
            backend.manual_seed(reseed)
        return _as_tuple(forward(*arrays))

    outputs = run_forward()
    G = upstream_gradients(outputs, seed)
    for p in params.values():
        p.grad[...] = 0
    input_grads = _as_tuple(backward(tuple(g.copy() for g in G) if len(G) > 1 else G[0].copy()))

    def loss():
        with no_grad():
            return sum(float((o * g).sum()) for o, g in zip(run_forward(), G))

    report = []
    for name, array, analytic in zip(names, arrays, input_grads):
        if analytic is None or getattr(analytic, "shape", None) != array.shape:
            continue
        numeric = numerical_gradient(loss, array, h)
        report.append((name, analytic, numeric, relative_error(analytic, numeric)))
    for name, p in params.items():
        analytic = p.grad.copy()
        numeric = numerical_gradient(loss, p.data, h)
        report.append((name, analytic, numeric, relative_error(analytic, numeric)))
    return report


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

    def run_forward():
        if reseed is not None:
            backend.manual_seed(reseed)
        return _as_tuple(forward(*arrays))

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
    outputs = run_forward()
    problems += mutations(before, "forward")
    before = snapshot()
    G = upstream_gradients(outputs, seed)
    G_before = [backend.to_numpy(g).copy() for g in G]
    for p in params.values():
        p.grad[...] = 0
    grads = _as_tuple(backward(G if len(G) > 1 else G[0]))
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
                            f"{name} has {tuple(array.shape)}; dL/d{name} has the shape of {name} (sum over "
                            f"the axes that broadcasting added)")
    if params:
        first = {n: backend.to_numpy(p.grad).copy() for n, p in params.items()}
        rng = backend.host_rng([seed, 0xACC])
        held = {n: rng.standard_normal(p.shape) for n, p in params.items()}
        for name, p in params.items():
            p.grad[...] = backend.asarray(held[name], dtype=p.grad.dtype)
        run_forward()
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
        if reseed is not None:
            backend.manual_seed(reseed)
        return _as_tuple(forward(*[values[n].copy() if n in floats else values[n] for n in names]))

    def zero():
        for p in params.values():
            p.grad[...] = 0

    def copies(G):  # backward gets its own copy of the upstream gradient: G is used again
        return tuple(g.copy() for g in G) if len(G) > 1 else G[0].copy()

    def gradients(returned):
        """{input name or "." + parameter name: host array} of one backward, or None when an input's
        gradient is missing or misshapen (the other rules report that)."""
        returned = _as_tuple(returned)
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


# --------------------------------------------------------------------------- #
# python -m minitf.gradcheck LAYER [--seed N] [--wrong] [--bug NAME [--fixed]]
# --------------------------------------------------------------------------- #
def _build(name, rng):
    """A small random instance of one layer: (forward, backward, inputs, params)."""
    import minitf
    from minitf.attention import attention_keep_mask

    def arr(*shape, scale=1.0):
        return backend.asarray(rng.normal(0.0, scale, shape))

    def randomize(module):
        for p in module.parameters():  # random biases/gains too: every gradient term matters
            p.data[...] = arr(*p.shape, scale=0.5)
        return module

    B, S, T, D, H, F, V = 2, 4, 3, 4, 2, 6, 7
    src_pad = backend.asarray(backend.host.arange(S)[None, :] >= backend.host.array([[S], [S - 1]]))
    if name == "linear":
        m = randomize(minitf.Linear(D, F))
        return m.forward, m.backward, {"x": arr(B, T, D)}, m
    if name == "embedding":
        m = minitf.Embedding(V, D)
        ids = backend.asarray(rng.integers(0, V, (B, T)))
        return (lambda: m.forward(ids)), m.backward, {}, m
    if name == "positional":
        m = minitf.PositionalEncoding(D)
        return m.forward, m.backward, {"x": arr(B, T, D)}, None
    if name == "dropout":
        m = minitf.Dropout(0.3)
        return m.forward, m.backward, {"x": arr(B, T, D)}, None
    if name == "layernorm":
        m = randomize(minitf.LayerNorm(D))
        return m.forward, m.backward, {"x": arr(B, T, D)}, m
    if name == "relu":
        m = minitf.ReLU()
        return m.forward, m.backward, {"x": arr(B, T, D)}, None
    if name == "softmax":
        m = minitf.Softmax()
        return m.forward, m.backward, {"x": arr(B, T, D, scale=3.0)}, None
    if name == "attention":
        Q, K, U = arr(B, H, T, D), arr(B, H, S, D), arr(B, H, S, D)
        keep = attention_keep_mask(src_pad, False, T, S)
        saved = {}

        def forward(Q, K, U):
            O, saved["P"] = minitf.scaled_dot_product_attention(Q, K, U, keep)
            return O
        return forward, (lambda dO: minitf.scaled_dot_product_attention_backward(dO, Q, K, U, saved["P"])), \
            {"Q": Q, "K": K, "U": U}, None
    if name == "mha":
        m = randomize(minitf.MultiHeadAttention(D, H))
        return (lambda x: m.forward(x, causal=True)), (lambda dy: m.backward(dy)[0]), {"x": arr(B, T, D)}, m
    if name == "cross":
        m = randomize(minitf.MultiHeadAttention(D, H))
        return (lambda x, mem: m.forward(x, mem, key_padding_mask=src_pad)), m.backward, \
            {"x": arr(B, T, D), "memory": arr(B, S, D)}, m
    if name == "feedforward":
        m = randomize(minitf.FeedForward(D, F))
        return m.forward, m.backward, {"x": arr(B, T, D)}, m
    if name in ("encoder_layer", "encoder"):
        m = randomize(minitf.EncoderLayer(D, H, F, dropout=0.0) if name == "encoder_layer"
                      else minitf.Encoder(2, D, H, F, dropout=0.0))
        return (lambda x: m.forward(x, src_pad)), m.backward, {"x": arr(B, S, D)}, m
    if name in ("decoder_layer", "decoder"):
        m = randomize(minitf.DecoderLayer(D, H, F, dropout=0.0) if name == "decoder_layer"
                      else minitf.Decoder(2, D, H, F, dropout=0.0))
        return (lambda y, mem: m.forward(y, mem, src_pad)), m.backward, {"y": arr(B, T, D), "memory": arr(B, S, D)}, m
    if name == "loss":
        m = minitf.LabelSmoothedCrossEntropy(0.1, ignore_index=0)
        target = backend.asarray(rng.integers(0, V, (B, T)))
        return (lambda z: backend.asarray(m.forward(z, target))), (lambda g: m.backward(float(g))), \
            {"logits": arr(B, T, V, scale=2.0)}, None
    if name in ("gelu", "gelu_tanh"):
        m = minitf.GELU("tanh" if name == "gelu_tanh" else "none")
        return m.forward, m.backward, {"x": arr(B, T, D, scale=2.0)}, None
    if name == "learned_positions":
        m = randomize(minitf.LearnedPositionalEmbedding(T + 2, D))
        return (lambda x: m.forward(x, start=1)), m.backward, {"x": arr(B, T, D)}, m
    if name == "gpt":  # GPT-2's shape, with the next-token loss: position t predicts token t + 1
        m = randomize(minitf.GPT(V, max_len=T, d_model=D, num_heads=H, num_layers=2, d_ff=F, dropout=0.0))
        loss = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
        ids = rng.integers(0, V, (B, T + 1))
        return (lambda: backend.asarray(loss(m(ids[:, :-1]), ids[:, 1:]))), \
            (lambda g: m.backward(loss.backward(float(g)))), {}, m
    if name == "model":
        m = randomize(minitf.Transformer(V, V, d_model=D, num_heads=H, num_encoder_layers=2, num_decoder_layers=2,
                                         d_ff=F, dropout=0.0))
        loss = minitf.LabelSmoothedCrossEntropy(0.1, ignore_index=0)
        src, tgt = rng.integers(1, V, (B, S)), rng.integers(1, V, (B, T + 1))
        src[1, -1] = 0
        return (lambda: backend.asarray(loss(m(src, tgt[:, :-1]), tgt[:, 1:]))), \
            (lambda g: m.backward(loss.backward(float(g)))), {}, m
    raise ValueError(f"unknown layer {name!r}")


#: seconds a check of a learner's code may run (its own layer, an exercise): a loop that never ends stops
TIME_LIMIT = 60.0

LAYERS = ["linear", "embedding", "positional", "dropout", "layernorm", "relu", "softmax", "attention", "mha",
          "cross", "feedforward", "encoder_layer", "decoder_layer", "encoder", "decoder", "loss", "model",
          "gelu", "gelu_tanh", "learned_positions", "gpt"]


def worst_entry(analytic, numeric, rtol=1e-6, atol=1e-7):
    """Where two gradients differ most: ``(index tuple, analytic value, numeric value,
    number of entries off, number of entries)``, an entry being off when
    |a - n| > rtol * max(|a|, |n|) + atol (the scale of the whole array)."""
    a, n = backend.to_numpy(analytic), backend.to_numpy(numeric)
    diff = abs(a - n)
    index = tuple(int(i) for i in backend.host.unravel_index(int(diff.argmax()), a.shape))
    scale = max(float(abs(a).max(initial=0)), float(abs(n).max(initial=0)))
    return index, float(a[index]), float(n[index]), int((diff > rtol * scale + atol).sum()), int(a.size)


def describe_worst(name, analytic, numeric, rtol=1e-6, atol=1e-7):
    """One line: which entry is furthest off, both values, their ratio, how many entries are off."""
    index, a, n, off, size = worst_entry(analytic, numeric, rtol, atol)
    ratio = f"{a / n + 0.0:.4g}" if n != 0 else "inf" if a != 0 else "nan"
    where = f"{name}[{', '.join(map(str, index))}]"
    return f"  furthest off: {where}  analytic {a:.6g}  numeric {n:.6g}  (analytic/numeric {ratio}); " \
           f"{off} of {size} entries off"


def diagnose(analytic, numeric, upstream=None, rtol=1e-6, atol=1e-7):
    """A hint from the pattern of the difference, for any layer: a gradient never
    written, a constant factor or a flipped sign, exactly the upstream gradient
    (a skip path), a few entries, or a missing term."""
    np = backend.host
    a, n = backend.to_numpy(analytic), backend.to_numpy(numeric)
    scale = max(float(abs(a).max(initial=0)), float(abs(n).max(initial=0)), 1e-300)
    if not a.any():
        return "analytic is 0 everywhere, numeric is not: this gradient is never computed (a path dropped, " \
               "or a .grad never added to)"
    if float(abs(n).max(initial=0)) <= atol:
        return "numeric is 0: the output does not depend on this array, yet backward gives it a gradient"
    big = abs(n) > 1e-3 * scale
    ratios = a[big] / n[big]
    c = float(np.median(ratios))
    if abs(c) > 1e-12 and float(abs(ratios - c).max(initial=0)) <= 1e-4 * abs(c) and \
            float(abs(a - c * n).max(initial=0)) <= rtol * scale + atol:
        if abs(c + 1) < 1e-4:
            return "analytic = -numeric in every entry: the sign is flipped"
        return f"analytic = {c:.4g} x numeric in every entry: a constant factor is missing or extra " \
               f"(a scale such as 1/sqrt(dk), the 1/N of a mean, a factor 2)"
    if upstream is not None:
        G = backend.to_numpy(upstream)
        if G.shape == a.shape:
            for sign, what in ((-1, "missing"), (1, "counted twice")):
                if float(abs(a - n - sign * G).max(initial=0)) <= rtol * scale + atol:
                    return f"analytic - numeric = {'-' if sign < 0 else '+'}dy, the upstream gradient, in every " \
                           f"entry: a path where dy passes straight through (a skip y = x + ...) is {what}"
    index, _, _, off, size = worst_entry(a, n, rtol, atol)
    if off <= size // 2:
        return f"only {off} of {size} entries are off: look at what they share (a repeated id, a masked or " \
               f"padded position, one row or column)"
    return "off almost everywhere, by no single factor: a term is missing or wrong (the product rule's " \
           "second term, the part through a mean or a normaliser of the row)"


class UserCodeError(Exception):
    """The learner's own code failed (or did not load, or ran past the time limit, or Ctrl-C stopped
    it); the message is one line: what failed, the exception, and where (its last frame in the
    learner's file). ``status``: the command's exit status (1, 130 for Ctrl-C)."""

    def __init__(self, message, status=1):
        super().__init__(message)
        self.status = status


def _where(tb, prefer=None):
    """"file.py:12 in backward: <the line>" of the last frame of ``tb`` in the file ``prefer``
    (the learner's), else of its last frame; "" without a traceback."""
    import pathlib
    import traceback
    frames = traceback.extract_tb(tb)
    if not frames:
        return ""
    mine = [f for f in frames if prefer is not None
            and pathlib.Path(f.filename).resolve() == pathlib.Path(prefer).resolve()]
    frame = (mine or frames)[-1]
    code = f": {frame.line.strip()}" if frame.line else ""
    return f"{pathlib.Path(frame.filename).name}:{frame.lineno} in {frame.name}{code}"


def user_error(error, what, path=None):
    """A :class:`UserCodeError` for ``error`` raised by the learner's code during ``what``
    (``path``: the learner's file, whose last frame is shown)."""
    if isinstance(error, SyntaxError):
        where = f"{error.filename}:{error.lineno}" + (f": {error.text.strip()}" if error.text else "")
        return UserCodeError(f"{what}: SyntaxError: {error.msg} ({where})")
    message = " ".join(str(error).split()) or "(no message)"
    where = _where(error.__traceback__, path)
    return UserCodeError(f"{what}: {type(error).__name__}: {message}" + (f" (at {where})" if where else ""))


class _TimeLimit:
    """``with _TimeLimit(seconds) as limit:`` interrupts the main thread after ``seconds``, as Ctrl-C
    would (a loop that never ends in a learner's backward); ``limit.expired`` tells the two apart."""

    def __init__(self, seconds):
        self.seconds, self.expired, self.timer = seconds, False, None

    def _expire(self):
        import _thread
        self.expired = True
        _thread.interrupt_main()

    def __enter__(self):
        import threading
        if self.seconds:
            self.timer = threading.Timer(self.seconds, self._expire)
            self.timer.daemon = True
            self.timer.start()
        return self

    def __exit__(self, *exc):
        if self.timer is not None:
            self.timer.cancel()
        return False


def guarded(run, path, seconds, what="the check failed", wrap=True):
    """``run()`` with the learner's failures as one line (a :class:`UserCodeError` naming the last frame
    in ``path``): ``seconds`` passed (a loop that never ends?), Ctrl-C, and with ``wrap`` any exception."""
    limit = _TimeLimit(seconds)
    try:
        with limit:
            return run()
    except KeyboardInterrupt as error:
        where = _where(error.__traceback__, path)
        where = f" (it was at {where})" if where else ""
        if limit.expired:
            raise UserCodeError(f"the check did not finish in {seconds:g} s{where}: a loop that never ends in forward "
                                f"or backward? Give it longer with --time-limit SECONDS") from None
        raise UserCodeError(f"interrupted{where}", status=130) from None
    except Exception as error:
        if not wrap or isinstance(error, UserCodeError):
            raise
        raise user_error(error, what, path) from None


def one_line_parser(**kwargs):
    """argparse for the study tools, with a usage error in one line (exit 2), as the application's
    ``minitf.training.errors.OneLineParser`` (the core does not import the application)."""
    import argparse

    class OneLineParser(argparse.ArgumentParser):
        def error(self, message):
            self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
    return OneLineParser(**kwargs)


def run_tool(main, argv=None):
    """A study tool's ``main`` as a command: a learner's error is one line on stderr (exit 1, 130
    for Ctrl-C), and output cut short by a closed pipe (``| head``) ends quietly."""
    import os
    import sys
    try:
        status = main(argv)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then caught below
        return status
    except UserCodeError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 141  # 128 + SIGPIPE, as a tool killed by the closed pipe


def load_object(spec):
    """``"path/to/file.py:NAME"`` -> the object NAME defined in that file (the file runs
    as a module, as ``python file.py`` would run it). A one-line ValueError when the file
    or the name is missing."""
    import importlib.util
    import pathlib
    path, _, name = spec.rpartition(":")
    if not path or not name:
        raise ValueError(f"expected FILE.py:NAME, got {spec!r}")
    file = pathlib.Path(path)
    if not file.is_file():
        raise ValueError(f"no such file: {path}")
    module_spec = importlib.util.spec_from_file_location(f"_gradcheck_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        raise user_error(error, f"{path} did not load", file) from None
    if not hasattr(module, name):
        raise ValueError(f"{path} defines no {name!r}")
    return getattr(module, name)


def _build_user(spec, shapes, rng):
    """FILE.py:NAME, where NAME() (a Module class or a function) returns a Module, or a tuple
    (module, input, ...); without inputs, random float64 arrays of ``shapes``."""
    import inspect

    from minitf.module import Module
    make = load_object(spec)
    if not callable(make):
        raise ValueError(f"{spec} is a {type(make).__name__}, not a Module class or a function that returns one")
    try:
        made = make()
    except Exception as error:
        raise user_error(error, f"{spec}() raised", spec.rpartition(":")[0]) from None
    module, *given = made if isinstance(made, tuple) else (made,)
    if not isinstance(module, Module):
        raise ValueError(f"{spec}() returned {type(module).__name__}, not a minitf Module")
    arrays = given or [backend.asarray(rng.normal(0.0, 1.0, shape)) for shape in shapes]
    positional = [(n, p) for n, p in inspect.signature(module.forward).parameters.items()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [n for n, p in positional if p.default is p.empty]
    if len(arrays) < len(required):
        raise ValueError(f"{type(module).__name__}.forward takes {len(required)} inputs ({', '.join(required)}), "
                         f"{'given' if given else '--shape gave'} {len(arrays)}: "
                         + ("return one per input from NAME()" if given else "give one --shape per input"))
    if any(int(a.size) == 0 for a in arrays):
        raise ValueError(f"{spec}() gave an input with no entries (shapes "
                         f"{', '.join(str(tuple(a.shape)) for a in arrays)}): nothing to check")
    names = [n for n, _ in positional][:len(arrays)]
    return module.forward, module.backward, dict(zip(names, arrays)), dict(module.named_parameters())


def print_check(forward, backward, inputs, params, seed=0, reseed=None, entries=4, wrong=False, hint=None,
                caches=False):
    """The command-line report of one check: the protocol's problems (each a FAIL line),
    then analytic against numeric, entry by entry, for every input and parameter, and
    for each array that fails its entry furthest off and a hint (``hint``, or the
    pattern's :func:`diagnose`); ``caches`` as in :func:`protocol_problems`. Returns the number of
    failures."""
    problems = protocol_problems(forward, backward, inputs, params, seed=seed, reseed=reseed, caches=caches)
    report = compare_gradients(forward, backward, inputs, params, seed=seed, reseed=reseed)
    upstream = None
    for problem in problems:
        print(f"FAIL {problem}")
    print(f"{'array':42s} {'shape':>12s}  {'analytic':>12s} {'numeric':>12s}  rel. error")
    failed, worst = 0, []
    for name, analytic, numeric, _ in report:
        analytic = backend.to_numpy(analytic).copy()
        numeric = backend.to_numpy(numeric)
        if wrong:
            analytic.reshape(-1)[0] *= -1  # the kind of slip a sign error in one term makes
        error = relative_error(analytic, numeric)
        status = "ok" if gradients_match(analytic, numeric) else "FAIL"
        failed += status == "FAIL"
        a, n = analytic.reshape(-1), numeric.reshape(-1)
        for i in range(min(entries, a.size)):
            label = name if i == 0 else ""
            shape = str(tuple(analytic.shape)) if i == 0 else ""
            tail = f"{error:.1e}  {status}" if i == 0 else ""
            print(f"{label:42s} {shape:>12s}  {a[i]:12.8f} {n[i]:12.8f}  {tail}")
        if status == "FAIL":
            worst.append(describe_worst(name, analytic, numeric))
            if hint is None:
                if upstream is None:
                    with no_grad():
                        outputs = _as_tuple(forward(*inputs.values()))
                    upstream = upstream_gradients(outputs, seed)
                worst.append(f"  hint: {diagnose(analytic, numeric, upstream[0] if len(upstream) == 1 else None)}")
    print(f"{len(report) - failed} of {len(report)} arrays match (max |a - n| <= 1e-6 max(|a|, |n|) + 1e-7)")
    if not sum(int(analytic.size) for _, analytic, _, _ in report):
        print("FAIL nothing was checked: no float input with a gradient and no parameter has an entry")
        failed += 1
    if failed:
        print("\n".join(worst))
        if hint is not None:
            print(f"hint: {hint}")
    return failed + len(problems)


def main(argv=None):
    """Print analytical vs numerical gradients of one layer, side by side, after the
    protocol checks (every float input gets a gradient of its shape, the incoming gradient
    is left unchanged, parameter gradients accumulate with +=, nothing changes an input).
    LAYER is one of the library's layers, or FILE.py:NAME, your own: NAME() (a Module class
    or a function) returns a Module, or a tuple (module, input, ...); without inputs, random
    arrays of the --shape shapes are drawn. With --bug NAME the layer's backward is replaced
    by one with a realistic bug (see minitf/bugs.py and docs/bugs.md)."""

    from minitf import bugs
    parser = one_line_parser(prog="python -m minitf.gradcheck", description=main.__doc__)
    parser.add_argument("layer", nargs="?", metavar="LAYER",
                        help="one of: " + ", ".join(LAYERS) + "; or FILE.py:NAME (optional with --bug)")
    parser.add_argument("--shape", action="append", metavar="2,3,4",
                        help="with FILE.py:NAME: the shape of one random input (repeat for each input; "
                             "default one input of shape 2,3,4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bug", choices=list(bugs.BUGS),
                        help="a backward with this bug in it: " + "; ".join(
                            f"{b.name} ({b.layer}): {b.summary}" for b in bugs.BUGS.values()))
    parser.add_argument("--fixed", action="store_true",
                        help="with --bug: the same hand-written backward with the right line instead")
    parser.add_argument("--list-bugs", action="store_true", help="list the bugs and exit")
    parser.add_argument("--wrong", action="store_true",
                        help="compare against a deliberately wrong gradient (one entry's sign flipped), "
                             "to see what a failing check looks like")
    parser.add_argument("--entries", type=int, default=4, help="entries shown per array")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT, metavar="SECONDS",
                        help=f"with FILE.py:NAME: stop a check that runs longer (default {TIME_LIMIT:g}; 0: no limit)")
    args = parser.parse_args(argv)
    if args.list_bugs:
        for b in bugs.BUGS.values():
            print(f"{b.layer:10s} --bug {b.name:22s} {b.summary}")
        return 0
    user = args.layer is not None and ":" in args.layer
    path = args.layer.rpartition(":")[0] if user else None
    if args.bug is not None:
        layer = bugs.BUGS[args.bug].layer
        if args.layer not in (None, layer):
            parser.error(f"bug {args.bug!r} lives in layer {layer!r}, not {args.layer!r}")
        args.layer = layer
    elif args.layer is None:
        parser.error("give a LAYER, or --bug NAME")
    elif args.layer in {b.layer for b in bugs.BUGS.values()} - set(LAYERS):
        parser.error(f"{args.layer!r} is only checked with a --bug (try --list-bugs)")
    elif not user and args.layer not in LAYERS:
        parser.error(f"unknown layer {args.layer!r}: give one of {', '.join(LAYERS)}, or FILE.py:NAME")
    if args.fixed and args.bug is None:
        parser.error("--fixed needs --bug NAME")
    if args.shape and not user:
        parser.error("--shape is for FILE.py:NAME")
    try:
        shapes = [tuple(int(n) for n in s.split(",")) for s in (args.shape or ["2,3,4"])]
    except ValueError:
        parser.error(f"--shape takes integers separated by commas, such as 2,3,4; got {args.shape}")
    for text, shape in zip(args.shape or [], shapes):
        if min(shape, default=0) < 1:
            parser.error(f"--shape {text}: every size must be at least 1 (an input with no entries has "
                         f"nothing to check)")
    if not args.time_limit >= 0:
        parser.error(f"--time-limit takes seconds >= 0 (0: no limit), got {args.time_limit:g}")
    rng = backend.host_rng(args.seed)
    with backend.default_dtype("float64"):
        backend.manual_seed(args.seed)
        if args.bug is not None:
            forward, backward, inputs, params = bugs.build(args.bug, rng, buggy=not args.fixed)
        elif user:
            try:
                forward, backward, inputs, params = guarded(lambda: _build_user(args.layer, shapes, rng), path,
                                                            args.time_limit, wrap=False)
            except ValueError as error:
                parser.error(str(error))
        else:
            forward, backward, inputs, module = _build(args.layer, rng)
            params = dict(module.named_parameters()) if module is not None else {}
        title = args.layer + (f" --bug {args.bug}" + (" --fixed" if args.fixed else "") if args.bug else "")
        print(f"{title}: float64, central differences h=1e-6, L = sum(forward(x) * G) for a random G")
        hint = bugs.BUGS[args.bug].hint if args.bug is not None and not args.fixed else None
        def check():
            return print_check(forward, backward, inputs, params, seed=args.seed, reseed=args.seed,
                               entries=args.entries, wrong=args.wrong, hint=hint, caches=user)
        failed = guarded(check, path, args.time_limit) if user else check()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(run_tool(main))
