"""The public entry points, each in a fresh process as a user reaches it: ``python -m tpudash``, ``tpudash.colab``.

The ``tpudash`` script is tests/unit/test_project.py's (pyproject's console
script on a terminal), ``tpudash.record`` is tests/unit/test_recording.py's
and ``python -m tpudash.engine`` the engine tests'.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import tomllib

import tpudash
from tests.conftest import REPO_ROOT
from tpudash import version

PROJECT_VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]


def run_python(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *arguments], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)


def test_python_dash_m_tpudash_answers_its_version():
    result = run_python("-m", "tpudash", "--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"tpudash {PROJECT_VERSION}"), result.stderr


def test_the_package_version_is_the_projects():
    assert tpudash.__version__ == version.__version__ == PROJECT_VERSION


def test_from_tpudash_import_colab_loads_it_only_when_asked_for():
    code = (
        "import sys, tpudash; before = 'tpudash.web.colab' in sys.modules; "
        "from tpudash import colab; "
        "print(before, callable(colab.show), sorted(m for m in ('tensorflow', 'textual') if m in sys.modules))"
    )
    result = run_python("-c", code)
    assert result.stdout.strip() == "False True []", result.stderr


def test_tpudash_has_no_other_lazy_attribute():
    with pytest.raises(AttributeError, match="no attribute 'dashboard'"):
        tpudash.dashboard  # noqa: B018
