"""The run view's header: the run's title and status, its params, what it ran on, its error, what it concluded,
its last message.

Every value a run was given or concluded shows whole, at any terminal size: the params and the
summary's line wrap (issue 26, 5.18: a cut params line dropped ``limit_test`` and a summary ended in
``…precision``). Only the last message (prose, whole in the Log tab) keeps one line and ends in an
ellipsis, so a long one cannot push the run's state out of the header.

While the store of a running run does not answer, a line under the title says so ("store
unreachable since 23:39:27 · 446 events held locally") and the run's clocks (the title's, the
stage line's: ``shown_now``) stand at that moment: what the view shows is as of then, and the run
may have gone on (issue 38: it read "preparing · 00:42" while the engine had finished).

A run that measures its MFU shows it beside its examples/s ("1185 examples/s · MFU 22.9 %": the newest
advice.json's, else run.json's ``mfu`` metric), and while any of its advice rules fires, one line says
the first (``advice: …  (a: Advice tab)``, cut to the header's width, the key never cut off).
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Static

from jobs import registry
from tpudash.advice.report import AdviceReport
from tpudash.format import format_seconds, format_value, runtime_line, status_text
from tpudash.runs.model import RunModel
from tpudash.runs.storeclient import Outage, outage, spilled_events
from tpudash.runs.uploader import local_run_dir
from tpudash.tui.advicetext import hint_line, rate_text
from tpudash.tui.quiet_widgets import OneLineStatic


def clipped(text: str, width: int) -> str:
    """``text`` cut to ``width`` cells with an ellipsis: a table cell must not push the others off screen."""
    return text if len(text) <= width else text[: width - 1] + "…"


def format_params(params: dict, job: str = "") -> str:
    """``name=value`` of the params that had an effect: one that does not apply under the
    others (momentum with optimizer=sgd) is left out, as the job's form hides it."""
    spec = registry().get(job)
    declared = {param.name: param for param in spec.params} if spec is not None else {}
    return "  ".join(
        f"{name}={clipped(format_value(value), 40)}"
        for name, value in params.items()
        if name not in declared or declared[name].applies(params)
    )


def last_message(model: RunModel) -> str | None:
    """The run's last info message when it says more than the summary's line (jobs often log that line too)."""
    line = model.summary.get("line")
    message = next((text for level, text in reversed(model.logs) if level == "info"), None)
    return None if message is None or message == line else message


def store_away(model: RunModel, runs_dir: object = None) -> Outage | None:
    """The outage of a running run's store, with the events held on this host (by a writer in this process, or
    spilled by one in another, such as the engine); None for an ended run or a store that answers.

    ``runs_dir``: the dashboard's runs directory (its settings'), whose store is its runs' store; None: any store
    this process uses (a dashboard reads one runs directory). A local directory has no store to be away.
    """
    if model.finished_state:
        return None
    away = outage(None if runs_dir is None else str(runs_dir))
    if away is None or away.held or not model.run_id:
        return away
    return Outage(away.store, away.since, away.reason, spilled_events(local_run_dir(None, model.run_id)))


def shown_now(model: RunModel, runs_dir: object = None) -> float | None:
    """The time the run's clocks show: None (now), or while its store is away the moment it stopped answering."""
    away = store_away(model, runs_dir)
    return None if away is None else away.since


def dashboard_runs_dir(widget: Widget) -> object:
    """The runs directory of the app showing ``widget`` (its settings'), or None in an app without settings."""
    return getattr(getattr(widget.app, "settings", None), "runs_dir", None)


class RunHeader(Vertical):
    """Title (job, status, clock, run id), params, error, the summary's line and the last message of one run."""

    DEFAULT_CSS = """
    RunHeader { height: auto; }
    RunHeader #run-title { height: 1; padding: 0 1; }
    RunHeader #run-store { height: auto; padding: 0 1; color: $warning; display: none; }
    RunHeader #run-params { height: auto; padding: 0 1; color: $text-muted; }
    RunHeader #run-runtime { height: 1; padding: 0 1; color: $text-muted; text-wrap: nowrap; text-overflow: ellipsis; }
    RunHeader #run-rate { height: 1; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; display: none; }
    RunHeader #run-advice { height: 1; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; display: none; }
    RunHeader #run-error { height: auto; max-height: 50vh; padding: 0 1; display: none; }
    RunHeader #run-outcome { height: auto; padding: 0 1; display: none; }
    RunHeader #run-message { height: 1; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; display: none; }
    """

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self._last_title: tuple[str, str, str, str] | str | None = None
        self._store_shown: str | None = None
        self.shown_state: tuple[str, str, str | None] | str | None = None
        """(run id, status, error) of what the params, error and outcome lines show; "empty" without a run."""
        self.advice: AdviceReport | None = None
        """The run's newest advice, as the run view read it (``tpudash.tui.advicetab``): the MFU and the hint."""
        self._rate_shown: Text | None = None
        self._hint_shown: Text | None = None

    def compose(self) -> ComposeResult:
        yield OneLineStatic("", id="run-title")  # its clock moves each second
        yield Static("", id="run-store", markup=False)
        yield Static("", id="run-params", markup=False)
        yield Static("", id="run-runtime", markup=False)
        yield OneLineStatic("", id="run-rate", markup=False)
        yield Static("", id="run-advice", markup=False)
        yield Static("", id="run-error", markup=False)
        yield Static("", id="run-outcome", markup=False)
        yield Static("", id="run-message", markup=False)

    def forget(self) -> None:
        """Draw the next model from scratch."""
        self._last_title = self.shown_state = self._store_shown = None
        self._hide_advice()

    def sync(self, model: RunModel | None) -> None:
        title = self.query_one("#run-title", Static)
        if model is None:
            if self._last_title != "empty":
                title.update(Text("No run yet: press m, r or g, or launch a job from Jobs (j).", style="dim"))
                self.query_one("#run-params", Static).update("")
                for line in self.query("#run-store, #run-runtime, #run-error, #run-outcome, #run-message"):
                    line.display = False
                self._hide_advice()
                self._last_title = self.shown_state = "empty"
                self._store_shown = None
            return
        away = store_away(model, dashboard_runs_dir(self))
        self._sync_store(away)
        self._sync_rate(model)
        self._sync_hint()
        elapsed = format_seconds(model.elapsed(None if away is None else away.since), precise=model.finished_state)
        header = (model.run_id, model.job, model.status, elapsed)
        if header != self._last_title:
            text = Text.assemble((model.job or "?", "bold"), "  ")
            text.append_text(status_text(model.status))
            text.append(f"  {elapsed}", "bold")
            if model.run_id:
                text.append(f"   {model.run_id}", "dim")
            title.update(text, layout=False)  # one fixed line: repaint it, no relayout
            self._last_title = header
        # The rest changes with the run's state only, not with its clock.
        state = (model.run_id, model.status, model.error)
        if state == self.shown_state:
            return
        self.shown_state = state
        self.query_one("#run-params", Static).update(format_params(model.params, model.job) or "(no params)")
        # What it ran on: a recorded run's framework and devices are not the dashboard's own.
        runtime = self.query_one("#run-runtime", Static)
        runtime_text = runtime_line(model.runtime)
        runtime.update(f"on {runtime_text}" if runtime_text else "")
        runtime.display = bool(runtime_text)
        error = self.query_one("#run-error", Static)
        if model.error:
            error.update(Text.assemble(("✗ ", "bold red"), (model.error, "red"), ("   (traceback in Log)", "dim")))
        error.display = bool(model.error)
        ended_well = model.finished_state and not model.error
        summary_line = model.summary.get("line") if ended_well else None
        summary_line = summary_line if isinstance(summary_line, str) and summary_line else None
        outcome = self.query_one("#run-outcome", Static)
        if summary_line:
            outcome.update(Text.assemble(("→ ", "bold"), (summary_line, "bold")))
        outcome.display = summary_line is not None
        message = last_message(model) if ended_well else None
        line = self.query_one("#run-message", Static)
        if message:
            # Without a summary line the last message is what the run concluded: bold, as the line would be.
            message = " ".join(message.splitlines())  # one line: a multi-line message shows its start
            line.update(Text.assemble(("→ ", "bold"), message) if summary_line is None else Text(message, style="dim"))
        line.display = message is not None

    def show_advice(self, report: AdviceReport | None, model: RunModel | None) -> None:
        """The run's advice, read anew (None: none): the MFU line and the hint while a rule fires."""
        self.advice = report
        self._sync_rate(model)
        self._sync_hint()

    def _hide_advice(self) -> None:
        """Hide the MFU and hint lines until the next ``sync`` draws them (the advice is the view's: it stays)."""
        self._rate_shown = self._hint_shown = None
        if self.is_mounted:
            for line in self.query("#run-rate, #run-advice"):
                line.display = False

    def _sync_rate(self, model: RunModel | None) -> None:
        """examples/s and the MFU; hidden while there is no MFU to say."""
        text = rate_text(self.advice, model.final_metrics) if model is not None else None
        if text == self._rate_shown or not self.is_mounted:
            return
        self._rate_shown = text
        line = self.query_one("#run-rate", Static)
        line.update(text or "", layout=False)  # one line whatever it says (its CSS): no relayout of the screen
        line.display = text is not None

    def _sync_hint(self) -> None:
        hint = self.advice.hint() if self.advice is not None else None
        text = hint_line(hint, self.size.width - 2) if hint else None
        if text == self._hint_shown or not self.is_mounted:
            return
        self._hint_shown = text
        line = self.query_one("#run-advice", Static)
        line.update(text or "")
        line.display = text is not None

    def on_resize(self) -> None:
        self._sync_hint()

    def _sync_store(self, away: Outage | None) -> None:
        """The line that says the run's store does not answer, and since when; hidden while it does."""
        text = None if away is None else f"⚠ {away.line()}: shown as of then; the run may have gone on"
        if text == self._store_shown:
            return
        self._store_shown = text
        line = self.query_one("#run-store", Static)
        line.update(text or "")
        line.display = text is not None
