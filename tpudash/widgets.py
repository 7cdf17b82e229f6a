"""Reusable dashboard widgets: bounded metric histories, plots, and the param form.

Plots are textual-plotext widgets: each subclasses ``PlotextPlot``, draws with
its own ``self.plt`` and has one ``replot()`` that turns the current data into
a figure. Histories are bounded (``DecimatedSeries`` halves its resolution when
full) and a plot's lines share a budget of about two points per column, so a
redraw costs the same after a million points as after a thousand. Redraws share a
``RedrawBudget``: plotext renders in pure Python, and a dashboard that steals a
core from training would cost its user the very throughput they are watching.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Button, Input, Label, OptionList, Select, Static, Switch
from textual_plotext import PlotextPlot

from jobs.base import JobSpec, Param, ParamError
from tpudash.series import DecimatedSeries, decimate_min_max, decimate_stride


def _page_keys_wait_for_layout() -> None:
    """Textual 8.2: pageup/pagedown reaching an OptionList (a Select's open
    list) before its first layout raised KeyError in ``_move_page`` and took
    the app down; found by the random-key soak. Until laid out, a page key
    does nothing."""
    move_page = OptionList._move_page

    def move_page_once_laid_out(self, direction):
        if (self.highlighted or 0) not in self._index_to_line:
            return
        move_page(self, direction)

    OptionList._move_page = move_page_once_laid_out


_page_keys_wait_for_layout()


# Points all lines of a plot draw together, per character column.
POINT_BUDGET_PER_COLUMN = 2.0


class RedrawBudget:
    """Keeps plot rendering under a fraction of one core.

    ``record`` adds the cost of a render; ``ready`` says whether plots may be
    redrawn now: not before ``min_interval`` since the last round (≤ 10 Hz) and
    not before the time spent rendering has been paid back at ``fraction``,
    but never more than ``max_interval`` later. A 20 ms render at the default
    1.5 % waits about 1.3 s before the next one.
    """

    def __init__(self, fraction: float = 0.015, min_interval: float = 0.1, max_interval: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.fraction = fraction
        self.min_interval = min_interval
        self.max_interval = max_interval
        self._clock = clock
        self._next_allowed = 0.0
        self._last_round = -math.inf
        self.rendered_seconds = 0.0
        self.renders = 0

    def ready(self) -> bool:
        now = self._clock()
        return now >= self._next_allowed and now - self._last_round >= self.min_interval

    def start_round(self) -> None:
        self._last_round = self._clock()

    def record(self, seconds: float) -> None:
        self.rendered_seconds += seconds
        self.renders += 1
        now = self._clock()
        # On a starved machine renders get slow; plots still move every max_interval.
        self._next_allowed = min(max(self._next_allowed, now) + seconds / self.fraction, now + self.max_interval)


# -- plots ----------------------------------------------------------------------


@dataclass
class PlotLine:
    """One labelled line (or scatter) of a plot, read from a bounded series."""

    label: str
    series: DecimatedSeries
    color: str | None = None
    scatter: bool = False
    """Dots instead of a line: for noisy raw values (cheap to draw, spikes still show)."""
    markers: bool = False
    """Also mark each point (per-epoch values: few, and each one matters)."""


class BudgetedPlot(PlotextPlot):
    """A PlotextPlot that reports what each render costs and redraws on resize."""

    DEFAULT_CSS = """
    BudgetedPlot {
        width: 1fr;
        height: 1fr;
        min-height: 8;
    }
    """

    MIN_WIDTH = 16
    MIN_HEIGHT = 5

    def __init__(self, budget: RedrawBudget | None = None, *, name: str | None = None, id: str | None = None,
                 classes: str | None = None):
        super().__init__(name=name, id=id, classes=classes)
        self.budget = budget
        self.last_render_seconds = 0.0
        self.points_drawn = 0
        """How many points the last ``replot`` handed to plotext (all lines)."""
        self._drawn_width = -1

    def render(self):
        if self.size.width < self.MIN_WIDTH or self.size.height < self.MIN_HEIGHT:
            return ""
        started = time.perf_counter()
        if self.size.width != self._drawn_width:
            # Decimation depends on the width, which may have changed since replot().
            self._replot_at_width()
        result = super().render()
        self.last_render_seconds = time.perf_counter() - started
        if self.budget is not None:
            self.budget.record(self.last_render_seconds)
        return result

    def on_resize(self) -> None:
        self.redraw()

    @property
    def columns(self) -> int:
        """Points worth drawing across: about one per character column."""
        return max(self.size.width - 10, 20)

    def redraw(self) -> None:
        """Replot the current data and schedule a repaint."""
        self._replot_at_width()
        self.refresh()

    def _replot_at_width(self) -> None:
        self._drawn_width = self.size.width
        self.replot()

    def replot(self) -> None:
        """Clear ``self.plt`` and plot the current data, decimated to the current width."""
        raise NotImplementedError


class MetricPlot(BudgetedPlot):
    """Lines of one metric against step: e.g. train per batch (smoothed), per epoch, val."""

    def __init__(self, title: str, budget: RedrawBudget | None = None, *, xlabel: str = "step",
                 log_y: bool = False, y_range: tuple[float, float] | None = None, id: str | None = None,
                 classes: str | None = None):
        super().__init__(budget, id=id, classes=classes)
        self.title = title
        self.xlabel = xlabel
        self.log_y = log_y
        self.y_range = y_range
        """Fixed y limits (percentages: 0 to 100), or None to follow the data."""
        self.lines: list[PlotLine] = []
        self.drawn_series: dict[str, tuple[list[float], list[float]]] = {}
        """What the last replot handed to plotext, per line label (decimated)."""

    def set_lines(self, lines: Sequence[PlotLine]) -> None:
        self.lines = list(lines)
        self.redraw()

    def replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.title(self.title)
        plt.xlabel(self.xlabel)
        drawn = 0
        all_positive = True
        self.drawn_series = {}
        plotted = [(line, *line.series.points()) for line in self.lines]
        plotted = [(line, xs, ys) for line, xs, ys in plotted if xs]
        allotments = share_points(self.point_budget, [len(xs) for _, xs, _ in plotted])
        for (line, xs, ys), allotment in zip(plotted, allotments):
            all_positive = all_positive and min(ys) > 0
            if line.scatter:
                # Dots, not a line: a line through noisy min/max points zigzags
                # the full height at every step, and plotext draws every pixel
                # of every segment (a hundred milliseconds for one noisy line).
                xs, ys = decimate_min_max(xs, ys, max(allotment // 2, 1))
                plt.scatter(xs, ys, label=line.label, color=line.color, marker="braille")
            else:
                # Lines carry smoothed or per-epoch values: evenly spaced points
                # follow them; min/max pairs would only add zigzags.
                xs, ys = decimate_stride(xs, ys, allotment)
                plt.plot(xs, ys, label=line.label, color=line.color, marker="braille")
                if line.markers and len(xs) <= self.columns // 4:
                    plt.scatter(xs, ys, color=line.color, marker="●")
            self.drawn_series[line.label] = (xs, ys)
            drawn += len(xs)
        if self.log_y and drawn and all_positive:
            plt.yscale("log")
        else:
            plt.yscale("linear")
        if self.y_range is not None:
            plt.ylim(*self.y_range)
        if not drawn:
            plt.title(f"{self.title} (waiting for data)")
        self.points_drawn = drawn

    @property
    def point_budget(self) -> int:
        """Points all lines may draw together: plotext's cost grows with them, not with history."""
        return int(POINT_BUDGET_PER_COLUMN * self.columns)


def share_points(budget: int, lengths: Sequence[int]) -> list[int]:
    """Split ``budget`` points among lines: short lines get all theirs, long ones share the rest."""
    allotments = [0] * len(lengths)
    remaining, left = budget, len(lengths)
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        allotments[index] = min(lengths[index], max(remaining // left, 2))
        remaining -= allotments[index]
        left -= 1
    return allotments


class PathPlot(BudgetedPlot):
    """A 2-D path, such as gradient descent's (x0, x1) from start to minimum."""

    def __init__(self, title: str, budget: RedrawBudget | None = None, *, xlabel: str = "x0", ylabel: str = "x1",
                 id: str | None = None, classes: str | None = None):
        super().__init__(budget, id=id, classes=classes)
        self.title = title
        self.xlabel = xlabel
        self.ylabel = ylabel
        self.path = DecimatedSeries()

    def set_path(self, path: DecimatedSeries) -> None:
        self.path = path
        self.redraw()

    def replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.title(self.title)
        plt.xlabel(self.xlabel)
        plt.ylabel(self.ylabel)
        xs, ys = decimate_stride(*self.path.points(), self.columns)
        if xs:
            plt.plot(xs, ys, marker="braille", label="path")
            plt.scatter([xs[0]], [ys[0]], marker="o", label="start", color="green")
            plt.scatter([xs[-1]], [ys[-1]], marker="x", label="end", color="red")
        else:
            plt.title(f"{self.title} (waiting for data)")
        self.points_drawn = len(xs)


class ReplicaBarPlot(BudgetedPlot):
    """One bar per replica or device, such as matmul GFLOP/s per device."""

    def __init__(self, budget: RedrawBudget | None = None, *, id: str | None = None, classes: str | None = None):
        super().__init__(budget, id=id, classes=classes)
        self.title = ""
        self.labels: list[str] = []
        self.values: list[float] = []

    def set_values(self, title: str, labels: Sequence[str], values: Sequence[float]) -> None:
        self.title = title
        self.labels = [str(label) for label in labels]
        self.values = [float(value) for value in values]
        self.redraw()

    def replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        if self.values:
            plt.bar(self.labels, self.values, marker="hd")
            plt.title(self.title)
        else:
            plt.title("per-replica values (waiting for data)")
        self.points_drawn = len(self.values)


# -- the param form ---------------------------------------------------------------


def _param_widget(param: Param) -> Input | Select | Switch:
    if param.kind == "bool":
        return Switch(value=bool(param.default), classes="param-input")
    if param.choices:
        options = [(str(choice), choice) for choice in param.choices]
        default = param.default if param.default in param.choices else param.choices[0]
        return Select(options, value=default, allow_blank=False, classes="param-input")
    # Plain text on purpose: a number-only Input would silently swallow a bad
    # key, where the user should see what is wrong and what is allowed.
    return Input(value=param.format(param.default), placeholder=param.allowed(), classes="param-input")


class ParamField(Vertical):
    """One param: its name and what it allows, the input, help text, and its error."""

    DEFAULT_CSS = """
    ParamField {
        height: auto;
        margin: 0 0 1 0;
    }
    ParamField .param-label { color: $text-primary; text-style: bold; }
    ParamField .param-help { color: $text-muted; }
    ParamField .param-error { color: $text-error; display: none; }
    ParamField.-invalid .param-error { display: block; }
    ParamField.-invalid .param-input { border: tall $error; }
    ParamField Switch { width: auto; }
    """

    def __init__(self, param: Param):
        super().__init__()
        self.param = param
        self.input = _param_widget(param)

    def compose(self) -> ComposeResult:
        yield Label(Text.assemble((self.param.name, "bold"), "  ", (f"({self.param.allowed()})", "dim")),
                    classes="param-label")
        yield self.input
        if self.param.help:
            yield Static(self.param.help, classes="param-help", markup=False)
        yield Static("", classes="param-error", markup=False)

    @property
    def raw_value(self) -> Any:
        """What the user entered: text for an Input, the choice or bool otherwise."""
        return self.input.value

    @property
    def error(self) -> str | None:
        return getattr(self, "_error", None)

    def mark(self, message: str | None) -> None:
        self._error = message
        self.set_class(message is not None, "-invalid")
        self.query_one(".param-error", Static).update(message or "")


class ParamForm(VerticalScroll):
    """A form generated from a job's Params; validates as the user types.

    Each field is parsed with ``Param.parse``; when every field parses, the
    whole set goes through ``spec.resolve`` (rules across fields) and, once
    the runtime is known, ``spec.check_runtime``. ``params`` holds the typed
    values when everything is valid, else None; ``errors`` maps field names
    (or "" for the form as a whole) to their messages.
    """

    DEFAULT_CSS = """
    ParamForm {
        height: 1fr;
        padding: 0 1;
    }
    ParamForm .form-title { text-style: bold; color: $text-accent; }
    ParamForm .form-description { color: $text-muted; margin: 0 0 1 0; }
    ParamForm .form-error { color: $text-error; display: none; margin: 0 0 1 0; }
    ParamForm.-invalid .form-error { display: block; }
    ParamForm .form-actions { height: auto; }
    ParamForm .form-actions Button { margin: 0 1 0 0; }
    """

    class Validated(Message):
        """The form was checked again; ``form.params`` is None while anything is invalid."""

        def __init__(self, form: "ParamForm"):
            super().__init__()
            self.form = form

        @property
        def control(self) -> "ParamForm":
            return self.form

    class LaunchRequested(Message):
        """The user asked to launch the job this form describes."""

        def __init__(self, form: "ParamForm"):
            super().__init__()
            self.form = form

        @property
        def control(self) -> "ParamForm":
            return self.form

    def __init__(self, spec: JobSpec, runtime: Callable[[], Any] | None = None, *, id: str | None = None):
        super().__init__(id=id)
        self.spec = spec
        self._runtime = runtime or (lambda: None)
        self.fields = [ParamField(param) for param in spec.params]
        self.params: dict | None = None
        self.errors: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        yield Static(Text.assemble((self.spec.title, "bold"), "  ", (self.spec.name, "dim")), classes="form-title")
        yield Static(self.spec.description, classes="form-description", markup=False)
        yield from self.fields
        yield Static("", classes="form-error", markup=False)
        with Horizontal(classes="form-actions"):
            yield Button("Launch (enter)", variant="primary", classes="launch")
            yield Button("Defaults", classes="defaults")

    def on_mount(self) -> None:
        self.validate()

    def field(self, name: str) -> ParamField:
        for field in self.fields:
            if field.param.name == name:
                return field
        raise KeyError(name)

    def set_value(self, name: str, value: Any) -> None:
        """Fill one field as if the user had typed or chosen ``value``."""
        widget = self.field(name).input
        if isinstance(widget, Input):
            widget.value = value if isinstance(value, str) else self.field(name).param.format(value)
        else:
            widget.value = value
        self.validate()

    def reset(self) -> None:
        for field in self.fields:
            param = field.param
            if isinstance(field.input, Input):
                field.input.value = param.format(param.default)
            else:
                field.input.value = param.default
        self.validate()

    def validate(self) -> dict | None:
        """Check every field and the whole; mark what is wrong; return the params or None."""
        errors: dict[str, str] = {}
        raw: dict[str, Any] = {}
        for field in self.fields:
            raw[field.param.name] = field.raw_value
            try:
                field.param.parse(field.raw_value)
            except ParamError as error:
                errors[field.param.name] = error.message
        params = None
        if not errors:
            try:
                params = self.spec.resolve(raw)
                runtime = self._runtime()
                if runtime is not None and self.spec.check_runtime is not None:
                    self.spec.check_runtime(params, runtime)
            except ParamError as error:
                key = error.field if error.field in raw else ""
                errors[key] = error.message if key else str(error)
                params = None
        for field in self.fields:
            field.mark(errors.get(field.param.name))
        form_error = errors.get("", "")
        self.set_class(bool(form_error), "-invalid")
        self.query_one(".form-error", Static).update(form_error)
        self.params, self.errors = params, errors
        self.post_message(self.Validated(self))
        return params

    def first_invalid(self) -> ParamField | None:
        return next((field for field in self.fields if field.error), None)

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.validate()

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        self.validate()

    def on_switch_changed(self, event: Switch.Changed) -> None:
        event.stop()
        self.validate()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(self.LaunchRequested(self))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.has_class("defaults"):
            self.reset()
        else:
            self.post_message(self.LaunchRequested(self))
