"""The garbage collector of the dashboard's own process, kept out of the way of keys once every screen is built.

``settle()`` runs when the screens have been built ahead (``tpudash.tui.background``),
in a process that holds one app for its whole life (``run_app``):

- what the process holds then (modules, screens, widgets) is frozen out of
  the collector's reach (``gc.freeze``): a full collection walks only what
  came after, ~15 ms instead of ~150 ms;
- full collections become rare (``SETTLED_THRESHOLDS``). After the freeze the
  unfrozen heap is small, so CPython's rule that a full collection waits
  until the long-lived objects grew by a quarter no longer holds them back:
  with the default thresholds a dashboard showing a training run collected
  the whole heap 13 times in 70 s, 22 ms of the UI thread each (34 ms at
  most) on a loaded machine, longer than a frame. Young collections stay
  frequent and short (a 3,000-object nursery: 0.3 ms on average, 4 ms at
  most; the middle generation 3 ms, 9 ms at most), so cyclic garbage is
  still found within seconds.

``hold()`` and ``let_go()`` keep collections out of a key's way: from the
key that switches screens until that screen's first frame is drawn, none
runs (CPython starts one whenever allocations pass the threshold, and a
screen switch allocates: 5.6 ms of a re-visit's 15 ms at p95 while a job
trained). What was due is collected right after the frame, before a user's
next key.

``release()`` gives everything back (the app's unmount): an app that ended
frees all it held, and a process that makes many apps (tests) keeps its
collector as it was.
"""

from __future__ import annotations

import gc
import time

SETTLED_THRESHOLDS = (3000, 10, 100)
"""Allocations before a young collection, young collections per middle one, middle ones per full one."""

_thresholds_before: tuple[int, int, int] | None = None
_held_since: float | None = None

HOLD_SECONDS_AT_MOST = 1.0
"""How long a key's hold may last if its frame never comes (the first visit of a screen not built ahead: 0.1–0.5 s)."""


def settle() -> None:
    """Freeze what the process holds now and make full collections rare."""
    global _thresholds_before
    gc.freeze()
    if _thresholds_before is None:
        _thresholds_before = gc.get_threshold()
    gc.set_threshold(*SETTLED_THRESHOLDS)


def hold() -> None:
    """No collection until ``let_go()``: the new screen's first frame (``seams.CollectsAfterFrames``)."""
    global _held_since
    if gc.isenabled():  # one disabled by someone else stays theirs
        gc.disable()
        _held_since = time.monotonic()


def let_go(held_for: float = 0.0) -> None:
    """Collect again, if ``hold()`` stopped it at least ``held_for`` seconds ago; safe to call any time.

    The UI's timer lets go of a hold older than ``HOLD_SECONDS_AT_MOST`` (a key whose frame never came).
    """
    global _held_since
    if _held_since is not None and time.monotonic() - _held_since >= held_for:
        _held_since = None
        gc.enable()


def release() -> None:
    """Unfreeze, and give the collector back its thresholds from before ``settle()``."""
    global _thresholds_before
    let_go()
    gc.unfreeze()
    if _thresholds_before is not None:
        gc.set_threshold(*_thresholds_before)
        _thresholds_before = None
