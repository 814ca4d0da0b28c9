"""The inspection page: one self-contained HTML file. The numbers go in as JSON (the attention weights
as base64 float32, exactly the model's values), the script and the style beside them; a strict
Content-Security-Policy (``default-src 'none'``, the one script and style allowed by their hashes)
keeps the page from loading anything, so it opens from disk with no network and no server.

:func:`example_data` turns an :class:`~minitf.study.inspection.numbers.Inspection` into the JSON of one
example; :func:`render` writes the page around the examples.
"""
import base64
import hashlib
import html
import json
import math
import pathlib
import re
import unicodedata

from minitf.backend import host as np

HERE = pathlib.Path(__file__).resolve().parent
#: The page's parts, package data beside this module.
TEMPLATE, SCRIPT, STYLE = "page.html", "page.js", "page.css"
#: The id of the ``<script type="application/json">`` that holds the numbers.
DATA_ID = "inspect-data"


#: Unicode's categories of the characters that are not shown as themselves: control characters (C0, DEL, C1: a
#: terminal's escape sequences, ESC, BEL), format characters (direction overrides, embeddings, isolates and marks,
#: zero-width spaces and joiners, the word joiner, the BOM, the soft hyphen), line and paragraph separators, and
#: lone surrogates.
HIDDEN = ("Cc", "Cf", "Zl", "Zp", "Cs")


def visible(text):
    """``text`` with every character of :data:`HIDDEN` written as a visible escape: a control character as
    ``\\xNN`` (``\\x1b``, as http.server's log writes it), any other as ``[U+XXXX]`` (``[U+202E]``). The one
    escaping of what the page shows and of what ``minitf.inspect`` writes to the terminal: a right-to-left
    override in a sentence cannot turn the page's own warning around, a zero-width character cannot hide, and
    an escape sequence never reaches a terminal raw."""
    if text.isprintable():  # nothing hidden (every HIDDEN character is unprintable): the common case, fast
        return text
    return "".join((f"\\x{ord(c):02x}" if unicodedata.category(c) == "Cc" else f"[U+{ord(c):04X}]")
                   if unicodedata.category(c) in HIDDEN else c for c in text)


def _visible_data(value):
    """``value`` (JSON data) with :func:`visible` applied to every string in it."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {key: _visible_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_visible_data(item) for item in value]
    return value


def encode_array(array):
    """{"shape", "dtype", "base64"}: the array's values as little-endian float32, exactly (the page
    decodes them with a Float32Array; float64 models are rounded to float32 here)."""
    array = np.ascontiguousarray(array, dtype="<f4")
    return {"shape": list(array.shape), "dtype": "float32", "base64": base64.b64encode(array.tobytes()).decode()}


def decode_array(encoded):
    """The array of :func:`encode_array` (for tests and readers of a page)."""
    data = base64.b64decode(encoded["base64"])
    return np.frombuffer(data, dtype="<f4").reshape(encoded["shape"])


def _number(value):
    """A float for JSON: None for NaN (JSON has no NaN)."""
    value = float(value)
    return None if math.isnan(value) else value


def probability_text(p):
    """A probability as the page shows it: three significant digits ("0.998", "0.0123"), more where three would
    round a probability below 1 up to "1" ("0.9996"); "1" only for 1 itself. None for none (NaN)."""
    if p is None or math.isnan(p):
        return None
    for digits in range(3, 18):  # 17 significant digits tell every float64 below 1 from 1
        text = f"{p:.{digits}g}"
        if p >= 1 or float(text) < 1:
            return text
    return text


def loaded_note(step, averaged_from=None):
    """What follows "loaded from RUN" in the page's header: " (step N)", or for the average of a run's last
    checkpoints (the ``averaged_from`` of its meta.json, their paths) the steps it averages; "" with neither."""
    if averaged_from:
        steps = [int(m.group(1)) for m in (re.fullmatch(r"step-(\d+)", pathlib.PurePath(str(p)).name)
                                           for p in averaged_from) if m]
        if len(steps) != len(averaged_from):
            return f" (the average of {len(averaged_from)} checkpoints)"
        listed = ", ".join(map(str, steps)) if len(steps) <= 5 else f"{steps[0]} to {steps[-1]}"
        return f" (the average of {len(steps)} checkpoints: steps {listed})"
    return "" if step is None else f" (step {step})"


def point_lines(points):
    """[[first, last]]: the ranges of ``points`` (name, norm) that the residual-stream chart joins by a line.
    Each stack's output starts a line of its own: the gradient at the encoder's output (the memory) does not
    come from the decoder's layer 0 below it in the list but from every decoder layer's cross-attention."""
    starts = [i for i, (name, _) in enumerate(points) if name.endswith(" out")] or [0]
    starts = sorted({0, *starts})
    return [[start, stop - 1] for start, stop in zip(starts, starts[1:] + [len(points)])]


#: The residual-stream chart's note on its broken line (an encoder-decoder).
POINTS_NOTE = ("The decoder's line and the encoder's are not joined: no gradient flows from the decoder's layer 0 "
               "to the encoder's output. The memory's gradient is the sum of what the cross-attention of every "
               "decoder layer sends to it.")
#: The embedding chart's note for a GPT, whose last bar is always 0.
LAST_TOKEN_NOTE = ("The last bar is always 0: the text's last token predicts nothing (there is no next token, so "
                   "its position is left out of the loss and its dlogits row is 0), and the causal mask lets no "
                   "later position read it, so no gradient reaches its embedding.")


#: Which tokens label the rows and the columns of each attention (``source``: the encoder's input;
#: ``input``: the decoder's, or a GPT's, input tokens).
AXES = {"encoder self-attention": ("source", "source"), "decoder masked self-attention": ("input", "input"),
        "cross-attention": ("input", "source"), "causal self-attention": ("input", "input"),
        "self-attention (both directions)": ("input", "input")}
#: Attentions whose weights above the diagonal are masked (a position sees itself and earlier ones).
CAUSAL = ("decoder masked self-attention", "causal self-attention")


def example_data(inspection, text, input_ids, piece, source_ids=None, target_from="", reference=None, notes=(),
                 source_piece=None, masked=False):
    """The JSON of one example: ``text`` as given, the token pieces (``piece(id) -> str``; the source's
    ``source_piece``, default ``piece``) of the decoder's (a GPT's) ``input_ids`` and of the ``source_ids``
    (translation), what the targets are (``target_from``), and every number of ``inspection``; ``masked``: an
    encoder's text, scored at its masks only (no last-token note)."""
    targets = [int(t) for t in inspection.targets]
    source_piece = source_piece or piece
    return {
        "text": text, "reference": reference, "masked": masked, "target_from": target_from, "notes": list(notes),
        "source": None if source_ids is None else [source_piece(int(i)) for i in source_ids],
        "input": [piece(int(i)) for i in input_ids],
        "predicted": [piece(t) if t >= 0 else None for t in targets],
        "probability": [_number(p) for p in inspection.probability],
        "probability_text": [probability_text(float(p)) for p in inspection.probability],
        "top": [[[piece(int(i)), float(p)] for i, p in zip(ids, probs)]
                for ids, probs in zip(inspection.top_ids, inspection.top_probs)],
        "top_text": [[probability_text(float(p)) for p in probs] for probs in inspection.top_probs],
        "loss": float(inspection.loss), "num_tokens": inspection.num_tokens, "smoothing": inspection.smoothing,
        "attention": [dict(name=name, rows=AXES[name][0], cols=AXES[name][1], causal=name in CAUSAL,
                           heads=inspection.head_labels.get(name), **encode_array(weights))
                      for name, weights in inspection.attention.items()],
        "position_bias": [{"name": name, "distances": [int(d) for d in distances],
                           "values": [[float(v) for v in head] for head in values]}
                          for name, (distances, values) in inspection.position_bias.items()],
        "walk": [{"section": step} if isinstance(step, str) else
                 {"label": step.label, "norm": step.norm, "shape": list(step.shape), "kind": step.kind}
                 for step in inspection.walk],
        "points": [[name, float(norm)] for name, norm in inspection.points],
        "point_lines": point_lines(inspection.points),
        "points_note": None if source_ids is None else POINTS_NOTE,
        "embedding_grad": {"axis": "input" if source_ids is None else "source",
                           "norms": [float(n) for n in inspection.embedding_grad],
                           "note": LAST_TOKEN_NOTE if source_ids is None and not masked else None},
        "experts": routing_data(inspection.experts),
    }


def routing_data(routings):
    """The JSON of the experts each position chose in each sparse feed-forward (None for a dense model): the blocks'
    ``layers``, ``num_experts`` E, ``top_k`` k, ``shared`` (a shared expert reads every position too), ``idx``
    [layer][position] [k expert ids, first choice first], and as float32 arrays (exactly the model's values, as the
    attention's) ``weights`` (layers, T, k) and the router's ``probs`` (layers, T, E)."""
    if not routings:
        return None
    return {"layers": [int(r.layer) for r in routings], "num_experts": int(routings[0].probs.shape[-1]),
            "top_k": int(routings[0].idx.shape[-1]), "shared": any(r.shared for r in routings),
            "idx": [[[int(e) for e in row] for row in r.idx] for r in routings],
            "weights": encode_array(np.stack([r.weights for r in routings])),
            "probs": encode_array(np.stack([r.probs for r in routings]))}


def _hash(text):
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def _script_json(data):
    """JSON safe inside a <script> element: no '<', '>' or '&' that could end it."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(data, served=False):
    """The page (a str) for ``data``: {"title", "model": {...}, "examples": [example_data, ...],
    "curves": {...} or None, "warnings": [...], "error": None or a message, "serve": None or {"max_chars",
    "reference"}}. ``served``: the page comes from ``--serve`` and its form may be sent to the same
    server (``form-action 'self'``); a file's page sends nothing anywhere. Every string the page shows goes in
    through :func:`visible`; the text boxes of ``serve`` keep the sentence as it was sent (sent again, it is the
    same sentence)."""
    data = dict(_visible_data({key: value for key, value in data.items() if key != "serve"}),
                serve=data.get("serve"))
    script, style = ((HERE / name).read_text(encoding="utf-8") for name in (SCRIPT, STYLE))
    csp = "; ".join(["default-src 'none'", f"script-src {_hash(script)}", f"style-src {_hash(style)}",
                     "img-src data:", "base-uri 'none'", "form-action " + ("'self'" if served else "'none'")])
    values = {"CSP": csp, "TITLE": html.escape(data.get("title", "minitf inspect")), "STYLE": style,
              "DATA": _script_json(data), "SCRIPT": script}
    template = (HERE / TEMPLATE).read_text(encoding="utf-8")
    # one pass over the template: an inserted value (the user's text among the data) is never searched again
    page, count = re.subn(r"__(CSP|TITLE|STYLE|DATA|SCRIPT)__", lambda m: values[m.group(1)], template)
    assert count == len(values), f"{TEMPLATE} must hold each of {sorted(values)} once"
    return page


def read_data(page):
    """The JSON data of a page written by :func:`render` (for tests and other readers)."""
    start = page.index(f'<script type="application/json" id="{DATA_ID}">')
    start = page.index(">", start) + 1
    return json.loads(page[start:page.index("</script>", start)])
