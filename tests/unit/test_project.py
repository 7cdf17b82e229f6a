"""The project's own contracts: CI runs the README's test and install commands, modules say what they are for."""

from __future__ import annotations

import ast
import importlib
import os
import re
import sys

import tomllib

from tests.conftest import REPO_ROOT
from tests.terminal import run_on_a_terminal


def readme_commands() -> list[str]:
    readme = (REPO_ROOT / "README.md").read_text()
    return re.findall(r"```(?:sh|bash)\n(.*?)\n```", readme, flags=re.S)


def test_ci_runs_exactly_the_readme_test_command():
    test_commands = [block for block in readme_commands() if "pytest" in block]
    assert test_commands, "README shows no test command"
    ci_script = (REPO_ROOT / ".ci" / "run").read_text()
    assert test_commands[0].strip() in ci_script


INSTALL_COMMAND = re.compile(
    r'python3 -m venv (?P<venv>\S+) && (?P=venv)/bin/pip install "\.\[(?P<extras>[^\]]*)\]"(?: && (?P=venv)/bin/(?P<script>\S+))?'
)


def test_readme_install_command_is_what_ci_installs_and_its_script_starts_the_dashboard(tmp_path):
    """The README's install line: CI installs the same extras (plus the test tools), and the script it ends with
    is pyproject's console script, which draws the dashboard on a terminal.

    This does not install anything (a unit test must be quick): the real install, in a fresh virtual
    environment, is tests/functional/test_base_install.py, and CI itself runs pip exactly as .ci/run says.
    """
    install = INSTALL_COMMAND.fullmatch(readme_commands()[0].strip())
    assert install is not None and install["script"], (
        f"README's first command is not an install: {readme_commands()[0]!r}"
    )
    ci_installs = [match for match in INSTALL_COMMAND.finditer((REPO_ROOT / ".ci" / "run").read_text())]
    assert ci_installs, ".ci/run installs nothing the README way"
    ci_install = ci_installs[0]
    assert ci_install["venv"] == install["venv"]
    assert set(ci_install["extras"].split(",")) == set(install["extras"].split(",")) | {"test"}

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert set(install["extras"].split(",")) <= set(project["optional-dependencies"])
    target = project["scripts"][install["script"]]
    module_name, function_name = target.split(":")
    assert callable(getattr(importlib.import_module(module_name), function_name))

    # What pip writes into .venv/bin/<script>, run as a user would on a terminal.
    console_script = f"import sys; from {module_name} import {function_name}; sys.exit({function_name}())"
    env = dict(os.environ, TERM="xterm-256color", TPUDASH_RUNS_DIR=str(tmp_path / "runs"))
    code, output = run_on_a_terminal([sys.executable, "-c", console_script, "--version"], env)
    assert (code, output.decode().strip()) == (0, f"tpudash {project['version']}")
    code, output = run_on_a_terminal(
        [sys.executable, "-c", console_script], dict(env, TPUDASH_EXIT_AFTER_FIRST_FRAME="1")
    )
    assert code == 0, output[-1000:]
    assert re.search(rb"first_frame_unix=[0-9.]+", output), output[-1000:]
    drawn = output.split(b"first_frame_unix=")[0]
    screen = re.sub(rb"\x1b\[[0-9;?<>$]*[a-zA-Z]", b"", drawn).decode(errors="replace")
    # The dashboard's header and key bar (" q Quit ", or compact "quit"), drawn on the terminal.
    assert "tpudash" in screen and "quit" in screen.lower()


def test_every_module_opens_with_a_docstring():
    missing = []
    for package in ("tpudash", "screens", "jobs", "tests"):
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            if not ast.get_docstring(tree) and path.stat().st_size > 0:
                missing.append(str(path.relative_to(REPO_ROOT)))
    assert missing == []


def test_every_package_in_the_tree_is_installed():
    """pyproject's package list covers every package (a directory with ``__init__.py``): an installed tpudash that
    misses one fails where the checkout works (``jobs.on_jax`` once did)."""
    import fnmatch

    include = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = [
        ".".join(init.parent.relative_to(REPO_ROOT).parts)
        for root in ("tpudash", "screens", "jobs")
        for init in sorted((REPO_ROOT / root).rglob("__init__.py"))
    ]
    left_out = [name for name in packages if not any(fnmatch.fnmatchcase(name, p) for p in include["include"])]
    assert "jobs.on_jax" in packages and left_out == []
