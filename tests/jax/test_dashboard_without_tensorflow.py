"""The dashboard in an environment with JAX and no TensorFlow at all (Colab's TPU runtime): its engine runs on JAX.

The host check is the real one but for its chip scan and holders, which are
faked. On a host with no chip the engine (a real process: ``python -m
tests.engine_main``, the engine with the test suite's jobs) starts on JAX,
Devices lists the 8 JAX devices XLA splits the CPU into, and a launch runs
there. On a TPU VM whose chips a JAX script holds (4 TPU v4 chips, a fake
libtpu metrics service, ``tests.fake_tpu_metrics``, standing in for the one
JAX's libtpu serves) the existing rule holds: Devices shows the chips, the
JAX process that holds them and their telemetry, no engine starts beside
it, and a launch asks to run on the CPU, where the engine then runs JAX on
the CPU alone.
"""

from __future__ import annotations

import asyncio
import sys

import psutil
from rich.console import Console
from textual.widgets import DataTable, Static

from jobs import registry
from tests.engine_jobs import SPECS as TEST_ENGINE_JOBS
from tests.engine_main import ENGINE_MAIN
from tests.fake_tpu_metrics import GIB, FakeTpuMetrics
from tpudash.accel import hostcheck
from tpudash.config import Settings
from tpudash.engine.handle import EngineProcess
from tpudash.tui.app import TpudashApp
from tpudash.tui.dialogs import ConfirmScreen

SIZE = (120, 40)
UNTIL_TIMEOUT = 60.0
JAX_SCRIPT = hostcheck.TpuHolder(4321, "python train_flax.py", ("/dev/accel0",), "JAX")
V4_8 = hostcheck.Chips(chip_type="TPU v4 chip", count=4, hbm_gib_per_chip=32, cores_per_chip=1)
JOBS = dict(registry()) | {spec.name: spec for spec in TEST_ENGINE_JOBS}


def held_tpu_host() -> hostcheck.HostCheck:
    """This environment as it is (its installed builds: no TensorFlow), on a TPU VM whose chips a JAX script holds."""
    return hostcheck.inspect(chip_scan=lambda: V4_8, holders=lambda: [JAX_SCRIPT])


def cpu_host() -> hostcheck.HostCheck:
    """This environment as it is, on a host with no TPU chip (a laptop, Colab's CPU runtime)."""
    return hostcheck.inspect(chip_scan=lambda: hostcheck.Chips(), holders=lambda: [])


def dashboard(settings: Settings, host_check_provider, tmp_path) -> TpudashApp:
    """The app with real engine processes that also have the test suite's jobs, started with the session's settings."""
    app = TpudashApp(settings, job_specs=JOBS, host_check_provider=host_check_provider)
    app.session._engine_factory = lambda listener: EngineProcess(
        listener, app.session.engine_settings, tmp_path / "engine.log", module=ENGINE_MAIN
    )
    return app


def rendered(widget: Static, width: int = 118) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(widget.content)
    return console.export_text()


async def until(pilot, predicate) -> None:
    """Wait, tick by tick of the app's UI timer, until ``predicate()`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + UNTIL_TIMEOUT
    while not predicate():
        remaining = deadline - loop.time()
        assert remaining > 0, f"condition not met within {UNTIL_TIMEOUT} s"
        await asyncio.wait_for(pilot.app.next_tick(), remaining)
    await pilot.pause()


def engine_children() -> list[str]:
    """Command lines of this process's children that run tpudash's engine."""
    commands = []
    for child in psutil.Process().children(recursive=True):
        try:
            commands.append(" ".join(child.cmdline()))
        except psutil.Error:
            continue
    return [command for command in commands if "engine" in command]


async def test_without_tensorflow_the_engine_runs_on_jax_devices_lists_its_8_devices_and_a_job_runs(
    isolated_runs_dir, tmp_path
):
    settings = Settings(runs_dir=isolated_runs_dir, telemetry_interval=0)
    app = dashboard(settings, cpu_host, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.runtime is not None)
        screen = app.screen
        assert app.runtime_status == "JAX · CPU · Mesh · 8 replicas (simulated)"
        assert app.engine_status == "ready on CPU (JAX)"
        summary = rendered(screen.query_one("#runtime-summary", Static))
        assert "framework  JAX 0.10.2 · 8 CPU devices" in summary
        assert "versions  JAX 0.10.2, Keras 3." in summary
        table = screen.query_one("#device-table", DataTable)
        assert [column.key.value for column in table.ordered_columns] == [
            "index",
            "name",
            "platform",
            "kind",
            "process",
            "memory",
            "last check",
        ]
        assert [table.get_row_at(row)[1] for row in range(table.row_count)] == [f"CPU:{index}" for index in range(8)]
        host_block = rendered(screen.query_one("#host-summary", Static))
        assert "JAX  0.10.2 · the engine runs jobs on it" in host_block
        assert "TensorFlow is not installed" not in host_block  # no problem: the jobs run on JAX

        live = app.session.launch_by_name("test-devices")
        assert live is not None
        await asyncio.wait_for(live.settled.wait(), UNTIL_TIMEOUT)
        assert live.model.status == "done"
        assert live.model.summary == {"framework": "jax", "devices": 8}

        await pilot.press("d", "m")  # matmul on every JAX device: not refused with TensorFlow's install line
        await until(pilot, lambda: app.device_check is not None)
        assert not any("no TensorFlow" in message for _, _, message in app.notices)
        assert app.device_check["job"] == "matmul" and app.device_check["status"] == "done"
        await pilot.press("d")
        table = app.screen.query_one("#device-table", DataTable)
        assert [str(table.get_row_at(row)[-1]).split(" ")[:2] for row in range(8)] == [["✓", "pass"]] * 8

        app.action_use_framework("tensorflow")  # the palette's switch: there is no TensorFlow here
        await pilot.pause()
        assert app.runtime_status == "no TensorFlow" and app.settings.framework == "tensorflow"
        assert app.session.lane.engine is None  # the JAX engine was released
        summary = rendered(app.screen.query_one("#runtime-summary", Static))
        assert "no TensorFlow: jobs cannot run until it is installed" in summary
        assert 'pip install "tensorflow>=2.20,<2.22"' in summary
        title = rendered(app.screen.query_one("#device-check-title", Static))
        assert "none: the engine lists them, and cannot start here" in title
    assert "tensorflow" not in sys.modules


async def test_beside_a_jax_script_holding_the_tpu_devices_shows_it_and_a_launch_runs_jax_on_the_cpu(
    isolated_runs_dir, tmp_path
):
    with FakeTpuMetrics(chips=4) as fake:
        fake.set(duty={0: 87.5, 1: 62.5, 2: 25.0, 3: 12.5}, used={0: 4 * GIB, 1: 2 * GIB, 2: GIB, 3: 0})
        settings = Settings(runs_dir=isolated_runs_dir, tpu_metrics=fake.address, telemetry_interval=0.2)
        app = dashboard(settings, held_tpu_host, tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.host_check is not None and len(app.session.telemetry.history) >= 2)
            screen = app.screen
            host_block = rendered(screen.query_one("#host-summary", Static))
            assert "4 × TPU v4 chip, 32 GiB HBM each" in host_block
            assert "the JAX process pid 4321 (python train_flax.py) via /dev/accel0" in host_block
            assert "TensorFlow build  not installed" in host_block

            telemetry = rendered(screen.query_one("#telemetry", Static))
            assert f"TPU — libtpu's metrics service at {fake.address}" in telemetry
            rows = {line.split()[0]: line for line in telemetry.splitlines() if line.strip()[:1].isdigit()}
            assert "88%" in rows["0"] and "4.0/16.0 GiB" in rows["0"]
            assert "12%" in rows["3"] and "0.0/16.0 GiB" in rows["3"]

            summary = rendered(screen.query_one("#runtime-summary", Static))
            assert "TPU in use by another process: no engine here" in summary
            assert app.runtime_status == "TPU held by JAX (pid 4321)"
            assert app.session.lane.engine_starts == 0 and engine_children() == []

            assert app.session.launch_by_name("test-devices") is None  # asked first: the chips stay with the script
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            assert app.screen.question.endswith("Run test-devices on the CPU (8 logical devices) instead?")
            assert engine_children() == []
            await pilot.press("y")
            await until(pilot, lambda: app.session.live_runs)
            (live,) = app.session.live_runs.values()
            await asyncio.wait_for(live.settled.wait(), UNTIL_TIMEOUT)
            assert live.model.status == "done" and live.model.summary == {"framework": "jax", "devices": 8}
            assert app.session.engine_settings.tpu == "none"  # JAX_PLATFORMS=cpu: libtpu is never loaded
            assert app.runtime.description.reasons["TPU"] == "--tpu none given: the TPU is left alone"
    assert "tensorflow" not in sys.modules
