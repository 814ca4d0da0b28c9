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

The example and how it is recorded: ``minitf.study.tracer``; the three views that follow the
gradient: ``minitf.study.walk``. Each model kind gives its example and its walk (``Kind.trace_example``,
found through the registry :mod:`minitf.kinds`: this command knows no model kind).
"""
import argparse

from minitf import backend, kinds
from minitf.study.tools import run_tool
from minitf.study.tracer import (CONFIG, GPT_CONFIG, GPT_IDS, GPT_NEXT, SMOOTHING, SRC, TGT_IN,  # noqa: F401 (the API)
                           TGT_OUT, Record, Tracer, build_model, format_array, named_modules, round_numbers, run,
                           run_gpt)
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


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m minitf.trace", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="show only modules whose dotted name starts with one of these")
    parser.add_argument("--first", metavar="CLASS",
                        help="show only the first module of this class that runs (LayerNorm, "
                             "MultiHeadAttention, LabelSmoothedCrossEntropy, ...), and what runs inside it")
    parser.add_argument("--no-params", action="store_true", help="leave out the parameter gradients")
    examples = traced_kinds()
    parser.add_argument("--model", choices=tuple(examples), default=None,
                        help="the example: the encoder-decoder (default), a one-layer GPT-2-style GPT with the "
                             "next-token loss (docs/gpt.md) or a one-block Llama (docs/llama.md)")
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
        parser.error("--walk, --norm-terms and --grad-norms take no other option (but --model)")
    if args.grad_norms and args.model is not None:
        parser.error("--grad-norms compares post-LN and pre-LN encoder-decoders; it takes no --model")
    if args.grad_norms:
        print_gradient_norms()
        return 0
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
