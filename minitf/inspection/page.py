"""The inspection page: one self-contained HTML file. The numbers go in as JSON (the attention weights
as base64 float32, exactly the model's values), the script and the style beside them; a strict
Content-Security-Policy (``default-src 'none'``, the one script and style allowed by their hashes)
keeps the page from loading anything, so it opens from disk with no network and no server.

:func:`example_data` turns an :class:`~minitf.inspection.numbers.Inspection` into the JSON of one
example; :func:`render` writes the page around the examples.
"""
import base64
import hashlib
import html
import json
import math
import pathlib
import re

from minitf.backend import host as np

HERE = pathlib.Path(__file__).resolve().parent
#: The page's parts, package data beside this module.
TEMPLATE, SCRIPT, STYLE = "page.html", "page.js", "page.css"
#: The id of the ``<script type="application/json">`` that holds the numbers.
DATA_ID = "inspect-data"


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


#: Which tokens label the rows and the columns of each attention (``source``: the encoder's input;
#: ``input``: the decoder's, or a GPT's, input tokens).
AXES = {"encoder self-attention": ("source", "source"), "decoder masked self-attention": ("input", "input"),
        "cross-attention": ("input", "source"), "causal self-attention": ("input", "input")}
#: Attentions whose weights above the diagonal are masked (a position sees itself and earlier ones).
CAUSAL = ("decoder masked self-attention", "causal self-attention")


def example_data(inspection, text, input_ids, piece, source_ids=None, target_from="", reference=None, notes=(),
                 source_piece=None):
    """The JSON of one example: ``text`` as given, the token pieces (``piece(id) -> str``; the source's
    ``source_piece``, default ``piece``) of the decoder's (a GPT's) ``input_ids`` and of the ``source_ids``
    (translation), what the targets are (``target_from``), and every number of ``inspection``."""
    targets = [int(t) for t in inspection.targets]
    source_piece = source_piece or piece
    return {
        "text": text, "reference": reference, "target_from": target_from, "notes": list(notes),
        "source": None if source_ids is None else [source_piece(int(i)) for i in source_ids],
        "input": [piece(int(i)) for i in input_ids],
        "predicted": [piece(t) if t >= 0 else None for t in targets],
        "probability": [_number(p) for p in inspection.probability],
        "top": [[[piece(int(i)), float(p)] for i, p in zip(ids, probs)]
                for ids, probs in zip(inspection.top_ids, inspection.top_probs)],
        "loss": float(inspection.loss), "num_tokens": inspection.num_tokens, "smoothing": inspection.smoothing,
        "attention": [dict(name=name, rows=AXES[name][0], cols=AXES[name][1], causal=name in CAUSAL,
                           **encode_array(weights)) for name, weights in inspection.attention.items()],
        "walk": [{"section": step} if isinstance(step, str) else
                 {"label": step.label, "norm": step.norm, "shape": list(step.shape), "kind": step.kind}
                 for step in inspection.walk],
        "points": [[name, float(norm)] for name, norm in inspection.points],
        "embedding_grad": {"axis": "input" if source_ids is None else "source",
                           "norms": [float(n) for n in inspection.embedding_grad]},
    }


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
    server (``form-action 'self'``); a file's page sends nothing anywhere."""
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
