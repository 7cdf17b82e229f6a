"""The places tpudash depends on how Textual works inside, not on its documented API.

Everything else in the dashboard uses Textual's public API. These have no
public way to do what they do, so they live here, each with the reason, and
``tests/unit/test_textual_seams.py`` fails as soon as a Textual release
changes what they rely on: an upgrade then says what to look at instead of
breaking the dashboard quietly. Written against Textual 8.2.

- ``guard_option_list_page_keys``: a page key reaching an OptionList before its
  first layout (a Select's list just opened) raises KeyError inside Textual and
  takes the app down. The list lives inside Select, so no subclass of ours can
  replace it.
- ``guard_select_mount_while_taken_down``: a Select mounting in a screen
  that is being closed (or as the app quits) looks up its own parts, which
  were never mounted, and raises NoMatches, taking the app down.
- ``UndelayedRevisits``: ``App.switch_mode`` holds every frame for 50 ms
  through ``App.delay_update`` to hide a screen still composing. A mode shown
  before is composed and kept, so that delay is pure key latency.
- ``UndelayedRevisits.compose_mode_ahead``: Textual builds a mode's screen on
  its first ``switch_mode`` (import, compose, mount, style), then re-parses the
  whole stylesheet from scratch twice (``refresh_css``: a new screen's CSS
  count is behind the app's): 0.1–0.5 s on the first press of a key. Built
  ahead, in idle time, the screen is styled as it mounts, its count set, its
  layout done and its widgets rendered (``paint_ahead``), its update timer
  started, so the first press only switches, as a re-visit does.
- ``KeptLayout``: ``App.switch_mode`` lays a mode's screen out again on every
  visit (``Screen._screen_resized``), even at the size it was laid out at
  with nothing moved since: about half of a re-visit's UI-thread time. A
  screen that asked for a layout while hidden says so (``_layout_required``),
  and then, or at another size, Textual's own layout runs.
- ``PaintsWhatChanged``: a frame that is not a full one renders every widget
  whose container overlaps the box around all the regions that changed
  (``Compositor._get_renders`` filters by the clip, not the widget), yet
  writes out only the changed lines. While a job trains, a clock at the top
  of the run body and its plots below make that box the whole body: 45
  widgets rendered, a handful changed. Its compositor renders only the
  widgets whose visible part overlaps a changed region; what reaches the
  terminal is the same.
- ``CollectsAfterFrames``: the frame a screen key waits for is the first
  one of another screen that ``App._display`` hands the terminal after it;
  the collection held back for that key (``tpudash.tui.collector.hold``)
  runs then.
- ``being_taken_down``: a screen closed while it still mounts (keys
  typed ahead: enter then escape) has its children removed before its own and
  its widgets' ``on_mount`` run, and Textual says so only through the private
  ``_pruning`` flag. Found by the random-key soak. A widget composed after
  that point never gets its children (``Widget.mount`` mounts nothing while
  pruning), yet its screen still handles what was queued before it closes:
  a run's load that finished early (seen once in CI). The same holds for a
  screen still mounting as the app shuts down (``App._shutdown`` clears
  ``is_running`` first; screens not running yet are closed without a
  prune).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from textual import events
from textual._compositor import Compositor
from textual.dom import DOMNode
from textual.geometry import Region, Size
from textual.screen import Screen
from textual.strip import Strip
from textual.widget import AwaitMount, Widget
from textual.widgets import OptionList, Select

from tpudash.tui import collector

# To the type checker the mixin is an App (it calls App's methods); at run
# time it is a plain class placed before App in the app's bases.
if TYPE_CHECKING:
    from textual.app import App

    _MixedIntoApp = App[Any]
    _MixedIntoScreen = Screen[Any]
else:
    _MixedIntoApp = _MixedIntoScreen = object

_GUARDED = "_tpudash_page_keys_guarded"
_PAINT_TIMER = "_tpudash_paint_ahead_timer"
TEXTUAL_MOVE_PAGE = OptionList._move_page
"""Textual's own page move, kept so a test can tell when a release no longer needs the guard."""
TEXTUAL_SELECT_ON_MOUNT = Select._on_mount
"""Textual's own Select mount, kept so a test can tell when a release no longer needs the guard."""


def being_taken_down(node: DOMNode) -> bool:
    """Is ``node`` being removed already, as its ``on_mount`` or a queued message runs? Then its children may be
    gone or never mounted: draw nothing."""
    return bool(node._pruning) or not node.app.is_running


class KeptLayout(_MixedIntoScreen):
    """A Screen mixin: a mode's screen shown again at the size of its last layout, with no layout asked for
    while it was hidden, keeps that layout; its resume repaints it as before. Built ahead and not shown yet,
    it is laid out whenever it asks (``lay_out_ahead``), so its first visit is such a visit too.

    Mix in before ``Screen``. Relies on ``App.switch_mode`` calling ``Screen._screen_resized`` before the
    screen's resume, and on a widget's layout request to a hidden screen setting its ``_layout_required``
    (the screen's update timer lays it out once it is shown, as it does for a request that comes later).
    """

    def _screen_resized(self, size: Size) -> None:
        if size == self._size and not (self._layout_required or self._scroll_required or self._layout_widgets):
            return  # nothing moved while hidden: the last layout stands
        super()._screen_resized(size)

    _ahead_asked = False

    async def _on_layout(self, message: Any) -> None:
        await super()._on_layout(message)
        # Built ahead and not shown yet: keep its layout current (its widgets go on mounting after the
        # first layout), so the first visit finds it laid out. A screen shown before waits for its visit.
        # One pass for many requests: a form mounting its fields asks once per field.
        if (
            self.stack_updates == 0
            and self._layout_required
            and not self._ahead_asked
            and not self.is_current
            and self.is_attached
        ):
            self._ahead_asked = True
            self.call_after_refresh(self._lay_out_ahead_once)

    def _lay_out_ahead_once(self) -> None:
        self._ahead_asked = False
        lay_out_ahead(self, self.app.size, 1)


class ChangedWidgetsCompositor(Compositor):
    """A compositor whose partial frames render only the widgets under a changed region.

    Textual's ``_render_chops`` lets the front-most widget at each cut of a line win, and
    ``ChopsUpdate`` writes out only the cuts within the changed lines' spans: the widget that wins a
    cut there is always one whose visible part overlaps a changed region, so leaving the others out
    changes nothing written. Relies on ``_get_renders`` reading ``visible_widgets`` (as a cached
    ``_visible_widgets``) to choose the widgets it renders; ``cuts`` are found over every widget first.

    It also leaves out of a frame's update the widgets under a node not displayed (a tab not shown):
    they are in no map, so Textual takes each for a new widget and maps the whole screen again at the
    next lookup of any widget's place (3-5 ms, at each epoch while a hidden tab's table refreshes).
    Such a widget can be drawn only after a layout, which maps it anyway.
    """

    def update_widgets(self, widgets: set[Widget]) -> None:
        super().update_widgets({widget for widget in widgets if displayed(widget)})

    _changed: tuple[Region, ...] = ()

    def render_partial_update(self) -> Any:
        _ = self.cuts  # found (and cached) over every widget, before the partial frame narrows them
        self._changed = tuple(self._dirty_regions)
        try:
            return super().render_partial_update()
        finally:
            self._changed = ()

    def _get_renders(self, crop: Region | None = None) -> Iterable[tuple[Region, Region, list[Strip]]]:
        changed = self._changed
        if not changed:
            return super()._get_renders(crop)
        every = self.visible_widgets
        self._visible_widgets = {
            widget: (region, clip)
            for widget, (region, clip) in every.items()
            if any(region.intersection(clip).overlaps(change) for change in changed)
        }
        try:
            return list(super()._get_renders(crop))
        finally:
            self._visible_widgets = every


def displayed(widget: Widget) -> bool:
    """Whether the widget and every widget it is in are displayed (a hidden tab's widgets are not)."""
    return all(node.display for node in widget.ancestors_with_self if isinstance(node, Widget))


class PaintsWhatChanged(_MixedIntoScreen):
    """A Screen mixin: its partial frames render only the widgets under what changed
    (``ChangedWidgetsCompositor``). Mix in before ``Screen``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._compositor = ChangedWidgetsCompositor()


def lay_out_ahead(screen: Screen[Any], size: Size, rounds: int = 3) -> None:
    """Lay a hidden screen out at ``size``, and again once the messages that caused are handled, while any asks.

    Its widgets answer their first size (a form mounting its fields, a bar its text) by asking for
    another layout: each round waits for those answers (``call_after_refresh`` on a hidden screen runs
    once its messages are handled) and lays it out again, ``rounds`` times at most. Relies on
    ``Screen._refresh_layout`` laying out a screen that is not current without drawing it, and on a
    layout request to a hidden screen only setting ``_layout_required`` (cleared here: the layout done
    covers it). Nothing is done once the screen is shown: its own update timer lays it out then.
    """
    if screen.is_current or not screen.is_attached or rounds <= 0:
        return
    if screen._size != size or screen._layout_required or screen._layout_widgets:
        screen._layout_required = False
        screen._refresh_layout(size)
        screen.call_after_refresh(lay_out_ahead, screen, size, rounds - 1)
    else:
        paint_ahead_when_quiet(screen)


PAINT_AHEAD_QUIET_SECONDS = 0.25
"""How long a hidden screen must ask for no layout before it is painted ahead."""


def paint_ahead_when_quiet(screen: Screen[Any]) -> None:
    """``paint_ahead`` once the screen has asked for no layout for ``PAINT_AHEAD_QUIET_SECONDS``.

    A screen goes on mounting after its first layouts (the Jobs screen's forms: a layout request per
    field); each would undo a paint done before it. Painted at each, the Jobs screen was rendered 87
    times over (0.14 s of the UI thread just after the first frame); painted once quiet, once.
    """
    waiting = getattr(screen, _PAINT_TIMER, None)
    if waiting is not None:
        waiting.stop()
    setattr(screen, _PAINT_TIMER, screen.set_timer(PAINT_AHEAD_QUIET_SECONDS, lambda: paint_ahead(screen)))


def paint_ahead(screen: Screen[Any]) -> None:
    """Render a laid-out hidden screen's widgets once, so its first visit paints from their caches.

    Each widget keeps the lines it rendered (``StylesCache``) until it changes; a screen's first paint
    renders every one of them (the Jobs screen's: 40 ms of the UI thread on a loaded machine), a
    re-visit's finds them kept. Rendered here in idle time, the first visit paints as a re-visit does.
    Its update timer is started too: Textual makes a screen's on first use, and that one sleeps a whole
    frame (1/60 s) before its first tick, so a first visit waited 17 ms to be painted. Started here, it
    ticks once while the screen is hidden (drawing nothing) and then waits: the first visit's tick comes
    at once, as a re-visit's does. Relies on ``Compositor._get_renders`` rendering each visible widget
    without drawing anything, and on ``Screen._update_timer`` and ``Timer._run`` as in Textual 8.2.
    """
    if screen.is_current or not screen.is_attached:
        return
    for _ in screen._compositor._get_renders():
        pass
    screen._update_timer.resume()


def guard_option_list_page_keys() -> None:
    """Until an OptionList is laid out, pageup/pagedown on it do nothing (Textual 8.2 raises KeyError).

    Found by the random-key soak (tests/functional/test_app_soak.py). Safe to call more than once.
    """
    if getattr(OptionList, _GUARDED, False):
        return
    move_page = TEXTUAL_MOVE_PAGE

    def move_page_once_laid_out(self, direction):
        # _index_to_line is filled by the first layout; before it, any page
        # move would look up a line that does not exist yet.
        if (self.highlighted or 0) not in self._index_to_line:
            return
        move_page(self, direction)

    OptionList._move_page = move_page_once_laid_out  # type: ignore[method-assign]  # the seam: Textual patched
    setattr(OptionList, _GUARDED, True)


def guard_select_mount_while_taken_down() -> None:
    """A Select mounting as its screen is closed (or the app quits) sets nothing up (Textual 8.2 raises
    NoMatches: its own parts were never mounted, and its mount looks them up). Safe to call more than once.

    Seen once in a local run of the suite: a form's Select in a screen built ahead as the app closed.
    """
    if getattr(Select, _GUARDED, False):
        return
    on_mount = TEXTUAL_SELECT_ON_MOUNT

    def on_mount_unless_taken_down(self, event):
        if being_taken_down(self):
            return  # its overlay and current value may be gone or never mounted: nothing to set up
        on_mount(self, event)

    Select._on_mount = on_mount_unless_taken_down  # type: ignore[method-assign]  # the seam: Textual patched
    setattr(Select, _GUARDED, True)


class CollectsAfterFrames(_MixedIntoApp):
    """An App mixin: no collection from a key that switches screens to the new screen's first frame.

    Mix in before ``App``. Relies on ``App._display`` being handed every frame for the terminal (None when
    nothing changed); the screen being left may still be handed one (a pending repaint) after the key.
    """

    _leaving: Screen[Any] | None = None

    def hold_collections_until_switched(self) -> None:
        """Hold collections back (``collector.hold``) until a frame of another screen than the one on show."""
        self._leaving = self.screen
        collector.hold()

    def _display(self, screen: Screen[Any], renderable: Any) -> None:
        super()._display(screen, renderable)
        if renderable is not None and self._leaving is not None and screen is not self._leaving:
            self._leaving = None
            collector.let_go()


class UndelayedRevisits(_MixedIntoApp):
    """An App mixin: ``switch_mode_undelayed`` skips Textual's 50 ms hold for a mode shown or built before.

    Mix in before ``App`` (``class MyApp(UndelayedRevisits, App)``). Relies on
    ``App.switch_mode`` calling ``App.delay_update`` while it switches. A mode
    is built ahead (``compose_mode_ahead``) in idle time, or, when its key comes
    first, just before the switch: never through Textual's ``_init_mode``.
    """

    _skip_delay = False
    _modes_shown: set[str] | None = None
    _modes_composing: dict[str, asyncio.Future[None]] | None = None

    async def switch_mode_undelayed(self, mode: str, module_name: str | None = None) -> None:
        """``switch_mode(mode)``, its screen built first if it was not (``module_name``: its module); no hold."""
        if mode in self._modes and mode != self.current_mode:
            await self.compose_mode_ahead(mode, module_name)
        shown = self._modes_shown
        if shown is None:
            shown = self._modes_shown = {self.current_mode}
        self._skip_delay = mode in shown
        try:
            await self.switch_mode(mode)
        finally:
            self._skip_delay = False
        shown.add(mode)

    def delay_update(self, delay: float = 0.05) -> None:
        if self._skip_delay:
            return
        super().delay_update(delay)

    def mode_composed(self, mode: str) -> bool:
        """True once ``mode``'s screen exists (shown, or built by ``compose_mode_ahead``)."""
        return mode in self._screen_stacks

    async def compose_mode_ahead(self, mode: str, module_name: str | None = None) -> None:
        """Build ``mode``'s screen without showing it: its next ``switch_mode`` only shows it.

        ``module_name`` (the screen's module) is imported on a thread first, so
        the UI thread keeps answering keys meanwhile. Relies on
        ``App.switch_mode`` skipping ``_init_mode`` for a mode with a screen
        stack, and re-applying CSS only for a screen whose ``_css_update_count``
        is behind the app's. Safe to call more than once, or while it runs.
        """
        composing = self._modes_composing
        if composing is None:
            composing = self._modes_composing = {}
        if mode in composing:
            await asyncio.shield(composing[mode])
            return
        if self.mode_composed(mode):
            # Textual's own first mode (built by _init_mode) never has its CSS count set: its next
            # visit would re-parse the stylesheet. It was styled as it mounted, as the others are.
            screen = self._screen_stacks[mode][0]
            if screen.is_mounted and screen._css_update_count < 0:
                screen._css_update_count = self._css_update_count
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        composing[mode] = done
        try:
            if module_name is not None:
                await asyncio.to_thread(importlib.import_module, module_name)
            if self.mode_composed(mode) or not self.is_running:
                return
            make_screen = self._modes[mode]
            screen = make_screen() if callable(make_screen) else self.get_screen(make_screen)
            # As _init_mode does, less the ScreenResume: switch_mode posts that when it shows the screen.
            self._screen_stacks[mode] = [screen]
            try:
                self._load_screen_css(screen)
                await AwaitMount(screen, self._register(self, screen))
            except BaseException:
                # Cut short by quitting (its worker cancelled), Textual is closing every stack in a loop
                # over this dict: the screen is closed with the others, and the dict must not change.
                if self.is_running:
                    del self._screen_stacks[mode]
                raise
            # Styled as it mounted, with the stylesheet as it is now: nothing to refresh.
            screen._css_update_count = self._css_update_count
            # Its size classes (the app's breakpoints) now, in idle time, rather than on the first switch;
            # a screen with a ``composed_ahead`` flag (screens.base.DashScreen) skips its first restyle.
            screen.post_message(events.Resize(self.size, self.size))
            # Then laid out, as its first visit would: that visit (KeptLayout) only paints it.
            screen.call_later(lay_out_ahead, screen, self.size)
            if hasattr(screen, "composed_ahead"):
                screen.composed_ahead = True
            shown = self._modes_shown
            if shown is None:
                shown = self._modes_shown = {self.current_mode}
            shown.add(mode)
        finally:
            done.set_result(None)
