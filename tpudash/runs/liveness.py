"""Whether the process that writes a run is still writing it: its flock on the host, its heartbeat across hosts.

A writer (``tpudash.runs.recorder.RunRecorder``) holds an exclusive flock on
``writer.lock`` in its run directory for as long as it writes, and the
kernel lets go of it when the process ends, however it ends. Any process on
the same host (another PID namespace, a container sharing the volume) tests
it with a non-blocking shared flock on a read-only descriptor: a lock held
is a live writer, a free one a writer gone. Nothing in /proc is read, and a
pid given to an unrelated process later changes nothing.

The same file holds the writer's heartbeat (JSON: ``heartbeat``, unix time,
refreshed every ``HEARTBEAT_INTERVAL_SECONDS``; ``interval``; ``host`` and
``pid`` as hints for messages), for readers that cannot see the lock, such
as another host on a shared store: there the heartbeat is judged by
the one staleness rule (``tpudash.runs.heartbeat``: live while it is at most
``STALE_AFTER_INTERVALS`` intervals old, never live from more than
``CLOCK_SKEW_SECONDS`` in the future). In a store, a run's writers beat in
``writers/<writer>.json``; they are read newest first and at most
``MAX_WRITERS_READ`` of them, and what is no heartbeat is counted and named.

Runs written before the lock existed have no ``writer.lock``; they are
judged by pid as before. Their record names the writer by host, pid and the
pid's start time; the start time tells a live writer from an unrelated
process given the same pid later. run.json stores it as ``pid_start_time``
(unix seconds); older runs stored ``pid_start``, the kernel's start time in
clock ticks since boot (field 22 of /proc/PID/stat); both are still judged.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from tpudash.runs import heartbeat
from tpudash.runs.backends import RunFiles

# The rule's constants, where the writers and readers of runs have always found them.
from tpudash.runs.heartbeat import CLOCK_SKEW_SECONDS as CLOCK_SKEW_SECONDS
from tpudash.runs.heartbeat import INTERVAL_RANGE_SECONDS as INTERVAL_RANGE_SECONDS
from tpudash.runs.heartbeat import MAX_HEARTBEAT_BYTES as MAX_HEARTBEAT_BYTES
from tpudash.runs.heartbeat import STALE_AFTER_INTERVALS as STALE_AFTER_INTERVALS
from tpudash.runs.layout import open_regular_fd

WRITERS_FOLDER = "writers"
"""In a run in a store: one heartbeat per writer, ``writers/<writer>.json``, replaced whole on its interval."""
# A run has one writer (or one per worker): more heartbeats than this are not read.
MAX_WRITERS_READ = 256
WRITER_FILE = "writer.lock"
"""In a run directory: flock'd by the run's writer while it writes; holds its heartbeat."""
HEARTBEAT_INTERVAL_SECONDS = 5.0

# The kernel's boot time, from which a start time is computed, is whole
# seconds and can move by one when the clock is adjusted: two readings of
# the same process's start time may differ by that much.
START_TIME_TOLERANCE_SECONDS = 1.0


class WriterLock:
    """The writer's side: the flock on ``writer.lock`` and a thread that refreshes the heartbeat in it.

    ``held`` is False when another process holds the lock (a writer that is
    still alive, or a child it forked); writing goes on without it, and
    readers on the host see that other holder.
    """

    def __init__(
        self, run_dir: Path, *, interval: float = HEARTBEAT_INTERVAL_SECONDS, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = run_dir / WRITER_FILE
        self.interval = interval
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fd: int | None = open_regular_fd(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.held = True
        except BlockingIOError:
            self.held = False
        except BaseException:
            os.close(self._fd)
            self._fd = None
            raise
        self.beat()

    def start(self) -> WriterLock:
        """Refresh the heartbeat every ``interval`` seconds on a daemon thread until ``release``."""
        self._thread = threading.Thread(
            target=self._beat_periodically, name=f"tpudash-heartbeat-{self.path.parent.name}", daemon=True
        )
        self._thread.start()
        return self

    def beat(self) -> None:
        """Write the heartbeat now; a write that fails (a full disk) is skipped, the lock still tells."""
        if self._fd is None or not self.held:
            return
        payload = {
            "heartbeat": round(self._clock(), 3),
            "interval": self.interval,
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        data = (json.dumps(payload, sort_keys=True) + "\n").encode()
        try:
            os.pwrite(self._fd, data, 0)
            os.ftruncate(self._fd, len(data))
        except OSError:
            pass

    def _beat_periodically(self) -> None:
        while not self._stop.wait(self.interval):
            self.beat()

    def release(self) -> None:
        """Stop the heartbeat and let go of the lock (the writer has finished or closed the run)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # the flock goes with the descriptor


def _open_writer_file(run_dir: Path) -> int | None:
    """``writer.lock`` opened read-only without following links or blocking; None when absent or unusable."""
    try:
        return open_regular_fd(run_dir / WRITER_FILE)
    except OSError:  # RefusedFile included
        return None


def lock_held(run_dir: Path) -> bool | None:
    """Whether a process on this host holds the run's writer lock (None: no ``writer.lock``, an older run)."""
    fd = _open_writer_file(run_dir)
    if fd is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None  # a file system without flock: the heartbeat must tell
    finally:
        os.close(fd)  # a shared lock we took goes with it
    return False


def heartbeat_fresh(run_dir: Path, now: float | None = None, problems: list[str] | None = None) -> bool | None:
    """Whether the writer's heartbeat in ``writer.lock`` is live by the one rule (None: there is none).

    A heartbeat from the future (beyond the skew) is not live, and ``problems`` says so.
    """
    fd = _open_writer_file(run_dir)
    if fd is None:
        return None
    try:
        data = os.read(fd, MAX_HEARTBEAT_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    state = beat_state(data, now)
    if state == heartbeat.CLOCK_AHEAD:
        payload = heartbeat.parse_beat(data) or {}
        heartbeat.add_problem(problems, f"{WRITER_FILE}: {_ahead(payload, now)}")
    return None if state is None else state == heartbeat.LIVE


def _ahead(payload: dict, now: float | None) -> str:
    return heartbeat.ahead_words(float(payload["heartbeat"]), time.time() if now is None else now)


def beat_state(data: bytes, now: float | None = None) -> str | None:
    """One heartbeat (its JSON) judged by the one rule (``heartbeat.judge``) at ``now``; None: it is not one."""
    payload = heartbeat.parse_beat(data)
    if payload is None:
        return None
    interval = heartbeat.interval_or(payload.get("interval"), HEARTBEAT_INTERVAL_SECONDS)
    return heartbeat.judge(float(payload["heartbeat"]), interval, time.time() if now is None else now)


def beat_is_fresh(data: bytes, now: float | None = None) -> bool | None:
    """Whether one heartbeat (its JSON) is live by the one rule; None: it is not one."""
    state = beat_state(data, now)
    return None if state is None else state == heartbeat.LIVE


def store_writers_alive(files: RunFiles, now: float | None = None, problems: list[str] | None = None) -> bool:
    """In a store: whether any writer of the run beat recently (``writers/*.json``).

    A store has no locks and its writers may be on any host, so the
    heartbeat alone tells: a run whose writers all stopped beating, or that
    never had one (a copy of a run that was still being written), is stale.
    Raises what the store raises when it cannot be asked. A run written by
    many workers is the chief's: another worker's heartbeat (``worker`` > 0,
    ``tpudash.runs.workers``) does not keep it live. The newest
    ``MAX_WRITERS_READ`` are read, newest first: files that are no heartbeat,
    and heartbeats from the future, are counted and named in ``problems``.
    """
    names = heartbeat.listed_newest_first(files, WRITERS_FOLDER)
    return writers_alive(names, lambda name: files.read(f"{WRITERS_FOLDER}/{name}", MAX_HEARTBEAT_BYTES), now, problems)


def writers_alive(
    names: list[str], read: Callable[[str], bytes], now: float | None = None, problems: list[str] | None = None
) -> bool:
    """Whether any of a run's heartbeats ``names`` (in ``writers/``, newest first) is a live chief's or sole writer's.

    ``read(name)`` gives a heartbeat's bytes (from the store, or from what a
    batch read of many runs fetched); the rest is ``store_writers_alive``'s rule.
    """
    junk = heartbeat.Junk(WRITERS_FOLDER, "heartbeats")
    try:
        for name in names[:MAX_WRITERS_READ]:
            if not name.endswith(".json"):
                junk.add(name, "not a heartbeat's name (<writer>.json)")
                continue
            try:
                data = read(name)
            except FileNotFoundError:
                continue  # removed since the listing
            except OSError as error:  # a refused file: too large, not a file
                junk.add(name, str(error) or type(error).__name__)
                continue
            state = beat_state(data, now)
            if state is None:
                junk.add(name, heartbeat.why_not_a_beat(data))
            elif state == heartbeat.CLOCK_AHEAD:
                heartbeat.add_problem(
                    problems, f"{WRITERS_FOLDER}/{name}: {_ahead(heartbeat.parse_beat(data) or {}, now)}"
                )
            elif state == heartbeat.LIVE and not beats_for_another_worker(data):
                return True
        return False
    finally:
        heartbeat.add_problem(problems, junk.line())
        if len(names) > MAX_WRITERS_READ:
            heartbeat.add_problem(
                problems,
                f"{WRITERS_FOLDER}/: {len(names):,} files, more than a run has writers; "
                f"the newest {MAX_WRITERS_READ} were read",
            )


def beats_for_another_worker(data: bytes) -> bool:
    """Whether a heartbeat is a non-chief worker's (its ``worker`` index above 0)."""
    payload = heartbeat.parse_beat(data)
    worker = payload.get("worker") if payload is not None else None
    return isinstance(worker, int) and not isinstance(worker, bool) and worker > 0


def writer_alive(run_dir: Path, on_this_host: bool, problems: list[str] | None = None) -> bool | None:
    """Whether the run's writer is still writing, by its lock and then its heartbeat; None: no way to tell.

    A lock held is conclusive wherever the holder is (another namespace on
    this host). A free lock is conclusive on this host; on another host the
    lock may not be visible here, so the heartbeat decides (one from the
    future is not live, and ``problems`` says so).
    """
    held = lock_held(run_dir)
    if held:
        return True
    if held is False and on_this_host:
        return False
    return heartbeat_fresh(run_dir, problems=problems)


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
