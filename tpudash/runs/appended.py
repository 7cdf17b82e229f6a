"""A run's appended file (``events.jsonl``, ``telemetry.jsonl``): where a local writer's events go, read as it grows.

A writer on this host appends each event to ``<stream>.jsonl``; a reader
takes the lines completed since its last read (``tail.EventTail``, a
mebibyte at a time, a half-written last line left for later). In a store
nothing appends: the file is there only when a local run was copied into
a bucket, complete, so it is read once, to its end, and never asked for
again; a run in segments only has none, and that is asked once too.
``segments.StreamTail`` reads this file first, then the segments.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import BinaryIO, Protocol

from jobs.events import Event
from tpudash.runs.tail import EventTail


class Opener(Protocol):
    """What the file is opened through: a run's files (``backends.RunFiles``), of which only ``open`` is needed."""

    def open(self, name: str) -> BinaryIO: ...


class AppendedStream:
    """A run's ``<stream>.jsonl`` read as its writer appends (``appends``), or once whole (in a store).

    ``read_new`` returns the events completed since the last; ``at_end``
    says whether it reached the end of what is written; ``unreachable`` why
    the store did not answer (then the file is asked for again at the next
    read); ``report`` what could not be read, as ``EventTail.report`` says it.
    """

    def __init__(self, files: Opener, stream: str, *, appends: bool) -> None:
        self.appends = appends
        """Whether a writer may still append (a local run); in a store the file is complete."""
        name = f"{stream}.jsonl"
        self.tail = EventTail(PurePosixPath(name), opener=lambda: files.open(name))
        self.done = False
        """In a store: read to its end (or found absent), never asked for again."""
        self.unreachable: str | None = None
        """Why the store did not answer at the last read, or None."""

    @property
    def at_end(self) -> bool:
        return self.tail.at_end

    @property
    def finished(self) -> bool:
        """A RunFinished was read: nothing more will come."""
        return self.tail.finished

    @property
    def problem_count(self) -> int:
        return self.tail.problem_count

    @property
    def problems(self) -> list[str]:
        return self.tail.problems

    def report(self) -> list[str]:
        return self.tail.report()

    def read_new(self, final: bool, max_bytes: int | None) -> list[tuple[float | None, Event]]:
        """The events completed since the last call (``final``: a last line without its newline too)."""
        self.unreachable = None
        if self.done:
            return []
        try:
            events = self.tail.read_new(final or not self.appends, max_bytes)
        except OSError:
            self.tail.lines.at_end = True  # absent (a run in segments only), or refused and named
            self.done = not self.appends
            return []
        except Exception as error:  # noqa: BLE001 - a store that does not answer: asked again next time
            self.unreachable = f"{type(error).__name__}: {error}"
            self.tail.lines.at_end = False
            return []
        # In a store it is complete: read on until its end (a bounded read stops sooner), then never again.
        self.done = not self.appends and self.tail.at_end
        return events

    def close(self) -> None:
        self.tail.close()
