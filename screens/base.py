"""The frame every tpudash screen shares: the session bar on top, the keys below.

A screen subclasses ``DashScreen`` and yields its body from ``compose_body``;
the session bar (runtime and accelerator lane) and the footer come with it.
This module stays light (no plots, no jobs): the first screen imports it
before the first frame.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Static


class SessionBar(Static):
    """The one-line header on every screen: the runtime, then the accelerator lane.

    Shows the app's ``runtime_status`` ("connecting…", then kind, strategy and
    replicas) and ``lane_status`` (the running job, its status and elapsed time,
    and how many runs wait).
    """

    DEFAULT_CSS = """
    SessionBar {
        dock: top;
        height: 1;
        width: 100%;
        background: $panel;
        color: $foreground;
        padding: 0 1;
    }
    """

    def on_mount(self) -> None:
        self.watch(self.app, "runtime_status", self._show, init=False)
        self.watch(self.app, "lane_status", self._show, init=False)
        self._show()

    def _show(self, _value: object = None) -> None:
        runtime = getattr(self.app, "runtime_status", "")
        lane = getattr(self.app, "lane_status", "")
        text = Text.assemble(("tpudash", "bold"), "  ", (runtime, "cyan" if "fail" not in runtime else "bold red"))
        if lane:
            text.append("  │  ")
            text.append(lane, "bold yellow" if "running" in lane else "")
        self.update(text, layout=False)  # always one line: no relayout


class DashScreen(Screen):
    """A screen with the session bar and the footer around its body."""

    def compose(self) -> ComposeResult:
        yield SessionBar()
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        raise NotImplementedError
