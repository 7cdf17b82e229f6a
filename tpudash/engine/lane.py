"""The accelerator lane as the dashboard sees it: the queue, the engine's lifecycle, cancel, crashes.

The dashboard never imports TensorFlow; an engine process (``python -m tpudash.engine``)
does, and runs one job at a time. ``Lane`` holds what the user asked for in
order, starts the engine on first need, sends it one run at a time, and
follows each run by tailing its events.jsonl — the same way any run on disk
is read. Cancel is cooperative first; a job that has not ended within the
grace period has its engine ended, and the run is recorded as cancelled
with everything it had reported. An engine that dies on its own (a signal,
the OOM killer, an abort in native code) leaves the dashboard up: the run is
recorded as failed with the signal and the engine's last stderr lines
(TensorFlow's start-up noise left out; the session log keeps it), and
the next launch starts a new engine. An engine that speaks another protocol
(a dashboard and an engine from two installs of tpudash) is ended at its
hello, and says so.

Textual-free: engine messages arrive on reader threads and are queued; the
app calls ``poll`` on its UI timer (and when ``wake`` fires), so every state
change happens on the UI thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jobs.base import JobSpec
from tpudash.config import FRAMEWORK_NAMES
from tpudash.engine.handle import EngineExit, EngineHandle, EngineNews, Listener
from tpudash.engine.protocol import (
    PROTOCOL_VERSION,
    AcceleratorHeld,
    Cancel,
    Hello,
    JobFinished,
    JobStarted,
    Launch,
    LaunchRefused,
    RuntimeFailed,
    RuntimeReady,
)
from tpudash.runs.layout import TELEMETRY_STREAM, new_run_id
from tpudash.runs.model import RunModel
from tpudash.runs.segments import StreamTail
from tpudash.runs.store import RunStore

ENGINE_NONE = "none"
ENGINE_STARTING = "starting"
ENGINE_READY = "ready"
ENGINE_RUNNING = "running"
ENGINE_RELEASED = "released"
ENGINE_CRASHED = "crashed"
ENGINE_INCOMPATIBLE = "incompatible"
ENGINE_HELD = "held"
"""Another engine on this host holds the accelerator: this dashboard watches (``tpudash.engine.hostlock``)."""
DEFAULT_CANCEL_GRACE_SECONDS = 2.0

STAGE_QUEUED = "queued"
STAGE_SENT = "sent"
STAGE_ENDED = "ended"


@dataclass(eq=False)
class LiveRun:
    """A run launched in this session: its params, its model, and how far it got."""

    run_id: str
    spec: JobSpec
    params: dict
    model: RunModel
    stage: str = STAGE_QUEUED
    tail: StreamTail | None = None
    telemetry_tail: StreamTail | None = None
    """The run's telemetry.jsonl: what the dashboard sampled while the run was live."""
    cancel_requested_at: float | None = None
    """Monotonic time the user asked to cancel (None: not asked)."""
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the run's end is on disk and in the model."""
    queue_position: int = 0
    """1 for the next run to start, 2 after it…; 0 once it has left the queue."""

    @property
    def job(self) -> str:
        return self.spec.name

    @property
    def cancelling(self) -> bool:
        return self.cancel_requested_at is not None and self.stage == STAGE_SENT


class LaneObserver:
    """What the lane tells its front end; every method runs on the UI thread."""

    def lane_runtime(self, description: dict) -> None:
        """The engine detected the runtime."""

    def lane_runtime_failed(self, failure: RuntimeFailed) -> None:
        """The engine could not set up the runtime, or speaks another protocol."""

    def lane_run_settled(self, live: LiveRun) -> None:
        """A run ended and its end is recorded."""

    def lane_accelerator_held(self, held: AcceleratorHeld) -> None:
        """Another engine on this host holds the accelerator; this dashboard's engine exited without it."""

    def lane_engine_changed(self) -> None:
        """The engine's state or the queue changed."""


EngineFactory = Callable[[Listener], EngineHandle]


class Lane:
    """The queue of session runs and the one engine that executes them."""

    def __init__(
        self,
        store: RunStore,
        start_engine: EngineFactory,
        observer: LaneObserver,
        wake: Callable[[], None] = lambda: None,
        *,
        cancel_grace: float = DEFAULT_CANCEL_GRACE_SECONDS,
        release_after: float = 0.0,
        keep_runs: int = 50,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.store = store
        self._start_engine = start_engine
        self._observer = observer
        self._wake = wake
        self.cancel_grace = cancel_grace
        self.release_after = release_after
        self.keep_runs = keep_runs
        self._clock = clock
        self._inbox: list[tuple[list, EngineNews]] = []
        self._inbox_lock = threading.Lock()
        self.runs: list[LiveRun] = []
        """Runs of this session in launch order (queued, sent, ended)."""
        self.engine: EngineHandle | None = None
        self.engine_state = ENGINE_NONE
        self.engine_detail = ""
        """What goes with the state: the runtime kind, the crash's signal, why it was released."""
        self.last_exit: EngineExit | None = None
        self.description: dict | None = None
        self.stopping = False
        """Set at quit: nothing new starts."""
        self._idle_since: float | None = None
        self._engine_starts = 0

    # -- what the UI reads ----------------------------------------------------------------
    @property
    def current(self) -> LiveRun | None:
        """The run the engine has (sent, not yet ended)."""
        return next((live for live in self.runs if live.stage == STAGE_SENT), None)

    @property
    def waiting(self) -> list[LiveRun]:
        return [live for live in self.runs if live.stage == STAGE_QUEUED]

    def _number_queue(self) -> None:
        position = 0
        for live in self.runs:
            if live.stage == STAGE_QUEUED:
                position += 1
                live.queue_position = position
            else:
                live.queue_position = 0

    @property
    def busy(self) -> bool:
        return any(live.stage != STAGE_ENDED for live in self.runs)

    @property
    def engine_starts(self) -> int:
        """How many engines this lane has started (a warm engine is reused)."""
        return self._engine_starts

    def engine_line(self) -> str:
        """The header's words for the engine: ``ready on CPU`` (``ready on CPU (JAX)``), ``running train``, ``crashed (SIGKILL)``."""
        state = self.engine_state
        if state == ENGINE_READY and self.engine_detail:
            return f"ready on {self.engine_detail}"
        if state == ENGINE_RUNNING:
            current = self.current
            return f"running {current.job}" if current is not None else "running"
        if state in (ENGINE_CRASHED, ENGINE_RELEASED, ENGINE_INCOMPATIBLE) and self.engine_detail:
            return f"{state} ({self.engine_detail})"
        if state == ENGINE_HELD:
            return "held by another dashboard"
        if state == ENGINE_STARTING and self.engine_detail:
            return f"starting on {self.engine_detail}…"
        return "starting…" if state == ENGINE_STARTING else state

    # -- requests -------------------------------------------------------------------------
    def launch(self, spec: JobSpec, params: dict) -> LiveRun:
        """Queue a run with validated ``params``; it goes to the engine when the lane is free."""
        run_id = new_run_id(spec.name)
        live = LiveRun(
            run_id, spec, dict(params), RunModel(run_id=run_id, job=spec.name, params=params, status="queued")
        )
        self.runs.append(live)
        ended = [item for item in self.runs if item.stage == STAGE_ENDED]
        for old in ended[: max(0, len(self.runs) - self.keep_runs)]:
            self.runs.remove(old)
        self._advance()
        self._number_queue()
        return live

    def cancel(self, live: LiveRun) -> None:
        """A queued run never starts; a running one is asked to stop, then ended after the grace period."""
        if live.stage == STAGE_QUEUED:
            self._end_queued(live, "cancelled")
        elif live.stage == STAGE_SENT and live.cancel_requested_at is None:
            live.cancel_requested_at = self._clock()
            if self.engine is None or not self.engine.send(Cancel(live.run_id)):
                self._kill_engine("cancelled")
        self._number_queue()
        self._observer.lane_engine_changed()

    def _end_queued(self, live: LiveRun, status: str, error: str | None = None) -> None:
        """End a run that never reached an engine: no record is written, as for a run never launched."""
        live.stage = STAGE_ENDED
        live.model.status, live.model.error, live.model.finished = status, error, time.time()
        live.model.version += 1
        self._settle(live)

    def cancel_all(self) -> None:
        for live in list(self.runs):
            self.cancel(live)

    def ensure_engine(self) -> None:
        """Start the engine if none has been started yet (the Devices screen's first need)."""
        if self.engine is None and self.engine_state == ENGINE_NONE and not self.stopping:
            self._spawn()

    def release(self, reason: str = "") -> str | None:
        """End the engine so another process can take the accelerator; the refusal's reason if busy."""
        if self.current is not None:
            return f"{self.current.job} is running; cancel it first"
        if self.engine is None:
            return "no engine is running"
        self._release_engine(reason)
        return None

    def restart_engine(self) -> str | None:
        """A new engine: detect the runtime again from scratch (the refusal's reason if busy)."""
        if self.busy:
            return "cancel or finish the running job first"
        if self.engine is not None:
            self._release_engine("restarted")
        self._spawn()
        return None

    def stop(self) -> None:
        """At quit: cancel every run; ``poll`` ends the engine once nothing runs (see ``stopped``)."""
        self.stopping = True
        self.cancel_all()

    @property
    def stopped(self) -> bool:
        return self.stopping and self.current is None

    def close(self) -> None:
        """Leave: release the engine whatever it is doing (it records its job's cancel itself)."""
        self.stopping = True
        if self.engine is not None:
            self._release_engine("the dashboard quit")

    # -- engine messages ----------------------------------------------------------------------
    def _listener_for(self, engine_ref: list) -> Listener:
        # The engine may speak before its constructor has returned, so the
        # reference is resolved when the message is handled, on the UI thread.
        def listen(message: EngineNews) -> None:
            with self._inbox_lock:
                self._inbox.append((engine_ref, message))
            self._wake()

        return listen

    def poll(self) -> bool:
        """Apply engine messages, read the running run's new events, enforce the cancel grace; True if anything changed."""
        with self._inbox_lock:
            inbox, self._inbox = self._inbox, []
        changed = False
        for engine_ref, message in inbox:
            changed = self._on_message(engine_ref[0], message) or changed
        current = self.current
        if current is not None:
            changed = self._read_events(current) or changed
            if (
                current.cancel_requested_at is not None
                and self.engine is not None
                and self._clock() - current.cancel_requested_at >= self.cancel_grace
                and self.engine.kill_reason is None
            ):
                self._kill_engine(f"{current.job} did not stop within {self.cancel_grace:g} s of cancel")
        if (
            self.release_after > 0
            and self.engine_state == ENGINE_READY
            and not self.busy
            and self._idle_since is not None
            and self._clock() - self._idle_since >= self.release_after
        ):
            self._release_engine(f"idle for {self.release_after:g} s")
            changed = True
        if self._advance():
            changed = True
        if changed:
            self._number_queue()
            self._observer.lane_engine_changed()
        return changed

    def _on_message(self, engine: EngineHandle | None, message: EngineNews) -> bool:
        if isinstance(message, EngineExit):
            return self._engine_exited(engine, message)
        if engine is not self.engine:
            return False  # a released engine's last words
        if isinstance(message, Hello):
            if message.protocol != PROTOCOL_VERSION:
                self._refuse_engine(message.protocol)
            elif message.framework != "tensorflow":
                self.engine_detail = FRAMEWORK_NAMES.get(message.framework, message.framework)
        elif isinstance(message, AcceleratorHeld):
            self._accelerator_held(message)
        elif isinstance(message, RuntimeReady):
            self.description = message.description
            self.engine_detail = str(self.description.get("kind", ""))
            if self.description.get("framework", "tensorflow") != "tensorflow":
                framework = str(self.description.get("framework"))
                self.engine_detail += f" ({FRAMEWORK_NAMES.get(framework, framework)})"
            self._set_state(ENGINE_RUNNING if self.current is not None else ENGINE_READY)
            self._observer.lane_runtime(self.description)
        elif isinstance(message, RuntimeFailed):
            self._observer.lane_runtime_failed(message)
        elif isinstance(message, JobStarted):
            self._set_state(ENGINE_RUNNING)
        elif isinstance(message, (JobFinished, LaunchRefused)):
            live = self._find(message.run_id)
            if live is not None:
                self._read_events(live, final=True)
            if live is not None and live.stage == STAGE_SENT:
                # Nothing on disk says it ended: refused (a version skew), failed
                # before its record existed (no runtime), or cancelled before it began.
                if isinstance(message, LaunchRefused):
                    self._end_unrecorded(live, "failed", f"the engine refused the run: {message.error}")
                else:
                    self._end_unrecorded(live, message.status, message.error)
            self._set_state(ENGINE_READY if self.description is not None else ENGINE_STARTING)
        return True

    def _refuse_engine(self, protocol: int) -> None:
        """An engine from another install of tpudash: end it, and say what to do."""
        self._incompatible = f"engine speaks protocol {protocol}, dashboard {PROTOCOL_VERSION}: reinstall tpudash"
        self._kill_engine(self._incompatible)
        self._observer.lane_runtime_failed(
            RuntimeFailed(error=self._incompatible, message=self._incompatible, missing_tensorflow=False)
        )

    def _accelerator_held(self, held: AcceleratorHeld) -> None:
        """Another engine holds the accelerator: this one is exiting; the runs that waited for it end, saying who.

        No new engine is started for them (it would find the lock held too);
        the next launch tries again, so once the holder exits this dashboard gets one.
        """
        self.engine = None  # its exit is then a released engine's last words: nothing to settle
        self.engine_detail = held.holder
        self._set_state(ENGINE_HELD)
        note = f"the accelerator is held by {held.holder}"
        for live in [live for live in self.runs if live.stage != STAGE_ENDED]:
            self._end_queued(live, "failed", note)
        self._observer.lane_accelerator_held(held)

    def _end_unrecorded(self, live: LiveRun, status: str, error: str | None) -> None:
        """End a run whose end is not on disk: a run that never began leaves no record, as if still queued."""
        if status == "cancelled" and (live.tail is None or not self.store.files(live.run_id).exists()):
            self._end_queued(live, "cancelled")
            return
        write_error = self.store.finish_abandoned(live.run_id, live.job, live.spec.as_text(live.params), status, error)
        self._read_events(live)
        if live.stage == STAGE_SENT:
            # The file does not say it ended (its end could not be written, or
            # not read back): the lane ends it itself, so the queue moves on.
            if write_error is not None:
                error = f"{error or status}; its end could not be recorded: {write_error}"
            self._end_directly(live, status, error)

    def _end_directly(self, live: LiveRun, status: str, error: str | None) -> None:
        """End a sent run in the model whatever its file holds, and settle it."""
        live.stage = STAGE_ENDED
        for tail in (live.tail, live.telemetry_tail):
            if tail is not None:
                tail.close()
        live.model.status, live.model.error, live.model.finished = status, error, time.time()
        live.model.version += 1
        self._settle(live)

    def _engine_exited(self, engine: EngineHandle | None, exit: EngineExit) -> bool:
        if engine is None or engine is not self.engine:
            return False
        self.engine = None
        self.last_exit = exit
        current = self.current
        if current is not None:
            self._read_events(current)
        incompatible, self._incompatible = self._incompatible, None
        if current is not None and current.stage == STAGE_SENT:
            cancelled = current.cancel_requested_at is not None and incompatible is None
            if incompatible is not None:
                error = incompatible
            elif cancelled:
                reason = engine.kill_reason or exit.describe()
                error = f"cancelled: {reason}; {exit.describe()}"
            else:
                error = f"{exit.describe()} while running {current.job}{exit.stderr_words()}"
            self._end_unrecorded(current, "cancelled" if cancelled else "failed", error)
        if incompatible is not None:
            for live in self.waiting:  # each would start an engine that speaks the same other protocol
                self._end_queued(live, "failed", incompatible)
            self.engine_detail = incompatible
            self._set_state(ENGINE_INCOMPATIBLE)
        elif exit.requested:
            self.engine_detail = engine.kill_reason or self._release_reason or ""
            self._set_state(ENGINE_RELEASED)
        else:
            self.engine_detail = exit.signal_name or f"exit status {exit.returncode}"
            self._set_state(ENGINE_CRASHED)
        return True

    def _find(self, run_id: Any) -> LiveRun | None:
        return next((live for live in self.runs if live.run_id == run_id), None)

    def _read_events(self, live: LiveRun, final: bool = False) -> bool:
        """Apply the run's new events to its model; True only when the run started or ended.

        Metrics, logs and progress reach the model here and the screens draw
        them on their own beat; reporting each batch as a lane change would
        redraw every list of runs ten times a second, on CPU training needs.
        ``final``: the engine says the run is over, so everything it wrote is
        read now (in a store, a follower otherwise reads on its own schedule).
        """
        if live.tail is None or live.stage == STAGE_ENDED:
            # Its end was read and its files closed: a closed tail reopens at the file's start, so
            # reading on (the engine's JobFinished after the tick read the end) would fold it in twice.
            return False
        events = live.tail.read_new(final=final)
        if events:
            live.model.apply_all(events)
        if live.telemetry_tail is not None:
            live.model.apply_all(live.telemetry_tail.read_new(final=final))
        if live.tail.finished and live.stage == STAGE_SENT:
            live.stage = STAGE_ENDED
            live.tail.close()
            if live.telemetry_tail is not None:
                live.telemetry_tail.close()
            self._settle(live)
            return True
        return any(event.type == "run_started" for _, event in events)

    def _settle(self, live: LiveRun) -> None:
        if self.current is None and self.engine is not None and self.engine_state == ENGINE_RUNNING:
            self._set_state(ENGINE_READY)
        live.settled.set()
        self._observer.lane_run_settled(live)

    # -- the engine --------------------------------------------------------------------------------
    _release_reason: str | None = None
    _incompatible: str | None = None
    """Why the engine was ended at its hello (another protocol), until its exit is handled."""

    def _spawn(self) -> EngineHandle:
        engine_ref: list = [None]
        self._release_reason = None
        self.description = None
        self.engine_detail = ""
        self._set_state(ENGINE_STARTING)
        self._engine_starts += 1
        engine = self.engine = self._start_engine(self._listener_for(engine_ref))
        engine_ref[0] = engine
        return engine

    def _release_engine(self, reason: str) -> None:
        engine, self.engine = self.engine, None
        self._release_reason = reason
        self.engine_detail = reason
        self._set_state(ENGINE_RELEASED)
        if engine is not None:
            engine.release()

    def _kill_engine(self, reason: str) -> None:
        if self.engine is not None:
            self.engine.kill(reason)

    def _set_state(self, state: str) -> None:
        self.engine_state = state
        self._idle_since = self._clock() if state == ENGINE_READY else None

    def _advance(self) -> bool:
        """Send the oldest queued run to the engine once the lane is free; True if one was sent."""
        if self.stopping or self.current is not None:
            return False
        waiting = self.waiting
        if not waiting:
            return False
        engine = self.engine if self.engine is not None else self._spawn()
        live = waiting[0]
        live.stage = STAGE_SENT
        live.tail = self.store.stream(live.run_id, follow=True)
        live.telemetry_tail = self.store.stream(live.run_id, TELEMETRY_STREAM, follow=True)
        if not engine.send(Launch(live.run_id, live.job, live.spec.as_text(live.params))):
            self._kill_engine("its control pipe closed")
        if self.engine_state == ENGINE_READY:
            self._set_state(ENGINE_RUNNING)
        return True
