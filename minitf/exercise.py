"""Backward-pass exercises (cs231n style): the forward is written, the backward is yours,
and one command says whether it is right and, if not, which input or parameter is wrong
and how (docs/exercises.md).

    python -m minitf.exercise list                   # the exercises
    python -m minitf.exercise start layernorm        # copies the exercise to ./layernorm.py
    python -m minitf.exercise check layernorm.py     # exit 0 when every check passes

The check is the gradient test of minitf.testing, with the same protocol checks: every
float input gets a gradient of its shape, the incoming gradient is left unchanged, the
parameters' ``.grad`` accumulate with +=, and every entry matches float64 central
differences (max |a - n| <= 1e-6 max(|a|, |n|) + 1e-7). The inputs are small and fixed,
with what each layer needs to show its mistakes: repeated ids, padding, two heads, dk > 1.
"""
import dataclasses
import pathlib
import shutil
import sys

from minitf import backend
from minitf.gradcheck.numeric import random_array, randomize
from minitf.gradcheck.report import print_check
from minitf.study.tools import (TIME_LIMIT, add_time_limit, check_time_limit, guarded, load_object, one_line_parser,
                                run_tool)

EXERCISES_DIR = pathlib.Path(__file__).resolve().parent / "exercises"
B, T, D, V = 2, 3, 4, 7


@dataclasses.dataclass(frozen=True)
class Exercise:
    name: str
    class_name: str
    summary: str
    page: str
    build: object  # build(cls, rng) -> (forward, backward, inputs, module)
    term_hint: str = ""  # what may be missing or wrong when a gradient is off everywhere by no one factor
    terms: object = None  # terms(inputs, upstream) -> {array: {name: (formula, array)}}, the right gradient's terms


def _plain(make):
    """An exercise whose forward takes float inputs only: f(cls, rng) -> (module, inputs)."""
    def build(cls, rng):
        module, inputs = make(cls, rng)
        return module.forward, module.backward, inputs, module
    return build


def _relu_input(rng):
    x = random_array(rng, (B, T, D))
    return x + 0.1 * ((x >= 0) * 2.0 - 1.0)  # |x| >= 0.1: no difference straddles the kink


def _attention(cls, rng):
    from minitf.attention import attention_keep_mask
    H, S, dk = 2, 4, 2
    pad = backend.asarray(backend.host.arange(S)[None, :] >= backend.host.array([[S], [S - 1]]))  # row 1: last key pads
    keep = attention_keep_mask(pad, False, T, S)
    module = cls()
    inputs = {name: random_array(rng, (B, H, length, dk)) for name, length in (("Q", T), ("K", S), ("U", S))}
    return (lambda Q, K, U: module.forward(Q, K, U, keep)), module.backward, inputs, module


def _loss(cls, rng):
    module = cls(0.1, ignore_index=0)
    target = rng.integers(1, V, (B, T))
    target[0, -1] = target[1, -2:] = 0  # padding: 3 real tokens of 6
    target = backend.asarray(target)
    return (lambda z: backend.asarray(module.forward(z, target))), (lambda g: module.backward(float(g))), \
        {"logits": random_array(rng, (B, T, V), 2.0)}, module


def _gelu(cls, rng):
    exact, tanh = cls(), cls("tanh")  # both forms, each on its own input: a wrong one is named
    return (lambda x_erf, x_tanh: backend.xp.stack([exact.forward(x_erf), tanh.forward(x_tanh)])), \
        (lambda dy: (exact.backward(dy[0]), tanh.backward(dy[1]))), \
        {"x_erf": random_array(rng, (B, T, D), 2.0), "x_tanh": random_array(rng, (B, T, D), 2.0)}, exact


def _embedding(cls, rng):
    module = randomize(cls(V, D), rng)
    ids = rng.integers(0, V, (B, T))
    ids[1, 0] = ids[0, 0] = ids[0, 2]  # one id three times
    ids = backend.asarray(ids)
    return (lambda: module.forward(ids)), module.backward, {}, module


def _rotary(cls, rng):
    module = cls(4, theta=100.0)  # dk 4: two pairs turned at two frequencies
    return (lambda x: module.forward(x, start=2)), module.backward, {"x": random_array(rng, (B, T, 2, 4))}, module


def _silu_terms(inputs, upstream):
    from minitf.layers import sigmoid
    x, (dy,) = inputs["x"], upstream
    s = sigmoid(x)
    return {"x": {"the product rule's first term": ("dy sigmoid(x)", dy * s),
                  "the product rule's second term": ("dy x sigmoid(x) (1 - sigmoid(x))", dy * x * s * (1.0 - s))}}


def _gelu_terms(inputs, upstream):
    import math

    from minitf.layers import GELU_CUBIC, SQRT_2_OVER_PI
    xp = backend.xp
    (dy,) = upstream  # the two forms' outputs stacked: dy[0] for x_erf, dy[1] for x_tanh
    x, z = inputs["x_erf"], inputs["x_tanh"]
    cdf = 0.5 * (1.0 + backend.erf(x / math.sqrt(2.0)))
    pdf = xp.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    t = xp.tanh(SQRT_2_OVER_PI * (z + GELU_CUBIC * z ** 3))
    du_dz = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * z * z)
    return {"x_erf": {"the product rule's first term": ("dy Phi(x)", dy[0] * cdf),
                      "the product rule's second term": ("dy x phi(x)", dy[0] * x * pdf)},
            "x_tanh": {"the product rule's first term": ("dy (1 + t) / 2", dy[1] * 0.5 * (1.0 + t)),
                       "the product rule's second term": ("dy x (1 - t^2) / 2 du/dx",
                                                          dy[1] * 0.5 * z * (1.0 - t * t) * du_dz)}}


def _router(cls, rng):
    E, k, N = 4, 2, 5
    mixtral, qwen = cls(k, True), cls(k, False)  # both forms, each on its own inputs: a wrong one is named
    inputs = {"logits_mixtral": random_array(rng, (N, E), 2.0), "out_mixtral": random_array(rng, (N, E, D)),
              "logits_qwen": random_array(rng, (N, E), 2.0), "out_qwen": random_array(rng, (N, E, D))}
    return (lambda zm, om, zq, oq: backend.xp.stack([mixtral.forward(zm, om), qwen.forward(zq, oq)])), \
        (lambda dy: mixtral.backward(dy[0]) + qwen.backward(dy[1])), inputs, mixtral


def _router_terms(inputs, upstream):
    """For each form, what the usual slips leave out of the right gradient (docs/moe.md): the unchosen experts'
    zero in dout (a gradient sent to every expert), the renormalisation's Jacobian, the softmax over all E."""
    from minitf.layers import softmax, softmax_backward
    from minitf.moe import put_rows, top_k
    xp = backend.xp
    (dy,) = upstream
    terms = {}
    for i, form in enumerate(("mixtral", "qwen")):
        z, out, g = inputs[f"logits_{form}"], inputs[f"out_{form}"], dy[i]
        p = softmax(z)
        idx, c = top_k(p, 2)
        t = c.sum(axis=-1, keepdims=True)
        w = c / t if form == "mixtral" else c
        dw = (g[:, None, :] * xp.take_along_axis(out, idx[..., None], axis=1)).sum(axis=-1)      # (N, k)

        def to_logits(dchosen):
            dp = xp.zeros_like(p)
            put_rows(dp, idx, dchosen)
            return softmax_backward(p, dp)

        unchosen = xp.ones_like(p)
        put_rows(unchosen, idx, 0.0)
        every = (p / t if form == "mixtral" else p) * unchosen  # the weights the unchosen experts would get
        terms[f"out_{form}"] = {"the zero gradient of the experts top-k did not choose":
                                ("-dy w_e at every unchosen expert e", -g[:, None, :] * every[..., None])}
        right = to_logits((dw - (dw * w).sum(axis=-1, keepdims=True)) / t if form == "mixtral" else dw)
        q = c / t  # the softmax of the chosen logits alone
        over_chosen = xp.zeros_like(p)
        put_rows(over_chosen, idx, q * (dw - (dw * q).sum(axis=-1, keepdims=True)))
        terms[f"logits_{form}"] = {"the softmax's backward over all E experts (not over the chosen k alone)":
                                   ("p (dp - <dp, p>) - q (dw - <dw, q>), q = softmax(chosen logits)",
                                    right - over_chosen)}
        if form == "mixtral":
            terms["logits_mixtral"]["the renormalisation's Jacobian term -<dw, w> / t"] = (
                "softmax'(p) of -<dw, w> / t at the chosen experts", right - to_logits(dw / t))
    return terms


EXERCISES = {e.name: e for e in [
    Exercise("linear", "Linear", "y = x W + b: dW, db and dx", "layers/linear.md",
             _plain(lambda cls, rng: (randomize(cls(D, 3), rng), {"x": random_array(rng, (B, T, D))})),
             "dx = dy W^T; dW = x^T dy and db = dy, each summed over every position"),
    Exercise("relu", "ReLU", "y = max(x, 0): dx", "layers/relu.md",
             _plain(lambda cls, rng: (cls(), {"x": _relu_input(rng)})),
             "dx = dy where x > 0 and 0 elsewhere"),
    Exercise("softmax", "Softmax", "y = softmax(x): dx without the Jacobian", "layers/softmax.md",
             _plain(lambda cls, rng: (cls(), {"x": random_array(rng, (B, T, 5), 2.0)})),
             "dx = y (dy - sum(dy y) over the row): the part through the row's sum"),
    Exercise("layernorm", "LayerNorm", "LayerNorm: dgamma, dbeta and the three terms of dx", "layers/layernorm.md",
             _plain(lambda cls, rng: (randomize(cls(D), rng), {"x": random_array(rng, (B, T, D))})),
             "dx's three terms: dxhat, the part through the row's mean, the part through its rstd"),
    Exercise("attention", "Attention", "softmax(Q K^T / sqrt(dk)) U with a padding mask: dQ, dK, dU",
             "layers/attention.md", _attention,
             "the softmax's backward from dP to dS, the part through each row's sum"),
    Exercise("loss", "LabelSmoothedCrossEntropy", "label-smoothed cross-entropy over non-pad tokens: dlogits",
             "layers/loss.md", _loss,
             "dlogits = (softmax(z) - q) / (non-pad tokens), q the smoothed target"),
    Exercise("embedding", "Embedding", "y = W[ids] sqrt(D): the scatter-add into dW", "layers/embedding.md",
             _embedding, "dW[id] = sqrt(D) times the sum of dy over the positions of that id"),
    Exercise("gelu", "GELU", "y = x Phi(x), exact (erf) and GPT-2's tanh form: dx", "gpt.md", _gelu,
             "y' = Phi(x) + x phi(x), tanh form (1 + t) / 2 + x (1 - t^2) / 2 du/dx: the product rule's second "
             "term, with tanh' = 1 - t^2 and du/dx, holds the usual slips", _gelu_terms),
    Exercise("silu", "SiLU", "y = x sigmoid(x), Marian's activation: dx", "pretrained.md",
             _plain(lambda cls, rng: (cls(), {"x": random_array(rng, (B, T, D), 3.0)})),
             "y' = s + x s (1 - s) with s = sigmoid(x): the product rule's two terms, and sigmoid' = s (1 - s) "
             "written with s, not with SiLU's output", _silu_terms),
    Exercise("rmsnorm", "RMSNorm", "RMSNorm, the Llama family's norm: dweight and the two terms of dx",
             "layers/rmsnorm.md",
             _plain(lambda cls, rng: (randomize(cls(D), rng), {"x": random_array(rng, (B, T, D))})),
             "dx = rstd (dxhat - xhat mean(dxhat xhat)): no term through a mean (none is subtracted), the part "
             "through the row's rstd kept"),
    Exercise("rotary", "RotaryEmbedding", "rotary positions on (B, T, heads, dk): dx, the rotation back",
             "layers/rotary.md", _rotary,
             "dx = dy cos - rotate_half(dy) sin: rotate_half's transpose is -rotate_half (the turn by -angle)"),
    Exercise("swiglu", "SwiGLU", "down(silu(gate(x)) * up(x)): the product rule and x's two paths",
             "layers/swiglu.md",
             _plain(lambda cls, rng: (randomize(cls(D, 6), rng), {"x": random_array(rng, (B, T, D))})),
             "da = dh u and du = dh a; dx = up_proj's dx + gate_proj's dx through SiLU's backward"),
    Exercise("router", "Router", "a mixture of experts' router: top-k of a softmax, renormalised or not",
             "moe.md", _router,
             "dout only at the chosen experts; dw = dy . out; with renormalisation dc = (dw - <dw, w>) / t; the "
             "softmax's backward over all E experts", _router_terms),
]}


def check(path, seed=0, time_limit=TIME_LIMIT):
    """Check the exercise in the file ``path``; prints the report, returns 0 (right) or 1. A file that
    is no exercise is one line on stderr (2); the learner's code failing, running past ``time_limit``
    seconds or Ctrl-C raise :class:`minitf.study.tools.UserCodeError` (one line)."""
    path = pathlib.Path(path)

    def refuse(message):
        print(f"error: {message}", file=sys.stderr)
        return 2

    def load(name):  # the file runs as it loads: a loop at its top level meets the time limit too
        return guarded(lambda: load_object(f"{path}:{name}"), path, time_limit, wrap=False)

    try:
        name = load("EXERCISE")
    except ValueError as error:
        return refuse(f"{error} (an exercise file sets EXERCISE = \"linear\", ...; "
                      f"start one with python -m minitf.exercise start NAME)")
    if not isinstance(name, str) or name not in EXERCISES:
        return refuse(f"{path} says EXERCISE = {name!r}; expected one of the names {', '.join(map(repr, EXERCISES))}")
    exercise = EXERCISES[name]
    try:
        cls = load(exercise.class_name)
    except ValueError as error:
        return refuse(f"{error}: exercise {name} is the class {exercise.class_name} (python -m minitf.exercise "
                      f"start {name} writes it)")
    rng = backend.host_rng(seed)
    print(f"{path.name}: exercise {name} ({exercise.summary}), float64 central differences")

    def run():
        forward, backward, inputs, module = exercise.build(cls, rng)
        terms = (lambda upstream: exercise.terms(inputs, upstream)) if exercise.terms is not None else None
        return print_check(forward, backward, inputs, dict(module.named_parameters()), seed=seed, entries=3,
                           caches=True, terms=terms, term_hint=exercise.term_hint)

    with backend.default_dtype("float64"):
        backend.manual_seed(seed)
        try:  # the learner's forward or backward failing: one line, where it failed
            failed = guarded(run, path, time_limit, unwrapped=(NotImplementedError,))
        except NotImplementedError as error:
            print(f"not written yet: {error}")
            return 1
    if failed:
        print(f"{exercise.class_name}.backward is wrong: see the FAIL lines above "
              f"(docs/{exercise.page} derives it)")
        return 1
    print(f"{exercise.class_name}.backward is right: every check passed")
    return 0


def main(argv=None):
    parser = one_line_parser(prog="python -m minitf.exercise", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="list the exercises")
    start = commands.add_parser("start", help="copy an exercise into a directory (default: here)")
    start.add_argument("name", choices=list(EXERCISES))
    start.add_argument("--to", default=".", help="directory to write NAME.py into")
    checker = commands.add_parser("check", help="check your backward in FILE")
    checker.add_argument("file")
    checker.add_argument("--seed", type=int, default=0)
    add_time_limit(checker)
    args = parser.parse_args(argv)
    if args.command == "list":
        for e in EXERCISES.values():
            print(f"{e.name:10s} {e.summary}  (docs/{e.page})")
        return 0
    if args.command == "start":
        if pathlib.Path(args.to).exists() and not pathlib.Path(args.to).is_dir():
            parser.error(f"--to {args.to} is a file; --to takes a directory to write {args.name}.py into")
        target = pathlib.Path(args.to) / f"{args.name}.py"
        if target.exists():
            parser.error(f"{target} exists already; check it with python -m minitf.exercise check {target}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(EXERCISES_DIR / f"{args.name}.py", target)
        print(f"wrote {target}: write the backward, then: python -m minitf.exercise check {target}")
        return 0
    if not pathlib.Path(args.file).is_file():
        parser.error(f"no such file: {args.file}")
    check_time_limit(parser, args.time_limit)
    return check(args.file, args.seed, args.time_limit)


if __name__ == "__main__":
    raise SystemExit(run_tool(main))
