"""One run on disk in the run view, read from its events.jsonl; a live run grows as its file does.

History opens a run here (``enter``), and ``w`` opens the newest live run of
another writer (the user's ``fit`` with TpudashCallback, ``tpudash.record``,
``tpudash run`` in another terminal). It says who writes the run and whether
it still grows, names what could not be read, and ``e`` exports its metrics;
``p`` profiles it, ``a`` shows its advice.
"""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Static
from textual.worker import Worker, WorkerState

from screens.stored_runs import ExportsRuns, RunsLoaded, follow_run
from tpudash.format import status_text
from tpudash.runs.follow import SOURCE_WORDS, RunFollower
from tpudash.runs.layout import SOURCE_JOB
from tpudash.tui.messages import DisplayTick
from tpudash.tui.runview import RunView
from tpudash.tui.seams import being_taken_down


class RunDetailScreen(ExportsRuns):
    """One run in the run view, read from its events.jsonl; a live run grows as its file does."""

    CSS_PATH = "history.tcss"

    BINDINGS = [
        Binding("escape", "close", "Back", id="history.back"),
        Binding("e", "export", "Export CSV", id="history.detail_export"),
        Binding(
            "p", "profile_shown", "Profile", id="history.detail_profile", tooltip="profile the next steps of this run"
        ),
        # Not on the keys line (full at 80 columns): the header's advice hint names it while a rule fires.
        Binding("a", "advice_shown", "Advice", id="history.detail_advice", show=False, tooltip="this run's advice"),
    ]

    def __init__(self, run_id: str):
        super().__init__()
        self.run_id = run_id
        self.follower: RunFollower | None = None
        self.loaded = False

    def compose_body(self) -> ComposeResult:
        yield Static(Text(f"loading {self.run_id}…", style="dim"), id="detail-problems")
        yield Static("", id="detail-source")
        yield RunView(id="detail-view")

    def on_mount(self) -> None:
        if being_taken_down(self):
            return  # opened and left at once (enter then escape): nothing to read for
        self.load()

    @work(thread=True, exit_on_error=False, group="history-load", description="Read a run's events.jsonl")
    def load(self) -> None:
        self.post_message(RunsLoaded([follow_run(self.dashboard.session.store, self.run_id)]))

    def on_runs_loaded(self, message: RunsLoaded) -> None:
        if being_taken_down(self):
            return  # left while loading: the run view may never have mounted its parts
        self.follower = message.followers[0]
        self.view.show(self.follower.model)
        store = self.dashboard.session.store
        self.view.follow_workers(store.files(self.run_id), local=store.local)
        self.view.follow_profiles(store.files(self.run_id), live=self.follower.live)
        self.view.follow_advice(store.files(self.run_id), live=self.follower.live)
        self._show_where_from()
        self.loaded = True

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if event.state == WorkerState.ERROR and not being_taken_down(self):
            problems = self.query_one("#detail-problems", Static)
            problems.update(Text(f"cannot open {self.run_id}: {worker.error}", style="bold red"))
            problems.display = True

    def _show_where_from(self) -> None:
        """Who writes the run and whether it still grows; what could not be read."""
        follower = self.follower
        if follower is None:
            return  # not read yet
        info, model = follower.info, follower.model
        writer = SOURCE_WORDS.get(info.source, info.source)
        pid = f" in pid {info.pid}" if info.pid is not None else ""
        if follower.live:
            text = Text.assemble(status_text("live"), f"  written by {writer}{pid}; this view grows with it")
        elif model.status == "interrupted":
            text = Text.assemble(
                status_text("interrupted"),
                f": the process writing it ({writer}{pid}) ended without finishing; everything it wrote is kept",
            )
        elif info.source != SOURCE_JOB:
            text = Text(f"recorded by {writer}{pid}", style="dim")
        else:
            text = Text("")
        source = self.query_one("#detail-source", Static)
        source.update(text)
        source.display = bool(text.plain)
        problems = self.query_one("#detail-problems", Static)
        if model.problems:
            problems.update(
                Text(
                    "⚠ could not read everything: "
                    + "; ".join(model.problems[:5])
                    + (f" (+{len(model.problems) - 5} more)" if len(model.problems) > 5 else ""),
                    style="yellow",
                )
            )
        problems.display = bool(model.problems)

    @property
    def view(self) -> RunView:
        return self.query_one("#detail-view", RunView)

    def on_display_tick(self, tick: DisplayTick) -> None:
        """On the app's timer: read what a live run added, then redraw on the display beat, as the Run view does."""
        force = tick.force
        follower = self.follower
        if follower is None:
            return
        if not follower.ended:
            follower.poll()
            if follower.ended:
                self._show_where_from()
                self.view.follow_profiles(self.dashboard.session.store.files(self.run_id), live=False)
                self.view.follow_advice(self.dashboard.session.store.files(self.run_id), live=False)
                force = True
        self.view.sync(force)

    def action_close(self) -> None:
        self.dismiss()

    def action_profile_shown(self) -> None:
        """Ask this run's writer for a profile of its next steps; a run that ended says why it cannot."""
        follower = self.follower
        if follower is None:
            return  # not read yet
        why = self.view.profile_run("running" if follower.live else follower.model.status)
        if why:
            self.app.notify(why[0].upper() + why[1:] + ".", severity="warning")

    def action_advice_shown(self) -> None:
        """Show this run's Advice tab (a run without advice says why)."""
        if self.follower is not None:
            self.view.open_advice()

    def action_export(self) -> None:
        self.export_run(self.run_id)
