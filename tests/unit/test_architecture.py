"""The architecture holds: no import cycle between modules, no module too big to read, a codemap that is true.

import-linter (run by .ci/run) checks who may import whom between packages;
this checks what it does not: a cycle between two modules, counting the
imports made inside functions (a lazy import still ties two modules), and
that ARCHITECTURE.md's codemap names what is really there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grimp
import pytest

from tests.conftest import REPO_ROOT

PACKAGES = ("tpudash", "screens", "jobs")
BACKENDS = REPO_ROOT / "tpudash" / "runs" / "backends.py"
MAX_MODULE_LINES = 600
ARCHITECTURE = REPO_ROOT / "ARCHITECTURE.md"


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    edges = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a long import chain cannot exhaust Python's recursion limit.
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = lowlink[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = lowlink[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    lowlink[module] = min(lowlink[module], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                lowlink[parent] = min(lowlink[parent], lowlink[module])
            if lowlink[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return cycles


@pytest.fixture(scope="module")
def project_graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def project_modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (REPO_ROOT / package).rglob("*.py"))


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import():
    graph = grimp.ImportGraph()
    for module in ("a", "b", "c", "d"):
        graph.add_module(module)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    graph.add_import(importer="c", imported="a")  # as a function-level import would
    graph.add_import(importer="c", imported="d")
    assert import_cycles(graph) == [["a", "b", "c"]]


def test_no_module_imports_itself_back_through_others(project_graph):
    cycles = import_cycles(project_graph)
    assert cycles == [], "import cycles between modules:\n" + "\n".join(" <-> ".join(cycle) for cycle in cycles)


@pytest.mark.parametrize("path", project_modules(), ids=lambda path: str(path.relative_to(REPO_ROOT)))
def test_every_module_is_short_enough_to_read_and_says_what_it_is_for(path):
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.name}: split it by what its parts do"
    if text.strip():
        assert text.lstrip().startswith(('"""', 'r"""')), f"{path.name} opens without a docstring"


def backend_classes() -> set[str]:
    """The classes ``tpudash/runs/backends.py`` defines (``LocalRunFiles``, ``BucketRoot``, …)."""
    tree = ast.parse(BACKENDS.read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef)}


def backend_isinstance_checks(source: str, classes: set[str]) -> list[int]:
    """The lines of ``source`` that ask ``isinstance(x, <a backend class>)`` (a tuple of classes included)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"):
            continue
        if len(node.args) != 2:
            continue
        asked = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
        names = {item.id if isinstance(item, ast.Name) else getattr(item, "attr", None) for item in asked}
        if names & classes:
            found.append(node.lineno)
    return found


def test_the_backend_check_finder_finds_a_check_of_a_backend_class():
    source = (
        "from tpudash.runs import backends\n"
        "isinstance(files, LocalRunFiles)\n"
        "isinstance(root, (int, backends.BucketRoot))\n"
        "isinstance(files, dict)\n"
    )
    assert backend_isinstance_checks(source, backend_classes()) == [2, 3]


def test_no_module_but_the_backends_asks_which_backend_it_holds():
    """What differs between a local directory and a store is asked of ``RunFiles`` or the root, never by class."""
    classes = backend_classes()
    assert {"LocalRunFiles", "BucketRunFiles", "LocalRoot", "BucketRoot"} <= classes
    found = [
        f"{path.relative_to(REPO_ROOT)}:{line}"
        for path in project_modules()
        if path != BACKENDS
        for line in backend_isinstance_checks(path.read_text(encoding="utf-8"), classes)
    ]
    assert found == [], "isinstance of a backend class outside tpudash/runs/backends.py (add a property there):\n" + (
        "\n".join(found)
    )


def codemap_entries() -> list[str]:
    """The dotted names the codemap's bullet lines start with (``- `tpudash.runs` ...``)."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    codemap = text.split("## Codemap", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^- `([\w./]+)`", codemap, flags=re.M)


def test_the_codemap_names_every_package_and_only_what_exists():
    entries = codemap_entries()
    packages = sorted(
        {".".join(path.relative_to(REPO_ROOT).parent.parts) for path in project_modules() if path.name == "__init__.py"}
    )
    missing = [package for package in packages if package not in entries]
    assert not missing, f"ARCHITECTURE.md's codemap has no line for {missing}"
    for entry in entries:
        as_path = REPO_ROOT / entry.replace(".", "/")
        assert as_path.is_dir() or as_path.with_suffix(".py").is_file(), f"the codemap names {entry}, which is gone"


MAX_APP_SHELL_LINES = 400


def test_the_app_shell_stays_a_shell():
    """tpudash/tui/app.py keeps the keys, modes, lifecycle and actions; a new job goes in a module of its own."""
    app_shell = REPO_ROOT / "tpudash" / "tui" / "app.py"
    lines = len(app_shell.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_APP_SHELL_LINES, f"app.py has {lines} lines: move a whole job out (see tpudash/tui/ticks.py)"
