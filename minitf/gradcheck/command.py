"""``python -m minitf.gradcheck LAYER``: analytical against numerical gradients of one layer,
side by side, after the protocol checks; LAYER is one of the library's layers
(:mod:`minitf.gradcheck.catalogue`), a layer with a realistic bug (``--bug NAME``,
minitf/study/bugs.py), or the learner's own (``FILE.py:NAME``, run under guard by
:mod:`minitf.study.tools`).
"""
import inspect

from minitf import backend
from minitf.study import bugs
from minitf.gradcheck.catalogue import LAYERS, build
from minitf.draws import random_array
from minitf.gradcheck.report import print_check
from minitf.module import Module
from minitf.study.tools import (add_time_limit, check_time_limit, guarded, load_object, one_line_parser, run_tool,
                                user_error)


def _build_user(spec, shapes, rng):
    """FILE.py:NAME, where NAME() (a Module class or a function) returns a Module, or a tuple
    (module, input, ...); without inputs, random float64 arrays of ``shapes``."""
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
    arrays = given or [random_array(rng, shape) for shape in shapes]
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


def main(argv=None):
    """Print analytical vs numerical gradients of one layer, side by side, after the
    protocol checks (every float input gets a gradient of its shape, the incoming gradient
    is left unchanged, parameter gradients accumulate with +=, nothing changes an input).
    LAYER is one of the library's layers, or FILE.py:NAME, your own: NAME() (a Module class
    or a function) returns a Module, or a tuple (module, input, ...); without inputs, random
    arrays of the --shape shapes are drawn. With --bug NAME the layer's backward is replaced
    by one with a realistic bug (see minitf/study/bugs.py and docs/bugs.md)."""
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
    add_time_limit(parser, "with FILE.py:NAME: stop a check that runs longer")
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
    check_time_limit(parser, args.time_limit)
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
            forward, backward, inputs, module = build(args.layer, rng)
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
