"""Checks of the study guide in docs/ (fast: no hypothesis, a few seconds in all).

1. every backticked reference `minitf.<module>.<Name>[.<attr>]` resolves;
2. every relative Markdown link points to an existing file (and heading anchor);
3. every layer (each ``minitf.Module`` subclass defined in a minitf module, plus
   Adam and WarmupSchedule) is named as `minitf.<module>.<Class>` on a page in docs/layers/;
4. every ```python block runs (fresh namespace, cwd = repo root);
5. every ```py block (a quote of the source) still matches the code line for line;
6. every page has balanced $$ display-math delimiters;
7. every ```text block in docs/ and in the top-level README says what it is, and the
   command output it shows is what the command prints now (see OUTPUT LABELS below);
8. every test file (`tests/test_*.py`) and test (`test_*`) that docs/ or the README names
   as evidence exists.

    python -m pytest tests/test_docs.py -q -p no:warnings
"""
import configparser
import contextlib
import importlib
import inspect
import io
import os
import pathlib
import pkgutil
import re
import shlex
import subprocess
import sys

import pytest

import minitf
from minitf import backend
from minitf.module import Module

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
EXTRA_DOCUMENTED = ["minitf.optim.Adam", "minitf.optim.WarmupSchedule"]

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
REFERENCE = re.compile(r"minitf(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def rel(path):
    return path.relative_to(ROOT).as_posix()


def read(page):
    return page.read_text(encoding="utf-8")


def fenced_blocks(text):
    """[(info string, code, line number of the opening fence)]"""
    return [(m.group(1).strip(), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def prose(text):
    """The page without its fenced blocks (kept as blank lines, so line numbers hold)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def references(page):
    """[(line, `minitf...` reference)] from inline code spans outside fenced blocks."""
    found = []
    for number, line in enumerate(prose(read(page)).splitlines(), 1):
        for span in INLINE_CODE.findall(line):
            if REFERENCE.fullmatch(span.strip()):
                found.append((number, span.strip()))
    return found


def resolve(dotted):
    """Import the longest module prefix of ``dotted``, then getattr the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as error:
            if error.name is not None and not ".".join(parts[:cut]).startswith(error.name):
                raise  # the module exists but one of its own imports is missing
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page):
    seen, result = {}, set()
    for _, title in HEADING.findall(prose(read(page))):
        base = slug(title)
        n = seen.get(base, 0)
        result.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return result


def test_docs_exist():
    assert (DOCS / "README.md").is_file(), "docs/README.md is missing"
    assert len(list((DOCS / "layers").glob("*.md"))) >= 10


def test_every_named_test_exists():
    """A promise that names its test (README "Resuming and what is guaranteed") must name
    one that runs: renaming or merging a test updates the docs."""
    defined = {name for path in (ROOT / "tests").glob("test_*.py")
               for name in re.findall(r"^def (test_\w+)", path.read_text(encoding="utf-8"), re.M)}
    missing = []
    for page in PAGES + [ROOT / "README.md"]:
        for number, line in enumerate(read(page).splitlines(), 1):
            missing += [f"{rel(page)}:{number}: {path}" for path in re.findall(r"tests/test_\w+\.py", line)
                        if not (ROOT / path).is_file()]
            missing += [f"{rel(page)}:{number}: {name}" for name in re.findall(r"`(test_\w+)`", line)
                        if name not in defined]
    assert not missing, "tests named in the docs that do not exist:\n" + "\n".join(missing)


def optional_packages():
    """Top-level modules of setup.cfg's extras (cupy-cuda12x -> cupy): what a reference may need
    beyond the README's test command."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    names = " ".join(config["options.extras_require"].values()).split()
    return {re.split(r"[-<>=\[]", name)[0].replace("-", "_") for name in names}


def check_references():
    """(references that do not resolve, references into a module whose optional extra is missing)"""
    broken, needs_extra, optional = [], [], optional_packages()
    for page in PAGES:
        for number, dotted in references(page):
            try:
                resolve(dotted)
            except (ImportError, AttributeError) as error:
                where = f"{rel(page)}:{number}: `{dotted}` ({type(error).__name__}: {error})"
                missing = getattr(error, "name", None)
                (needs_extra if missing and missing.split(".")[0] in optional else broken).append(where)
    return broken, needs_extra


def test_every_minitf_reference_resolves():
    """References into a module that needs an extra (minitf.pytorch needs torch) are checked by
    the next test, where the extras are installed."""
    broken, _ = check_references()
    assert not broken, "references that do not resolve:\n" + "\n".join(broken)


@pytest.mark.extra("torch", "bench")
def test_references_into_modules_that_need_an_extra_resolve():
    _, needs_extra = check_references()
    assert not needs_extra, "references whose extra is not installed:\n" + "\n".join(needs_extra)


def test_every_relative_link_points_to_an_existing_file():
    broken = []
    for page in PAGES:
        for number, line in enumerate(prose(read(page)).splitlines(), 1):
            line = INLINE_CODE.sub("", line)
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                    continue
                path, _, fragment = target.partition("#")
                file = (page.parent / path).resolve() if path else page
                if not file.exists():
                    broken.append(f"{rel(page)}:{number}: ({target}) -> no such file")
                elif fragment and file.suffix == ".md" and fragment not in anchors(file):
                    broken.append(f"{rel(page)}:{number}: ({target}) -> no heading #{fragment} in {rel(file)}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def documented_classes():
    """Qualified names of every Module subclass defined in a minitf module, plus the extras."""
    names = set(EXTRA_DOCUMENTED)
    for info in pkgutil.walk_packages(minitf.__path__, "minitf."):
        try:
            module = importlib.import_module(info.name)
        except ModuleNotFoundError as error:  # an optional third-party dependency is missing
            if error.name and error.name.split(".")[0] == "minitf":
                raise
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, Module):
                names.add(f"{cls.__module__}.{cls.__qualname__}")
    return sorted(names)


def test_every_layer_class_has_a_page():
    named = set()
    for page in sorted((DOCS / "layers").glob("*.md")):
        for _, dotted in references(page):
            parts = dotted.split(".")
            named.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
    missing = [name for name in documented_classes() if name not in named]
    assert not missing, ("classes not named (as `minitf.<module>.<Class>`) on any page in docs/layers/:\n"
                         + "\n".join(missing))


def blocks(info):
    return [pytest.param(page, code, line, id=f"{rel(page)}:{line}")
            for page in PAGES for lang, code, line in fenced_blocks(read(page)) if lang == info]


@pytest.mark.parametrize("page, code, line", blocks("python"))
def test_python_block_runs(page, code, line, monkeypatch):
    if backend.get_device() != "cpu":
        pytest.skip("the snippets pass NumPy arrays: they run on the CPU backend")
    monkeypatch.chdir(ROOT)
    dtype = backend.get_default_dtype()
    try:
        exec(compile(code, f"{rel(page)}:{line}", "exec"), {"__name__": "__docs__"})
    finally:
        backend.set_default_dtype(dtype)
        backend.manual_seed(0)


def _normalise(line):
    return " ".join(line.split())


SOURCE_LINES = None


def _source_lines(keep):
    """The normalised lines of minitf/'s files whose path ``keep(path)`` accepts."""
    return {_normalise(l) for f in (ROOT / "minitf").rglob("*.py") if keep(f)
            for l in f.read_text(encoding="utf-8").splitlines()}


def _not_in(code, lines):
    """The quoted lines of ``code`` not among ``lines`` (a blank line or '...' is a gap)."""
    return [q for q in code.splitlines() if _normalise(q) not in ("", "...") and _normalise(q) not in lines]


@pytest.mark.parametrize("page, code, line", blocks("py"))
def test_quoted_source_matches_the_code(page, code, line):
    """```py blocks quote minitf/ verbatim (up to indentation); a line '...' marks a gap."""
    global SOURCE_LINES
    if SOURCE_LINES is None:
        SOURCE_LINES = _source_lines(lambda f: True)
    stale = _not_in(code, SOURCE_LINES)
    assert not stale, f"{rel(page)}:{line}: quoted lines not found in minitf/:\n" + "\n".join(stale)


LIBRARY_LINES = None


@pytest.mark.parametrize("page, code, line", blocks("py"))
def test_quoted_source_is_the_librarys_not_an_exercises(page, code, line):
    """A ```py block quotes the library: its lines are found in minitf/ outside minitf/exercises/, whose files are
    the learner's copies with the backward left out (their forward is written for reading, not the library's: a
    quote of the exercise's SiLU forward shown as minitf.layers.SiLU's would not be the code that runs). A quote of
    an exercise's own file is a ```py exercise block."""
    global LIBRARY_LINES
    if LIBRARY_LINES is None:
        LIBRARY_LINES = _source_lines(lambda f: "exercises" not in f.parts)
    only_in_exercises = _not_in(code, LIBRARY_LINES)
    assert not only_in_exercises, (f"{rel(page)}:{line}: quoted lines found only in minitf/exercises/ (quote the "
                                   f"library's code, or mark the block ```py exercise):\n"
                                   + "\n".join(only_in_exercises))


@pytest.mark.parametrize("page, code, line", blocks("py exercise"))
def test_quoted_exercise_source_matches_the_exercises(page, code, line):
    """```py exercise blocks quote a learner's copy in minitf/exercises/ verbatim (up to indentation), where no
    library layer holds the code (BERT's tanh and masked-LM loss): the page says it is the exercise's."""
    stale = _not_in(code, _source_lines(lambda f: "exercises" in f.parts))
    assert not stale, f"{rel(page)}:{line}: quoted lines not found in minitf/exercises/:\n" + "\n".join(stale)


FUNCTIONS_BY_LINE = {}


def _functions_by_line():
    """{normalised source line: [(function node, the file's lines)]} for every line of every function in minitf/
    (read once)."""
    import ast
    found = FUNCTIONS_BY_LINE
    if found:
        return found
    for f in (ROOT / "minitf").rglob("*.py"):
        text = f.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef):
                for number in range(node.body[0].lineno, node.end_lineno + 1):
                    found.setdefault(_normalise(lines[number - 1]), []).append((node, lines))
    return found


def _assignments(function, lines, name):
    """The normalised lines of ``function`` that assign ``name``."""
    import ast
    found = set()
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        if any(isinstance(t, ast.Name) and t.id == name for target in targets for t in ast.walk(target)):
            found.add(_normalise(lines[node.lineno - 1]))
    return found


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_a_quoted_backwards_return_has_each_gradient_it_returns_built_on_the_page(page):
    """A quoted ``return`` line of a function that returns gradients (names dq, dk, dv...): the line of that
    function that builds each of them is quoted on the page too (the reader follows each one back)."""
    import ast
    blocks_ = [code for info, code, _ in fenced_blocks(read(page)) if info == "py"]
    quoted = {_normalise(q) for code in blocks_ for q in code.splitlines()}
    functions = _functions_by_line()
    missing = []
    for q in sorted(quoted):
        if not q.startswith("return ") or len(functions.get(q, [])) != 1:
            continue
        function, lines = functions[q][0]
        try:
            names = {n.id for n in ast.walk(ast.parse(q.partition("#")[0].strip()[len("return "):]))
                     if isinstance(n, ast.Name) and n.id.startswith("d")}
        except SyntaxError:
            continue
        missing += [f"{name} (returned by: {q})" for name in sorted(names)
                    if _assignments(function, lines, name) and not _assignments(function, lines, name) & quoted]
    assert not missing, f"{rel(page)}: quoted returns of gradients whose building line is not quoted: {missing}"


SOURCE_INDENTS = None


@pytest.mark.parametrize("page, code, line", blocks("py"))
def test_quoted_source_keeps_the_codes_indentation(page, code, line):
    """A quoted line is indented as in the code: a reader who copies a line of a method, or of an
    ``if`` inside it, sees where it sits (a quote that leaves out the ``if`` around its lines shows
    them one level out, and fails). Lines not found in minitf/ are the test above's."""
    global SOURCE_INDENTS
    if SOURCE_INDENTS is None:
        SOURCE_INDENTS = {}
        for f in (ROOT / "minitf").rglob("*.py"):
            for l in f.read_text(encoding="utf-8").splitlines():
                SOURCE_INDENTS.setdefault(_normalise(l), set()).add(len(l) - len(l.lstrip(" ")))
    quoted = [(q, len(q) - len(q.lstrip(" ")), SOURCE_INDENTS.get(_normalise(q))) for q in code.splitlines()
              if _normalise(q) not in ("", "...")]
    moved = [f"{indent} spaces, the code has {sorted(found)}: {q.strip()}" for q, indent, found in quoted
             if found and indent not in found]
    assert not moved, f"{rel(page)}:{line}: quoted lines indented otherwise than in minitf/:\n" + "\n".join(moved)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_display_math_is_balanced(page):
    lines = [l.strip() for l in prose(read(page)).splitlines()]
    assert sum(l.count("$$") for l in lines) % 2 == 0, f"{rel(page)}: unbalanced $$"


def test_no_control_character_in_prose():
    """A control character in prose is an escape gone wrong: "\\text" written as "\text" in a
    Python string became a tab ("dL/d<TAB>ext{logits}"). Code blocks may hold tabs (tool output)."""
    found = [f"{rel(page)}:{number}: {line.strip()!r}" for page in PAGES
             for number, line in enumerate(prose(read(page)).splitlines(), 1)
             if any(ord(c) < 32 for c in line)]
    assert not found, "control characters in prose:\n" + "\n".join(found)


def silu_derivative_facts():
    """Where SiLU's derivative s + g s (1 - s) reaches 1, its peak and its minimum, from minitf's own backward
    (dy = 1) on a grid of step 1e-4 over [-8, 8]: {name: value}."""
    from minitf.layers import SiLU
    g = backend.host.linspace(-8.0, 8.0, 160001)
    with backend.default_dtype("float64"):
        layer = SiLU()
        layer.forward(backend.asarray(g))
        d = backend.to_numpy(layer.backward(backend.asarray(backend.host.ones_like(g))))
    up = backend.host.nonzero((d[:-1] - 1) * (d[1:] - 1) < 0)[0]
    zero = backend.host.nonzero(d[:-1] * d[1:] < 0)[0]
    assert len(up) == 1 and len(zero) == 1, "SiLU' crosses 1 once and 0 once"
    top, bottom = int(d.argmax()), int(d.argmin())
    return {"reaches 1 at": g[up[0]], "reaches 0 at": g[zero[0]], "peak": d[top], "peak at": g[top], "minimum": d[bottom],
            "minimum at": g[bottom], "at 0": d[80000]}


def test_the_swiglu_page_states_silus_derivative_as_the_backward_computes_it():
    """docs/layers/swiglu.md states where SiLU's derivative reaches 1, its peak and its minimum: each number
    as minitf.layers.SiLU's backward gives it, to the digits written."""
    text = " ".join(read(DOCS / "layers" / "swiglu.md").split())
    facts = silu_derivative_facts()
    stated = re.search(r"\$\\tfrac12\$ at \$g = 0\$, reaches 1 at \$g \\approx (?P<one>[\d.]+)\$, peaks at "
                       r"\$(?P<peak>[\d.]+)\$ near \$g \\approx (?P<peak_at>[\d.]+)\$ and falls back to 1 from above; "
                       r"it is negative for \$g < -(?P<zero>[\d.]+)\$, down to \$(?P<minimum>-[\d.]+)\$ near "
                       r"\$g \\approx (?P<minimum_at>-[\d.]+)\$", text)
    assert stated, "docs/layers/swiglu.md no longer states SiLU's derivative in the sentence this test reads"
    assert facts["at 0"] == 0.5
    for name, fact in (("one", facts["reaches 1 at"]), ("peak", facts["peak"]), ("peak_at", facts["peak at"]),
                       ("zero", -facts["reaches 0 at"]), ("minimum", facts["minimum"]),
                       ("minimum_at", facts["minimum at"])):
        written = stated.group(name)
        digits = len(written.partition(".")[2])
        assert abs(float(written) - fact) <= 0.5 * 10 ** -digits + 1e-4, (name, written, fact)


def meta_ffn_width(d_model, multiple_of, multiplier=None):
    """The feed-forward width of Meta's Llama code (model.py's FeedForward): 2/3 of 4 D, times
    ``ffn_dim_multiplier`` when the model sets one, rounded up to a multiple of ``multiple_of``."""
    hidden = int(2 * (4 * d_model) / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def test_the_swiglu_pages_widths_follow_metas_rule():
    """docs/layers/swiglu.md's table of feed-forward widths: each row's F is what Meta's rule makes of its D,
    multiplier and multiple; Llama 2 70B is in it with its multiplier 1.3 (F = 28672, not 8/3 D rounded to 256)."""
    rows = re.findall(r"^\| ([^|]+) \| (\d+) \| (none|[\d.]+) \| (\d+) \| (\d+) \|$",
                      read(DOCS / "layers" / "swiglu.md"), re.M)
    assert len(rows) >= 4, "docs/layers/swiglu.md: no table of feed-forward widths (models | D | multiplier | ...)"
    for models, d, multiplier, multiple, width in rows:
        expected = meta_ffn_width(int(d), int(multiple), None if multiplier == "none" else float(multiplier))
        assert int(width) == expected, (models, width, expected)
    assert any("Llama 2 70B" in models and multiplier == "1.3" and width == "28672"
               for models, _, multiplier, _, width in rows), rows


@pytest.mark.parametrize("name", ["llama.md", "layers/llama_block.md"])
def test_the_llama_pages_say_which_llamas_tie_their_embeddings(name):
    """Llama 2 and Llama 3 (8B, 70B, 405B) have an output matrix of their own; Llama 3.2 1B and 3B tie it to the
    embedding (their config.json's tie_word_embeddings is true): a page that calls "Llama 3" untied names the sizes,
    and names the two that tie."""
    text = " ".join(read(DOCS / name).split())
    for match in re.finditer(r"untied \(([^)]*)\)|a matrix of its own otherwise \(([^)]*)\)", text):
        said = match.group(1) or match.group(2)
        assert not re.search(r"\b3\b", said) or re.search(r"3\.2|\d+B", said), \
            f"docs/{name}: '{match.group(0)}' calls every Llama 3 untied"
    assert re.search(r"Llama 3\.2 1B and 3B[^.]*tie", text), f"docs/{name}: say that Llama 3.2 1B and 3B tie"


def test_the_study_guides_page_list_names_every_page():
    listed = read(DOCS / "README.md").split("## All pages", 1)[1]
    missing = [rel(page) for page in PAGES if page.name != "README.md"
               and f"]({page.relative_to(DOCS).as_posix()})" not in listed]
    assert not missing, f"docs/README.md's page list leaves out: {missing}"


# --------------------------------------------------------------------------- #
# OUTPUT LABELS. Every ```text block carries one label in its info string:
#
#   ```text output-of: python -m minitf.gradcheck layernorm --seed 0
#       the block is what that command prints (stdout), run from the repository root with
#       this checkout first on PYTHONPATH; only `python -m minitf...` and `python scripts/...`
#       commands are allowed;
#   ```text output-of: python block above
#       the block is what the nearest ```python block above it on the page prints;
#   ```text recorded: <where it comes from>
#       output of something too slow to rerun in a test (a 13-minute training run, a
#       hypothesis search); the label must say what produced it;
#   ```text diagram
#       a drawing, not output.
#
# Comparison: line by line, trailing spaces ignored; a line that is exactly "..." in the
# block stands for any number of lines (zero or more) of the real output, so a page may
# show an excerpt. One normalisation: a number in e-notation at or below 1e-7 (the
# rounding noise of a gradient check, "3.6e-10") matches any other such number, because
# its digits depend on the BLAS build and the CPU. Everything else must match to the last
# digit: the commands print no timings and seed every random draw.
# --------------------------------------------------------------------------- #
TEXT_LABEL = re.compile(r"^text (output-of: (?P<command>.+)|recorded: .+|diagram)$")
TEXT_PAGES = PAGES + [ROOT / "README.md"]


def text_blocks():
    return [(page, info, code, line) for page in TEXT_PAGES
            for info, code, line in fenced_blocks(read(page)) if info.split(" ")[0] == "text"]


def test_every_text_block_is_labelled():
    unlabelled = [f"{rel(page)}:{line}: ```{info}" for page, info, _, line in text_blocks()
                  if not TEXT_LABEL.match(info)]
    assert not unlabelled, ("```text blocks need a label (output-of: COMMAND, output-of: python block above, "
                            "recorded: SOURCE, or diagram):\n" + "\n".join(unlabelled))


ROUNDING_NOISE = re.compile(r"\b\d(?:\.\d+)?e-(?:0?[7-9]|[1-9]\d)\b")


def _noise(line):
    return ROUNDING_NOISE.sub("<noise>", line.rstrip())


def output_matches(expected, actual):
    """True if ``actual`` lines equal ``expected`` lines, where an expected "..." line
    matches any run of actual lines (trailing whitespace ignored everywhere)."""
    want = [_noise(l) for l in expected.strip("\n").splitlines()]
    got = [_noise(l) for l in actual.strip("\n").splitlines()]

    def match(i, j):
        if i == len(want):
            return j == len(got)
        if want[i] == "...":
            return any(match(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and want[i] == got[j] and match(i + 1, j + 1)

    return match(0, 0)


def test_output_matching_is_strict():
    """The comparison itself can fail: a changed digit, a missing line or an extra line."""
    assert output_matches("a\n...\nd\n", "a\nb\nc\nd\n")
    assert output_matches("a\n...\n", "a\n")
    assert not output_matches("a 1.0\n", "a 1.5\n")
    assert not output_matches("a\nb\n", "a\nb\nc\n")
    assert not output_matches("a\n...\nd\n", "a\nb\nc\n")
    assert output_matches("x 3.6e-10 ok\n", "x 4.1e-11 ok\n")        # rounding noise
    assert not output_matches("x 3.6e-10 ok\n", "x 3.6e-02 ok\n")    # a real error is not noise
    assert not output_matches("x 9.33e-01\n", "x 4.85e-01\n")


def run_command(command):
    argv = shlex.split(command)
    assert argv[0] == "python" and (argv[1:2] == ["-m"] and argv[2].startswith("minitf")
                                    or argv[1].startswith("scripts/")), command
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable] + argv[1:], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"{command} failed:\n{done.stderr[-2000:]}"
    return done.stdout


def python_block_above(page, line):
    before = [(code, l) for info, code, l in fenced_blocks(read(page)) if info == "python" and l < line]
    assert before, f"{rel(page)}:{line}: no ```python block above"
    code, l = before[-1]
    out = io.StringIO()
    dtype = backend.get_default_dtype()
    import numpy as np
    printoptions = np.get_printoptions()
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"{rel(page)}:{l}", "exec"), {"__name__": "__docs__"})
    finally:
        os.chdir(cwd)
        np.set_printoptions(**printoptions)
        backend.set_default_dtype(dtype)
        backend.manual_seed(0)
    return out.getvalue()


def output_blocks():
    found = []
    for page, info, code, line in text_blocks():
        match = TEXT_LABEL.match(info)
        if match and match.group("command"):
            found.append(pytest.param(page, match.group("command").strip(), code, line, id=f"{rel(page)}:{line}"))
    return found


@pytest.mark.parametrize("page, command, shown, line", output_blocks())
def test_shown_output_is_what_the_command_prints(page, command, shown, line):
    if backend.get_device() != "cpu":
        pytest.skip("the recorded outputs are CPU (NumPy) outputs")
    if command == "python block above":
        actual = python_block_above(page, line)
    else:
        actual = run_command(command)
    assert output_matches(shown, actual), (
        f"{rel(page)}:{line}: the block no longer matches `{command}`; it prints now:\n{actual}")


# --------------------------------------------------------------------------- #
# THE FRONT PAGE AND THE TENSE OF THE DOCS. README.md is a front page (the rest lives in
# docs/), with the study guide on its first screen; user documentation speaks of the
# software as it is, so the words of a work log (rounds, issues, dates) stay out of its
# prose. Fenced blocks are not prose: a recorded translation may say "today".
# --------------------------------------------------------------------------- #
README_MAX_LINES = 200  # the lead's bar for issue 36 (opus-mt's commands)
NOTEBOOK_WORDS = re.compile(
    r"\b(this round|first round|second round|last round|the issue|before this change|this session|today)\b"
    r"|\b20\d\d-\d\d\b|\bon 20\d\d\b"
    r"|\b(January|February|March|April|June|July|August|September|October|November|December)\b", re.I)
#: docs/README.md (the study guide) is being reworded elsewhere; it joins the check once that lands.
TENSE_EXEMPT = set()


def notebook_words(text):
    """[(line number, word)] of work-log words in the prose of a page."""
    return [(number, m.group(0)) for number, line in enumerate(prose(text).splitlines(), 1)
            for m in NOTEBOOK_WORDS.finditer(line)]


def test_readme_is_a_front_page_with_the_study_guide_on_its_first_screen():
    lines = read(ROOT / "README.md").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"
    assert any("(docs/README.md)" in line for line in lines[:30]), "link the study guide in README's first 30 lines"


def test_notebook_words_are_found():
    """The check itself can fail, and ignores fenced blocks."""
    assert [w for _, w in notebook_words("As measured in the first round,\nat 2026-12-01\n")] == \
        ["first round", "2026-12"]
    assert notebook_words("measured on 2026 hardware") and notebook_words("the issue says")
    assert notebook_words("Since December the budget") and notebook_words("measured Today")
    assert not notebook_words("```text recorded: x\nThe weather is well today.\n```\n")
    assert not notebook_words("Vaswani et al., 2017; a roundabout; the issues of a checkpoint\n")


@pytest.mark.parametrize("page", [p for p in TEXT_PAGES if rel(p) not in TENSE_EXEMPT], ids=rel)
def test_docs_speak_of_the_software_as_it_is(page):
    found = notebook_words(read(page))
    assert not found, f"{rel(page)}: work-log words in prose (history lives in git log):\n" + "\n".join(
        f"  line {n}: {w!r}" for n, w in found)
