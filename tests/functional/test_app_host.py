"""The host check in the app: Devices shows the chips and problems before TensorFlow answers; without
TensorFlow the app stays usable and refuses launches with the install line; a failed automatic TPU
attempt falls back to the CPU default."""

from __future__ import annotations

import asyncio
import os
import threading

from textual.widgets import DataTable, Static

from jobs.events import Metric, RunFinished, RunStarted
from screens.devices import DevicesScreen
from screens.jobs import JobsScreen
from tests.functional.conftest import RUN_TIMEOUT, SIZE, runtime_ready, until
from tpudash.accel import hostcheck
from tpudash.accel import runtime as runtime_module
from tpudash.accel.startup import TensorFlowMissing, TpuFallback
from tpudash.config import Settings
from tpudash.engine.__main__ import detect_runtime
from tpudash.runs.layout import new_run_id
from tpudash.runs.store import RunStore
from tpudash.tui.bars import SessionBar
from tpudash.tui.quiet_widgets import Spinner

CPU_INSTALL_LINE = hostcheck.install_line("cpu")


def tpu_host_with_the_cpu_build() -> hostcheck.HostCheck:
    """A v4-8 TPU VM where someone installed the CPU build of TensorFlow (the most common TPU mistake)."""
    chips = hostcheck.Chips(chip_type="TPU v4 chip", count=4, hbm_gib_per_chip=32, cores_per_chip=1)
    distributions = {"tensorflow": "2.21.0"}
    return hostcheck.HostCheck(
        chips=chips,
        distributions=distributions,
        tensorflow_found=True,
        diagnoses=hostcheck.diagnose(chips, distributions, [], tensorflow_found=True),
    )


def host_without_tensorflow() -> hostcheck.HostCheck:
    chips = hostcheck.Chips()
    return hostcheck.HostCheck(
        chips=chips, tensorflow_found=False, diagnoses=hostcheck.diagnose(chips, {}, [], tensorflow_found=False)
    )


def raise_tensorflow_missing():
    """What ``get_runtime`` raises on a host without TensorFlow: the host check's own diagnosis."""
    raise TensorFlowMissing(host_without_tensorflow().blocking(tensorflow=True)[0].message)


def screen_text(screen) -> str:
    """Every Static's text on ``screen``, one per line."""
    return "\n".join(str(static.content) for static in screen.query(Static))


def write_finished_run(runs_dir) -> str:
    """A gradient-descent run on disk, as an earlier session with TensorFlow left it."""
    run_id = new_run_id("gradient-descent")
    recorder = RunStore(runs_dir).create(run_id, "gradient-descent", {"steps": 20}, {"kind": "CPU"})
    recorder.record(RunStarted(run_id, "gradient-descent", {"steps": 20}, {"kind": "CPU"}, 0.0))
    recorder.record(Metric("loss", 0.0022596875205636024, 19, epoch=0))
    recorder.record(RunFinished(status="done", summary={"loss": 0.0022596875205636024}))
    return run_id


async def test_devices_shows_the_host_block_before_the_runtime_is_ready(make_app, runtime):
    tensorflow_may_answer = threading.Event()

    def runtime_still_loading():
        tensorflow_may_answer.wait(RUN_TIMEOUT)
        return runtime

    app = make_app(runtime_provider=runtime_still_loading, host_check_provider=tpu_host_with_the_cpu_build)
    try:
        async with app.run_test(size=SIZE) as pilot:
            screen = app.screen
            assert isinstance(screen, DevicesScreen)
            await until(pilot, lambda: app.host_check is not None)
            host_block = str(screen.query_one("#host-summary", Static).content)
            assert "4 × TPU v4 chip, 32 GiB HBM each" in host_block
            assert "tensorflow 2.21.0" in host_block
            problem = next(line for line in host_block.splitlines() if "pip uninstall -y tensorflow" in line)
            assert "CPU build of TensorFlow is installed" in problem
            assert not app.runtime_settled.is_set() and app.runtime is None
            assert "connecting…" in str(screen.query_one("#runtime-summary", Static).content)
            spinner = screen.query_one("#runtime-loading", Spinner)
            await until(pilot, lambda: spinner.animating)

            tensorflow_may_answer.set()
            await runtime_ready(pilot)
            # Hidden once the runtime answered, it stops redrawing: no timer left waking the UI thread for it.
            await until(pilot, lambda: not spinner.display and not spinner.animating)
            # The runtime's own host scan replaces the app's: one host block, never two.
            assert screen_text(screen).count("TPU chips") == 1
            assert screen.query_one("#device-table", DataTable).row_count == 8
    finally:
        tensorflow_may_answer.set()


async def test_without_tensorflow_the_app_works_and_refuses_launches_with_the_install_line(make_app, isolated_runs_dir):
    earlier_run = write_finished_run(isolated_runs_dir)
    app = make_app(runtime_provider=raise_tensorflow_missing, host_check_provider=host_without_tensorflow)
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await until(pilot, lambda: app.host_check is not None)
        # Neither TensorFlow nor JAX: both install lines, TensorFlow's first.
        assert app.runtime_status == "no TensorFlow or JAX"
        assert "no TensorFlow or JAX" in str(app.screen.query_one(SessionBar).content)
        summary = str(app.screen.query_one("#runtime-summary", Static).content)
        assert CPU_INSTALL_LINE in summary and "runtime failed" not in summary
        assert summary.index(CPU_INSTALL_LINE) < summary.index(hostcheck.jax_install_line("cpu"))
        # The host block says what was found, without repeating the install line shown above it.
        host_block = str(app.screen.query_one("#host-summary", Static).content)
        assert "not installed" in host_block and CPU_INSTALL_LINE not in host_block

        for key in ("g", "m", "r"):
            await pilot.press(key)
        await app.action_open_form("gradient-descent")
        assert isinstance(app.screen, JobsScreen)
        app.screen.current_form.query_one("Button.launch").focus()
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        refusals = [message for _, _, message in app.notices if "not launched: no TensorFlow or JAX" in message]
        assert len(refusals) == 4 and all(CPU_INSTALL_LINE in message for message in refusals)
        assert [path.name for path in isolated_runs_dir.iterdir()] == [earlier_run]
        assert not app.session.live_runs and app.current_mode == "jobs"
        assert app.screen.query_one("#job-list").option_count == len(app.session.job_specs)

        await pilot.press("escape", "h")  # out of the form, where letters are typing
        await app.workers.wait_for_complete()
        history = app.screen.query_one("#history-table", DataTable)
        await until(pilot, lambda: history.row_count == 1)
        assert history.get_row_at(0)[2] == "gradient-descent"

        await pilot.press("question_mark")
        await pilot.pause()
        assert app.current_mode == "help"


async def test_a_failed_automatic_tpu_attempt_falls_back_to_the_cpu_default(make_app, runtime, monkeypatch):
    monkeypatch.delenv(runtime_module.FALLBACK_REASON_VARIABLE, raising=False)
    reason = "the chip scan finds 4 × TPU v4 chip, but importing TensorFlow did not answer within 60 s"
    requests = []

    def get_runtime(settings, reinitialize=False):
        requests.append((settings.tpu, reinitialize))
        if settings.tpu != runtime_module.NO_TPU:
            raise TpuFallback(reason)
        return runtime

    monkeypatch.setattr(runtime_module, "get_runtime", get_runtime)
    settings = Settings.load()
    # The engine's own detection, on a thread engine so the patched get_runtime applies.
    app = make_app(runtime_provider=lambda: detect_runtime(settings), host_check_provider=tpu_host_with_the_cpu_build)
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        assert requests == [(None, False), (runtime_module.NO_TPU, True)]
        assert os.environ[runtime_module.FALLBACK_REASON_VARIABLE] == reason
        assert app.runtime.description == runtime.description and app.runtime_error is None
        assert "8 replicas" in app.runtime_status
        assert app.settings.tpu is None  # a re-initialisation tries the TPU again
        await asyncio.wait_for(app.workers.wait_for_complete(), RUN_TIMEOUT)
