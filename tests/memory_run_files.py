"""A run's files in a dict, as a store holds them, for the tests of the readers (``segments.StreamTail``).

``MemoryFiles`` is a ``RunFiles`` that can be taken down (every call raises,
as an unreachable store's client does), can hold its listings until a test
lets them go (a store that is slow to answer), and remembers every handle
it gave out, so a test can see that each was closed.
"""

from __future__ import annotations

import io
import threading

from jobs.events import Event, Metric, dumps
from tpudash.runs.segments import segment_name

DEADLINE_SECONDS = 20.0


class StoreDown(Exception):  # noqa: N818 - named as what happened, like the clients' own
    """What a store's client raises when it cannot reach the store (botocore's and gcsfs's are no OSError)."""


class TrackedBytes(io.BytesIO):
    """An object's bytes as a handle; ``MemoryFiles.handles`` keeps each one to check it was closed."""


class MemoryFiles:
    """A run's objects in a dict; see the module docstring."""

    where = "memory://bucket/runs/20260101-000000-fit-abcdef"

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.down = False
        self.listings = 0
        self.opened: dict[str, int] = {}
        """How many times each object was opened."""
        self.handles: list[TrackedBytes] = []
        self.listings_open = threading.Event()
        """Cleared: a listing waits until it is set again (a store slow to answer)."""
        self.listings_open.set()

    def open(self, name: str) -> io.BytesIO:
        self.opened[name] = self.opened.get(name, 0) + 1
        if self.down:
            raise StoreDown("the store is unreachable")
        if name not in self.objects:
            raise FileNotFoundError(name)
        handle = TrackedBytes(self.objects[name])
        self.handles.append(handle)
        return handle

    def list(self, folder: str) -> list[str]:
        assert self.listings_open.wait(DEADLINE_SECONDS), "a listing held past the deadline"
        if self.down:
            raise StoreDown("the store is unreachable")
        self.listings += 1
        prefix = f"{folder}/"
        return sorted(name[len(prefix) :] for name in self.objects if name.startswith(prefix))


def segment(files: MemoryFiles, writer: str, seq: int, *steps: int, stream: str = "events") -> None:
    """Segment ``seq`` of ``writer``: one loss point per step (the segment's number by default)."""
    lines = [dumps(Metric("loss", 1.0, step=step), float(step)) for step in (steps or (seq,))]
    files.objects[f"{stream}/{segment_name(writer, seq)}"] = ("\n".join(lines) + "\n").encode()


def event_lines(*events: Event) -> bytes:
    """Events as a writer appends them, one JSON line each, stamped 1, 2, 3…"""
    return "".join(dumps(event, float(number)) + "\n" for number, event in enumerate(events, 1)).encode()
