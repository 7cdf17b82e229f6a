"""A bare Textual app (a header, one line, the footer) that prints when its first frame is drawn, and exits.

The first-frame benchmark launches it beside ``python -m tpudash``, turn about: what a
Textual app costs this machine to its first frame, so the dashboard's own part shows
whatever the machine's speed (``tests.benchmarks.bench_first_frame``).
"""

from __future__ import annotations

import time

from textual.app import App, ComposeResult
from textual.widgets import Footer, Header, Static


class BareApp(App[None]):
    BINDINGS = [("q", "quit", "Quit")]

    def __init__(self) -> None:
        super().__init__()
        self.first_frame_at: float | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("one line")
        yield Footer()

    def on_mount(self) -> None:
        self.call_after_refresh(self._after_first_frame)  # as the dashboard times its own

    def _after_first_frame(self) -> None:
        self.first_frame_at = time.time()
        self.exit()


if __name__ == "__main__":
    app = BareApp()
    app.run()
    print(f"first_frame_unix={app.first_frame_at:.6f}")
