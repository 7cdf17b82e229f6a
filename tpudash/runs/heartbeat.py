"""The one staleness rule: what a heartbeat says of its writer (a run's writer, a cluster's worker, a host's agent).

Every heartbeat carries when it was written (unix time, by the writer's
clock) and the writer's interval between beats. A reader judges it at its
own ``now`` (``judge``), the same way for ``writer.lock``,
``writers/<writer>.json`` and ``hosts/<name>/host.json``:

- ``live`` while it is at most ``STALE_AFTER_INTERVALS`` intervals old;
- ``stale`` after that (the writer died, or is cut off from the store);
- ``clock ahead`` when it is more than ``CLOCK_SKEW_SECONDS`` in the
  reader's future: the writer's clock is ahead, or the file lies (``1e300``,
  the year 9999). Never live: a stamp from the future would otherwise stay
  fresh for as long as that future lasts. Within the skew it is live, and
  it turns stale at most ``CLOCK_SKEW_SECONDS`` later than an exact clock's;
- ``stopped`` when the writer said it stopped (an agent stopped cleanly),
  whatever its age.

A reader of a folder of heartbeats reads at most a bounded number of them:
``listed_newest_first`` gives the most recently written first, so files
that are no heartbeat (junk, however many, sorted ahead by name) never hide
the one a live writer keeps replacing. ``Junk`` counts the ones skipped and
names the first in one problem line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from jobs.events import is_finite_number
from tpudash.runs.backends import RunFiles

STALE_AFTER_INTERVALS = 3
"""A heartbeat older than this many of its writer's intervals is stale."""
CLOCK_SKEW_SECONDS = 5.0
"""How far ahead of the reader's clock a heartbeat may be and still count (the hosts' clocks may disagree this much)."""
INTERVAL_RANGE_SECONDS = (0.01, 600.0)
"""What a heartbeat's own interval may say; outside it, the writer's kind's default is used (or the file refused)."""
MAX_HEARTBEAT_BYTES = 4096
"""A writer's heartbeat file is a few hundred bytes; anything larger is not one."""

LIVE = "live"
STALE = "stale"
CLOCK_AHEAD = "clock ahead"
STOPPED = "stopped"
STATES = (LIVE, STALE, CLOCK_AHEAD, STOPPED)


def stale_after(interval: float) -> float:
    """Seconds without a beat after which a writer beating every ``interval`` seconds is stale."""
    return STALE_AFTER_INTERVALS * interval


def judge(beat: float, interval: float, now: float, *, stopped: bool = False) -> str:
    """``live``, ``stale``, ``clock ahead`` or ``stopped``: the one rule (see the module docstring)."""
    if stopped:
        return STOPPED
    age = now - beat
    if age < -CLOCK_SKEW_SECONDS:
        return CLOCK_AHEAD
    if age <= stale_after(interval):
        return LIVE
    return STALE


def interval_or(stated: Any, default: float) -> float:
    """A heartbeat's own interval when it is one a writer may state, else ``default``."""
    low, high = INTERVAL_RANGE_SECONDS
    if is_finite_number(stated) and low <= stated <= high:
        return float(stated)
    return default


def seconds_words(seconds: float) -> str:
    """``40 s``, ``12 min``, ``5 h``, ``3 d``, ``more than a year``: how far apart two clocks are, at a glance."""
    seconds = abs(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.0f} h"
    if seconds <= 365 * 86400:
        return f"{seconds / 86400:.0f} d"
    return "more than a year"


def ahead_words(beat: float, now: float) -> str:
    """Why a heartbeat is not counted: ``its heartbeat is 3 h ahead of this clock (not counted as live)``."""
    return f"its heartbeat is {seconds_words(beat - now)} ahead of this clock (not counted as live)"


def parse_beat(data: bytes) -> dict[str, Any] | None:
    """A heartbeat file's JSON object with a finite ``heartbeat``; None when it is not one (too large, not JSON…)."""
    if len(data) > MAX_HEARTBEAT_BYTES:
        return None
    try:
        payload = json.loads(data)
    except ValueError:
        return None
    if not isinstance(payload, dict) or not is_finite_number(payload.get("heartbeat")):
        return None
    return payload


def why_not_a_beat(data: bytes) -> str:
    """What is wrong with a file ``parse_beat`` refused, in a few words."""
    if len(data) > MAX_HEARTBEAT_BYTES:
        return f"larger than {MAX_HEARTBEAT_BYTES} bytes"
    try:
        payload = json.loads(data)
    except ValueError:
        return "not JSON"
    if not isinstance(payload, dict):
        return "not a JSON object"
    return "no heartbeat time in it"


# -- many heartbeats in one folder -----------------------------------------------------------------


def listed_newest_first(files: RunFiles, folder: str) -> list[str]:
    """The files in ``folder`` (hidden ones left out), the most recently written first; one listing.

    Locally by modification time (links and anything but regular files left
    out), in a store by the time its listing gives; a kind of files that
    gives no time lists by name. Raises what the store raises when it cannot be asked.
    """
    return newest_first(files.list_by_time(folder))


def newest_first(timed: Iterable[tuple[float, str]]) -> list[str]:
    """The names of (time, name) pairs, hidden ones left out, the most recent first and by name at a tie."""
    kept = [(stamp, name) for stamp, name in timed if name and name[0] != "."]
    return [name for _, name in sorted(kept, key=lambda pair: (-pair[0], pair[1]))]


@dataclass
class Junk:
    """Entries of a folder that are not what a writer writes there: counted, the first few named, in one problem line."""

    where: str
    """The folder, as the problem line names it (``writers``, ``hosts``)."""
    what: str
    """What they are not, in words (``heartbeats``, ``host reports``)."""
    named: list[str] = field(default_factory=list)
    count: int = 0

    NAMED = 3

    def add(self, name: str, why: str = "") -> None:
        self.count += 1
        if len(self.named) < self.NAMED:
            self.named.append(f"{name}: {why}" if why else name)

    def line(self) -> str | None:
        """``writers/: 256 files are no heartbeats (a000.json: not JSON; …); skipped``, or None when there are none."""
        if not self.count:
            return None
        more = "; …" if self.count > len(self.named) else ""
        noun = "file is" if self.count == 1 else "files are"
        return f"{self.where}/: {self.count:,} {noun} no {self.what} ({'; '.join(self.named)}{more}); skipped"


def add_problem(problems: list[str] | None, line: str | None) -> None:
    """Add ``line`` to ``problems``, in place of an earlier line about the same file (a reader asked again)."""
    if problems is None or line is None:
        return
    about = line.partition(": ")[0]
    problems[:] = [kept for kept in problems if kept.partition(": ")[0] != about]
    problems.append(line)
