"""The Session log screen: what TensorFlow and tfds wrote to fd 2, and this session's notifications.

While the TUI runs, file descriptor 2 points at the session log file, so C++
logs and tqdm bars never tear the screen; this pane tails that file. Both
panes wrap at their own width and wrap again when the terminal is resized:
a line written at 160 columns is whole, not cut, at 80.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from screens.base import DashScreen
from tpudash.runs.tail import LineTail
from tpudash.tui.panelog import PaneLog

TAIL_SECONDS = 0.5
READ_LIMIT = 1 << 20


class SessionLogScreen(DashScreen):
    """Tails the session log file."""

    CSS_PATH = "log.tcss"

    def compose_body(self) -> ComposeResult:
        with Vertical(id="log-body"):
            yield Static("", id="log-title")
            yield PaneLog(id="session-log", max_lines=5000)
            yield Static(Text("Notifications", style="bold"), id="notices-title")
            yield PaneLog(id="notices", max_lines=500)

    def on_mount(self) -> None:
        self._last_notice_shown: tuple[float, str, str] | None = None
        session_log = self.dashboard.host_io.session_log
        self._log_lines = LineTail(session_log.log_path, limit=READ_LIMIT) if session_log is not None else None
        title = self.query_one("#log-title", Static)
        if session_log is None:
            title.update(
                Text(
                    "fd 2 is not redirected in this session (TPUDASH_NATIVE_STDERR=terminal or a test run)", style="dim"
                )
            )
        else:
            title.update(Text.assemble(("Session log ", "bold"), (str(session_log.log_path), "dim")))
        self.set_interval(TAIL_SECONDS, self.tail)
        self.tail()

    def tail(self) -> None:
        self._show_notices()
        if self._log_lines is None or not self.is_current:
            return
        # Only whole lines: a C++ log line may be half written.
        try:
            lines = self._log_lines.read_lines()
        except OSError:
            return
        if not lines:
            return
        log = self.query_one("#session-log", PaneLog)
        # tqdm redraws with carriage returns; the last state of a bar is what matters.
        for line in b"".join(piece + b"\n" for piece in lines).decode("utf-8", errors="replace").splitlines():
            log.write_line(Text(line.rsplit("\r", 1)[-1]))

    def _show_notices(self) -> None:
        # The app keeps only the newest notices (a capped list), so the count says
        # nothing once it is full: the pane remembers the last notice it wrote.
        notices = self.dashboard.notices
        last = self._last_notice_shown
        if not notices or notices[-1] is last:
            return
        start = next((index + 1 for index in range(len(notices) - 1, -1, -1) if notices[index] is last), 0)
        log = self.query_one("#notices", PaneLog)
        styles = {"error": "bold red", "warning": "yellow"}
        for stamp, severity, message in notices[start:]:
            log.write_line(
                Text(f"{time.strftime('%H:%M:%S', time.localtime(stamp))} {message}", style=styles.get(severity, ""))
            )
        self._last_notice_shown = notices[-1]
