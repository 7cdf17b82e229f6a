"""Whether the process that writes a run still exists, and when a process started (psutil).

A run's record names its writer by host, pid and the pid's start time; the
start time tells a live writer from an unrelated process that was given the
same pid later. run.json stores it as ``pid_start_time`` (unix seconds).
Runs written before that stored ``pid_start``, the kernel's start time in
clock ticks since boot (field 22 of /proc/PID/stat); both are still judged.
"""

from __future__ import annotations

import os

import psutil

# The kernel's boot time, from which a start time is computed, is whole
# seconds and can move by one when the clock is adjusted: two readings of
# the same process's start time may differ by that much.
START_TIME_TOLERANCE_SECONDS = 1.0


def process_start_time(pid: int) -> float | None:
    """When process ``pid`` started (unix time), or None when it does not exist or may not be asked."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def _start_time_from_ticks(start_ticks: str) -> float | None:
    """A ``pid_start`` of an older run (clock ticks since boot) as unix time; None when it is not a number."""
    try:
        ticks = int(start_ticks)
        ticks_per_second = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return None
    return psutil.boot_time() + ticks / ticks_per_second


def process_alive(pid: int, start_time: float | None = None, *, start_ticks: str | None = None) -> bool:
    """Whether the process that wrote a run still exists.

    ``start_time`` (unix seconds) or, for runs written by older versions,
    ``start_ticks`` tell it from a later process given the same pid; with
    neither, a process with that pid counts.
    """
    try:
        process = psutil.Process(pid)
        status = process.status()
        created = process.create_time()
    except psutil.NoSuchProcess:  # a zombie too, where it cannot be asked: it has exited
        return False
    except psutil.AccessDenied:
        return True  # another user's process: it exists, and that is all we may know
    if status in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
        return False  # it has exited; its parent has not collected it yet
    if start_time is None and start_ticks is not None:
        start_time = _start_time_from_ticks(start_ticks)
    return start_time is None or abs(created - start_time) <= START_TIME_TOLERANCE_SECONDS
