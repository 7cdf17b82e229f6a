"""``tpudash agent`` stopped cleanly (SIGTERM) leaves its host ``stopped``, never ``stale``, and without its last figures.

The agent is a real process on a local runs directory, its libtpu service
a loopback port nothing answers on; ``tpudash hosts`` is run as a user runs
it, table and ``--json``. (Killed with SIGKILL, an agent's host turns stale:
tests/functional/test_agents.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO_ROOT
from tpudash.runs.hosts import HostsReader

# An agent's interpreter, imports and first report on a loaded 2-core machine.
FIRST_REPORT_SECONDS = 30.0
# How often the test looks at the runs directory: a reader's poll, not a wait standing in for an event.
LOOK_EVERY = 0.1
STOP_SECONDS = 10.0


def tpudash(*argv: str) -> subprocess.CompletedProcess:
    """``python -m tpudash ARGV`` from this tree, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "tpudash", *argv], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60
    )


def test_an_agent_stopped_with_sigterm_leaves_its_host_stopped_not_stale(tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    argv = [sys.executable, "-m", "tpudash", "agent", "--name", "sim-1", "--interval", "0.2"]
    argv += ["--runs-dir", str(runs_dir), "--tpu-metrics", "127.0.0.1:9"]
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    agent = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO_ROOT, env=env)
    try:
        deadline = time.monotonic() + FIRST_REPORT_SECONDS
        while not HostsReader(runs_dir).read():
            assert time.monotonic() < deadline, "the agent never reported"
            assert agent.poll() is None, agent.stderr.read() if agent.stderr else ""
            time.sleep(LOOK_EVERY)
        (reporting,) = HostsReader(runs_dir).read()
        assert reporting.state(time.time()) == "live" and reporting.cpu_percent is not None

        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=STOP_SECONDS) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(timeout=STOP_SECONDS)
        if agent.stderr is not None:
            agent.stderr.close()

    (host,) = HostsReader(runs_dir).read()
    assert host.stopped and host.state(time.time() + 3600) == "stopped", "a clean stop read as stale"
    assert host.cpu_percent is None and host.memory_used is None

    listed = tpudash("--runs-dir", str(runs_dir), "hosts", "--json")
    assert listed.returncode == 0, listed.stderr
    (shown,) = json.loads(listed.stdout)
    assert (shown["state"], shown["stale"], shown["cpu_percent"]) == ("stopped", False, None)

    table = tpudash("--runs-dir", str(runs_dir), "hosts")
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if "sim-1" in line)
    assert "stopped" in row and "%" not in row and "live" not in row
