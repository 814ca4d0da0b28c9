"""The layout: the core (the library a learner reads) and the translation
application on top of it (minitf.nmt). Imports go from the application to the
core, never back, and nowhere in a circle; no module grows past ~400 lines.

The graph is built from the source with ``ast`` (every import statement, also
those inside functions), not by importing anything."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minitf"
#: Entry points of the application that keep a short command name in the top folder.
APPLICATION_ENTRY_POINTS = {"minitf.translate"}
MAX_LINES = 400


def module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules():
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_application(name):
    return name == "minitf.nmt" or name.startswith("minitf.nmt.") or name in APPLICATION_ENTRY_POINTS


def imported_modules(path, known):
    """The minitf modules one file imports: ``from minitf.nmt import data`` counts
    ``minitf.nmt.data``, ``from minitf.nmt.data import Corpus`` counts ``minitf.nmt.data``.
    The package ``minitf`` itself is left out (every submodule runs its __init__)."""
    found = set()

    def owner(name):  # the longest known module that ``name`` lies in
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(owner(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import (use absolute imports)"
            found.update(owner(f"{node.module}.{alias.name}") for alias in node.names)
    return {name for name in found if name and name != "minitf"}


def import_graph():
    known = modules()
    return {name: imported_modules(path, known) - {name} for name, path in known.items()}


def find_cycle(graph):
    """One import cycle as a list of module names, or None (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for child in sorted(graph.get(node, ())):
            if state.get(child) == "open":
                return stack[stack.index(child):] + [child]
            if child not in state:
                cycle = visit(child)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_graph_sees_real_imports():
    graph = import_graph()
    assert "minitf.module" in graph["minitf.layers"]
    assert "minitf.transformer" in graph["minitf.nmt.trainer"]
    assert "minitf.nmt.checkpoint" in graph["minitf.nmt.train"]


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_core_never_imports_the_application():
    wrong = {core: sorted(m for m in imports if is_application(m))
             for core, imports in import_graph().items() if not is_application(core)}
    wrong = {k: v for k, v in wrong.items() if v}
    assert not wrong, f"core modules importing the application: {wrong}"


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_size(name):
    lines = modules()[name].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{name} has {lines} lines (> {MAX_LINES}): split it by job"
