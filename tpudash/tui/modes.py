"""The app's modes and the screens the shell opens, named, not imported: the shell never imports ``screens``.

``MODE_SCREENS`` maps mode → (screen module, class, label, what it shows).
The app imports a screen's module only when its mode is first shown (or a
live run is opened), by name, so this module imports no screen and
``screens`` may import the shell's widgets without a cycle.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from textual.screen import Screen

MODE_SCREENS = {
    "devices": ("screens.devices", "DevicesScreen", "Devices", "the runtime, strategy and logical devices"),
    "jobs": ("screens.jobs", "JobsScreen", "Jobs", "every job with its parameter form"),
    "run": ("screens.run", "RunScreen", "Run view", "the live view of this session's runs"),
    "history": ("screens.history", "HistoryScreen", "History", "past runs: open, overlay, export"),
    "hosts": ("screens.hosts", "HostsScreen", "Hosts", "every host's chips, CPU, memory and heartbeat"),
    "log": ("screens.log", "SessionLogScreen", "Session log", "TensorFlow's native log and notifications"),
    "help": ("screens.help", "HelpScreen", "Help", "keys and what tpudash keeps"),
}
RUN_DETAIL_SCREEN = ("screens.run_detail", "RunDetailScreen")
"""One run on disk, live or finished (``w`` opens a live run of another writer there)."""


def _screen_class(module_name: str, class_name: str) -> type[Screen]:
    screen_class: type[Screen] = getattr(importlib.import_module(module_name), class_name)
    return screen_class


def mode_screen_factories() -> dict[str, str | Callable[[], Screen]]:
    """The app's ``MODES``: each imports its screen's module only when the mode is first shown."""

    def factory(module_name: str, class_name: str) -> Callable[[], Screen]:
        def make_screen() -> Screen:
            return _screen_class(module_name, class_name)()

        make_screen.__name__ = f"make_{class_name}"
        return make_screen

    return {mode: factory(module, cls) for mode, (module, cls, _, _) in MODE_SCREENS.items()}


def run_detail_screen(run_id: str) -> Screen:
    """The screen that follows one run on disk."""
    module_name, class_name = RUN_DETAIL_SCREEN
    return _screen_class(module_name, class_name)(run_id)
