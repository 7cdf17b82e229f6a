"""The README's examples of what the program prints are the program's own words, checked here."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from jobs.base import ParamError
from jobs.matmul import check_memory
from tests.conftest import REPO_ROOT

GIB = 2**30


def readme_text() -> str:
    """The README with its line breaks undone, so a quoted message reads as one line."""
    return " ".join((REPO_ROOT / "README.md").read_text(encoding="utf-8").split())


def test_the_readmes_memory_refusal_is_what_the_matmul_check_says():
    quoted = re.search(
        r"`(m: m=(\d+), k=(\d+), n=(\d+) \((\w+)\) needs [^`]* ([\d.]+) GiB available;[^`]*)`", readme_text()
    )
    assert quoted is not None, "the README no longer shows the memory refusal"
    example, m, k, n, dtype, available = quoted.groups()
    params = {"m": int(m), "k": int(k), "n": int(n), "dtype": dtype}

    # The machine's free memory is the README's example figure; the rest is computed.
    with pytest.raises(ParamError) as refusal:
        check_memory(params, SimpleNamespace(kind="CPU"), available_host=int(float(available) * GIB))

    assert str(refusal.value) == example


def test_the_readmes_gradient_descent_result_is_what_the_job_prints(isolated_runs_dir, capsys):
    from tpudash.cli import main as cli

    quoted = re.search(r"tpudash run gradient-descent +# prints ([^`\n]+?) (?=tpudash|```)", readme_text())
    assert quoted is not None, "the README no longer shows what `tpudash run gradient-descent` prints"

    assert cli.main(["run", "gradient-descent", "--json"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    assert quoted.group(1) in [event["text"] for event in events if event["type"] == "log"]
