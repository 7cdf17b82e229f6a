"""The dashboard beside a JAX session, in an environment with no TensorFlow at all (Colab's TPU runtime).

The host check is the real one but for its chip scan and holders, which are
faked: 4 TPU v4 chips, held by a JAX script. A fake libtpu metrics service
(``tests.fake_tpu_metrics``) stands in for the one JAX's libtpu serves on a
TPU host. The dashboard watches: Devices shows the chips, the JAX process
that holds them and their telemetry, says that jobs need TensorFlow, and
never starts an engine; launches are refused with the install line.
"""

from __future__ import annotations

import sys

import psutil
from rich.console import Console
from textual.widgets import Static

from tests.fake_tpu_metrics import GIB, FakeTpuMetrics
from tpudash.accel import hostcheck
from tpudash.config import Settings
from tpudash.tui.app import TpudashApp

SIZE = (120, 40)
UNTIL_TIMEOUT = 60.0
JAX_SCRIPT = hostcheck.TpuHolder(4321, "python train_flax.py", ("/dev/accel0",), "JAX")
V4_8 = hostcheck.Chips(chip_type="TPU v4 chip", count=4, hbm_gib_per_chip=32, cores_per_chip=1)


def held_tpu_host() -> hostcheck.HostCheck:
    """This environment as it is (its installed builds: no TensorFlow), on a TPU VM whose chips a JAX script holds."""
    return hostcheck.inspect(chip_scan=lambda: V4_8, holders=lambda: [JAX_SCRIPT])


def rendered(widget: Static, width: int = 118) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(widget.content)
    return console.export_text()


async def until(pilot, predicate) -> None:
    """Wait, tick by tick of the app's UI timer, until ``predicate()`` holds."""
    import asyncio

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
    return [command for command in commands if "tpudash.engine" in command]


async def test_beside_jax_without_tensorflow_devices_shows_the_chips_holder_and_telemetry_and_no_engine_starts(
    isolated_runs_dir,
):
    with FakeTpuMetrics(chips=4) as fake:
        fake.set(duty={0: 87.5, 1: 62.5, 2: 25.0, 3: 12.5}, used={0: 4 * GIB, 1: 2 * GIB, 2: GIB, 3: 0})
        settings = Settings(runs_dir=isolated_runs_dir, tpu_metrics=fake.address, telemetry_interval=0.2)
        app = TpudashApp(settings, host_check_provider=held_tpu_host)
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

            summary = str(screen.query_one("#runtime-summary", Static).content)
            assert "no TensorFlow: jobs cannot run until it is installed" in summary
            assert 'pip install "tensorflow-tpu==2.20.0" "libtpu==0.0.17"' in summary
            assert app.runtime_status == "no TensorFlow"

            await pilot.press("m")  # refused with the install line: nothing is started
            await pilot.pause()
            assert any("matmul not launched: no TensorFlow" in message for _, _, message in app.notices)
            assert app.session.lane.engine_starts == 0 and app.session.engine_pid is None
            assert engine_children() == []
    assert "tensorflow" not in sys.modules
