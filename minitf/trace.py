"""A hand-checkable trace: one tiny example, forward and backward through the whole
Transformer, printing every activation and every gradient with its name and shape.

    python -m minitf.trace                                  # everything (a few hundred lines)
    python -m minitf.trace --only loss generator            # only names starting with these
    python -m minitf.trace --only encoder.layers.0.self_attn --no-params
    python -m minitf.trace --first LayerNorm --no-params     # the first LayerNorm that runs

The example: B = 1 sentence, S = T = 2 tokens, D = 4, H = 2 heads (dk = 2), F = 8,
V = 5 tokens, one encoder and one decoder layer, float64, dropout 0, label smoothing 0.1.
Weight matrices hold round numbers (k/10); biases and LayerNorm gains keep their
initial 0 and 1, so every step can be redone with a pocket calculator (docs/trace.md).

How it records, without knowing how any layer works inside: every sub-module
instance gets its ``forward`` and ``backward`` wrapped at runtime, and the wrapper
logs the arrays that go in and come out, under the module's dotted name (the
attribute path from the model, as in ``named_parameters``). The two public attention
functions of ``minitf.attention`` are wrapped the same way, so the inside of one
attention (Q, K, U, P, O) shows too. The wrappers are removed afterwards.

A module called twice in one forward (the shared embedding: source, then target)
gets two records; its backward calls come in reverse order (the cache stack of
``minitf.module``), and ``Record.partner`` pairs each backward with its forward.
"""
import argparse
import contextlib
import dataclasses
import inspect
import sys



import minitf
from minitf import backend
from minitf.backend import host as numpy  # host arrays for printing
from minitf.module import Module

# the example (see the module docstring); 0 is padding, 1 is BOS, and the target is the
# source reversed, as in the reversal task of docs/reversal.md
CONFIG = dict(src_vocab_size=5, tgt_vocab_size=5, d_model=4, num_heads=2, num_encoder_layers=1,
              num_decoder_layers=1, d_ff=8, dropout=0.0, share_embeddings=True, pad_id=0)
SRC = [[3, 4]]          # (B, S) = (1, 2)
TGT_IN = [[1, 4]]       # (B, T) = (1, 2): BOS, then the first target token
TGT_OUT = [[4, 3]]      # (B, T): the source reversed
SMOOTHING = 0.1
ATTENTION_FUNCTIONS = ("scaled_dot_product_attention", "scaled_dot_product_attention_backward")


def round_numbers(size, seed):
    """``size`` entries k/10 with integers k in -5..5, drawn with a fixed seed (a fixed
    pattern such as a cycle would make some embedding rows differ by a constant, and
    LayerNorm's zero-mean output would then tie their logits)."""
    return numpy.random.default_rng(seed).integers(-5, 6, size) / 10.0


def named_modules(model, prefix=""):
    """(dotted name, module) for the model and every sub-module; a shared module appears
    once, under the first name that reaches it (the order of ``named_parameters``)."""
    seen = set()

    def visit(module, name):
        if id(module) in seen:
            return
        seen.add(id(module))
        yield name, module
        for child_name, child in module.named_children():
            yield from visit(child, f"{name}.{child_name}" if name else child_name)

    yield from visit(model, prefix)


@dataclasses.dataclass
class Record:
    """One call: ``kind`` is "forward" or "backward"; ``inputs`` and ``outputs`` are
    (name, array) pairs (arrays as NumPy copies); ``call`` counts calls of that kind of
    this module from 0; ``depth`` is the nesting depth."""
    index: int
    kind: str
    name: str
    call: int
    depth: int
    inputs: list
    outputs: list = dataclasses.field(default_factory=list)
    partner: int = None  # index of the matching forward (for a backward) and vice versa


def _is_array(value):
    return backend.is_array(value) or isinstance(value, numpy.ndarray)


def _copy(value):
    return numpy.array(backend.to_numpy(value))


def _arrays(names, values):
    return [(n, _copy(v)) for n, v in zip(names, values) if _is_array(v)]


class Tracer:
    """Wraps forward/backward of every module of ``model`` (and of ``extra`` modules,
    such as the loss) while active; ``records`` lists every call in order."""

    def __init__(self, model, extra=()):
        self.targets = list(named_modules(model)) + list(extra)
        self.records, self.depth, self.stack = [], 0, []
        self._counts, self._open = {}, {}

    def _wrap(self, name_of, kind, function, out_names=None):
        """``name_of()`` gives the record's name at call time."""
        try:
            signature = list(inspect.signature(function).parameters)
        except (TypeError, ValueError):
            signature = []

        def wrapper(*args, **kwargs):
            name = name_of()
            names = signature[:len(args)] + list(kwargs)
            key = (name, kind)
            call = self._counts.get(key, 0)
            self._counts[key] = call + 1
            record = Record(len(self.records), kind, name, call, self.depth,
                            _arrays(names, list(args) + list(kwargs.values())))
            self.records.append(record)
            self.depth += 1
            self.stack.append(name)
            try:
                result = function(*args, **kwargs)
            finally:
                self.depth -= 1
                self.stack.pop()
            values = result if isinstance(result, tuple) else (result,)
            if kind == "backward":
                forward = self._open[name].pop()          # LIFO: the cache stack's order
                record.partner, self.records[forward].partner = forward, record.index
                in_names = [n for n, _ in self.records[forward].inputs]
                names_out = ["d" + in_names[i] if i < len(in_names) else f"grad{i}" for i in range(len(values))]
            else:
                self._open.setdefault(name, []).append(record.index)
                names_out = out_names or (["y"] if len(values) == 1 else [f"y{i}" for i in range(len(values))])
            record.outputs = [(n, _copy(v)) if _is_array(v) else (n, v) for n, v in zip(names_out, values)
                              if _is_array(v) or isinstance(v, float)]
            return result

        return wrapper

    @contextlib.contextmanager
    def active(self):
        patched = []
        for name, module in self.targets:
            for kind in ("forward", "backward"):
                method = getattr(type(module), kind, None)
                if method is None or method is getattr(Module, kind):
                    continue  # the base class's NotImplementedError stub: never called
                module.__dict__[kind] = self._wrap(lambda name=name: name, kind, getattr(module, kind))
                patched.append((module, kind))
        attention = sys.modules["minitf.attention"]
        originals = {f: getattr(attention, f) for f in ATTENTION_FUNCTIONS if hasattr(attention, f)}
        for f, function in originals.items():
            # recorded under the module that calls it: "<module>/attention"
            backward = f.endswith("backward")
            setattr(attention, f, self._wrap(self._attention_name, "backward" if backward else "forward",
                                             function, None if backward else ["O", "P"]))
        try:
            yield self
        finally:
            for module, kind in patched:
                del module.__dict__[kind]
            for f, function in originals.items():
                setattr(attention, f, function)

    def _attention_name(self):
        return f"{self.stack[-1]}/attention" if self.stack else "attention"


def build_model():
    """The traced model: CONFIG, float64, weight matrices set to round numbers."""
    backend.manual_seed(0)
    model = minitf.Transformer(**CONFIG)
    for offset, (_, p) in enumerate(model.named_parameters()):
        data = backend.to_numpy(p.data)
        if data.ndim >= 2:                                  # weights: round numbers
            p.data[...] = backend.asarray(round_numbers(data.size, offset).reshape(data.shape))
    return model


def run(model=None):
    """Forward, loss and backward of the example under a Tracer. Returns
    (tracer, model, loss). Call inside ``default_dtype("float64")``."""
    model = build_model() if model is None else model
    loss_fn = minitf.LabelSmoothedCrossEntropy(smoothing=SMOOTHING, ignore_index=CONFIG["pad_id"])
    src, tgt_in, tgt_out = (numpy.array(a) for a in (SRC, TGT_IN, TGT_OUT))
    tracer = Tracer(model, extra=[("loss", loss_fn)])
    model.zero_grad()
    with tracer.active():
        logits = model(src, tgt_in)
        loss = loss_fn(logits, tgt_out)
        model.backward(loss_fn.backward())
    return tracer, model, loss


def format_array(name, value, indent):
    if isinstance(value, float):
        return f"{indent}{name:16s} {'()':12s} {value:.6f}"
    shape = str(tuple(value.shape))
    if value.dtype.kind in "iub":
        text = numpy.array2string(value)
    else:
        text = numpy.array2string(value, precision=4, floatmode="fixed", suppress_small=True,
                                  max_line_width=200)
    text = text.replace("-0.0000", " 0.0000")              # no signed zeros: they are rounding
    pad = "\n" + indent + " " * 30
    return f"{indent}{name:16s} {shape:12s} " + text.replace("\n", pad)


def first_of_class(tracer, class_name):
    """The dotted name of the first module of class ``class_name`` that ran a forward."""
    classes = {name: type(module).__name__ for name, module in tracer.targets}
    for record in tracer.records:
        if record.kind == "forward" and classes.get(record.name) == class_name:
            return record.name
    raise SystemExit(f"no module of class {class_name!r} ran; classes: {sorted(set(classes.values()))}")


def format_record(record, calls=1, base_depth=0, partner=None):
    indent = "  " * (record.depth - base_depth)
    label = record.name or "model"
    note = ""
    if calls > 1:
        note = f"  (call {record.call + 1} of {calls}"
        if record.kind == "backward" and partner is not None:
            note += f", the backward of forward call {partner.call + 1}"
        note += ")"
    lines = [f"{indent}{record.kind} {label}{note}"]
    for name, value in record.inputs:
        lines.append(format_array(name, value, indent + "  "))
    for name, value in record.outputs:
        lines.append(format_array("-> " + name, value, indent + "  "))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m minitf.trace", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="show only modules whose dotted name starts with one of these")
    parser.add_argument("--first", metavar="CLASS",
                        help="show only the first module of this class that runs (LayerNorm, "
                             "MultiHeadAttention, LabelSmoothedCrossEntropy, ...), and what runs inside it")
    parser.add_argument("--no-params", action="store_true", help="leave out the parameter gradients")
    args = parser.parse_args(argv)
    with backend.default_dtype("float64"):
        tracer, model, loss = run()
    if args.first:
        args.only = (args.only or []) + [first_of_class(tracer, args.first)]
    calls = {}
    for record in tracer.records:
        calls[record.name, record.kind] = calls.get((record.name, record.kind), 0) + 1

    def shown(name):
        return not args.only or any(name == o or name.startswith(o + ".") or name.startswith(o + "/")
                                    for o in args.only)

    print(f"trace: B=1, S=T=2, D=4, H=2 (dk=2), F=8, V=5, float64, dropout 0, smoothing {SMOOTHING}")
    print(f"src_ids {SRC}, tgt_in_ids {TGT_IN}, tgt_out {TGT_OUT}; loss {loss:.6f}")
    print("arrays: name, shape, values (4 decimals); '-> y' is an output, 'dy' the gradient "
          "coming in, '-> dx' the gradient going out")
    records = [r for r in tracer.records if shown(r.name or "model")]
    base_depth = min((r.depth for r in records), default=0)
    for record in records:
        print()
        partner = None if record.partner is None else tracer.records[record.partner]
        print(format_record(record, calls[record.name, record.kind], base_depth, partner))
    if not args.no_params:
        params = [(n, p) for n, p in model.named_parameters() if shown(n)]
        if params:
            print()
            print("parameters and their gradients (a shared parameter once, under its first name)")
            for name, p in params:
                print(f"  {name}")
                print(format_array("value", backend.to_numpy(p.data), "    "))
                print(format_array("grad", backend.to_numpy(p.grad), "    "))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
