"""What tpudash relies on in Textual beyond its documented API: each test fails when a release changes it.

tpudash/textual_seams.py holds the two seams into Textual's insides; the
other tests here pin the Textual behaviour our public-API code depends on
(the order handlers run in, which changes post which message, the shape of
Select). When one fails after an upgrade, the failing test names what to
look at.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
from textual import timer as textual_timer
from textual.app import App, ComposeResult
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.geometry import Size
from textual.screen import Screen
from textual.strip import Strip
from textual.widgets import Label, OptionList, Select, TabbedContent, TabPane

from screens.base import DashScreen
from tpudash.tui.runview import RunTabs
from tpudash.tui.seams import (
    PAINT_AHEAD_QUIET_SECONDS,
    TEXTUAL_MOVE_PAGE,
    TEXTUAL_SELECT_ON_MOUNT,
    KeptLayout,
    UndelayedRevisits,
    being_taken_down,
    guard_option_list_page_keys,
    guard_select_mount_while_taken_down,
)


def test_textual_still_fails_on_a_page_key_before_layout():
    """If this fails, Textual fixed its page move on a list not laid out yet: drop the guard."""
    options = OptionList("a", "b", "c")
    try:
        TEXTUAL_MOVE_PAGE(options, 1)
    except KeyError:
        return
    raise AssertionError(
        "Textual's OptionList._move_page no longer fails before layout: "
        "remove guard_option_list_page_keys from tpudash/textual_seams.py"
    )


def test_guarded_page_key_before_layout_does_nothing():
    guard_option_list_page_keys()
    guard_option_list_page_keys()  # twice: still one guard, not a guard around a guard
    options = OptionList("a", "b", "c")
    options.highlighted = 1
    OptionList._move_page(options, 1)
    assert options.highlighted == 1


class ListApp(App):
    def compose(self) -> ComposeResult:
        yield OptionList(*(f"option {index}" for index in range(50)))


async def test_guarded_page_keys_still_page_once_laid_out():
    guard_option_list_page_keys()
    app = ListApp()
    async with app.run_test(size=(40, 12)) as pilot:
        options = app.query_one(OptionList)
        options.focus()
        options.highlighted = 0
        await pilot.press("pagedown")
        assert options.highlighted >= 8  # a page of a 12-row screen
        await pilot.press("pageup")
        assert options.highlighted == 0


class ModesApp(UndelayedRevisits, App):
    MODES = {"a": lambda: Screen(), "b": lambda: Screen()}
    DEFAULT_MODE = "a"

    def __init__(self) -> None:
        super().__init__()
        self.delays_kept = 0

    def delay_update(self, delay: float = 0.05) -> None:
        skipped = self._skip_delay
        super().delay_update(delay)
        self.delays_kept += not skipped


class PlainModesApp(App):
    MODES = ModesApp.MODES
    DEFAULT_MODE = "a"

    def __init__(self) -> None:
        super().__init__()
        self.delays_asked = 0

    def delay_update(self, delay: float = 0.05) -> None:
        self.delays_asked += 1
        super().delay_update(delay)


async def test_textual_switch_mode_still_holds_frames_through_delay_update():
    """If this fails, switch_mode no longer calls delay_update: UndelayedRevisits does nothing any more."""
    app = PlainModesApp()
    async with app.run_test():
        await app.switch_mode("b")
        await app.switch_mode("a")
        assert app.delays_asked == 2


async def test_a_mode_shown_or_built_before_switches_without_the_hold():
    app = ModesApp()
    async with app.run_test():
        await app.switch_mode_undelayed("b")  # first time: built before the switch, so no hold either
        await app.switch_mode_undelayed("a")  # the first mode was shown at start
        await app.switch_mode_undelayed("b")
        assert app.delays_kept == 0
        assert app.current_mode == "b"


async def test_a_mode_built_ahead_switches_without_restyling_the_app():
    """If this fails, switch_mode re-parses the stylesheet for a screen built by compose_mode_ahead: look at how
    Textual 8.2's switch_mode compares a screen's _css_update_count with the app's."""
    app = ModesApp()
    async with app.run_test():
        await app.compose_mode_ahead("b")
        assert app.mode_composed("b")
        refreshes = []
        refresh_css = app.refresh_css
        app.refresh_css = lambda *args, **kwargs: refreshes.append(app.current_mode) or refresh_css(*args, **kwargs)
        await app.switch_mode_undelayed("b")
        await app.switch_mode_undelayed("a")
        assert app.current_mode == "a"
        assert refreshes == []


class TabsApp(App):
    def compose(self) -> ComposeResult:
        with RunTabs(id="outer"):
            with TabPane("Plots", id="plots"):
                with TabbedContent(id="inner"):
                    with TabPane("One", id="one"):
                        yield Label("one")
                    with TabPane("Two", id="two"):
                        yield Label("two")
            with TabPane("Log", id="log"):
                yield Label("log")


async def test_run_tabs_tell_the_users_choice_from_the_views():
    """The run view follows the run's content until the user picks a tab (Textual posts
    Tabs.TabActivated for a click or key, never for ``active`` set from code)."""
    app = TabsApp()
    async with app.run_test(size=(60, 12)) as pilot:
        tabs = app.query_one("#outer", RunTabs)
        tabs.active = "log"
        await pilot.pause()
        tabs.active = "plots"
        await pilot.pause()
        assert not tabs.user_chose
        await pilot.click("#inner Tab#--content-tab-two")
        await pilot.pause()
        assert app.query_one("#inner", TabbedContent).active == "two"
        assert not tabs.user_chose  # a tab of a view inside the run's tabs
        await pilot.click("#outer > ContentTabs Tab#--content-tab-log")
        await pilot.pause()
        assert tabs.active == "log"
        assert tabs.user_chose


class CountingScreen(DashScreen):
    def compose_body(self) -> ComposeResult:
        yield Label("body")

    def update_node_styles(self, animate: bool = True) -> None:
        self.restyled = getattr(self, "restyled", 0) + 1
        super().update_node_styles(animate)


class ResumeApp(App):
    MODES = {"counted": CountingScreen, "other": lambda: Screen()}
    DEFAULT_MODE = "counted"


async def test_a_screen_shown_again_is_not_restyled():
    """Our ScreenResume handler runs before Screen's own, which reads ``refresh_styles``."""
    app = ResumeApp()
    async with app.run_test() as pilot:
        screen = app.screen
        await pilot.pause()
        before = getattr(screen, "restyled", 0)
        await app.switch_mode("other")
        await app.switch_mode("counted")
        await pilot.pause()
        assert getattr(screen, "restyled", 0) == before


class SelectApp(App):
    def compose(self) -> ComposeResult:
        yield Select([("one", 1), ("two", 2)], value=1, allow_blank=False)


async def test_an_open_select_list_has_the_select_as_parent():
    """screens/jobs.py tells an open Select's list from other focus by its parent."""
    app = SelectApp()
    async with app.run_test() as pilot:
        app.query_one(Select).focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.focused, OptionList)
        assert isinstance(app.focused.parent, Select)


class MountRecordingScreen(Screen):
    """Records, as it mounts, whether it is already being taken down."""

    def compose(self) -> ComposeResult:
        yield Label("mounting this child lets the pop run before the screen's own on_mount")

    def on_mount(self) -> None:
        self.taken_down = being_taken_down(self)


class PlainApp(App):
    pass


async def test_a_screen_closed_while_it_mounts_knows_it_is_being_taken_down():
    """Its children may already be gone by then (tests/functional/test_app_history.py shows it in the app)."""
    app = PlainApp()
    async with app.run_test() as pilot:
        closed_at_once = MountRecordingScreen()
        app.push_screen(closed_at_once)
        app.pop_screen()
        await pilot.pause()
        kept = MountRecordingScreen()
        await app.push_screen(kept)
        await pilot.pause()
    assert closed_at_once.taken_down is True  # False: Textual no longer flags it; look again at the seam
    assert kept.taken_down is False


class ShutdownRecordingApp(App):
    """Records, as it starts closing its screens, whether a widget of the screen on show counts as taken down."""

    def compose(self) -> ComposeResult:
        yield Label("on show until the app shuts down")

    async def _close_all(self) -> None:
        self.taken_down_at_shutdown = being_taken_down(self.query_one(Label))
        await super()._close_all()


async def test_a_widget_still_mounting_as_the_app_shuts_down_knows_it_is_being_taken_down():
    """A screen built ahead and still mounting when the app closes is closed without a prune: its widgets'
    ``on_mount`` may run with their children gone (CI saw the run view's tabs gone as it hid one)."""
    app = ShutdownRecordingApp()
    async with app.run_test() as pilot:
        await pilot.pause()
        assert being_taken_down(app.query_one(Label)) is False
    assert app.taken_down_at_shutdown is True  # False: App._shutdown no longer clears is_running first


class HeldMountScreen(Screen):
    """Its mount waits for ``release``: the build of its mode is under way until then."""

    release = asyncio.Event()

    async def on_mount(self) -> None:
        await self.release.wait()


class QuittingFirstScreen(Screen):
    """Closed first as the app quits: cuts the build short then, as quitting cancels the app's workers."""

    building: asyncio.Future | None = None

    def on_unmount(self) -> None:
        assert self.building is not None
        self.building.cancel()
        HeldMountScreen.release.set()  # so the held screen can close in turn


class HeldModeApp(UndelayedRevisits, App):
    MODES = {"first": QuittingFirstScreen, "held": HeldMountScreen}
    DEFAULT_MODE = "first"


async def test_quitting_while_a_mode_is_built_ahead_closes_cleanly():
    """Textual closes every mode's stack as it quits; a build cut short then must leave that dict alone."""
    HeldMountScreen.release = asyncio.Event()
    app = HeldModeApp()
    async with app.run_test() as pilot:
        building = asyncio.ensure_future(app.compose_mode_ahead("held"))
        app.screen.building = building
        await pilot.pause()
        assert app.mode_composed("held") and not building.done()
    assert building.cancelled()


class LayoutCounting:
    """Counts the screen's layouts; its label is as wide as its text (auto width)."""

    def compose(self) -> ComposeResult:
        yield Label("short", id="grows")

    def _refresh_layout(self, size=None, scroll: bool = False) -> None:
        self.layouts = getattr(self, "layouts", 0) + 1
        super()._refresh_layout(size, scroll)  # type: ignore[misc]


class PlainLayoutCountingScreen(LayoutCounting, Screen):
    pass


class KeptLayoutScreen(LayoutCounting, KeptLayout, Screen):
    pass


class LayoutModesApp(UndelayedRevisits, App):
    MODES = {"plain": PlainLayoutCountingScreen, "kept": KeptLayoutScreen, "other": lambda: Screen()}
    DEFAULT_MODE = "other"


async def revisit(app: App, mode: str, pilot) -> int:
    """Show ``mode`` again (from "other"); how many layouts its screen did meanwhile."""
    screen = app.get_screen_stack(mode)[0]
    before = getattr(screen, "layouts", 0)
    await app.switch_mode_undelayed("other")
    await app.switch_mode_undelayed(mode)
    await pilot.pause()
    return screen.layouts - before


async def test_textual_still_lays_a_mode_out_again_on_every_visit():
    """If this fails, switch_mode no longer lays out a screen shown again unchanged: KeptLayout can go."""
    app = LayoutModesApp()
    async with app.run_test(size=(60, 12)) as pilot:
        await app.switch_mode_undelayed("plain")
        await pilot.pause()
        assert await revisit(app, "plain", pilot) >= 1


async def test_a_screen_shown_again_unchanged_keeps_its_layout_and_is_painted():
    app = LayoutModesApp()
    async with app.run_test(size=(60, 12)) as pilot:
        await app.switch_mode_undelayed("kept")
        await pilot.pause()
        assert await revisit(app, "kept", pilot) == 0
        assert "short" in app.export_screenshot()  # the resume repainted it


async def test_a_screen_changed_or_resized_while_hidden_is_laid_out_again_when_shown():
    app = LayoutModesApp()
    async with app.run_test(size=(60, 12)) as pilot:
        await app.switch_mode_undelayed("kept")
        await pilot.pause()
        screen = app.screen
        await app.switch_mode_undelayed("other")
        screen.query_one("#grows", Label).update("a label much longer than before")  # asks for a layout
        await pilot.pause()
        await app.switch_mode_undelayed("kept")
        await pilot.pause()
        assert screen.layouts >= 2
        assert screen.query_one("#grows", Label).region.width == len("a label much longer than before")
        await app.switch_mode_undelayed("other")
        await pilot.resize_terminal(80, 20)
        await pilot.pause()
        layouts = screen.layouts
        await app.switch_mode_undelayed("kept")
        await pilot.pause()
        assert screen.layouts > layouts
        assert screen.size == Size(80, 20)


class RenderCountingLabel(Label):
    """Counts the lines it renders anew (a line kept in its cache is not rendered again)."""

    lines_rendered = 0

    def render_line(self, y: int) -> Strip:
        self.lines_rendered += 1
        return super().render_line(y)


class GrowingScreen(LayoutCounting, KeptLayout, Screen):
    """Answers its first size by mounting another label: a second layout, while it is still hidden."""

    def compose(self) -> ComposeResult:
        yield from super().compose()
        yield Vertical(RenderCountingLabel("drawn once", id="drawn"), id="box")

    def on_resize(self) -> None:
        if not self.query("#grown"):
            self.mount(Label("grown on its first size", id="grown"))


class SleepsBeforeShown:
    """The sleeps a screen's update timer asks for until the screen's first frame: patched over
    ``textual.timer.sleep`` and ``App._display``."""

    def __init__(self, app: App, screen: Screen) -> None:
        self.screen = screen
        self.seconds: list[float] = []
        self.shown = False
        self._sleep = textual_timer.sleep
        display = app._display

        def shown(on: Screen, renderable: object) -> None:
            display(on, renderable)  # type: ignore[arg-type]
            self.shown = self.shown or (on is screen and renderable is not None)

        app._display = shown  # type: ignore[method-assign]

    async def sleep(self, seconds: float) -> None:
        caller = sys._getframe(1).f_locals.get("self")
        if not self.shown and caller is self.screen._update_timer:
            self.seconds.append(seconds)
        await self._sleep(seconds)


class AheadApp(UndelayedRevisits, App):
    MODES = {"other": lambda: Screen(), "growing": GrowingScreen}
    DEFAULT_MODE = "other"


async def test_a_mode_built_ahead_is_laid_out_and_painted_ahead_and_its_first_visit_only_shows_it(monkeypatch):
    app = AheadApp()
    async with app.run_test(size=(60, 12)) as pilot:
        await app.compose_mode_ahead("growing")
        screen = app.get_screen_stack("growing")[0]
        for _ in range(50):  # bounded: each pause lets the screen handle what its last layout caused
            if screen.query("#grown") and not screen._layout_required and getattr(screen, "layouts", 0) >= 2:
                break
            await pilot.pause()
        grown = screen.query_one("#grown", Label)
        assert grown.region.width == len("grown on its first size")  # laid out while hidden, its answer too
        # Later still, before its first visit, it mounts more (a form's fields, a table's rows): laid out too.
        await screen.query_one("#box", Vertical).mount(Label("mounted later", id="later"))
        later = screen.query_one("#later", Label)
        for _ in range(50):
            if later.region.width:
                break
            await pilot.pause()
        assert later.region.width == len("mounted later")
        layouts = screen.layouts
        # Painted ahead: its widgets' lines rendered while it is hidden, its update timer started, then ticked
        # once (a hidden screen's tick pauses it, drawing nothing). Painted once it has been quiet a while.
        drawn = screen.query_one("#drawn", RenderCountingLabel)
        for _ in range(100):  # bounded: 5 s at most, for a quiet time of PAINT_AHEAD_QUIET_SECONDS
            if drawn.lines_rendered and not screen._update_timer._active.is_set():
                break
            await pilot.pause(PAINT_AHEAD_QUIET_SECONDS / 5)
        rendered_ahead = drawn.lines_rendered
        assert rendered_ahead >= 1
        sleeps = SleepsBeforeShown(app, screen)
        monkeypatch.setattr(textual_timer, "sleep", sleeps.sleep)
        await app.switch_mode_undelayed("growing")
        await pilot.pause()
        assert screen.layouts == layouts
        shown = app.export_screenshot()
        assert "short" in shown and "grown" in shown and "later" in shown  # (the screenshot spaces words with &#160;)
        assert "drawn" in shown and drawn.lines_rendered == rendered_ahead  # painted from what was rendered ahead
        # The first visit's paint is the timer's next tick, not one a whole frame (1/60 s) after its first start.
        assert sleeps.shown and not [seconds for seconds in sleeps.seconds if seconds > 0.001], sleeps.seconds


class SelectScreen(Screen):
    """A form's choice, with a value: its mount sets the value shown, from its own parts."""

    def compose(self) -> ComposeResult:
        yield Select([("float32", 1), ("bfloat16", 2)], value=2)


async def close_while_a_select_mounts(how: str) -> None:
    app = PlainApp()
    async with app.run_test() as pilot:
        await pilot.pause()
        app.push_screen(SelectScreen())
        if how == "screen closed":
            app.pop_screen()
            await pilot.pause()
        # else: the app quits as the screen mounts (the end of this block)


@pytest.mark.parametrize("how", ["screen closed", "app quits"])
async def test_textual_still_fails_on_a_select_mounting_as_it_is_taken_down(monkeypatch, how):
    """If this fails, Textual's Select no longer fails there: drop guard_select_mount_while_taken_down."""
    monkeypatch.setattr(Select, "_on_mount", TEXTUAL_SELECT_ON_MOUNT)
    with pytest.raises(NoMatches):
        await close_while_a_select_mounts(how)


@pytest.mark.parametrize("how", ["screen closed", "app quits"])
async def test_a_select_mounting_as_it_is_taken_down_closes_cleanly(how):
    guard_select_mount_while_taken_down()
    guard_select_mount_while_taken_down()  # twice: one guard
    await close_while_a_select_mounts(how)


async def test_a_guarded_select_still_shows_its_value():
    guard_select_mount_while_taken_down()
    app = PlainApp()
    async with app.run_test() as pilot:
        await app.push_screen(SelectScreen())
        await pilot.pause()
        select = app.screen.query_one(Select)
        assert select.value == 2 and "bfloat16" in str(select.query_one("SelectCurrent #label").render())
