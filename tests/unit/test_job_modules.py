"""Job modules stand alone: what two jobs share lives in a module of its own, named for what it is."""

from __future__ import annotations

import ast
from pathlib import Path

from jobs import JOB_MODULES

REPO_ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, ``from jobs import datasets`` counted as ``jobs.datasets``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_job_module_imports_another():
    for module in JOB_MODULES:
        path = REPO_ROOT / (module.replace(".", "/") + ".py")
        others = (set(JOB_MODULES) - {module}) & imported_modules(path)
        assert not others, f"{module} imports {sorted(others)}: move what they share to a module of its own"


def test_the_check_finds_such_an_import(tmp_path):
    """The test above cannot pass by reading nothing: the same reading finds both import forms."""
    source = tmp_path / "job.py"
    source.write_text("from jobs.matmul import format_gib\nfrom jobs import replicas\n", encoding="utf-8")
    assert {"jobs.matmul", "jobs.replicas"} <= imported_modules(source)
