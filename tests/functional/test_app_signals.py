"""SIGTERM and SIGINT to the dashboard: the running job ends cancelled and recorded, the terminal comes back.

Each test starts the real ``tpudash`` console script on a pseudo-terminal
(120×40, xterm-256color) with its runs directory in the test's temporary
directory, and reads the terminal in a thread so the app never blocks on
output. It drives the app with keys as a user would: the palette opens the
gradient-descent form with the cursor in it, the steps field gets a count no
test waits for, enter launches. Once the run's record says it is running and
stepping, the signal goes to the process. Every wait is on something the app
writes (the screen, the run's files), never a fixed sleep.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from jobs import get_job
from tests.conftest import REPO_ROOT
from tests.unit.test_cli import USER_UNSET
from tpudash.runs.store import RunStore
from tpudash.runs.tail import read_events

# A whole-process end-to-end test: CI runs it after the default suite (pytest -m slow).
pytestmark = pytest.mark.slow

TPUDASH_SCRIPT = Path(sys.executable).with_name("tpudash")
ROWS, COLUMNS = 40, 120
EXIT_CANCELLED = 130
WAIT_SECONDS = 60
# Far more steps than the test waits for: only the signal ends this run.
ENDLESS_STEPS = "100000"
CONTROL_P = b"\x10"
TAB, ENTER = b"\t", b"\r"
# Any escape sequence: CSI (colours, cursor moves, modes), OSC, or a two-byte escape.
ESCAPE_SEQUENCE = re.compile(rb"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")
ENTER_ALTERNATE_SCREEN, LEAVE_ALTERNATE_SCREEN = b"\x1b[?1049h", b"\x1b[?1049l"
SHOW_CURSOR = b"\x1b[?25h"
CURSOR_OR_STYLE = re.compile(rb"\x1b\[([0-?]*)[ -/]*([@-~])")
# The start of an escape sequence whose end has not been read yet (a read of the pty may stop anywhere).
UNFINISHED_ESCAPE = re.compile(rb"\x1b(\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?)?")


class ScreenGrid:
    """Just enough of a terminal to read Textual's frames: cursor moves, text, and each cell's colours."""

    def __init__(self):
        self.cells = [[(" ", b"")] * COLUMNS for _ in range(ROWS)]
        self.row = self.column = 0
        self.style = b""
        self._unfinished = b""
        """The tail of the last read that splits an escape sequence or a character: read with the next."""

    def feed(self, data: bytes) -> None:
        data, self._unfinished = self._unfinished + data, b""
        position = 0
        while position < len(data):
            if data[position] == 0x1B and UNFINISHED_ESCAPE.fullmatch(data, position):
                self._unfinished = data[position:]
                return
            if data[position] == 0x1B:
                sequence = CURSOR_OR_STYLE.match(data, position)
                if sequence is not None:
                    params, command = sequence.groups()
                    if command == b"H":
                        row, _, column = params.partition(b";")
                        self.row, self.column = int(row or 1) - 1, int(column or 1) - 1
                    elif command == b"m":
                        self.style = b"" if params in (b"", b"0") else params
                    position = sequence.end()
                else:
                    other = ESCAPE_SEQUENCE.match(data, position)
                    position = other.end() if other is not None else position + 1
            elif data[position] == 0x0D:
                self.column, position = 0, position + 1
            elif data[position] == 0x0A:
                self.row, position = self.row + 1, position + 1
            else:
                lead = data[position]
                length = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
                if position + length > len(data):
                    self._unfinished = data[position:]
                    return
                if 0 <= self.row < ROWS and 0 <= self.column < COLUMNS:
                    self.cells[self.row][self.column] = (
                        data[position : position + length].decode("utf-8", "replace"),
                        self.style,
                    )
                self.column, position = self.column + 1, position + length

    def line(self, row: int) -> str:
        return "".join(char for char, _ in self.cells[row])

    def text(self) -> str:
        """What the screen shows now, line by line."""
        return "\n".join(self.line(row) for row in range(ROWS))

    def field(self, name: str, names: Sequence[str]) -> tuple[str, bool] | None:
        """Field ``name``'s shown value, and whether it has focus (its name is drawn unlike the names of
        the other fields in ``names``). A form's line is the job list's border, its name, its value."""
        labels = {}  # name -> (value, style of the name's first cell)
        for row in range(ROWS):
            line = self.line(row)
            for match in re.finditer(r"│ (\w+) +(\S+)", line):
                if match.group(1) in names:
                    labels[match.group(1)] = (match.group(2), self.cells[row][match.start(1)][1])
        if name not in labels:
            return None
        value, style = labels[name]
        others = [other_style for other, (_, other_style) in labels.items() if other != name]
        return value, bool(others) and all(other_style != style for other_style in others)


class TerminalSession:
    """``tpudash`` on a pseudo-terminal; everything it writes is collected by a reader thread."""

    def __init__(self, runs_dir: Path):
        self.master, self.terminal = pty.openpty()
        fcntl.ioctl(self.terminal, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        self.attributes_before = termios.tcgetattr(self.terminal)
        environment = {
            key: value for key, value in os.environ.items() if key not in (*USER_UNSET, "TPUDASH_NATIVE_STDERR")
        }
        environment.update(TERM="xterm-256color", COLUMNS=str(COLUMNS), LINES=str(ROWS), TPUDASH_RUNS_DIR=str(runs_dir))
        self.output = bytearray()
        self.screen = ScreenGrid()
        self._changed = threading.Condition()
        self._reading = True
        self.process = subprocess.Popen(
            [str(TPUDASH_SCRIPT)],
            stdin=self.terminal,
            stdout=self.terminal,
            stderr=self.terminal,
            cwd=REPO_ROOT,
            env=environment,
            start_new_session=True,
        )
        # The test keeps its own end of the terminal open, to read its modes after the app exits.
        self._reader = threading.Thread(target=self._read, name="tpudash terminal reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if not ready:
                if self._reading:
                    continue
                return  # the app has exited and everything it wrote has been read
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            with self._changed:
                self.output += chunk
                self.screen.feed(chunk)
                self._changed.notify_all()

    # -- waiting ----------------------------------------------------------------------
    def wait_for(self, predicate, what: str, timeout: float = WAIT_SECONDS) -> None:
        """Wait until ``predicate()`` holds, checked whenever the app writes.

        Also every 0.1 s, for predicates on the run's files, which change
        between frames.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.process.poll() is not None:
                    raise AssertionError(
                        f"waited for {what}; exit code {self.process.poll()}; "
                        f"screen text so far: {self.text()[-2000:]!r}"
                    )
                self._changed.wait(min(remaining, 0.1))

    def text(self, since: int = 0) -> str:
        """What the app wrote after byte ``since``, with escape sequences removed."""
        return ESCAPE_SEQUENCE.sub(b"", bytes(self.output[since:])).decode("utf-8", errors="replace")

    def wait_for_text(self, text: str, since: int = 0) -> None:
        self.wait_for(lambda: text in self.text(since), f"{text!r} on the screen")

    # -- typing -----------------------------------------------------------------------
    def type(self, keys: bytes) -> int:
        """Type ``keys``; returns the output position before them (to wait for what they draw)."""
        mark = len(self.output)
        os.write(self.master, keys)
        return mark

    def finish(self) -> int:
        """Wait for the process to exit and the reader to drain the terminal; the exit code."""
        code = self.process.wait(WAIT_SECONDS)
        self._reading = False
        self._reader.join(WAIT_SECONDS)
        return code

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reading = False
        self._reader.join(WAIT_SECONDS)
        os.close(self.master)
        os.close(self.terminal)


@pytest.fixture
def terminal_session(isolated_runs_dir):
    sessions: list[TerminalSession] = []

    def start() -> TerminalSession:
        session = TerminalSession(isolated_runs_dir)
        sessions.append(session)
        return session

    yield start
    for session in sessions:
        session.close()


def the_running_run(runs_dir: Path) -> Path | None:
    """The one run in ``runs_dir`` once its record says running and it has taken a step, else None."""
    runs = [path for path in runs_dir.glob("*-gradient-descent-*") if (path / "run.json").exists()]
    if len(runs) != 1:
        return None
    try:
        status = json.loads((runs[0] / "run.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        return None  # being replaced right now
    events, _ = read_events(runs[0] / "events.jsonl")
    stepped = any(event.type == "progress" for _, event in events)
    return runs[0] if status == "running" and stepped else None


def launch_an_endless_descent(session: TerminalSession, runs_dir: Path) -> Path:
    """Palette → the gradient-descent form → steps = a count no test waits for → enter; the run's directory."""
    session.wait_for_text("replicas")  # the session bar shows the detected runtime
    mark = session.type(CONTROL_P)
    session.wait_for_text("Search for commands", since=mark)
    session.type(b"form gradient")
    # The palette searches as each key comes: enter only once its list is down to this one form
    # (an earlier list, with other jobs' forms first, would take enter to one of those).
    form_hit, any_form_hit = f"{get_job('gradient-descent').title}: set params, then enter to launch", "set params,"
    session.wait_for(
        lambda: form_hit in session.screen.text() and session.screen.text().count(any_form_hit) == 1,
        "the palette's list down to the gradient-descent form",
    )
    mark = session.type(ENTER)
    session.wait_for_text("learning_rate", since=mark)
    # The form opens with the cursor in its first field; one stop per field
    # shown (momentum waits for optimizer=momentum) up to steps. Typing waits
    # until steps has the focus: keys typed ahead of a focus move go to the
    # widget that had it.
    spec = get_job("gradient-descent")
    shown = [param.name for param in spec.params if param.applies(spec.defaults())]
    session.wait_for(
        lambda: session.screen.field(shown[0], shown) is not None and session.screen.field(shown[0], shown)[1],
        "the form's first field to have the focus",
    )
    session.type(TAB * shown.index("steps"))
    session.wait_for(lambda: session.screen.field("steps", shown) == ("20", True), "the steps field to have the focus")
    session.type(ENDLESS_STEPS.encode())
    session.wait_for(
        lambda: session.screen.field("steps", shown) == (ENDLESS_STEPS, True), f"steps to read {ENDLESS_STEPS}"
    )
    session.type(ENTER)
    run_dir = None

    def running() -> bool:
        nonlocal run_dir
        run_dir = the_running_run(runs_dir)
        return run_dir is not None

    session.wait_for(running, "the run's record to say running")
    assert json.loads((run_dir / "run.json").read_text())["params"]["steps"] == int(ENDLESS_STEPS)

    def stepping() -> bool:
        events, _ = read_events(run_dir / "events.jsonl")
        return any(event.type == "progress" and event.done >= 1 for _, event in events)

    # A quit ends a run within a step: the run has taken one, so its cancel comes mid-way.
    session.wait_for(stepping, "the run to take its first step")
    return run_dir


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_dashboard_cancels_the_run_records_it_and_restores_the_terminal(
    signal_number, terminal_session, isolated_runs_dir
):
    session = terminal_session()
    run_dir = launch_an_endless_descent(session, isolated_runs_dir)
    assert not termios.tcgetattr(session.terminal)[3] & termios.ECHO, "the app runs the terminal without echo"

    session.process.send_signal(signal_number)
    code = session.finish()

    assert "Traceback" not in session.text()

    [info] = RunStore(isolated_runs_dir).list_runs()
    assert info.path == str(run_dir) and info.status == "cancelled"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "cancelled"
    data = RunStore(isolated_runs_dir).load(info.run_id)
    assert data.problems == []
    assert data.events[-1][1].type == "run_finished" and data.events[-1][1].status == "cancelled"
    steps = [event.done for _, event in data.events if event.type == "progress"]
    assert 1 <= steps[-1] < int(ENDLESS_STEPS)

    # The terminal is as the app found it: out of the alternate screen with the
    # cursor shown, and (the pty's modes) echo and line editing back on.
    output = bytes(session.output)
    left = output.rfind(LEAVE_ALTERNATE_SCREEN)
    assert output.rfind(ENTER_ALTERNATE_SCREEN) < left, "the app never left the alternate screen"
    after_leaving = output[left:]
    assert SHOW_CURSOR in after_leaving
    assert ESCAPE_SEQUENCE.sub(b"", after_leaving).strip() == b"", f"drawn after leaving: {after_leaving!r}"
    attributes_after = termios.tcgetattr(session.terminal)
    assert attributes_after[3] & termios.ECHO and attributes_after[3] & termios.ICANON
    assert attributes_after == session.attributes_before
    # What the README promises for a signal to the dashboard, like `tpudash run`: 130, cancelled.
    assert code == EXIT_CANCELLED
