"""The dashboard's terminal and signals: fd 2 to the session log, prints into it, SIGTERM/SIGINT to quit.

While the TUI runs, file descriptor 2 (TensorFlow's C++ logs, tqdm, and the
engine's stderr, which inherits it) goes to the session log, so nothing
tears the screen; Python's prints and warnings, which Textual captures, are
written there too. SIGTERM and SIGINT are handed to the app's quit flow (a
first one cancels the running job cleanly, a second leaves at once).
Textual-free: the app calls these from its lifecycle handlers.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpudash.accel.nativelog import NativeStderr

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class HostIO:
    """fd 2 and the stop signals for as long as the app runs; each is off unless asked for."""

    def __init__(self, redirect_stderr: bool = False, handle_signals: bool = False):
        self.redirect_stderr = redirect_stderr
        self.handle_signals = handle_signals
        self.session_log: NativeStderr | None = None
        """The ``NativeStderr`` holding fd 2 while the app runs (None when not redirected)."""
        self._signals_installed: list[int] = []

    def redirect(self, runs_dir: Path | str) -> None:
        """Point fd 2 at a new session log (before Textual's driver exists: it draws on a private copy)."""
        if self.redirect_stderr:
            from tpudash.accel.nativelog import NativeStderr, session_log_path

            self.session_log = NativeStderr(session_log_path(runs_dir)).start()

    @staticmethod
    def write_print(text: str) -> None:
        """A captured print or warning, into fd 2 (the session log while redirected)."""
        try:
            os.write(2, text.encode("utf-8", errors="replace"))
        except OSError:
            pass

    def install_signal_handlers(self, on_signal: Callable[[int], None]) -> None:
        """SIGTERM and SIGINT call ``on_signal`` on the running event loop (when ``handle_signals``)."""
        if not self.handle_signals:
            return
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            try:
                loop.add_signal_handler(signum, on_signal, signum)
                self._signals_installed.append(signum)
            except (RuntimeError, ValueError, NotImplementedError):
                pass

    def remove_signal_handlers(self) -> None:
        for signum in self._signals_installed:
            try:
                asyncio.get_running_loop().remove_signal_handler(signum)
            except (RuntimeError, ValueError):
                pass

    def release(self) -> None:
        """Point fd 2 (and sys.stderr) back where they were when the app started."""
        if self.session_log is not None:
            self.session_log.stop()
