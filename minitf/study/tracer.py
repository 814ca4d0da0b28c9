"""The recorder behind ``python -m minitf.trace``: one tiny example, forward and backward
through the whole Transformer, with every activation and every gradient kept under its
module's name.

The example: B = 1 sentence, S = T = 2 tokens, D = 4, H = 2 heads (dk = 2), F = 8,
V = 5 tokens, one encoder and one decoder layer, float64, dropout 0, label smoothing 0.1.
Weight matrices hold round numbers (k/10); biases and LayerNorm gains keep their
initial 0 and 1, so every step can be redone with a pocket calculator (docs/trace.md).
The GPT example (``run_gpt``, ``python -m minitf.trace --model gpt``, docs/gpt.md): one
sequence of L = 4 tokens, the same sizes, GPT-2's choices, one layer, the next-token loss.

How it records, without knowing how any layer works inside: every sub-module
instance gets its ``forward`` and ``backward`` wrapped at runtime, and the wrapper
logs the arrays that go in and come out, under the module's dotted name (the
attribute path from the model, as in ``named_parameters``), and what a backward added
to the ``.grad`` of the module's own parameters. The two public attention
functions of ``minitf.attention`` are wrapped the same way, so the inside of one
attention (Q, K, U, P, O) shows too. The wrappers are removed afterwards.

A module called twice in one forward (the shared embedding: source, then target)
gets two records; its backward calls come in reverse order (the cache stack of
``minitf.module``), and ``Record.partner`` pairs each backward with its forward.
"""
import contextlib
import dataclasses
import inspect
import sys

import minitf
from minitf import backend
from minitf.backend import host as numpy  # host arrays for printing
from minitf.module import Module, Parameter

# the example (see the module docstring); 0 is padding, 1 is BOS, and the target is the
# source reversed, as in the reversal task of docs/reversal.md
CONFIG = dict(src_vocab_size=5, tgt_vocab_size=5, d_model=4, num_heads=2, num_encoder_layers=1,
              num_decoder_layers=1, d_ff=8, dropout=0.0, share_embeddings=True, pad_id=0)
SRC = [[3, 4]]          # (B, S) = (1, 2)
TGT_IN = [[1, 4]]       # (B, T) = (1, 2): BOS, then the first target token
TGT_OUT = [[4, 3]]      # (B, T): the source reversed
SMOOTHING = 0.1
# the GPT example (``--model gpt``): GPT-2's choices (pre-LN with a final LayerNorm, tanh GELU,
# learned positions), one layer; position t predicts token t + 1, and the last position, which
# has no next token, gets the target -1 (ignored): its dlogits row is 0. Token 3 occurs twice.
GPT_CONFIG = dict(vocab_size=5, max_len=4, d_model=4, num_heads=2, num_layers=1, d_ff=8, dropout=0.0)
GPT_IDS = [[3, 1, 3, 4]]       # (B, L) = (1, 4)
GPT_NEXT = [[1, 3, 4, -1]]     # GPT_IDS shifted left by one; -1: no next token
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
    grads: list = dataclasses.field(default_factory=list)  # backward: (parameter, what it added to .grad)


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

    def _wrap(self, name_of, kind, function, out_names=None, module=None):
        """``name_of()`` gives the record's name at call time; a backward of ``module``
        also records what it added to the ``.grad`` of the module's own parameters."""
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
            own = [] if module is None or kind != "backward" else \
                [(n, p) for n, p in vars(module).items() if isinstance(p, Parameter)]
            before = [_copy(p.grad) for _, p in own]
            try:
                result = function(*args, **kwargs)
                record.grads = [(n, _copy(p.grad) - b) for (n, p), b in zip(own, before)]
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
                module.__dict__[kind] = self._wrap(lambda name=name: name, kind, getattr(module, kind),
                                                   module=module)
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


@dataclasses.dataclass(frozen=True)
class Example:
    """One traced example of ``python -m minitf.trace --model NAME``, as the model's kind gives it
    (``Kind.trace_example``): ``run()`` -> (tracer, model, loss) (inside ``default_dtype("float64")``),
    ``header(loss)`` -> the lines that open the trace, ``print_walk(tracer, model, loss)`` ``--walk``'s view."""
    run: object
    header: object
    print_walk: object


def header(loss):
    """The lines that open the trace of the encoder-decoder example."""
    return [f"trace: B=1, S=T=2, D=4, H=2 (dk=2), F=8, V=5, float64, dropout 0, smoothing {SMOOTHING}",
            f"src_ids {SRC}, tgt_in_ids {TGT_IN}, tgt_out {TGT_OUT}; loss {loss:.6f}"]


def gpt_header(loss):
    """The lines that open the trace of the GPT example."""
    return ["trace: GPT, B=1, L=4, D=4, H=2 (dk=2), F=8, V=5, one layer, pre-LN, tanh GELU, learned positions, "
            "float64, dropout 0", f"ids {GPT_IDS}, next-token targets {GPT_NEXT} (-1: none, ignored); loss {loss:.6f}"]


def build_model(model_class=None, config=None):
    """The traced model: ``model_class(**config)`` (default: the paper's Transformer of CONFIG; the GPT example
    passes minitf.GPT and GPT_CONFIG), float64, weight matrices set to round numbers."""
    backend.manual_seed(0)
    return with_round_numbers((model_class or minitf.Transformer)(**(config or CONFIG)))


def with_round_numbers(model):
    """``model`` with every weight matrix and table set to round numbers (:func:`round_numbers`, each parameter
    its own offset); biases and LayerNorm gains keep their initial 0 and 1. Returns it."""
    for offset, (_, p) in enumerate(model.named_parameters()):
        data = backend.to_numpy(p.data)
        if data.ndim >= 2:                                  # weights: round numbers
            p.data[...] = backend.asarray(round_numbers(data.size, offset).reshape(data.shape))
    return model


def run(model=None):
    """Forward, loss and backward of the example under a Tracer. Returns
    (tracer, model, loss). Call inside ``default_dtype("float64")``."""
    model = build_model() if model is None else model
    return run_translation(model, SRC, TGT_IN, TGT_OUT, SMOOTHING, CONFIG["pad_id"])


def run_translation(model, src, tgt_in, tgt_out, smoothing=0.0, pad_id=0):
    """An encoder-decoder ``model`` on (B, S) source ids and (B, T) target ids (``tgt_in`` its start token first,
    ``tgt_out`` the same shifted by one): forward, the label-smoothed loss (``pad_id`` ignored) and backward under a
    Tracer. Returns (tracer, model, loss)."""
    loss_fn = minitf.LabelSmoothedCrossEntropy(smoothing=smoothing, ignore_index=pad_id)
    src, tgt_in, tgt_out = (numpy.array(a) for a in (src, tgt_in, tgt_out))
    tracer = Tracer(model, extra=[("loss", loss_fn)])
    model.zero_grad()
    with tracer.active():
        logits = model(src, tgt_in)
        loss = loss_fn(logits, tgt_out)
        model.backward(loss_fn.backward())
    return tracer, model, loss


def run_gpt(model=None):
    """The GPT example: forward, the next-token loss (no smoothing) and backward under a Tracer.
    Returns (tracer, model, loss). Call inside ``default_dtype("float64")``."""
    return run_next_token(build_model(minitf.GPT, GPT_CONFIG) if model is None else model)


def run_next_token(model, ids=GPT_IDS, targets=GPT_NEXT):
    """A decoder-only ``model`` (the GPT's, or a kind's) on (B, L) ``ids`` (default: the GPT example's) and their
    next-token ``targets`` (-1: none): forward, the next-token loss (no smoothing) and backward under a Tracer.
    Returns (tracer, model, loss)."""
    loss_fn = minitf.LabelSmoothedCrossEntropy(0.0, ignore_index=-1)
    tracer = Tracer(model, extra=[("loss", loss_fn)])
    model.zero_grad()
    with tracer.active():
        logits = model(numpy.array(ids))
        loss = loss_fn(logits, numpy.array(targets))
        model.backward(loss_fn.backward())
    return tracer, model, loss


# --------------------------------------------------------------------------- #
# python -m minitf.trace --checkpoint PATH: one short text through a loaded model
# --------------------------------------------------------------------------- #
#: The most tokens of ``--text`` traced (per side of a translation): the output stays readable.
MAX_TOKENS = 8
#: ``--text``'s default.
TEXT = "Der Hund sieht ein Haus."


def widen(model):
    """Every parameter of ``model`` as float64, in place (its gradient zeroed): the trace's arithmetic is then
    float64's, as the built-in examples'. Returns the dtype the weights had (a tied parameter is widened once)."""
    params = list(model.parameters())
    dtype = params[0].data.dtype if params else numpy.dtype("float64")
    for p in params:
        p.data = backend.asarray(p.data, dtype="float64")
        p.grad = backend.xp.zeros_like(p.data)
    return numpy.dtype(dtype)


def encode_text(encode, text, limit, what):
    """``encode([text])``'s ids cut to ``limit``; a one-line ValueError when they are none."""
    ids = [int(i) for i in encode([text])[0]]
    if not ids:
        raise ValueError(f"--text {text!r} gives no {what} tokens with this tokenizer; give text in its alphabet")
    return ids[:limit]


def next_token_example(loaded, text, max_tokens=MAX_TOKENS):
    """The :class:`Example` of a loaded decoder-only model (a kind whose models continue text): ``text`` tokenized
    by its tokenizer and cut to ``max_tokens`` (and its context) is the prompt, each position scored on the next
    token, the last on none."""
    ids = encode_text(loaded.tokenizer.encode, text, min(max_tokens, loaded.context or max_tokens), "")
    if len(ids) < 2:
        raise ValueError(f"--text {text!r} is {len(ids)} token; a language model needs at least 2 to score a "
                         "next token: give a longer text")
    targets = ids[1:] + [-1]
    return Example(lambda: run_next_token(loaded.model, [ids], [targets]),
                   lambda loss: loaded_header(loaded, [f"ids {[ids]}, next-token targets {[targets]} "
                                                       f"(-1: none, ignored); loss {loss:.6f}"]), None)


def translation_example(loaded, text, start_id, end_id, max_tokens=MAX_TOKENS):
    """The :class:`Example` of a loaded encoder-decoder: ``text`` is the source (its first ``max_tokens`` - 1
    tokens and ``end_id``) and the target (its target side's tokens, teacher-forced: the decoder reads ``start_id``
    and the first tokens, and is scored on each next one, ``end_id`` last)."""
    limit = min(max_tokens, loaded.context or max_tokens) - 1
    src = encode_text(loaded.tokenizer.encode, text, limit, "source") + [end_id]
    tgt = encode_text(getattr(loaded.tokenizer, "encode_target", loaded.tokenizer.encode), text, limit, "target")
    tgt_in, tgt_out = [start_id] + tgt, tgt + [end_id]
    model = loaded.model
    return Example(lambda: run_translation(model, [src], [tgt_in], [tgt_out], 0.0, model.pad_id),
                   lambda loss: loaded_header(loaded, [f"src_ids {[src]}, tgt_in_ids {[tgt_in]}, tgt_out {[tgt_out]}"
                                                       f" (the text on both sides); loss {loss:.6f}"]), None)


def loaded_header(loaded, lines):
    """The lines that open the trace of a loaded model: what it is, where from, then ``lines``."""
    shape = loaded.kind.describe_model(loaded.model)[2]
    return [f"trace: {shape}", f"from {loaded.source}, float64, eval mode (dropout off), no label smoothing",
            *lines]


#: Arrays of more entries print as a summary (3 rows and columns at each edge): a loaded model's (8, 58101)
#: logits stay 7 lines; the built-in examples' arrays (at most 64 entries) print whole.
SUMMARY = 64


def format_values(value):
    """An array's values as NumPy prints them, 4 decimals, no signed zeros."""
    if value.dtype.kind in "iub":
        return numpy.array2string(value)
    text = numpy.array2string(value, precision=4, floatmode="fixed", suppress_small=True, max_line_width=200,
                              threshold=SUMMARY, edgeitems=3)  # a big array: its corners, "..." between
    return text.replace("-0.0000", " 0.0000")              # no signed zeros: they are rounding


def format_array(name, value, indent):
    if isinstance(value, float):
        return f"{indent}{name:16s} {'()':12s} {value:.6f}"
    shape = str(tuple(value.shape))
    text = format_values(value)
    pad = "\n" + indent + " " * 30
    return f"{indent}{name:16s} {shape:12s} " + text.replace("\n", pad)
