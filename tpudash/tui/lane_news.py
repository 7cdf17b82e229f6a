"""What the lane says, shown: the runtime found or failed, a run's end noticed, the session bar's engine and lane text.

``LaneNews`` is the session's ``tpudash.engine.lane.LaneObserver``: the lane
calls it on the UI thread when the engine detects the runtime (or cannot),
when another dashboard's engine holds the accelerator and when a run's end
is recorded, and it writes what that means into the ``SessionView``. It also
writes the session bar's two status lines, the engine's (with a notice when
the engine crashed) and the lane's (the running job and its clock, the
queue, the last end). Textual-free, as the session it serves
(``tpudash.tui.session.DashboardSession``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from tpudash.format import counted, format_seconds

if TYPE_CHECKING:  # the lane loads with the session's first run, after the first frame
    from tpudash.engine.lane import Lane, LaneObserver, LiveRun
    from tpudash.engine.protocol import AcceleratorHeld, RuntimeFailed
    from tpudash.tui.hostgate import HostGate
    from tpudash.tui.session_view import SessionView
else:
    LaneObserver = object  # it only names the methods implemented here


class NewsSession(Protocol):
    """What the news uses of ``tpudash.tui.session.DashboardSession`` (named here: the session imports the news)."""

    view: SessionView
    gate: HostGate
    quitting: bool

    @property
    def lane(self) -> Lane: ...

    @property
    def live_runs(self) -> dict[str, LiveRun]: ...


class LaneNews(LaneObserver):
    """The lane's news in the session's view; see the module docstring."""

    def __init__(self, session: NewsSession):
        self._session = session

    @property
    def view(self) -> SessionView:
        return self._session.view

    # -- what the lane says (LaneObserver, on the UI thread) ----------------------------------------
    def lane_runtime(self, description: dict) -> None:
        from tpudash.accel.description import Runtime

        runtime = Runtime.from_description(description)
        view = self.view
        view.runtime_settled.set()
        simulated = " (simulated)" if runtime.description.simulated else ""
        # On JAX the framework leads (``JAX · CPU · Mesh · 8 replicas``); TensorFlow's line is as it always was.
        framework = "JAX · " if runtime.framework == "jax" else ""
        view.runtime_status = (
            f"{framework}{runtime.description.kind} · {runtime.description.strategy} · "
            f"{counted(runtime.description.num_replicas, 'replica')}{simulated}"
        )
        view.runtime_error = None
        view.framework_missing = None
        view.runtime = runtime

    def lane_runtime_failed(self, failure: RuntimeFailed) -> None:
        view = self.view
        view.runtime_settled.set()
        if failure.missing_tensorflow:
            self._session.gate.show_missing_framework(failure.message or failure.error, "no TensorFlow")
            return
        error = failure.error or "unknown error"
        view.runtime_status = "runtime failed"
        view.runtime_error = error
        view.runtime = None
        view.notify(error, title="Runtime detection failed", severity="error", timeout=15)

    def lane_accelerator_held(self, held: AcceleratorHeld) -> None:
        self._session.gate.show_engine_lock_held(held.holder)

    def lane_run_settled(self, live: LiveRun) -> None:
        model = live.model
        duration = format_seconds(model.elapsed())
        if live.run_id not in self._session.live_runs:
            return
        from tpudash.engine.lane import ENGINE_HELD

        if self._session.lane.engine_state == ENGINE_HELD and model.started is None:
            return  # it never started: the accelerator-held notice says why
        notify = self.view.notify
        if model.status == "done":
            notify(f"{model.job} done in {duration}", title="Run finished")
        elif model.status == "failed":
            notify(model.error or "failed", title=f"{model.job} failed", severity="error", timeout=10)
        elif model.status == "cancelled" and model.started is None:
            notify(f"{model.job} removed from the queue before it started", title="Run cancelled", severity="warning")
        elif model.status == "cancelled":
            notify(f"{model.job} cancelled after {duration}", title="Run cancelled", severity="warning")
        results = model.device_results()
        if results:
            self.view.device_check = {
                "run_id": model.run_id,
                "job": model.job,
                "finished": model.finished,
                "status": model.status,
                "results": results,
            }

    def lane_engine_changed(self) -> None:
        self.show_engine_status(self._session.lane)

    # -- status text ------------------------------------------------------------------------------
    def show_engine_status(self, lane: Lane | None) -> None:
        """The session bar's engine line; a notice when it says the engine crashed (None: nothing launched yet)."""
        if lane is None:
            return
        status = lane.engine_line()
        if status != self.view.engine_status:
            from tpudash.engine.lane import ENGINE_CRASHED

            if lane.engine_state == ENGINE_CRASHED and lane.last_exit is not None:
                self.view.notify(
                    f"{lane.last_exit.describe()}; the next launch starts a new one. "
                    "Its last lines are in the session log (l).",
                    title="Engine crashed",
                    severity="error",
                    timeout=15,
                )
            self.view.engine_status = status

    def show_lane_status(self, lane: Lane | None) -> None:
        """The session bar's lane line (None: nothing launched yet, so nothing to say)."""
        if lane is None:
            return
        self.view.lane_status = self.lane_status_text(lane)

    def lane_status_text(self, lane: Lane) -> str:
        """The session bar's words for the lane: the running job, its status and clock, the queue, the last end."""
        live = lane.current
        waiting = len(lane.waiting)
        if live is not None and self._session.quitting:
            # Quit was confirmed: the job is being cancelled and the app exits once it is recorded.
            return f"stopping: cancelling {live.job}…"
        if live is not None:
            model = live.model
            clock = format_seconds(model.elapsed(), precise=False)
            status = "cancelling" if live.cancelling else model.status if model.started else "starting"
            text = f"{model.job} ● {status} {clock}"
        else:
            last = next((item for item in reversed(lane.runs) if item.model.finished_state), None)
            text = (
                f"last: {last.model.job} {last.model.status} ({format_seconds(last.model.elapsed())})"
                if last
                else "idle"
            )
            if last is not None and last.model.error:
                text += f": {last.model.error}"
        if waiting:
            text += f" · {waiting} queued"
        return text
