"""A hand-checkable trace: one tiny example, forward and backward through the whole
Transformer, printing every activation and every gradient with its name and shape.

    python -m minitf.trace                                  # everything (a few hundred lines)
    python -m minitf.trace --only loss generator            # only names starting with these
    python -m minitf.trace --only encoder.layers.0.self_attn --no-params
    python -m minitf.trace --first LayerNorm --no-params     # the first LayerNorm that runs
    python -m minitf.trace --walk          # the gradient from the loss to the embedding, with code lines
    python -m minitf.trace --norm-terms    # the terms of every LayerNorm backward, per row
    python -m minitf.trace --grad-norms    # post-LN vs pre-LN: the gradient reaching each layer
    python -m minitf.trace --model gpt --no-params   # the same for a one-layer GPT (docs/gpt.md)
    python -m minitf.trace --model gpt --walk        # its gradient from the loss to the embedding
    python -m minitf.trace --model llama --walk      # the Llama block's (docs/llama.md)
    python -m minitf.trace --model bert --walk       # BERT's masked LM (docs/bert.md)
    python -m minitf.trace --checkpoint RUN_OR_FOLDER --text "Der Hund." --no-params   # a trained model

The example and how it is recorded: ``minitf.study.tracer``; the three views that follow the
gradient: ``minitf.study.walk``. Each model kind gives its example and its walk (``Kind.trace_example``,
found through the registry :mod:`minitf.kinds`: this command knows no model kind). ``--checkpoint`` reads
any run, checkpoint or Hugging Face folder through the one loader (:func:`minitf.load`) and traces one
short text through that model, widened to float64; its kind says how (``Kind.trace_loaded``).
"""
import pathlib
import sys

from minitf import backend, kinds
from minitf.loader import load
from minitf.study.tools import one_line_parser, run_tool
from minitf.training.errors import report_errors
from minitf.study.tracer import (CONFIG, GPT_CONFIG, GPT_IDS, GPT_NEXT, MAX_TOKENS, SMOOTHING, SRC,  # noqa: F401
                           TEXT, TGT_IN, TGT_OUT, Record, Tracer, build_model, format_array, named_modules,
                           round_numbers, run, run_gpt, widen)
from minitf.study.walk import print_gradient_norms, print_norm_terms


def traced_kinds():
    """{--model name: its kind's traced example}, the default kind first: every kind that has one."""
    return {kind.name: example for kind in kinds.every() for example in [kind.trace_example()] if example}

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


def loaded_example(path, text):
    """The :class:`minitf.study.tracer.Example` of the model at ``path`` (read by :func:`minitf.load`, widened to
    float64): one forward and backward of ``text``, as the model's kind says (``Kind.trace_loaded``)."""
    loaded = load(path, warn=lambda message: print(message, file=sys.stderr))
    widen(loaded.model)
    return loaded.kind.trace_loaded(loaded, text)


def read_checkpoint(path, text):
    """(exit status, :func:`loaded_example`): a missing or damaged ``path``, or a ``text`` that does not fit, is
    the loader's one line on stderr (``minitf.trace: error: ...``) and a non-zero status, as in the other
    commands."""
    found = []
    status = report_errors("minitf.trace", lambda _: found.append(loaded_example(path, text)) or 0, None,
                           memory_hint="trace a smaller model")
    return status, found[0] if found else None


def main(argv=None):
    parser = one_line_parser(prog="python -m minitf.trace", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="show only modules whose dotted name starts with one of these")
    parser.add_argument("--first", metavar="CLASS",
                        help="show only the first module of this class that runs (LayerNorm, "
                             "MultiHeadAttention, LabelSmoothedCrossEntropy, ...), and what runs inside it")
    parser.add_argument("--no-params", action="store_true", help="leave out the parameter gradients")
    examples = traced_kinds()
    parser.add_argument("--model", choices=tuple(examples), default=None,
                        help="the example: the encoder-decoder (default), a one-layer GPT-2-style GPT with the "
                             "next-token loss (docs/gpt.md), a one-block Llama (docs/llama.md) or a one-layer BERT "
                             "masked LM (docs/bert.md)")
    parser.add_argument("--checkpoint", type=pathlib.Path, metavar="RUN_OR_FOLDER",
                        help="instead of a built-in example: a run folder of train.py (any --model), one of its "
                             "checkpoints, or a Hugging Face Marian, GPT-2, Llama-family or BERT-family folder, traced "
                             "in float64 (its weights widened) on --text (a masked LM's: each [MASK] scored on its "
                             "own top candidate)")
    parser.add_argument("--text", help=f"with --checkpoint: the text, cut to its first {MAX_TOKENS} tokens; a "
                                       "translation model reads it as the source and as the target (teacher-forced: "
                                       "its start token, then the text's tokens, each scored on the next, </s> "
                                       "last), a language model as the prompt, each token scored on the next "
                                       f"(default: {TEXT!r})")
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--walk", action="store_true",
                      help="instead: the gradient from dL/dlogits down to the tied embedding, step by step, "
                           "with the line of code of each step (docs/walk.md)")
    view.add_argument("--norm-terms", action="store_true",
                      help="instead: the mean and variance terms of every LayerNorm backward, per row")
    view.add_argument("--grad-norms", action="store_true",
                      help="instead: the gradient norm reaching each layer of a 6+6-layer model at "
                           "initialisation, post-LN and pre-LN (docs/layers/residual.md)")
    args = parser.parse_args(argv)
    if (args.walk or args.norm_terms or args.grad_norms) and (args.only or args.first or args.no_params):
        parser.error("--walk, --norm-terms and --grad-norms take no other option (but --model, or --checkpoint "
                     "and --text for --norm-terms)")
    if args.grad_norms and args.model is not None:
        parser.error("--grad-norms compares post-LN and pre-LN encoder-decoders; it takes no --model")
    if args.checkpoint is not None and args.model is not None:
        parser.error("--model picks a built-in example; --checkpoint's folder fixes the model: give one of them")
    if args.checkpoint is not None and (args.walk or args.grad_norms):
        parser.error("--walk and --grad-norms follow the built-in examples line by line; a loaded model's walk (the "
                     "gradient's norm at each step) is on python -m minitf.inspect --checkpoint PATH's page")
    if args.text is not None and args.checkpoint is None:
        parser.error("--text goes with --checkpoint (the built-in examples have their own ids)")
    if args.grad_norms:
        print_gradient_norms()
        return 0
    if args.checkpoint is not None:
        backend.check_environment()
        status, example = read_checkpoint(args.checkpoint, TEXT if args.text is None else args.text)
        if status:
            return status
    else:
        example = examples[args.model or next(iter(examples))]
    with backend.default_dtype("float64"):
        tracer, model, loss = example.run()
    if args.walk:
        example.print_walk(tracer, model, loss)
        return 0
    if args.norm_terms:
        print_norm_terms(tracer)
        return 0
    if args.first:
        args.only = (args.only or []) + [first_of_class(tracer, args.first)]
    calls = {}
    for record in tracer.records:
        calls[record.name, record.kind] = calls.get((record.name, record.kind), 0) + 1

    def shown(name):
        return not args.only or any(name == o or name.startswith(o + ".") or name.startswith(o + "/")
                                    for o in args.only)

    for line in example.header(loss):
        print(line)
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
    raise SystemExit(run_tool(main))
