"""Checks of the study guide in docs/ (fast: no hypothesis, a few seconds in all).

1. every backticked reference `minitf.<module>.<Name>[.<attr>]` resolves;
2. every relative Markdown link points to an existing file (and heading anchor);
3. every layer (each ``minitf.Module`` subclass defined in a minitf module, plus
   Adam and WarmupSchedule) is named as `minitf.<module>.<Class>` on a page in docs/layers/;
4. every ```python block runs (fresh namespace, cwd = repo root);
5. every ```py block (a quote of the source) still matches the code line for line;
6. every page has balanced $$ display-math delimiters.

    python -m pytest tests/test_docs.py -q -p no:warnings
"""
import importlib
import inspect
import pathlib
import pkgutil
import re

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


def test_every_minitf_reference_resolves():
    broken = []
    for page in PAGES:
        for number, dotted in references(page):
            try:
                resolve(dotted)
            except (ImportError, AttributeError) as error:
                broken.append(f"{rel(page)}:{number}: `{dotted}` ({type(error).__name__}: {error})")
    assert not broken, "references that do not resolve:\n" + "\n".join(broken)


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


@pytest.mark.parametrize("page, code, line", blocks("py"))
def test_quoted_source_matches_the_code(page, code, line):
    """```py blocks quote minitf/ verbatim (up to indentation); a line '...' marks a gap."""
    global SOURCE_LINES
    if SOURCE_LINES is None:
        SOURCE_LINES = {_normalise(l) for f in (ROOT / "minitf").rglob("*.py")
                        for l in f.read_text(encoding="utf-8").splitlines()}
    stale = [q for q in code.splitlines()
             if _normalise(q) not in ("", "...") and _normalise(q) not in SOURCE_LINES]
    assert not stale, f"{rel(page)}:{line}: quoted lines not found in minitf/:\n" + "\n".join(stale)


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_display_math_is_balanced(page):
    lines = [l.strip() for l in prose(read(page)).splitlines()]
    assert sum(l.count("$$") for l in lines) % 2 == 0, f"{rel(page)}: unbalanced $$"
