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


def compare_gradients(forward, backward, inputs, params=(), seed=0, h=1e-6, reseed=None):
    """Run ``forward(*inputs)`` and ``backward(G)`` once, then every numerical gradient.

    forward: callable on the ``inputs`` arrays; returns an array or a tuple of arrays.
    backward: callable on the upstream gradient(s); returns dL/d(input) for each
        input (an array, None for a non-differentiable input, or a tuple of these).
    inputs: dict name -> array; params: dict name -> Parameter.
    reseed: if set, ``backend.manual_seed(reseed)`` before every forward, so
        that dropout draws the same mask each time.

    Returns a list of ``(name, analytic, numeric, relative_error)``.
    """
    names, arrays = list(inputs), list(inputs.values())
    params = dict(params)
    # a stream of its own: G must not repeat the values the inputs were drawn with
    upstream_rng = backend.host_rng([seed, 0x5EED])

    def run_forward():
        if reseed is not None:
            backend.manual_seed(reseed)
        return _as_tuple(forward(*arrays))

    outputs = run_forward()
    G = tuple(backend.asarray(upstream_rng.standard_normal(o.shape), dtype=o.dtype) for o in outputs)
    for p in params.values():
        p.grad[...] = 0
    input_grads = _as_tuple(backward(G if len(G) > 1 else G[0]))

    def loss():
        with no_grad():
            return sum(float((o * g).sum()) for o, g in zip(run_forward(), G))

    report = []
    for name, array, analytic in zip(names, arrays, input_grads):
        if analytic is None:
            continue
        numeric = numerical_gradient(loss, array, h)
        report.append((name, analytic, numeric, relative_error(analytic, numeric)))
    for name, p in params.items():
        analytic = p.grad.copy()
        numeric = numerical_gradient(loss, p.data, h)
        report.append((name, analytic, numeric, relative_error(analytic, numeric)))
    return report


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
        Q, K, V_ = arr(B, H, T, D), arr(B, H, S, D), arr(B, H, S, D)
        keep = attention_keep_mask(src_pad, False, T, S)
        saved = {}

        def forward(Q, K, V_):
            O, saved["P"] = minitf.scaled_dot_product_attention(Q, K, V_, keep)
            return O
        return forward, (lambda dO: minitf.scaled_dot_product_attention_backward(dO, Q, K, V_, saved["P"])), \
            {"Q": Q, "K": K, "V": V_}, None
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
    if name == "model":
        m = randomize(minitf.Transformer(V, V, d_model=D, num_heads=H, num_encoder_layers=2, num_decoder_layers=2,
                                         d_ff=F, dropout=0.0))
        loss = minitf.LabelSmoothedCrossEntropy(0.1, ignore_index=0)
        src, tgt = rng.integers(1, V, (B, S)), rng.integers(1, V, (B, T + 1))
        src[1, -1] = 0
        return (lambda: backend.asarray(loss(m(src, tgt[:, :-1]), tgt[:, 1:]))), \
            (lambda g: m.backward(loss.backward(float(g)))), {}, m
    raise ValueError(f"unknown layer {name!r}")


LAYERS = ["linear", "embedding", "positional", "dropout", "layernorm", "relu", "softmax", "attention", "mha",
          "cross", "feedforward", "encoder_layer", "decoder_layer", "encoder", "decoder", "loss", "model"]


def worst_entry(analytic, numeric, rtol=1e-6, atol=1e-7):
    """Where two gradients differ most: ``(index tuple, analytic value, numeric value,
    number of entries off, number of entries)``, an entry being off when
    |a - n| > rtol * max(|a|, |n|) + atol (the scale of the whole array)."""
    a, n = backend.to_numpy(analytic), backend.to_numpy(numeric)
    diff = abs(a - n)
    index = tuple(int(i) for i in backend.host.unravel_index(int(diff.argmax()), a.shape))
    scale = max(float(abs(a).max(initial=0)), float(abs(n).max(initial=0)))
    return index, float(a[index]), float(n[index]), int((diff > rtol * scale + atol).sum()), int(a.size)


def describe_worst(name, analytic, numeric):
    """One line: which entry is furthest off, both values, their ratio, how many entries are off."""
    index, a, n, off, size = worst_entry(analytic, numeric)
    ratio = f"{a / n:.4g}" if n != 0 else "inf" if a != 0 else "nan"
    where = f"{name}[{', '.join(map(str, index))}]"
    return f"  furthest off: {where}  analytic {a:.6g}  numeric {n:.6g}  (analytic/numeric {ratio}); " \
           f"{off} of {size} entries off"


def main(argv=None):
    """Print analytical vs numerical gradients of one layer, side by side.
    With --bug NAME the layer's backward is replaced by one with a realistic bug
    (see minitf/bugs.py and docs/bugs.md)."""
    import argparse

    from minitf import bugs
    parser = argparse.ArgumentParser(prog="python -m minitf.gradcheck", description=main.__doc__)
    parser.add_argument("layer", nargs="?", choices=LAYERS + sorted({b.layer for b in bugs.BUGS.values()} - set(LAYERS)),
                        help="the layer to check (optional with --bug)")
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
    args = parser.parse_args(argv)
    if args.list_bugs:
        for b in bugs.BUGS.values():
            print(f"{b.layer:10s} --bug {b.name:22s} {b.summary}")
        return 0
    if args.bug is not None:
        layer = bugs.BUGS[args.bug].layer
        if args.layer not in (None, layer):
            parser.error(f"bug {args.bug!r} lives in layer {layer!r}, not {args.layer!r}")
        args.layer = layer
    elif args.layer is None:
        parser.error("give a LAYER, or --bug NAME")
    elif args.layer not in LAYERS:
        parser.error(f"layer {args.layer!r} is only checked with a --bug (try --list-bugs)")
    if args.fixed and args.bug is None:
        parser.error("--fixed needs --bug NAME")
    rng = backend.host_rng(args.seed)
    with backend.default_dtype("float64"):
        backend.manual_seed(args.seed)
        if args.bug is not None:
            forward, backward, inputs, params = bugs.build(args.bug, rng, buggy=not args.fixed)
        else:
            forward, backward, inputs, module = _build(args.layer, rng)
            params = dict(module.named_parameters()) if module is not None else {}
        report = compare_gradients(forward, backward, inputs, params, seed=args.seed, reseed=args.seed)
    title = args.layer + (f" --bug {args.bug}" + (" --fixed" if args.fixed else "") if args.bug else "")
    print(f"{title}: float64, central differences h=1e-6, L = sum(forward(x) * G) for a random G")
    print(f"{'array':42s} {'shape':>12s}  {'analytic':>12s} {'numeric':>12s}  rel. error")
    failed, worst = 0, []
    for name, analytic, numeric, _ in report:
        analytic = backend.to_numpy(analytic).copy()
        numeric = backend.to_numpy(numeric)
        if args.wrong:
            analytic.reshape(-1)[0] *= -1  # the kind of slip a sign error in one term makes
        error = relative_error(analytic, numeric)
        status = "ok" if gradients_match(analytic, numeric) else "FAIL"
        failed += status == "FAIL"
        a, n = analytic.reshape(-1), numeric.reshape(-1)
        for i in range(min(args.entries, a.size)):
            label = name if i == 0 else ""
            shape = str(tuple(analytic.shape)) if i == 0 else ""
            tail = f"{error:.1e}  {status}" if i == 0 else ""
            print(f"{label:42s} {shape:>12s}  {a[i]:12.8f} {n[i]:12.8f}  {tail}")
        if status == "FAIL":
            worst.append(describe_worst(name, analytic, numeric))
    print(f"{len(report) - failed} of {len(report)} arrays match (max |a - n| <= 1e-6 max(|a|, |n|) + 1e-7)")
    if failed:
        print("\n".join(worst))
        if args.bug is not None and not args.fixed:
            print(f"hint: {bugs.BUGS[args.bug].hint}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
