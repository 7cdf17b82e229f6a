"""The dashboard as ``tpudash`` runs it (a real terminal, its engine a process), with a train run it starts itself.

``python -m tests.benchmarks.quit_driver STATE_FILE`` runs ``TpudashApp`` the
way ``tpudash.tui.app.run_app`` does (fd 2 to the session log, signal
handlers) in the terminal it is started in (``bench_quit`` starts it in
tmux). Once the engine's runtime is up it launches a train run (synthetic
MNIST, light model, many epochs) and, once the run's first epoch is over
(tracing done: the run is stepping, as a user who decides to quit sees it),
writes STATE_FILE: this process's pid, the engine's pid, the run's id. Then
the benchmark presses ``q`` and ``y`` in the terminal like a user.

Each step of the quit is stamped (``time.time()``) into STATE_FILE.phases as
it happens, so the benchmark can say where the time went: the confirm, the
run's end recorded, ``exit()``, the app unmounted, ``run()`` returned, the
interpreter's last atexit hook.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tpudash.config import Settings
from tpudash.tui.app import TpudashApp

QUIT_WHEN_VARIABLE = "TPUDASH_BENCH_QUIT_WHEN"
"""``stepping`` (default): past the first epoch; ``started``: the run has begun, its first epoch still tracing."""
TRAIN_OVERRIDES = {
    "dataset": "mnist",
    "source": "synthetic",
    "model": "light",
    "loop": "fit",
    "batch_per_replica": "64",
    "limit_train": "10240",
    "limit_test": "512",
    "epochs": "1000",
}


class QuitBenchApp(TpudashApp):
    """``TpudashApp`` that launches one train run itself and says when it is stepping."""

    CSS_PATH = str(Path(sys.modules[TpudashApp.__module__].__file__ or "").with_name("app.tcss"))

    def __init__(self, state_file: Path, **options: Any):
        super().__init__(Settings.load(), **options)
        self.state_file = state_file
        self.phases_file = state_file.with_name(state_file.name + ".phases")
        self._live: Any = None
        self._announced = False
        self.quit_when = os.environ.get(QUIT_WHEN_VARIABLE, "stepping")

    def stamp(self, phase: str) -> None:
        with open(self.phases_file, "a") as phases:
            phases.write(json.dumps({"phase": phase, "time": time.time()}) + "\n")

    def _tick(self) -> None:
        super()._tick()
        if self._live is None and self.runtime is not None:
            self._live = self.session.launch_by_name("train", TRAIN_OVERRIDES)
        live = self._live
        if live is None or self._announced:
            return
        epochs = live.model.progress.get("epoch")
        stepping = epochs is not None and epochs.done >= 1
        # "started": the run has begun and is still tracing its first epoch (train's cancel then waits for the grace).
        ready = live.model.status == "running" if self.quit_when == "started" else stepping
        if ready and not live.settled.is_set():
            self._announced = True
            state = {"dashboard_pid": _own_pid(), "engine_pid": self.session.engine_pid, "run_id": live.run_id}
            partial = self.state_file.with_name(self.state_file.name + ".partial")
            partial.write_text(json.dumps(state))
            partial.replace(self.state_file)

    def _quit_answered(self, yes: bool | None) -> None:
        self.stamp("confirmed")
        super()._quit_answered(yes)

    def exit(self, *args: Any, **kwargs: Any) -> None:
        self.stamp("exit called")
        super().exit(*args, **kwargs)

    def on_unmount(self) -> None:
        self.stamp("unmount")
        super().on_unmount()
        self.stamp("session closed")


def _own_pid() -> int:
    return os.getpid()


def main(argv: list[str]) -> int:
    state_file = Path(argv[0])
    app = QuitBenchApp(state_file, redirect_stderr=True, handle_signals=True)
    atexit.register(app.stamp, "last atexit hook")  # registered first, so it runs last
    try:
        app.run()
    finally:
        app.stamp("run returned")
    code = app.return_code or 0
    # As ``tpudash`` ends after its dashboard (``tpudash.cli.main``), where the tree under test has that step.
    leave_now = getattr(importlib.import_module("tpudash.cli.main"), "leave_now", None)
    if leave_now is not None:
        leave_now(code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
