"""Two runs' loss curves in one plot (History: mark two runs with ``space``, then ``o``)."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Static
from textual.worker import Worker, WorkerState

from screens.base import DashScreen
from screens.stored_runs import RunsLoaded, follow_run
from tpudash.runs.model import MetricTrack, RunModel
from tpudash.runs.series import DecimatedSeries
from tpudash.tui.plots import MetricPlot, PlotLine
from tpudash.tui.seams import being_taken_down


def loss_series(model: RunModel) -> list[tuple[str, DecimatedSeries]]:
    """The loss curves of a run worth overlaying: the finest train series, then its held-out data (val and test)."""
    tracks = model.families.get("loss", [])
    lines = []
    for granularity in ("batch", "step", "epoch"):
        train = [track for track in tracks if track.split == "train" and track.granularity == granularity]
        if train:
            track = train[0]
            lines.append(
                ("train", track.smoothed if track.smoothed is not None and len(track.smoothed) else track.series)
            )
            break
    held_out = [track for track in tracks if track.split in HELD_OUT_SPLITS]
    if held_out:
        lines.append((HELD_OUT_LABEL, held_out_series(held_out)))
    lines += [(track.split, track.series) for track in tracks if track.split not in HELD_OUT_SPLITS | {"train"}]
    return lines


# A run's "val" (evaluated every epoch) and "test" (once, at the end) are the same held-out data:
# one line, named once, instead of the same split drawn twice (issue 26, 5.11).
HELD_OUT_SPLITS = {"val", "test"}
HELD_OUT_LABEL = "held-out"


def held_out_series(tracks: list[MetricTrack]) -> DecimatedSeries:
    """The val and test points of a run as one series in step order (a point at a step both have counts once)."""
    points: dict[float, float] = {}
    for track in sorted(tracks, key=lambda track: track.split != "val"):
        for x, y in zip(*track.series.points()):
            points.setdefault(x, y)
    series = DecimatedSeries()
    series.extend(sorted(points.items()))
    return series


class OverlayScreen(DashScreen):
    """Two runs' loss curves in one plot."""

    CSS_PATH = "history.tcss"

    BINDINGS = [Binding("escape", "close", "Back", id="history.overlay_back")]

    def __init__(self, run_ids: list[str]):
        super().__init__()
        self.run_ids = run_ids
        self.models: list[RunModel] = []

    def compose_body(self) -> ComposeResult:
        yield Static(Text("loading…", style="dim"), id="overlay-title")
        yield MetricPlot("loss", id="overlay-plot")

    def on_mount(self) -> None:
        if being_taken_down(self):
            return  # opened and left at once: nothing to read for
        self.load()

    @work(thread=True, exit_on_error=False, group="history-load", description="Read two runs' events.jsonl")
    def load(self) -> None:
        self.post_message(RunsLoaded([follow_run(self.dashboard.session.store, run_id) for run_id in self.run_ids]))

    def on_runs_loaded(self, message: RunsLoaded) -> None:
        if being_taken_down(self):
            return  # left while loading: its plot may never have mounted its parts
        title = self.query_one("#overlay-title", Static)
        self.models = [follower.model for follower in message.followers]
        colors = (("blue", "cyan"), ("red", "orange"))
        lines: list[PlotLine] = []
        missing = []
        for (train_color, val_color), model in zip(colors, self.models):
            series = loss_series(model)
            if not series:
                missing.append(model.run_id)
            for split, values in series:
                lines.append(
                    PlotLine(
                        f"{model.job} {model.run_id[-6:]} {split}",
                        values,
                        color=train_color if split == "train" else val_color,
                    )
                )
        self.query_one("#overlay-plot", MetricPlot).set_lines(lines)
        text = Text.assemble(("loss: ", "bold"), " vs ".join(model.run_id for model in self.models))
        if missing:
            text.append(f"   no loss metric in {', '.join(missing)}", "yellow")
        title.update(text)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and not being_taken_down(self):
            title = self.query_one("#overlay-title", Static)
            title.update(Text(f"cannot open the runs: {event.worker.error}", style="bold red"))

    @property
    def plot(self) -> MetricPlot:
        return self.query_one("#overlay-plot", MetricPlot)

    def action_close(self) -> None:
        self.dismiss()
