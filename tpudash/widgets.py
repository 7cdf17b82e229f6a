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
from textual.widgets import Button, Input, Label, Select, Static, Switch
from textual_plotext import PlotextPlot

from jobs.base import JobSpec, Param, ParamError
from tpudash.series import DecimatedSeries, decimate_min_max, decimate_stride


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
        self.markers: dict[str, tuple[float, float]] = {}
        """Where the last replot put the "start" and "end" markers."""

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
        self.markers = {"start": (xs[0], ys[0]), "end": (xs[-1], ys[-1])} if xs else {}
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
    # Compact (one line, no border): a form of sixteen fields fits a 24-line terminal.
    if param.kind == "bool":
        return Switch(value=bool(param.default), classes="param-input")
    if param.choices:
        options = [(str(choice), choice) for choice in param.choices]
        default = param.default if param.default in param.choices else param.choices[0]
        return Select(options, value=default, allow_blank=False, compact=True, classes="param-input")
    # Plain text on purpose: a number-only Input would silently swallow a bad
    # key, where the user should see what is wrong and what is allowed.
    return Input(value=param.format(param.default), placeholder=param.allowed(), compact=True,
                 classes="param-input")


class ParamField(Vertical):
    """One param on one line, its name beside its input; what it allows and its help
    below while it has focus (always on a tall screen); its error below when it has one.

    A param that has no effect with the other params' current values
    (``Param.applies_when``) is hidden, unless its value is wrong.
    """

    # A scoped rule is prefixed with "ParamField", so one about the screen's height could never match.
    SCOPED_CSS = False
    DEFAULT_CSS = """
    ParamField {
        height: auto;
    }
    /* On the field itself too, so Textual restyles its label and help when the focus moves in or out. */
    ParamField:focus-within { background: $boost; }
    ParamField .param-row { height: auto; }
    ParamField .param-label { color: $text-primary; text-style: bold; padding: 0 1 0 0; }
    ParamField:focus-within .param-label { color: $text-accent; text-style: bold reverse; }
    ParamField .param-input { width: 1fr; }
    ParamField Input.param-input { background: $boost; }
    ParamField Input.param-input:focus { background: $primary 25%; }
    ParamField Switch.param-input { width: auto; height: 1; border: none; padding: 0 1; }
    ParamField .param-switch-state { width: 1fr; padding: 0 1; }
    ParamField .param-help { color: $text-muted; display: none; }
    ParamField:focus-within .param-help { display: block; }
    Screen.-tall ParamField .param-help { display: block; }
    ParamField .param-error { color: $text-error; display: none; }
    ParamField.-invalid .param-error { display: block; }
    ParamField.-invalid .param-input { background: $error 30%; }
    ParamField.-inapplicable { display: none; }
    ParamField.-inapplicable.-invalid { display: block; }
    """

    def __init__(self, param: Param, label_width: int | None = None):
        super().__init__()
        self.param = param
        self.input = _param_widget(param)
        self.label_width = label_width or len(param.name) + 1

    def compose(self) -> ComposeResult:
        with Horizontal(classes="param-row"):
            label = Label(self.param.name, classes="param-label", markup=False)
            label.styles.width = self.label_width
            yield label
            yield self.input
            if isinstance(self.input, Switch):
                # A one-line switch is a small bar; the word says which way it is set.
                yield Label(self.param.format(self.input.value), classes="param-switch-state")
        help_text = Text(self.param.allowed(), style="italic")
        if self.param.help:
            help_text.append(f" · {self.param.help}")
        yield Static(help_text, classes="param-help")
        yield Static("", classes="param-error", markup=False)

    def on_switch_changed(self, event: Switch.Changed) -> None:
        self.query_one(".param-switch-state", Label).update(self.param.format(event.value))

    @property
    def raw_value(self) -> Any:
        """What the user entered: text for an Input, the choice or bool otherwise."""
        return self.input.value

    @property
    def error(self) -> str | None:
        return getattr(self, "_error", None)

    @property
    def applies(self) -> bool:
        """False while the other params' values make this one have no effect (it is hidden then)."""
        return not self.has_class("-inapplicable")

    def mark(self, message: str | None) -> None:
        self._error = message
        self.set_class(message is not None, "-invalid")
        self.query_one(".param-error", Static).update(message or "")


class ParamForm(VerticalScroll, can_focus=False):
    """A form generated from a job's Params; validates as the user types.

    Each field is parsed with ``Param.parse``; when every field parses, the
    whole set goes through ``spec.resolve`` (rules across fields) and, once
    the runtime is known, ``spec.check_runtime``. ``params`` holds the typed
    values when everything is valid, else None; ``errors`` maps field names
    (or "" for the form as a whole) to their messages.

    Whatever has focus inside the form (a field, a select, a switch, a
    button), a character typed there is the user's typing: it never reaches
    the app's one-letter keys (``c`` cancel, ``q`` quit, …).
    """

    DEFAULT_CSS = """
    ParamForm {
        height: 1fr;
        padding: 0 1;
    }
    ParamForm .form-title { text-style: bold; color: $text-accent; }
    ParamForm .form-description { color: $text-muted; }
    ParamForm .form-error { color: $text-error; display: none; }
    ParamForm.-invalid .form-error { display: block; }
    ParamForm .form-actions { height: auto; margin: 1 0 0 0; }
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
        label_width = max((len(param.name) for param in spec.params), default=0) + 2
        self.fields = [ParamField(param, label_width) for param in spec.params]
        self.params: dict | None = None
        self.errors: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        yield Static(Text.assemble((self.spec.title, "bold"), "  ", (self.spec.name, "dim")), classes="form-title")
        yield Static(self.spec.description, classes="form-description", markup=False)
        yield from self.fields
        yield Static("", classes="form-error", markup=False)
        with Horizontal(classes="form-actions"):
            yield Button("Launch (enter)", variant="primary", compact=True, classes="launch")
            yield Button("Defaults", compact=True, classes="defaults")

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
            field.set_class(not field.param.applies(raw), "-inapplicable")
        form_error = errors.get("", "")
        self.set_class(bool(form_error), "-invalid")
        self.query_one(".form-error", Static).update(form_error)
        self.params, self.errors = params, errors
        self.post_message(self.Validated(self))
        return params

    def first_invalid(self) -> ParamField | None:
        return next((field for field in self.fields if field.error), None)

    def focus_first(self) -> None:
        """Put the cursor in the first field shown, now (``focus()`` would wait behind keys already typed)."""
        shown = next((field for field in self.fields if field.applies), None)
        if shown is not None:
            self.screen.set_focus(shown.input)

    def check_consume_key(self, key: str, character: str | None) -> bool:
        # Textual then drops the screen's and the app's bindings of every
        # character while focus is in the form (and from the keys line);
        # keys bound inside it (space on a switch or a select) still work.
        return character is not None and character.isprintable()

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
