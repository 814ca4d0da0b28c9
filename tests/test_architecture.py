"""The layout: the core (the library a learner reads); the application on top of it: the
training machinery both models share (minitf.training), translation (minitf.nmt) and language
modelling (minitf.lm); and the tools run as files (``train.py``, ``benchmarks/*.py``,
``scripts/*.py``). Imports go from the application to the core, never back; neither model's
package imports the other's; the library never imports a tool; a tool imports no other tool
except a folder's shared module (``benchmarks/common.py``); and nothing imports in a circle.

The graph is built from the source with ``ast`` (every import statement, also
those inside functions), not by importing anything."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minitf"
#: Folders of scripts run as ``python folder/name.py``: Python puts the script's folder first on
#: sys.path, so ``import common`` there is the sibling ``common.py``.
SCRIPT_FOLDERS = ("benchmarks", "scripts")
#: The modules of the script folders that other files may import: what the folder's scripts share.
SHARED = {"benchmarks.common"}
#: Entry points of the application, above the model packages: the commands with a short name (minitf.train is
#: the train.py command, which picks a model's task by --model).
APPLICATION_ENTRY_POINTS = {"minitf.translate", "minitf.generate", "minitf.train", "minitf.export"}
APPLICATION_ENTRY_POINTS |= {"minitf.inspect"}  # the inspection page (issue 37): above both models
APPLICATION_ENTRY_POINTS |= {"minitf.trace"}  # the trace: each kind's example and walk, found through the registry
APPLICATION_ENTRY_POINTS |= {"minitf.fill_mask", "minitf.classify"}  # the BERT kind's commands
def _kind_packages():
    """({kind name: its package}, {package: the packages it extends}) from the registry (minitf.kinds) and each kind's
    ``extends``: a new kind's package is checked the moment its registry line is written."""
    from minitf import kinds
    package = {name: module.rsplit(".", 1)[0] for name, module in kinds.KINDS.items()}
    return package, {package[kind.name]: tuple(package[other] for other in kind.extends) for kind in kinds.every()
                     if kind.extends}


#: The model packages, one per kind in the registry: none imports another (what they share belongs in
#: minitf.training), except where a kind extends another (``Kind.extends``: the Llama family trains with the
#: language model's task, trainer and tokenizers).
MODEL_PACKAGES = tuple(dict.fromkeys(_kind_packages()[0].values()))
EXTENDS = _kind_packages()[1]
#: The application's packages: the shared training machinery, one package per model kind, the registry of the
#: kinds and the one loader.
APPLICATION_PACKAGES = ("minitf.training", *MODEL_PACKAGES, "minitf.kinds", "minitf.loader")
#: The core's model modules (the models a learner reads): the shared machinery imports none of them.
CORE_MODEL_MODULES = ("minitf.transformer", "minitf.gpt")


def module_name(path, root=ROOT):
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root=ROOT):
    """{module name: path} of the package, the script folders and the top folder's scripts."""
    paths = sorted((root / "minitf").rglob("*.py")) + sorted(root.glob("*.py"))
    paths += [p for folder in SCRIPT_FOLDERS for p in sorted((root / folder).glob("*.py"))]
    return {module_name(p, root): p for p in paths}


def package_of(name, packages):
    """The package of ``packages`` that module ``name`` belongs to, or None."""
    return next((p for p in packages if name == p or name.startswith(p + ".")), None)


def is_application(name):
    return package_of(name, APPLICATION_PACKAGES) is not None or name in APPLICATION_ENTRY_POINTS


def is_library(name):
    return name == "minitf" or name.startswith("minitf.")


def imported_modules(path, name, known):
    """The known modules that file ``path`` (module ``name``) imports: ``from minitf.nmt import
    data`` counts ``minitf.nmt.data``, ``from minitf.nmt.data import Corpus`` counts
    ``minitf.nmt.data``; in a script folder, ``import common`` counts the sibling
    ``<folder>.common``. The package ``minitf`` itself is left out (every submodule runs its
    __init__)."""
    found = set()
    folder = name.rpartition(".")[0] if name.partition(".")[0] in SCRIPT_FOLDERS else None

    def owner(imported):  # the sibling script, else the longest known module that ``imported`` lies in
        if folder and f"{folder}.{imported.partition('.')[0]}" in known:
            return f"{folder}.{imported.partition('.')[0]}"
        while imported and imported not in known:
            imported = imported.rpartition(".")[0]
        return imported

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(owner(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import (use absolute imports)"
            found.update(owner(f"{node.module}.{alias.name}") for alias in node.names)
    return {m for m in found if m and m != "minitf"}


def import_graph(root=ROOT):
    known = modules(root)
    return {name: imported_modules(path, name, known) - {name} for name, path in known.items()}


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


def tool_imports(graph):
    """{importer: [scripts it imports]}: every import of a script (``train``, a module of a
    script folder) that is not a shared module."""
    wrong = {name: sorted(m for m in imports if not is_library(m) and m not in SHARED)
             for name, imports in graph.items()}
    return {k: v for k, v in wrong.items() if v}


def test_the_graph_sees_real_imports():
    graph = import_graph()
    assert "minitf.module" in graph["minitf.layers"]
    assert "minitf.kinds" in graph["minitf.training.checkpoint"]
    assert "minitf.training.checkpoint" in graph["minitf.train"]
    assert "minitf.transformer" in graph["minitf.nmt.translation_trainer"]
    assert "minitf.training.text" in graph["minitf.nmt.data"]
    assert {"minitf.training.trainer", "minitf.nmt.decode"} <= graph["minitf.nmt.translation_trainer"]
    assert "minitf.kinds" in graph["minitf.train"]
    assert "minitf.nmt.task" in graph["minitf.nmt.kind"] and "minitf.lm.task" in graph["minitf.lm.kind"]
    assert {"minitf.loader", "minitf.nmt.kind"} <= graph["minitf.nmt.translate"]
    assert "minitf.nmt.translation_trainer" in graph["minitf.nmt.task"]
    assert "minitf.lm.trainer" in graph["minitf.lm.task"]
    assert "minitf.train" in graph["train"]
    assert "minitf.nmt.decode" in graph["scripts.compare_devices"]
    for script in ("benchmark", "ab_step", "layer_profile", "data_parallel", "torch_equal_minutes", "gpt_step",
                   "torch_lm_equal_minutes", "marian_opus", "llama_step", "bert_step", "torch_bert_equal_minutes",
                   "moe_step"):
        assert "benchmarks.common" in graph[f"benchmarks.{script}"], script


def test_a_script_folder_sibling_import_is_seen(tmp_path):
    (tmp_path / "minitf").mkdir()
    (tmp_path / "minitf" / "__init__.py").write_text("")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "one.py").write_text("import two\nimport numpy\n")
    (tmp_path / "benchmarks" / "two.py").write_text("def f():\n    from one import main\n")
    (tmp_path / "benchmarks" / "common.py").write_text("from benchmarks.two import f\n")
    graph = import_graph(tmp_path)
    assert graph["benchmarks.one"] == {"benchmarks.two"}
    assert graph["benchmarks.common"] == {"benchmarks.two"}
    cycle = find_cycle(graph)
    assert cycle[0] == cycle[-1] and set(cycle) == {"benchmarks.one", "benchmarks.two"}, cycle
    assert tool_imports(graph) == {"benchmarks.one": ["benchmarks.two"], "benchmarks.two": ["benchmarks.one"],
                                   "benchmarks.common": ["benchmarks.two"]}


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


#: The one crossing allowed: ``minitf.load(path)``, the application's loader offered at the top of the package,
#: imported inside the function when it is called (never when ``import minitf`` runs: checked below).
TOP_LEVEL_LOADER = ("minitf", "minitf.loader")


def test_the_core_never_imports_the_application():
    wrong = {core: sorted(m for m in imports if is_application(m) and (core, m) != TOP_LEVEL_LOADER)
             for core, imports in import_graph().items() if is_library(core) and not is_application(core)}
    wrong = {k: v for k, v in wrong.items() if v}
    assert not wrong, f"core modules importing the application: {wrong}"
    module_level = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8")).body
    imported = {node.module for node in module_level if isinstance(node, ast.ImportFrom)}
    assert TOP_LEVEL_LOADER[1] not in imported and "minitf.kinds" not in imported, \
        "import minitf must not import the application (minitf.load imports its loader when called)"


def model_crossings(graph):
    """{importer: [modules of another model's package it imports]}."""
    wrong = {}
    for name, imports in graph.items():
        mine = package_of(name, MODEL_PACKAGES)
        allowed = (None, mine, *EXTENDS.get(mine, ()))
        crossing = sorted(m for m in imports if mine and package_of(m, MODEL_PACKAGES) not in allowed)
        if crossing:
            wrong[name] = crossing
    return wrong


def test_neither_model_imports_the_other():
    """Translation (minitf.nmt) and language modelling (minitf.lm) share only minitf.training and the core; a kind
    that extends another (EXTENDS: the Llama family, the language model) imports that one, never the reverse."""
    wrong = model_crossings(import_graph())
    assert not wrong, f"a model's modules importing the other's (move what they share into minitf.training): {wrong}"


def test_the_packages_come_from_the_registry():
    assert {"minitf.nmt", "minitf.lm", "minitf.llama"} <= set(MODEL_PACKAGES)
    assert EXTENDS["minitf.llama"] == ("minitf.lm",) and "minitf.nmt" not in EXTENDS


def test_model_crossings_are_seen():
    graph = {"minitf.lm.data": {"minitf.nmt.data", "minitf.training.text"}, "minitf.nmt.decode": {"minitf.lm"},
             "minitf.train": {"minitf.nmt.data", "minitf.lm.data"}, "minitf.nmtx": {"minitf.lm"},
             "minitf.llama.task": {"minitf.lm.task", "minitf.nmt.data"}, "minitf.lm.trainer": {"minitf.llama.model"}}
    assert model_crossings(graph) == {"minitf.lm.data": ["minitf.nmt.data"], "minitf.nmt.decode": ["minitf.lm"],
                                      "minitf.llama.task": ["minitf.nmt.data"], "minitf.lm.trainer": ["minitf.llama.model"]}
    assert is_application("minitf.training.trainer") and is_application("minitf.generate")
    assert not is_application("minitf.gpt") and not is_application("minitf.nmtx")


def test_the_shared_training_machinery_imports_no_model():
    """minitf.training serves every model kind and imports none: neither a kind's package nor a model module of the
    core (minitf.transformer, minitf.gpt); a kind's differences live in its own package (its Kind,
    a Trainer subclass, a Task), found through the registry (minitf.kinds), never in an if/else here."""
    wrong = {name: sorted(m for m in imports if package_of(m, MODEL_PACKAGES + CORE_MODEL_MODULES))
             for name, imports in import_graph().items() if package_of(name, ("minitf.training",))}
    wrong = {k: v for k, v in wrong.items() if v}
    assert not wrong, f"shared training modules importing a model's package: {wrong}"


def upward_imports(graph):
    """{importer: [entry points it imports]}: a module of the application's packages (or the core) that imports
    a command above them."""
    wrong = {name: sorted(m for m in imports if m in APPLICATION_ENTRY_POINTS)
             for name, imports in graph.items() if is_library(name) and name not in APPLICATION_ENTRY_POINTS}
    return {k: v for k, v in wrong.items() if v}


def command_model_imports(graph, command="minitf.train"):
    """The modules of the model packages and the core's model modules that a command imports."""
    return sorted(m for m in graph[command] if package_of(m, MODEL_PACKAGES + CORE_MODEL_MODULES))


def test_the_train_command_sits_above_the_models_and_knows_only_their_tasks():
    """minitf.train finds a kind's task through the registry (minitf.kinds) by --model and contains no model's
    details: it imports nothing of a model package, and nothing below it imports it back. The one loader
    (minitf.loader) likewise imports no kind."""
    graph = import_graph()
    assert not upward_imports(graph), f"modules importing a command above them: {upward_imports(graph)}"
    assert not command_model_imports(graph), f"the command imports a model's modules: {command_model_imports(graph)}"
    for registry in ("minitf.kinds", "minitf.loader"):
        assert not command_model_imports(graph, registry), (registry, command_model_imports(graph, registry))


def test_upward_and_model_imports_of_the_command_are_seen():
    graph = {"minitf.train": {"minitf.nmt.task", "minitf.lm.data", "minitf.training.task"},
             "minitf.nmt.task": {"minitf.train"}, "minitf.lm.generate": {"minitf.generate"}, "train": {"minitf.train"}}
    assert upward_imports(graph) == {"minitf.nmt.task": ["minitf.train"], "minitf.lm.generate": ["minitf.generate"]}
    assert command_model_imports(graph) == ["minitf.lm.data", "minitf.nmt.task"]


def test_the_library_never_imports_a_tool():
    wrong = {name: sorted(m for m in imports if not is_library(m))
             for name, imports in import_graph().items() if is_library(name)}
    wrong = {k: v for k, v in wrong.items() if v}
    assert not wrong, f"library modules importing a script: {wrong}"


def test_no_script_imports_another_script():
    """Scripts share code through a shared module (benchmarks/common.py), never by importing each other."""
    graph = import_graph()
    assert {name.partition(".")[0] for name in graph} >= set(SCRIPT_FOLDERS), "a script folder went unseen"
    wrong = tool_imports(graph)
    assert not wrong, f"scripts importing another script (move what they share into {sorted(SHARED)}): {wrong}"


def package_graph(graph):
    """The import graph between minitf's sub-packages (minitf.study, minitf.gradcheck, minitf.training, ...):
    each module of a sub-package folded into it (minitf.study.inspection.page into minitf.study); the core's
    modules (minitf.layers, ...), the tools and the scripts stay themselves. Imports inside a package vanish."""
    packages = {".".join(path.relative_to(ROOT).parts[:2]) for path in PACKAGE.glob("*/__init__.py")}

    def fold(name):
        top = ".".join(name.split(".")[:2])
        return top if top in packages else name

    folded = {}
    for name, imports in graph.items():
        folded.setdefault(fold(name), set()).update(fold(m) for m in imports)
    return {name: imports - {name} for name, imports in folded.items()}


def test_no_import_cycle_between_packages():
    """Imports between packages go one way too: a module of minitf.study importing minitf.gradcheck while a
    module of minitf.gradcheck imports minitf.study is a cycle of packages, though no module imports itself
    back (what both need belongs below both)."""
    cycle = find_cycle(package_graph(import_graph()))
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle)


def test_a_package_cycle_is_seen():
    graph = {"minitf.study.bugs": {"minitf.gradcheck.numeric"}, "minitf.gradcheck.command": {"minitf.study.bugs"},
             "minitf.gradcheck.numeric": {"minitf.module"}, "minitf.module": set()}
    assert find_cycle(graph) is None
    cycle = find_cycle(package_graph(graph))
    assert cycle is not None and set(cycle) == {"minitf.study", "minitf.gradcheck"}, cycle
