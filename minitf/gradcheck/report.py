"""What a failed gradient check says: the entry furthest off, a hint from the pattern of
the difference (:func:`diagnose`), and the command-line report of one check that
``python -m minitf.gradcheck`` and ``python -m minitf.exercise`` print (:func:`print_check`).
"""
from minitf import backend
from minitf.gradcheck.numeric import as_tuple, compare_gradients, gradients_match, relative_error, upstream_gradients
from minitf.gradcheck.protocol import protocol_problems
from minitf.module import no_grad


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


#: the last hint's examples when the layer is not known (a layer's own text replaces them: ``term_hint``)
ANY_LAYER_TERMS = "the product rule's second term, the part through a mean or a normaliser of the row"


def _equal(a, b, rtol, atol):
    """a = b in every entry, within the check's tolerance on the larger of the two."""
    scale = max(float(abs(a).max(initial=0)), float(abs(b).max(initial=0)))
    return float(abs(a - b).max(initial=0)) <= rtol * scale + atol


def diagnose(analytic, numeric, upstream=None, rtol=1e-6, atol=1e-7, terms=None, term_hint=None, slips=None):
    """A hint from the pattern of the difference, for any layer: a gradient never
    written, a slip the layer knows, a constant factor or a flipped sign, the upstream
    gradient never applied, exactly the upstream gradient (a skip path), a few entries,
    or a missing term.

    terms: optional {name: (formula, array)}, the terms of the right gradient (upstream
    gradient applied): one missing or counted twice is named. slips: optional [(formula,
    test, what)], the usual slips in this layer's backward, each named when its test
    holds: an array (the gradient that slip gives, "analytic = formula") or a function
    of the analytic gradient (True: the slip is there). term_hint: what the last hint
    says may be missing or wrong in this layer (None: examples from any layer; "": none
    named)."""
    np = backend.host
    a, n = backend.to_numpy(analytic), backend.to_numpy(numeric)
    scale = max(float(abs(a).max(initial=0)), float(abs(n).max(initial=0)), 1e-300)
    if not a.any():
        return "analytic is 0 everywhere, numeric is not: this gradient is never computed (a path dropped, " \
               "or a .grad never added to)"
    for formula, test, what in slips or ():
        if callable(test) and test(a):
            return f"{formula}: {what}"
        if not callable(test) and test.shape == a.shape and _equal(a, backend.to_numpy(test), rtol, atol):
            return f"analytic = {formula} in every entry: {what}"
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
        if G.shape == a.shape and _equal(a * G, n, rtol, atol):
            return "analytic x dy = numeric in every entry, dy the upstream gradient: the local derivative is " \
                   "right, but the upstream gradient dy is not applied (the chain rule: return dy times it)"
        if G.shape == a.shape:
            for sign, what in ((-1, "missing"), (1, "counted twice")):
                if float(abs(a - n - sign * G).max(initial=0)) <= rtol * scale + atol:
                    return f"analytic - numeric = {'-' if sign < 0 else '+'}dy, the upstream gradient, in every " \
                           f"entry: a path where dy passes straight through (a skip y = x + ...) is {what}"
    for name, (formula, term) in (terms or {}).items():
        term = backend.to_numpy(term)
        if term.shape == a.shape and _equal(n - a, term, rtol, atol):
            return f"numeric - analytic = {formula} in every entry: {name} is missing"
        if term.shape == a.shape and _equal(a - n, term, rtol, atol):
            return f"analytic - numeric = {formula} in every entry: {name} is counted twice"
    index, _, _, off, size = worst_entry(a, n, rtol, atol)
    if off <= size // 2:
        return f"only {off} of {size} entries are off: look at what they share (a repeated id, a masked or " \
               f"padded position, one row or column)"
    term_hint = ANY_LAYER_TERMS if term_hint is None else term_hint
    return "off almost everywhere, by no single factor: a term is missing or wrong" + \
        (f" ({term_hint})" if term_hint else "")


def print_check(forward, backward, inputs, params, seed=0, reseed=None, entries=4, wrong=False, hint=None,
                caches=False, terms=None, term_hint=None, slips=None):
    """The command-line report of one check: the protocol's problems (each a FAIL line),
    then analytic against numeric, entry by entry, for every input and parameter, and
    for each array that fails its entry furthest off and a hint (``hint``, or the
    pattern's :func:`diagnose`); ``caches`` as in :func:`protocol_problems`. A float input
    whose gradient is missing or of the wrong shape is a row that says it was not compared
    (its FAIL line says why). ``terms``: optional ``terms(upstream) -> {array name: {name:
    (formula, array)}}``, ``slips``: optional ``slips(upstream) -> {array name: [(formula, test,
    what)]}`` and ``term_hint`` (a text, or {array name: text}) for :func:`diagnose`.
    Returns the number of failures."""
    problems = protocol_problems(forward, backward, inputs, params, seed=seed, reseed=reseed, caches=caches)
    report = compare_gradients(forward, backward, inputs, params, seed=seed, reseed=reseed)
    upstream = None
    for problem in problems:
        print(f"FAIL {problem}")
    print(f"{'array':42s} {'shape':>12s}  {'analytic':>12s} {'numeric':>12s}  rel. error")
    compared = {name for name, _, _, _ in report}
    not_compared = [(name, array) for name, array in inputs.items()
                    if backend.is_array(array) and array.dtype.kind == "f" and name not in compared]
    for name, array in not_compared:  # the protocol's FAIL line above says why
        print(f"{name:42s} {str(tuple(array.shape)):>12s}  not compared: no gradient of its shape  FAIL")
    failed, worst = len(not_compared), []
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
                        outputs = as_tuple(forward(*inputs.values()))
                    upstream = upstream_gradients(outputs, seed)
                    known = terms(upstream) if terms is not None else {}
                    known_slips = slips(upstream) if slips is not None else {}
                layer_hint = term_hint.get(name) if isinstance(term_hint, dict) else term_hint
                found = diagnose(analytic, numeric, upstream[0] if len(upstream) == 1 else None,
                                 terms=known.get(name), term_hint=layer_hint, slips=known_slips.get(name))
                worst.append(f"  hint: {found}")
    total = len(report) + len(not_compared)
    print(f"{total - failed} of {total} arrays match (max |a - n| <= 1e-6 max(|a|, |n|) + 1e-7)")
    if not sum(int(analytic.size) for _, analytic, _, _ in report) and not not_compared:
        print("FAIL nothing was checked: no float input with a gradient and no parameter has an entry")
        failed += 1
    if worst:
        print("\n".join(worst))
    if failed:
        if hint is not None:
            print(f"hint: {hint}")
    return failed + len(problems)
