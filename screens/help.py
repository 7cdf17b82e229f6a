"""The Help screen: every key, what each screen is for, and what tpudash keeps on disk."""

from __future__ import annotations

from rich.table import Table as RichTable
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from screens.base import DashScreen

SCREEN_KEYS = (
    (
        "Jobs",
        "↑/↓ pick a job · enter open its form (t: the train form) · tab through the form · enter in a field or on "
        "Launch launches · enter on a choice opens it, on a switch toggles it · escape back to the list; j always "
        "comes back to the list (in a form, letters are typing: the keys above wait until escape)",
    ),
    (
        "Run view",
        "[ / ] previous / next run of this session · x cancel the run shown (queued or running; greyed once it "
        "ended) · c cancel the running job · p profile the next 5 steps of a live run (any writer, here or in a "
        "bucket; also on a run opened from History) and show its Profile tab: in its list of captures, enter shows "
        "one and b puts it beside the one shown · ← / → the previous / next tab: Plots, Replicas, Results, Log, "
        "and Workers for a run of several workers, Profile once there is one (tab first, if the focus is elsewhere)",
    ),
    (
        "Hosts",
        "↑/↓ move through the hosts (the table scrolls past what fits) · read every 2 s · a host whose agent "
        "has not written a heartbeat for 3 of its intervals shows as stale",
    ),
    (
        "History",
        "enter open (a live run keeps growing) · space mark · o overlay two marked runs' loss · "
        "e export CSV · f5 reload · new runs appear by themselves",
    ),
)


class HelpScreen(DashScreen):
    """Keys and guarantees."""

    CSS_PATH = "help.tcss"

    BINDINGS = [Binding("escape", "app.back", "Back", id="help.back")]

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Static(self._keys(), id="help-keys")
            yield Static(self._screens(), id="help-screens")
            yield Static(self._guarantees(), id="help-guarantees")

    def _keys(self) -> RichTable:
        table = RichTable(
            title="Keys (anywhere, except in a form)", title_justify="left", show_header=False, box=None, padding=(0, 2)
        )
        # The app's bindings are all Binding objects (Textual also takes tuples).
        for binding in (binding for binding in self.dashboard.BINDINGS if isinstance(binding, Binding)):
            key = binding.key_display or self.app.get_key_display(binding)
            table.add_row(Text(key, style="bold cyan"), binding.tooltip or binding.description)
        table.add_row(
            Text("ctrl+p", style="bold cyan"),
            "command palette: every job, every screen, release the accelerator, re-initialise the TPU",
        )
        return table

    def _screens(self) -> RichTable:
        table = RichTable(title="On each screen", title_justify="left", show_header=False, box=None, padding=(0, 2))
        for name, keys in SCREEN_KEYS:
            table.add_row(Text(name, style="bold"), keys)
        return table

    def _guarantees(self) -> Text:
        runs_dir = self.dashboard.session.runs_dir
        session_log = self.dashboard.host_io.session_log
        log = session_log.log_path if session_log is not None else "not redirected in this session"
        return Text.assemble(
            ("What tpudash keeps\n", "bold"),
            f"Every run is a directory in {runs_dir}: its events (flushed as they are emitted; in a bucket, "
            "a segment every 2 seconds) and run.json (status, params, final metrics).\n",
            "Jobs run in the engine, a process of their own that owns TensorFlow (or JAX, where the session has "
            "no TensorFlow, or --framework jax) and the accelerator; this dashboard imports neither. The engine "
            "starts on first need and stays warm between jobs; "
            "E (or the palette) releases it, so a notebook can take the TPU. If it dies (a signal, out of memory, "
            "a native crash) the dashboard stays up, the run is recorded as failed with the signal, and the next "
            "launch starts a new engine.\n",
            f"Cancel (c) stops the job at its next step and records it as cancelled with the metrics so far; "
            f"a job still running {self.dashboard.settings.cancel_grace:g} s later has its engine ended, and is "
            "recorded the same way.\n",
            "Quit (q) while a job runs asks first; yes cancels the job, waits until it is recorded, then exits.\n",
            "Your own training shows here too: model.fit with TpudashCallback, or a loop in tpudash.record, "
            "writes a run into the same directory; History lists it as ● live within a second and w opens the "
            "newest live run, growing as it trains. A run whose process died shows as interrupted, with "
            "everything it wrote.\n",
            f"Telemetry (Devices, and under a run's plots): each TPU chip's duty cycle and HBM from libtpu's "
            f"metrics service at {self.dashboard.settings.tpu_metrics}, host CPU and memory, sampled every "
            f"{self.dashboard.settings.telemetry_interval:g} s without TensorFlow; recorded with every live run "
            "(telemetry.jsonl). A missing value says why.\n",
            "Hosts (n): every host where `tpudash agent --runs-dir` points at this runs directory or bucket "
            "writes a heartbeat and its latest sample under hosts/ in it; the agent needs no inbound port.\n",
            f"The engine's native log for this session (its stderr: TensorFlow's or XLA's C++ logs): {log}\n",
        )
