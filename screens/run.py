"""The Run screen: the live view of the runs this session launched, with the accelerator lane beside it.

The run on show is drawn by ``tpudash.tui.runview.RunView``; this screen picks
which run that is (the newest, or the one chosen in the lane list) and
redraws it on the app's ``DisplayTick``; a run of several workers also lists
them (``RunView.follow_workers``). ``x`` (cancel this run) is greyed on the
keys line once the run shown has ended. ``p`` asks the run shown for a profile
of its next steps and shows the run view's Profile tab (``tpudash.tui.profiletab``);
``a`` shows its Advice tab (``tpudash.tui.advicetab``).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from screens.base import DashScreen
from tpudash.format import status_text
from tpudash.tui.messages import DisplayTick
from tpudash.tui.runview import RunView
from tpudash.tui.seams import being_taken_down


class RunScreen(DashScreen):
    """The live view of this session's runs; the lane (running and queued runs) on the side."""

    CSS_PATH = "run.tcss"

    BINDINGS = [
        Binding(
            "left_square_bracket", "show_neighbour(-1)", "Prev run", id="run.previous", key_display="[", show=False
        ),
        Binding("right_square_bracket", "show_neighbour(1)", "Next run", id="run.next", key_display="]", show=False),
        Binding("x", "cancel_shown", "Cancel this run", id="run.cancel_shown"),
        Binding("p", "profile_shown", "Profile", id="run.profile", tooltip="profile the next steps of the run shown"),
        # Not on the keys line (full at 80 columns): the header's advice hint names it while a rule fires.
        Binding("a", "advice_shown", "Advice", id="run.advice", show=False, tooltip="the run's advice"),
    ]

    def compose_body(self) -> ComposeResult:
        with Horizontal(id="run-body"):
            yield RunView(id="run-view")
            with Vertical(id="lane-panel"):
                yield Label("Session runs", id="lane-title")
                yield OptionList(id="lane-list")

    def on_mount(self) -> None:
        self._lane_signature: tuple = ()
        self._cancellable_shown: bool | None = None
        self.watch(self.app, "shown_run_id", self._show_run)
        self.watch(self.app, "lane_version", self.refresh_lane)
        self._ready = True

    @property
    def view(self) -> RunView:
        return self.query_one("#run-view", RunView)

    def _show_run(self, run_id: str | None) -> None:
        if self.dashboard.exiting or being_taken_down(self):
            # A signal or quit arrived while this screen was mounting, or it is being closed as it mounts
            # (built ahead as the app closes): its widgets are going away, its run view may have no parts.
            return
        live = self.dashboard.session.live_runs.get(run_id) if run_id else None
        self.view.show(live.model if live else None)
        # A run of several workers (``tpudash run --workers N``) lists them; read on the display beat, off this thread.
        store = self.dashboard.session.store
        self.view.follow_workers(store.files(run_id) if live and run_id else None, local=store.local)
        self.view.follow_profiles(store.files(run_id) if live and run_id else None, live=self.shown_cancellable)
        self.view.follow_advice(store.files(run_id) if live and run_id else None, live=self.shown_cancellable)
        self.refresh_lane()
        self._sync_cancel_key()

    def on_display_tick(self, tick: DisplayTick) -> None:
        """On the app's timer (and when a run starts or ends): redraw what changed."""
        # A mode's screen is current before it has composed; there is nothing to draw yet. Once a signal or
        # quit has the app exiting, its widgets are going away: nothing is drawn, and no read is started.
        if getattr(self, "_ready", False) and not self.dashboard.exiting:
            self.view.sync(tick.force)
            self._sync_cancel_key()

    def _shown_live(self):
        shown = self.dashboard.shown_run_id
        return self.dashboard.session.live_runs.get(shown) if shown is not None else None

    @property
    def shown_cancellable(self) -> bool:
        """Whether the run on show can still be cancelled (queued or running)."""
        live = self._shown_live()
        return live is not None and not live.settled.is_set() and not live.model.finished_state

    def _sync_cancel_key(self) -> None:
        cancellable = self.shown_cancellable
        if cancellable != self._cancellable_shown:
            self._cancellable_shown = cancellable
            self.refresh_bindings()
            live = self._shown_live()
            store = self.dashboard.session.store
            self.view.follow_profiles(store.files(live.run_id) if live else None, live=cancellable)
            self.view.follow_advice(store.files(live.run_id) if live else None, live=cancellable)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """``x`` greyed (None: shown, disabled) while the run on show has ended or there is none."""
        if action == "cancel_shown":
            return True if self.shown_cancellable else None
        if action == "profile_shown":  # on an ended run it says why it cannot
            return True if self._shown_live() is not None else None
        return True

    def refresh_lane(self, _version: int = 0) -> None:
        """List this session's runs, newest first, with their status."""
        live_runs = list(self.dashboard.session.live_runs.values())[::-1]
        signature: tuple[object, ...] = tuple(
            (live.run_id, live.model.status, live.queue_position) for live in live_runs
        )
        signature += (self.dashboard.shown_run_id,)
        if signature == self._lane_signature:
            return
        self._lane_signature = signature
        lane = self.query_one("#lane-list", OptionList)
        lane.clear_options()
        for live in live_runs:
            model = live.model
            text = status_text(model.status)
            text.append(f" {model.job}", "bold" if live.run_id == self.dashboard.shown_run_id else "")
            if model.status == "queued" and live.queue_position:
                text.append(f" (#{live.queue_position})", "dim")
            lane.add_option(Option(text, id=live.run_id))
        if self.dashboard.shown_run_id in self.dashboard.session.live_runs:
            lane.highlighted = lane.get_option_index(self.dashboard.shown_run_id)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option_id:
            self.dashboard.shown_run_id = event.option_id

    def action_cancel_shown(self) -> None:
        """Cancel the run on screen: a queued one leaves the queue without running."""
        live = self._shown_live()
        if live is None or live.settled.is_set():
            self.app.notify("This run has already ended.", severity="warning")
            return
        self.dashboard.session.cancel_run(live)

    def action_profile_shown(self) -> None:
        """Ask the run shown for a profile of its next steps (written into the run; its writer answers)."""
        live = self._shown_live()
        why = self.view.profile_run(live.model.status if live is not None else "not shown")
        if why:
            self.app.notify(why[0].upper() + why[1:] + ".", severity="warning")

    def action_advice_shown(self) -> None:
        """Show the Advice tab of the run shown (a run without advice says why)."""
        if self._shown_live() is not None:
            self.view.open_advice()

    def action_show_neighbour(self, offset: int) -> None:
        run_ids = list(self.dashboard.session.live_runs)
        if not run_ids:
            return
        shown = self.dashboard.shown_run_id
        current = run_ids.index(shown) if shown in run_ids else len(run_ids) - 1
        self.dashboard.shown_run_id = run_ids[max(0, min(len(run_ids) - 1, current + offset))]
