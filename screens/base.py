"""The frame every tpudash screen shares: the session bar on top, the keys below.

A screen subclasses ``DashScreen`` and yields its body from ``compose_body``;
the session bar (runtime and accelerator lane) and the footer come with it.
This module stays light (no plots, no jobs): the first screen imports it
before the first frame.
"""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Static


class SessionBar(Static):
    """The one-line header on every screen: the runtime, then the accelerator lane.

    Shows the app's ``runtime_status`` ("connecting…", then kind, strategy and
    replicas, or "no TensorFlow"), ``engine_status`` (the process that owns
    TensorFlow: none, starting…, ready on KIND, running JOB, released,
    crashed) and ``lane_status`` (the running job, its status and elapsed
    time, and how many runs wait).
    """

    DEFAULT_CSS = """
    SessionBar {
        dock: top;
        height: 1;
        width: 100%;
        background: $panel;
        color: $foreground;
        padding: 0 1;
    }
    """

    def on_mount(self) -> None:
        self.watch(self.app, "runtime_status", self._show, init=False)
        self.watch(self.app, "lane_status", self._show, init=False)
        self.watch(self.app, "engine_status", self._show, init=False)
        self._show()

    def _show(self, _value: object = None) -> None:
        runtime = getattr(self.app, "runtime_status", "")
        lane = getattr(self.app, "lane_status", "")
        engine = getattr(self.app, "engine_status", "")
        style = "bold red" if "fail" in runtime else "bold yellow" if runtime.startswith("no TensorFlow") else "cyan"
        text = Text.assemble(("tpudash", "bold"), "  ", (runtime, style))
        if engine:
            engine_style = "bold red" if engine.startswith("crashed") else "dim" if engine in ("none", "released") else ""
            text.append("  │  engine ")
            text.append(engine, engine_style)
        if lane:
            text.append("  │  ")
            text.append(lane, "bold yellow" if "running" in lane else "")
        self.update(text, layout=False)  # always one line: no relayout


class KeyBar(Widget, can_focus=False):
    """The keys line at the bottom: every shown binding of the screen, one widget.

    Textual's ``Footer`` mounts a widget per key and recomposes them all
    whenever the bindings change — on every screen switch and focus move,
    which made a switch cost ~20 ms idle and several times that under
    training. This draws the same line as one ``Text``, re-renders only when
    the keys shown actually change, and a click on a key presses it.
    """

    COMPONENT_CLASSES = {"keybar--key", "keybar--description", "keybar--disabled"}
    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        height: 1;
        width: 100%;
        background: $footer-background;
        color: $footer-foreground;
        .keybar--key {
            color: $footer-key-foreground;
            text-style: bold;
        }
        .keybar--description {
            color: $footer-description-foreground;
        }
        .keybar--disabled {
            text-style: dim;
        }
    }
    """

    def __init__(self) -> None:
        super().__init__()
        self._shown: tuple = ()
        self._spans: list[tuple[int, int, str]] = []
        """(first cell, end cell, key) of each key on the line, for clicks."""

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)
        self._bindings_changed(self.screen)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, screen: Screen) -> None:
        if screen is not self.screen:
            return
        shown = self._shown_bindings()
        if shown != self._shown:
            self._shown = shown
            self.refresh()

    def _shown_bindings(self) -> tuple:
        """(key, key display, description, enabled) of each binding to show; the palette's last."""
        app = self.app
        seen_actions: set[str] = set()
        shown = []
        palette = None
        for key, (_node, binding, enabled, _tooltip) in self.screen.active_bindings.items():
            entry = (binding.key, app.get_key_display(binding), binding.description, enabled)
            if app.ENABLE_COMMAND_PALETTE and key == app.COMMAND_PALETTE_BINDING:
                palette = entry
            elif binding.show and binding.action not in seen_actions:
                seen_actions.add(binding.action)
                shown.append(entry)
        return tuple(shown) + ((palette,) if palette is not None else ())

    def render(self) -> Text:
        key_style = self.get_component_rich_style("keybar--key", partial=True)
        description_style = self.get_component_rich_style("keybar--description", partial=True)
        disabled_style = self.get_component_rich_style("keybar--disabled", partial=True)
        palette_key = self.app.COMMAND_PALETTE_BINDING if self.app.ENABLE_COMMAND_PALETTE else None
        keys, palette = Text(end=""), Text(end="")
        placed: list[tuple[Text, int, int, str]] = []
        for key, key_display, description, enabled in self._shown:
            part = palette if key == palette_key else keys
            start = part.cell_len
            part.append(f" {key_display} ", key_style if enabled else key_style + disabled_style)
            if description:
                part.append(f"{description} ", description_style if enabled else description_style + disabled_style)
            placed.append((part, start, part.cell_len, key))
        # The palette key sits at the right edge, like Textual's footer; the
        # other keys are cropped before it on a narrow terminal.
        width = self.size.width or keys.cell_len + palette.cell_len
        room = max(0, width - palette.cell_len)
        keys.truncate(room, pad=True)
        self._spans = [(start, min(end, room), key) if part is keys else (room + start, room + end, key)
                       for part, start, end, key in placed]
        return Text.assemble(keys, palette, no_wrap=True, overflow="crop", end="")

    def on_click(self, event: events.Click) -> None:
        for start, end, key in self._spans:
            if start <= event.x < end:
                self.app.simulate_key(key)
                return


class DashScreen(Screen):
    """A screen with the session bar and the keys line around its body."""

    def compose(self) -> ComposeResult:
        yield SessionBar()
        yield from self.compose_body()
        yield KeyBar()

    def _on_screen_resume(self, event: events.ScreenResume) -> None:
        # A mode switch asks the screen to re-apply the whole stylesheet to
        # every widget (~20 ms for the Jobs form), though nothing about its
        # styles changed while it was hidden: a theme change re-applies CSS
        # on its own, and widgets restyle themselves when their classes
        # change. Textual skips the same work when a screen on top is
        # popped; a screen that has been shown before skips it here. (Textual
        # calls this before Screen's own handler, which reads the flag.)
        if self._shown_before:
            event.refresh_styles = False
        self._shown_before = True

    _shown_before = False

    def compose_body(self) -> ComposeResult:
        raise NotImplementedError
