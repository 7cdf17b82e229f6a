"""The shell's bars on every screen: the session bar on top, the keys line at the bottom.

``SessionBar`` draws the app's runtime, engine and lane status; ``KeyBar``
draws the screen's bindings in one line that fits the terminal (``fit_keys``)
and always keeps the keys of the app's contract. Both stay light: the first
screen mounts them before the first frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.screen import Screen
from textual.widget import Widget

from tpudash.format import counted
from tpudash.tui.quiet_widgets import OneLineStatic


class SessionBar(OneLineStatic):
    """The one-line header on every screen: the runtime, then the accelerator lane.

    Shows the app's ``runtime_status`` ("connecting…", then kind, strategy and
    replicas, or "no TensorFlow"), ``engine_status`` (the process that owns
    TensorFlow: none, starting…, ready on KIND, running JOB, released,
    crashed) and ``lane_status`` (the running job, its status and elapsed
    time, how many runs wait, or the last run's end and its error). When that
    is wider than the terminal the line gets brief: the runtime without its
    strategy, the engine only when it is not simply ready or running, and
    what does not fit of the lane ends in "…" (the run view has it whole).
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

    _stale = False
    """The line changed while this bar's screen was not on show: it is drawn when the screen shows."""

    def on_mount(self) -> None:
        self.watch(self.app, "runtime_status", self._show, init=False)
        self.watch(self.app, "lane_status", self._show, init=False)
        self.watch(self.app, "engine_status", self._show, init=False)
        self.app.screen_change_signal.subscribe(self, self._screen_changed)
        self._show()

    def on_resize(self) -> None:
        self._show()

    def _screen_changed(self, _screen: object) -> None:
        if self._stale:
            # Right after the screen's first frame, not in it: a key's new screen draws as fast as ever, and the
            # news it missed follows a frame later.
            self.call_after_refresh(self._show)

    def _show(self, _value: object = None) -> None:
        if self.screen not in self.app.screen_stack:
            # Every screen has this bar, and the lane's clock moves each second: a screen of another mode (composed
            # ahead, or left) would redraw its bar unseen, every second, with a CPU training needs (issue 37).
            self._stale = True
            return
        self._stale = False
        width = self.content_size.width
        text = self._line(brief=False)
        if width and text.cell_len > width:
            text = self._line(brief=True)
            text.truncate(width, overflow="ellipsis")
        self.update(text, layout=False)  # always one line: no relayout

    def _line(self, brief: bool) -> Text:
        app = self.app
        runtime = getattr(app, "runtime_status", "")
        lane = getattr(app, "lane_status", "")
        engine = getattr(app, "engine_status", "")
        style = (
            "bold red"
            if "fail" in runtime
            else "bold yellow"
            if runtime.startswith(("no TensorFlow", "no JAX"))
            else "cyan"
        )
        description = getattr(getattr(app, "runtime", None), "description", None)
        if brief and description is not None:
            framework = "JAX · " if getattr(description, "framework", "") == "jax" else ""
            runtime = f"{framework}{description.kind} · {counted(description.num_replicas, 'replica')}" + (
                " (simulated)" if description.simulated else ""
            )
        separator = " │ " if brief else "  │  "
        text = Text.assemble(("tpudash", "bold"), "  ", (runtime, style))
        # Brief: "ready on CPU" and "running train" only repeat the runtime and the lane.
        if engine and not (brief and (engine in ("none", "running") or engine.startswith(("ready", "running ")))):
            engine_style = (
                "bold red" if engine.startswith("crashed") else "dim" if engine in ("none", "released") else ""
            )
            text.append(f"{separator}engine ")
            text.append(engine, engine_style)
        if lane:
            text.append(separator)
            text.append(
                lane,
                "bold yellow"
                if "running" in lane or lane.startswith("stopping")
                else "bold red"
                if " failed" in lane
                else "",
            )
        return text


@dataclass(frozen=True)
class ShownKey:
    """One binding on the keys line."""

    key: str
    display: str
    description: str
    enabled: bool
    rank: int
    """0: a key of the contract (never left out), 1: the screen's own, 2: the app's others."""

    @property
    def mnemonic(self) -> bool:
        """The description starts with the key's letter, so the compact line shows it as the word's first letter."""
        return len(self.display) == 1 and self.description[:1].lower() == self.display.lower()

    def width(self, compact: bool, described: bool) -> int:
        if not compact:
            return cell_len(f" {self.display} ") + (len(self.description) + 1 if self.description else 0)
        if described and self.description and self.mnemonic:
            return len(self.description)
        return cell_len(self.display) + (1 + len(self.description) if described and self.description else 0)


def fit_keys(
    keys: Sequence[ShownKey], width: int, full_style_width: int = 0
) -> tuple[bool, list[tuple[ShownKey, bool]]]:
    """How to draw ``keys`` (the palette key last) in ``width`` cells: (compact, [(key, with description)]).

    One style for every screen at a given width: every key as `` d Devices ``
    while ``width`` holds ``full_style_width`` (what the widest screen's line
    needs) and this line; else compact (``devices`` with its first letter as
    the key, else ``x cancel``, one space apart). Then, until the line fits,
    descriptions go before any key does (a bare ``v`` still says the key
    works here; help and the palette say what it does): first the app's
    other keys', then the screen's, then the contract's, each from the
    right; only then the app's other keys, then the screen's, from the
    right. Whatever happens, every key of the contract stays on the line.
    """

    def needed(compact: bool, chosen: list[tuple[ShownKey, bool]]) -> int:
        return sum(key.width(compact, described) for key, described in chosen) + (len(chosen) - 1 if compact else 0)

    chosen = [(key, True) for key in keys]
    if width >= full_style_width and needed(False, chosen) <= width:
        return False, chosen
    for rank in (2, 1, 0):
        for index in range(len(chosen) - 1, -1, -1):
            if needed(True, chosen) <= width:
                return True, chosen
            if chosen[index][0].rank == rank:
                chosen[index] = (chosen[index][0], False)
    for rank in (2, 1):
        for index in range(len(chosen) - 1, -1, -1):
            if needed(True, chosen) <= width:
                return True, chosen
            if chosen[index][0].rank == rank:
                del chosen[index]
    return True, chosen


class KeyBar(Widget, can_focus=False):
    """The keys line at the bottom: every shown binding of the screen, one widget.

    Textual's ``Footer`` mounts a widget per key and recomposes them all
    whenever the bindings change — on every screen switch and focus move,
    which made a switch cost ~20 ms idle and several times that under
    training. This draws the same line as one ``Text``, re-renders only when
    the keys shown actually change, and a click on a key presses it. On a
    narrow terminal the line turns compact (``fit_keys``) so the keys of the
    contract (the app's ``CONTRACT_KEYS``) are always there; the others are
    in help (``?``) and the palette. Whether it is compact depends on the
    width alone, never on the screen: every screen's line has one style.
    """

    SCREEN_KEYS_ROOM = 56
    """Cells a screen's own keys take in the full style, at most (History's four; a test holds every screen to it)."""

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
        self._shown: tuple[ShownKey, ...] = ()
        self.spans: list[tuple[int, int, str]] = []
        """(first cell, end cell, key) of each key on the line as last drawn, left to right (clicks land here)."""

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)
        self._bindings_changed(self.screen)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def on_resize(self) -> None:
        self.refresh()

    def _bindings_changed(self, screen: Screen) -> None:
        if screen is not self.screen:
            return
        shown = self._shown_bindings()
        if shown != self._shown:
            self._shown = shown
            self.refresh()

    def _shown_bindings(self) -> tuple[ShownKey, ...]:
        """Each binding to show, the palette's last."""
        app = self.app
        contract: frozenset[str] = getattr(app, "CONTRACT_KEYS", frozenset())
        seen_actions: set[str] = set()
        shown = []
        palette = None
        for key, (node, binding, enabled, _tooltip) in self.screen.active_bindings.items():
            rank = 0 if binding.key in contract else 2 if node is app else 1
            entry = ShownKey(binding.key, app.get_key_display(binding), binding.description, enabled, rank)
            if app.ENABLE_COMMAND_PALETTE and key == app.COMMAND_PALETTE_BINDING:
                palette = entry
            elif binding.show and binding.action not in seen_actions:
                seen_actions.add(binding.action)
                shown.append(entry)
        return tuple(shown) + ((palette,) if palette is not None else ())

    def _full_style_width(self) -> int:
        """The width from which every screen's line fits in the full style: the app's keys, the palette's, a screen's."""
        app = self.app
        app_keys = [
            ShownKey(binding.key, app.get_key_display(binding), binding.description, True, 2)
            for binding in app.BINDINGS
            if isinstance(binding, Binding) and binding.show
        ]
        palette_key = app.COMMAND_PALETTE_BINDING if app.ENABLE_COMMAND_PALETTE else None
        palette = [key for key in self._shown if key.key == palette_key]
        return sum(key.width(False, True) for key in app_keys + palette) + self.SCREEN_KEYS_ROOM

    def render(self) -> Text:
        key_style = self.get_component_rich_style("keybar--key", partial=True)
        description_style = self.get_component_rich_style("keybar--description", partial=True)
        disabled_style = self.get_component_rich_style("keybar--disabled", partial=True)
        palette_key = self.app.COMMAND_PALETTE_BINDING if self.app.ENABLE_COMMAND_PALETTE else None
        width = self.size.width or sum(key.width(False, True) for key in self._shown)
        compact, chosen = fit_keys(self._shown, width, self._full_style_width())
        keys, palette = Text(end=""), Text(end="")
        placed: list[tuple[Text, int, int, str]] = []
        for shown, described in chosen:
            part = palette if shown.key == palette_key else keys
            keys_style = key_style if shown.enabled else key_style + disabled_style
            words_style = description_style if shown.enabled else description_style + disabled_style
            if compact and part.cell_len:
                part.append(" ")
            start = part.cell_len
            if not compact:
                part.append(f" {shown.display} ", keys_style)
                if shown.description:
                    part.append(f"{shown.description} ", words_style)
            elif described and shown.description and shown.mnemonic:
                # "devices" with its d drawn as the key: the line fits 80 columns.
                part.append(shown.display, keys_style)
                part.append(shown.description[1:], words_style)
            else:
                part.append(shown.display, keys_style)
                if described and shown.description:
                    part.append(f" {shown.description.lower()}", words_style)
            placed.append((part, start, part.cell_len, shown.key))
        # The palette key sits at the right edge, like Textual's footer; on a
        # terminal narrower than the contract's keys the line is cropped.
        if compact and keys.cell_len and palette.cell_len:
            palette.pad_left(1)
            placed = [
                (part, start + 1, end + 1, key) if part is palette else (part, start, end, key)
                for part, start, end, key in placed
            ]
        room = max(0, width - palette.cell_len)
        keys.truncate(room, pad=True)
        self.spans = [
            (start, min(end, room), key) if part is keys else (room + start, room + end, key)
            for part, start, end, key in placed
            if part is not keys or start < room
        ]
        return Text.assemble(keys, palette, no_wrap=True, overflow="crop", end="")

    def on_click(self, event: events.Click) -> None:
        for start, end, key in self.spans:
            if start <= event.x < end:
                self.app.simulate_key(key)
                return
