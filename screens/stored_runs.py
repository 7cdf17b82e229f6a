"""What the screens of runs on disk share: reading runs on a worker thread, and CSV export.

History, a run's own view (``screens.run_detail``) and the overlay of two runs
(``screens.overlay``) read runs from their events.jsonl off the UI thread; History
and a run's view export a run's metrics as CSV into its run directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from textual import work
from textual.message import Message

from screens.base import DashScreen
from tpudash.runs.export_stream import write_run_csv
from tpudash.runs.follow import RunFollower
from tpudash.runs.store import RunStore

EXPORT_FILE = "metrics.csv"


def follow_run(store: RunStore, run_id: str) -> RunFollower:
    """A follower of ``run_id`` that has read everything written so far (call from a worker thread)."""
    follower = RunFollower(store, run_id)
    follower.catch_up()
    return follower


def export_path(store: RunStore, run_id: str) -> Path:
    """Where a run's CSV goes: beside its events, or for a run in a bucket, under this host's tpudash data."""
    if store.local:
        return Path(store.find(run_id)) / EXPORT_FILE
    from tpudash.config import default_runs_dir

    return default_runs_dir(os.environ).parent / "exports" / f"{run_id}-{EXPORT_FILE}"


class RunExported(Message):
    """A run's metrics were written as CSV to ``path``."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path


class RunsLoaded(Message):
    """Runs were read from their events.jsonl: a follower each, in the order asked."""

    def __init__(self, followers: list[RunFollower]):
        super().__init__()
        self.followers = followers


class ExportsRuns(DashScreen):
    """A screen whose ``export_run(run_id)`` writes the run's metrics as CSV in a worker and says where."""

    @work(thread=True, exit_on_error=False, group="history-export", description="Export a run's metrics as CSV")
    def export_run(self, run_id: str) -> None:
        store = self.dashboard.session.store
        path = export_path(store, run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as out:
            write_run_csv(store, run_id, out)  # as the run is read: a run of a million events in bounded memory
        self.post_message(RunExported(path))

    def on_run_exported(self, message: RunExported) -> None:
        self.app.notify(f"exported to {message.path}", title="CSV export")
