"""The frame every tpudash screen shares: the session bar on top, the keys below.

A screen subclasses ``DashScreen`` and yields its body from ``compose_body``;
the session bar (runtime and accelerator lane) and the footer come with it.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer

from tpudash.widgets import SessionBar


class DashScreen(Screen):
    """A screen with the session bar and the footer around its body."""

    def compose(self) -> ComposeResult:
        yield SessionBar()
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        raise NotImplementedError
