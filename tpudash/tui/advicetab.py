"""The run view's Advice tab: the TPU pitfalls checklist of a run, its MFU and its compile marks (issue 40).

The run's writer keeps ``<run>/advice.json`` (``tpudash.advice.report``);
``FollowsAdvice``, mixed into ``RunView``, reads it through the run's
``RunFiles`` (a bucket run reads as a local one) on a thread worker, never
on the UI thread: on the display beat at most once every ``LOCAL_READ_SECONDS``
(``STORE_READ_SECONDS`` in a store) while the run is live, once for a run
that ended. What it read goes to the tab (``AdviceTab``, drawn by
``tpudash.tui.advicetext``), to the header (the MFU, the one-line hint while
a rule fires) and to the metric plots (the recompiles as marks on their step
axis). ``input-bound``, which a writer leaves to its readers (they have the
telemetry and the profiles), is judged at each read from the run's telemetry
and newest profile, as ``tpudash advise`` judges it
(``tpudash.advice.inputbound``). The tab is listed once the run has advice
(or an unreadable file); ``a`` on the run screens shows it anyway, saying
why there is none.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static, TabbedContent

from tpudash.advice.inputbound import with_input_bound
from tpudash.advice.report import AdviceReport, read_report
from tpudash.runs.backends import RunFiles
from tpudash.tui.advicetext import READING, advice_text, no_advice_text, unreadable_text

ADVICE_PANE = "tab-advice"
LOCAL_READ_SECONDS = 2.0
STORE_READ_SECONDS = 5.0  # a read is a request in a bucket


class AdviceFeed:
    """When a run's advice.json is due to be read, and reading it (``read`` runs off the UI thread)."""

    def __init__(self, files: RunFiles, *, live: bool) -> None:
        self.files = files
        self.live = live
        self.interval = LOCAL_READ_SECONDS if files.local_dir is not None else STORE_READ_SECONDS
        self.reading = False
        """A read is under way on a worker thread: another is not started meanwhile."""
        self.read_since_end = False
        """An ended run is read once: set once that read started."""
        self._next = 0.0

    def due(self, now: float | None = None) -> bool:
        if self.reading:
            return False
        if not self.live:
            return not self.read_since_end
        return (time.monotonic() if now is None else now) >= self._next

    def begin(self) -> None:
        self.reading = True
        self._next = time.monotonic() + self.interval
        if not self.live:
            self.read_since_end = True

    def ended(self) -> None:
        """The run stopped being live: one more read, its last word, then none."""
        if self.live:
            self.live, self.read_since_end = False, False

    def read(self) -> AdviceReport | str | None:
        """The report, ``input-bound`` judged from the run's telemetry and profiles; None without advice.json; the
        sentence why when it cannot be read."""
        try:
            report = read_report(self.files)
            return with_input_bound(report, self.files) if report is not None else None
        except ValueError as error:
            return str(error)
        except Exception as error:  # noqa: BLE001 - the store away: said, and read again at the next interval
            return f"{type(error).__name__}: {error}"
        finally:
            self.reading = False


class AdviceTab(VerticalScroll):
    """One run's advice: every rule, the MFU, the compile marks; or why there is none."""

    DEFAULT_CSS = """
    AdviceTab { height: 1fr; padding: 0 1; }
    AdviceTab #advice-body { height: auto; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.report: AdviceReport | None = None
        self.problem: str | None = None
        """Why advice.json could not be read (its ValueError), or None."""
        self.read = False
        """advice.json was read at least once for the run shown (no file is "none" only then)."""
        self._drawn: tuple | None = None
        self._text: Text | None = None

    def compose(self) -> ComposeResult:
        yield Static(Text(READING, style="dim"), id="advice-body")

    def show(self, report: AdviceReport | None, problem: str | None, *, read: bool = True) -> None:
        self.report, self.problem, self.read = report, problem, read
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        if not self.is_mounted:
            return
        # A tab not on show has no size yet: the app's width until it is shown (then on_resize draws it again).
        width = max(40, (self.size.width or self.app.size.width) - 2)
        drawn = (self.report, self.problem, self.read, width)
        if drawn == self._drawn:
            return
        self._drawn = drawn
        if self.problem is not None:
            text = unreadable_text(self.problem)
        elif self.report is not None:
            text = advice_text(self.report, width)
        elif self.read:
            text = no_advice_text()
        else:
            text = Text(READING, style="dim")
        if text == self._text:
            return  # a live run's report is read anew every few seconds, mostly to say the same: no relayout for it
        self._text = text
        # A live run's report is read anew every few seconds, and new words lay the whole screen out again: while
        # another tab is shown, that cost training's cores for nothing (issue 37). Showing the tab lays it out.
        self.query_one("#advice-body", Static).update(text, layout=self.is_on_screen)


class FollowsAdvice(Widget):
    """The run view's part that follows a run's advice.json: the Advice tab, the header's lines, the plots' marks."""

    _advice_feed: AdviceFeed | None = None
    advice: AdviceReport | None = None
    """The run's newest advice read (None: none yet, or none at all)."""

    def advice_tab(self) -> AdviceTab:
        return self.query_one(AdviceTab)

    def follow_advice(self, files: RunFiles | None, *, live: bool) -> None:
        """Read the advice of ``files``' run (None: no run); ``live``: its writer still writes it."""
        feed = self._advice_feed
        if feed is not None and files is not None and feed.files.where == files.where:
            if not live:
                feed.ended()
                self._read_advice_when_due()
            return
        self._advice_feed = AdviceFeed(files, live=live) if files is not None else None
        self.query_one("#run-tabs", TabbedContent).hide_tab(ADVICE_PANE)
        self.advice_tab().show(None, None, read=False)
        self.advice_changed(None)
        self._read_advice_when_due()  # the first read now, not at the next beat

    def _read_advice_when_due(self) -> None:
        feed = self._advice_feed
        if feed is None or not feed.due() or getattr(self.app, "exiting", False):
            return  # nothing to read, not yet, or the app is going: no worker is started on its way out
        feed.begin()
        self.run_worker(
            lambda: self._read_advice(feed),
            thread=True,
            exit_on_error=False,
            group="run-view-advice",
            description="read the run's advice.json",
        )

    def _read_advice(self, feed: AdviceFeed) -> None:
        result = feed.read()
        if feed is self._advice_feed:
            try:
                self.app.call_from_thread(self._advice_read, feed, result)
            except RuntimeError:
                pass  # the app stopped while this read: there is no view left to show it

    def _advice_read(self, feed: AdviceFeed, result: AdviceReport | str | None) -> None:
        if feed is not self._advice_feed or not self.is_mounted:
            return  # another run's, read before the view moved on
        report = result if isinstance(result, AdviceReport) else None
        problem = result if isinstance(result, str) else None
        if report is None and problem is None and self.advice is not None:
            report = self.advice  # a writer replacing the file between two reads: what was read stands
        self.advice_tab().show(report, problem)
        if report is not None or problem is not None:
            self.query_one("#run-tabs", TabbedContent).show_tab(ADVICE_PANE)
        if report != self.advice:
            self.advice = report
            self.advice_changed(report)

    def advice_changed(self, report: AdviceReport | None) -> None:
        """Draw ``report`` where the view shows it besides the tab (the header, the plots): ``RunView``'s."""
        self.advice = report

    def open_advice(self) -> None:
        """``a``: show the Advice tab (a run without advice says why), and keep it shown."""
        tabs = self.query_one("#run-tabs", TabbedContent)
        tabs.show_tab(ADVICE_PANE)
        tabs.active = ADVICE_PANE
        if hasattr(tabs, "user_chose"):
            tabs.user_chose = True  # the view stops choosing the tab for the user
