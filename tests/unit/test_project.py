"""The project's own contracts: CI runs the README's test command, modules say what they are for."""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO_ROOT


def readme_commands() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text()
    return re.findall(r"```(?:sh|bash)\n(.*?)\n```", readme, flags=re.S)


def test_ci_runs_exactly_the_readme_test_command():
    test_commands = [block for block in readme_commands() if "pytest" in block]
    assert test_commands, "README shows no test command"
    ci_script = (REPO_ROOT / ".ci" / "run").read_text()
    assert test_commands[0].strip() in ci_script


def test_readme_install_command_installs_and_starts_the_dashboard():
    install = readme_commands()[0]
    assert "pip install" in install and install.rstrip().endswith("tpudash")


def test_every_module_opens_with_a_docstring():
    missing = []
    for package in ("tpudash", "screens", "jobs", "tests"):
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            if not ast.get_docstring(tree) and path.stat().st_size > 0:
                missing.append(str(path.relative_to(REPO_ROOT)))
    assert missing == []
