"""The run view's Profile tab: why a step takes the time it takes, from XProf's summary of a capture.

``p`` (the run screens, the palette) asks the run's writer for a profile of
its next steps over the bus; the tab follows the answer (read at most once a
second), then has the capture converted (XProf in a child process) and shows
its ``summary.json``: step time with a bar per step, where the step's time goes
as one stacked bar, the device's utilisation, the top ops, the input
pipeline's verdict and slowest stages, XProf's recommendations, and the
command that opens the whole trace. Every capture of the run is listed;
``b`` on one puts it beside the one shown. All reads, the request and the
conversion run on thread workers (``tpudash.tui.profile_requests``).

``tpudash.tui.profiletext`` draws a summary as text (no widget), so tests read it as a user would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.widget import Widget
from textual.widgets import OptionList, Static, TabbedContent
from textual.widgets.option_list import Option
from textual.worker import get_current_worker

from tpudash.profiles.requests import DEFAULT_PROFILE_STEPS, FINAL_STATES, STATE_CAPTURING, STATE_DONE, ProfileAnswer
from tpudash.profiles.summary import CaptureInfo, ProfileError, ProfileSummary
from tpudash.runs.backends import RunFiles
from tpudash.tui.profile_requests import ProfileCalls, trace_command
from tpudash.tui.profiletext import BREAKDOWN_THEME, FALLBACK_COLORS, IDLE_COLOR, capture_label, steps, summary_text

PROFILE_PANE = "tab-profile"


# -- the tab ------------------------------------------------------------------------------


class CaptureList(OptionList):
    """The run's captures, newest first: enter shows one, ``b`` puts it beside the one shown."""

    BINDINGS = [Binding("b", "beside", "Beside", id="profile.beside")]

    def action_beside(self) -> None:
        option = self.highlighted_option
        tab = next((node for node in self.ancestors if isinstance(node, ProfileTab)), None)
        if option is not None and option.id and tab is not None:
            tab.compare_with(option.id)


class ProfileTab(Vertical):
    """One run's profiles: what a request is doing now, its captures, the summary of the one shown."""

    DEFAULT_CSS = """
    ProfileTab { height: 1fr; }
    ProfileTab #profile-state { height: auto; padding: 0 1; }
    ProfileTab #profile-captures { height: auto; max-height: 5; border: none; display: none; }
    ProfileTab #profile-scroll { height: 1fr; padding: 0 1; }
    ProfileTab #profile-body { height: auto; }
    """

    def __init__(self, calls: ProfileCalls | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.calls = calls or ProfileCalls()
        self.files: RunFiles | None = None
        self.live = False
        self.state = "none"
        """none, not-live, requested, capturing, converting, failed, shown."""
        self.state_line = ""
        self.captures: list[CaptureInfo] = []
        self.summaries: dict[str, ProfileSummary] = {}
        self.shown: str | None = None
        self.beside: str | None = None
        self.asked = False
        """``p`` was pressed for this run (the tab is listed then, even for a run that cannot be profiled)."""
        self.busy = False
        """A request is on its way: another ``p`` says so instead of asking again."""
        self._generation = 0
        self._drawn: tuple | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="profile-state")
        yield CaptureList(id="profile-captures")
        with VerticalScroll(id="profile-scroll"):
            yield Static("", id="profile-body")

    # -- what the run view calls -----------------------------------------------------
    def follow(self, files: RunFiles | None, *, live: bool) -> None:
        """Show ``files``' run (None: no run): its captures are listed off the UI thread."""
        self._generation += 1
        self.files, self.live = files, live
        self.captures, self.summaries, self.shown, self.beside = [], {}, None, None
        self.busy = self.asked = False
        self._set_state("none" if live else "not-live", self._idle_words())
        self._draw()
        if files is not None:
            self._start(self._list_captures, files, "list the run's profiles")

    def request(self, status: str) -> str | None:
        """``p``: ask the run's writer for a profile of its next steps; the sentence why not, or None."""
        files = self.files
        if files is None:
            return "no run is shown: there is nothing to profile"
        self.asked = True
        if status != "running":
            self.live = False
            why = f"this run is not live ({status}): nothing is training to profile"
            self._set_state("not-live", why[0].upper() + why[1:] + "." + self._captures_note())
            return why
        if self.busy:
            return "a profile of this run is already on its way"
        self.live, self.busy = True, True
        self._set_state(
            "requested", f"Asking the run's writer for a profile of the next {DEFAULT_PROFILE_STEPS} steps…"
        )
        self._start(self._profile, files, "ask for a profile and wait for it")
        return None

    def show_capture(self, capture: str) -> None:
        self.shown = capture
        if self.beside == capture:
            self.beside = None
        self._load([capture])

    def compare_with(self, capture: str) -> None:
        """Put ``capture`` beside the one shown (again: take it away)."""
        if capture == self.shown:
            return
        self.beside = None if self.beside == capture else capture
        self._load([name for name in (self.shown, self.beside) if name])

    # -- on thread workers ---------------------------------------------------------------
    def _start(self, work: Callable, files: RunFiles, description: str, *args: object) -> None:
        if getattr(self.app, "exiting", False):
            return  # the app is going: no read is started on its way out
        generation = self._generation
        self.run_worker(
            lambda: work(files, generation, *args),
            thread=True,
            exit_on_error=False,
            group="profile-tab",
            description=description,
        )

    def _later(self, generation: int, call: Callable, *args: object) -> None:
        """Run ``call`` on the UI thread, unless the tab moved to another run meanwhile."""

        def if_current() -> None:
            if generation == self._generation and self.is_mounted:
                call(*args)

        try:
            self.app.call_from_thread(if_current)
        except RuntimeError:
            pass  # the app stopped: there is no tab left to show it

    def _list_captures(self, files: RunFiles, generation: int, show_newest: bool = True) -> None:
        try:
            captures = self.calls.captures(files)
        except (OSError, ValueError) as error:
            self._later(generation, self._set_state, "failed", f"The run's profiles could not be listed: {error}")
            return
        self._later(generation, self._captures_listed, captures, show_newest)

    def _profile(self, files: RunFiles, generation: int) -> None:
        worker = get_current_worker()
        try:
            request = self.calls.request(files, DEFAULT_PROFILE_STEPS)
        except (OSError, ValueError) as error:
            self._later(generation, self._failed, f"The request could not be written into the run: {error}")
            return
        waiting = f"Requested a profile of the next {DEFAULT_PROFILE_STEPS} steps; waiting for the run's writer…"
        self._later(generation, self._set_state, "requested", waiting)
        deadline = time.monotonic() + self.calls.answer_timeout
        answer: ProfileAnswer | None = None
        said_capturing = False
        pause = threading.Event()
        while not worker.is_cancelled:
            try:
                answer = self.calls.answer(files, request.id)
            except (OSError, ValueError):
                answer = None  # the store is away for a moment: asked again at the next poll
            if answer is not None and answer.state in FINAL_STATES:
                break
            if answer is not None and answer.state == STATE_CAPTURING and not said_capturing:
                said_capturing = True
                self._later(
                    generation, self._set_state, "capturing", f"{answer.host}: capturing steps {steps(answer)}…"
                )
            if time.monotonic() >= deadline:
                self._later(
                    generation,
                    self._failed,
                    f"No answer from the run's writer in {self.calls.answer_timeout:g} s: it looks for requests "
                    "once a second, between steps (is it between epochs, or stuck?)",
                )
                return
            pause.wait(self.calls.poll_seconds)  # a read is a request in a bucket: at most one a second
        if worker.is_cancelled or answer is None:
            return
        if answer.state != STATE_DONE or not answer.capture:
            self._later(
                generation, self._failed, f"The run's writer could not profile: {answer.reason or 'no reason given'}"
            )
            return
        note = f" ({answer.reason})" if answer.reason else ""
        self._later(
            generation,
            self._set_state,
            "converting",
            f"Converting the capture of steps {steps(answer)} with XProf…{note}",
        )
        try:
            summary = self.calls.summarize(files, answer.capture)
        except ProfileError as error:
            self._later(generation, self._failed, f"The capture could not be read: {error}")
            return
        self._later(generation, self._summary_ready, summary, f"Profile of steps {steps(answer)}{note}.")
        self._list_captures(files, generation, show_newest=False)

    def _read_summaries(self, files: RunFiles, generation: int, names: Iterable[str]) -> None:
        for name in names:
            if name in self.summaries:
                continue
            try:
                summary = self.calls.summary(files, name)
                if summary is None:
                    self._later(generation, self._set_state, "converting", f"Converting capture {name} with XProf…")
                    summary = self.calls.summarize(files, name)
            except (ProfileError, OSError, ValueError) as error:
                self._later(generation, self._set_state, "failed", f"Capture {name} could not be read: {error}")
                return
            self._later(generation, self._summary_ready, summary, None)

    # -- on the UI thread -------------------------------------------------------------
    def _load(self, names: list[str]) -> None:
        missing = [name for name in names if name not in self.summaries]
        if missing and self.files is not None:
            self._start(self._read_summaries, self.files, "read a profile's summary", missing)
        self._draw()

    def _captures_listed(self, captures: list[CaptureInfo], show_newest: bool) -> None:
        self.captures = captures
        listing = self.query_one(CaptureList)
        listing.clear_options()
        for info in captures:
            listing.add_option(Option(capture_label(info), id=info.name))
        listing.display = bool(captures)
        if self.shown in {info.name for info in captures}:
            listing.highlighted = listing.get_option_index(self.shown)
        if captures and self.shown is None and show_newest:
            self.show_capture(captures[0].name)
        if self.state in ("none", "not-live") and not self.asked:
            self._set_state(self.state, self._idle_words())
        self._reveal()

    def _summary_ready(self, summary: ProfileSummary, said: str | None) -> None:
        self.summaries[summary.capture] = summary
        if said is not None:  # the answer to this tab's request: shown, whichever was
            self.busy = False
            self.shown = summary.capture
            self._set_state("shown", said)
        elif self.state == "converting":
            self._set_state("shown", "")
        self._draw()

    def _failed(self, sentence: str) -> None:
        self.busy = False
        self._set_state("failed", sentence)

    def _set_state(self, state: str, text: str) -> None:
        self.state, self.state_line = state, text
        if self.is_mounted:
            line = self.query_one("#profile-state", Static)
            style = "bold red" if state == "failed" else "yellow" if state == "not-live" else ""
            line.update(Text(text, style=style))
            line.display = bool(text)
        self._reveal()

    def _idle_words(self) -> str:
        if self.files is None:
            return "No run is shown."
        if self.live:
            return f"Press p to profile the next {DEFAULT_PROFILE_STEPS} steps of this run." + self._captures_note()
        return "This run is not live: nothing is training to profile." + self._captures_note()

    def _captures_note(self) -> str:
        if not self.captures:
            return " It has no capture yet."
        count = len(self.captures)
        listed = "capture is" if count == 1 else "captures are"
        return f" Its {count} {listed} listed below (enter shows one, b puts it beside the one shown)."

    def _reveal(self) -> None:
        """The tab is listed once it has something to say: a live run, a capture, or a ``p``."""
        if not self.is_mounted:
            return
        if self.live or self.captures or self.asked or self.state not in ("none", "not-live"):
            tabs = next((node for node in self.ancestors if isinstance(node, TabbedContent)), None)
            if tabs is not None:
                tabs.show_tab(PROFILE_PANE)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option_id:
            self.show_capture(event.option_id)

    def on_resize(self) -> None:
        self._draw()

    def theme_colors(self) -> dict[str, str]:
        """Each part's colour from the app's theme (a theme without one: a fixed colour)."""
        theme = self.app.current_theme
        colors = {}
        for key, name in BREAKDOWN_THEME.items():
            value = getattr(theme, name, None)
            colors[key] = value if isinstance(value, str) and value else FALLBACK_COLORS[name]
        colors["idle"] = IDLE_COLOR
        return colors

    def _draw(self) -> None:
        if not self.is_mounted:
            return
        shown = self.summaries.get(self.shown) if self.shown else None
        beside = self.summaries.get(self.beside) if self.beside else None
        width = max(40, self.size.width - 3)
        drawn = (id(shown), id(beside), width, self.files and self.files.where)
        if drawn == self._drawn:
            return
        self._drawn = drawn
        body = self.query_one("#profile-body", Static)
        if shown is None or self.files is None:
            body.update("")
            return
        command = trace_command(self.files)
        body.update(summary_text(shown, width=width, command=command, colors=self.theme_colors(), beside=beside))


class FollowsProfiles(Widget):
    """The run view's part that profiles its run: a Profile tab in ``#run-tabs``, listed once it has something."""

    def profile_tab(self) -> ProfileTab:
        return self.query_one(ProfileTab)

    def hide_profile_tab(self) -> None:
        self.query_one("#run-tabs", TabbedContent).hide_tab(PROFILE_PANE)

    def follow_profiles(self, files: RunFiles | None, *, live: bool) -> None:
        """Show the profiles of ``files``' run; ``live``: its writer still trains, so ``p`` can ask it."""
        tab = self.profile_tab()
        shown = tab.files
        if (shown and shown.where) == (files and files.where):
            if live != tab.live and tab.state in ("none", "not-live") and not tab.asked:
                tab.live = live
                tab._set_state("none" if live else "not-live", tab._idle_words())
            return
        self.hide_profile_tab()
        tab.follow(files, live=live)

    def profile_run(self, status: str) -> str | None:
        """``p``: profile the run shown (``status``: its status now) and show the tab; why not, or None."""
        tab = self.profile_tab()
        why = tab.request(status)
        tabs = self.query_one("#run-tabs", TabbedContent)
        if tab.files is not None:
            tabs.show_tab(PROFILE_PANE)
            tabs.active = PROFILE_PANE
            if hasattr(tabs, "user_chose"):
                tabs.user_chose = True  # the view stops choosing the tab for the user
        return why
