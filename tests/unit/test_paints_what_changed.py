"""PaintsWhatChanged (tpudash.tui.seams): a partial frame renders only the widgets under what changed, and
writes out exactly what Textual's own frame writes.

The screen is a column of labelled rows inside nested containers, as the run view is: a clock at the top
and a plot at the bottom change, the rows between do not.
"""

from __future__ import annotations

from typing import Any

from textual._compositor import Compositor
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Static

from tpudash.tui.seams import ChangedWidgetsCompositor, PaintsWhatChanged


class Ticking(Widget):
    """A line whose text changes in place: a repaint, no layout (as the run header's clock)."""

    DEFAULT_CSS = "Ticking { height: 1; }"

    def __init__(self, text: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.text = text

    def render(self) -> str:
        return self.text

    def tick(self, text: str) -> None:
        self.text = text
        self.refresh()


class BodyScreen(PaintsWhatChanged, Screen):
    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Vertical(*(Static(f"lane {index}") for index in range(8)), id="lanes")
            with Vertical(id="body"):
                yield Ticking("clock 0:00", id="clock")
                for index in range(10):
                    yield Static(f"row {index}: unchanged", classes="row")
                yield Ticking("plot ⠁⠂⠄", id="plot")


class BodyApp(App):
    CSS = "#lanes { width: 20; } #body { width: 1fr; }"
    SCREEN: type[Screen] = BodyScreen

    def on_mount(self) -> None:
        self.push_screen(self.SCREEN())


def changed_frame(app: App, frame) -> tuple[str, set[str]]:
    """Move the clock and the plot, then draw one partial frame with ``frame`` (Textual's own or the
    seam's): what it writes to the terminal, and which widgets it rendered."""
    screen = app.screen
    compositor = screen._compositor
    clock, plot = screen.query_one("#clock", Ticking), screen.query_one("#plot", Ticking)
    clock.tick("clock 0:01")
    plot.tick("plot ⠁⠂⠄⡀⢀")
    compositor.update_widgets({clock, plot})
    rendered: set[str] = set()
    render_lines = Widget.render_lines

    def noted(widget, crop):
        rendered.add(widget.id or ("row" if widget.has_class("row") else type(widget).__name__))
        return render_lines(widget, crop)

    Widget.render_lines = noted  # type: ignore[method-assign]
    try:
        update = frame(compositor)
    finally:
        Widget.render_lines = render_lines  # type: ignore[method-assign]
    return "".join(update.render_segments(app.console)), rendered


async def test_a_partial_frame_renders_only_the_widgets_under_what_changed_and_writes_what_textual_writes():
    app = BodyApp()
    async with app.run_test(size=(80, 16)) as pilot:
        await pilot.pause()
        compositor = app.screen._compositor
        assert isinstance(compositor, ChangedWidgetsCompositor)
        # Textual's own frame (the base class's, on the same compositor), then the seam's, for the same change.
        textual_wrote, textual_rendered = changed_frame(app, Compositor.render_partial_update)
        wrote, rendered = changed_frame(app, ChangedWidgetsCompositor.render_partial_update)
        assert wrote == textual_wrote
        assert "clock 0:01" in wrote and "⢀" in wrote and "row 3" not in wrote
        assert {"clock", "plot"} <= rendered
        assert "row" not in rendered and "lanes" not in rendered
        # If this fails, Textual renders only what changed by itself: the seam can go.
        assert "row" in textual_rendered


class OverlaidScreen(BodyScreen):
    """A box on a layer above, across the clock's line and two rows: it hides part of the clock."""

    DEFAULT_CSS = """
    OverlaidScreen { layers: base above; }
    #box { layer: above; offset: 26 0; width: 9; height: 3; background: red; }
    """

    def compose(self) -> ComposeResult:
        yield from super().compose()
        yield Static("BOX", id="box")


class OverlaidApp(BodyApp):
    SCREEN = OverlaidScreen


async def test_a_widget_in_front_of_a_change_still_covers_it():
    app = OverlaidApp()
    async with app.run_test(size=(80, 16)) as pilot:
        await pilot.pause()
        textual_wrote, _ = changed_frame(app, Compositor.render_partial_update)
        wrote, rendered = changed_frame(app, ChangedWidgetsCompositor.render_partial_update)
        assert wrote == textual_wrote
        assert "BOX" in wrote and "box" in rendered and "row" not in rendered


class HiddenTabScreen(BodyScreen):
    """The body, and beside it a container not displayed (as a tab not shown) with a line that changes."""

    def compose(self) -> ComposeResult:
        yield from super().compose()
        with Vertical(id="hidden-tab"):
            yield Ticking("table 0", id="hidden")

    def on_mount(self) -> None:
        self.query_one("#hidden-tab").display = False


class HiddenTabApp(BodyApp):
    SCREEN = HiddenTabScreen


async def test_a_change_under_a_hidden_node_does_not_map_the_whole_screen_again(monkeypatch):
    whole_maps: list[bool] = []
    arrange = Compositor._arrange_root

    def noted(self, root, size, visible_only=True):
        if not visible_only:
            whole_maps.append(True)
        return arrange(self, root, size, visible_only)

    monkeypatch.setattr(Compositor, "_arrange_root", noted)
    app = HiddenTabApp()
    async with app.run_test(size=(80, 16)) as pilot:
        await pilot.pause()
        screen = app.screen
        compositor = screen._compositor
        hidden, clock = screen.query_one("#hidden", Ticking), screen.query_one("#clock", Ticking)
        _ = clock.size  # the map of every widget, as a first lookup of any widget's place makes it
        whole_maps.clear()
        for update in (ChangedWidgetsCompositor.update_widgets, Compositor.update_widgets):
            hidden.tick("table 1")
            clock.tick("clock 0:02")
            update(compositor, {hidden, clock})
            _ = clock.size  # a widget's place looked up, as the run view does at every beat
            wrote = "".join(compositor.render_partial_update().render_segments(app.console))
            assert "clock 0:02" in wrote and "table" not in wrote
            if update is ChangedWidgetsCompositor.update_widgets:
                assert whole_maps == []
        # If this fails, Textual no longer maps the whole screen for a hidden widget's change: the seam can go.
        assert whole_maps == [True]
        await pilot.pause()
