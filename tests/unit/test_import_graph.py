"""What the dashboard imports before its first frame: the first screen, not the rest (issue 26, first frame ≤ 0.25 s).

``python -m tpudash`` runs on a pseudo-terminal, as a user starts it, with
``TPUDASH_EXIT_AFTER_FIRST_FRAME``: it names every module it had imported
when its first frame was drawn, and exits. The other screens, the plots,
the lane (jobs, the engine's protocol, the runs store, psutil) and
TensorFlow load after that frame.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.terminal import run_on_a_terminal

PROJECT = Path(__file__).resolve().parents[2]
# Each costs the first frame 10–40 ms of imports; none is needed to draw Devices.
LOADED_AFTER_THE_FIRST_FRAME = (
    "tensorflow",
    "plotext",
    "textual_plotext",
    "aiohttp",
    "screens.jobs",
    "screens.history",
    "screens.run",
    "screens.log",
    "screens.help",
    "tpudash.tui.plots",
    "tpudash.tui.runview",
    "tpudash.engine.lane",
    "tpudash.runs.store",
    "psutil",
)


def modules_at_first_frame(tmp_path: Path) -> set[str]:
    environment = dict(
        os.environ,
        TPUDASH_EXIT_AFTER_FIRST_FRAME="1",
        TERM="xterm-256color",
        TPUDASH_RUNS_DIR=str(tmp_path),
    )
    code, output = run_on_a_terminal([sys.executable, "-m", "tpudash"], environment, timeout=60, cwd=str(PROJECT))
    said = re.search(rb"modules_at_first_frame=(\S+)", output)
    assert code == 0 and said is not None, output[-800:]
    return set(said.group(1).decode().split(","))


@pytest.fixture(scope="module")
def modules_seen_at_first_frame(tmp_path_factory) -> set[str]:
    return modules_at_first_frame(tmp_path_factory.mktemp("runs"))


def test_the_first_frame_imports_only_the_first_screen(modules_seen_at_first_frame):
    modules = modules_seen_at_first_frame
    assert "screens.devices" in modules  # the first screen, drawn
    assert "textual.app" in modules
    loaded_too_early = sorted(name for name in LOADED_AFTER_THE_FIRST_FRAME if name in modules)
    assert loaded_too_early == []


def test_the_first_frame_imports_neither_the_jobs_nor_their_event_decoder(modules_seen_at_first_frame):
    # jobs.base → jobs.events → msgspec: ~30 ms of the first frame; the dashboard reads events only once a run shows.
    protocol = sorted(name for name in modules_seen_at_first_frame if name.split(".")[0] in ("jobs", "msgspec"))
    assert protocol == []
