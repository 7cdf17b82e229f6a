"""The dashboard on a TPU host where a JAX process holds the chips: it watches, and asks before a TensorFlow job.

The host check is faked (4 TPU v4 chips, the TPU build installed, the chips
held by a JAX script); the engine is the tests' in-thread one on the shared
8-device CPU runtime. On Devices no engine starts and the runtime panel
names the holder. Launching asks to run on the CPU instead: Cancel launches
nothing, "Run on the CPU" starts the engine with the TPU left alone
(``tpu="none"``: libtpu never loads) and runs the job.
"""

from __future__ import annotations

from textual.widgets import Button, Static

from tests.functional.conftest import SIZE, run_settled, shown_live, until
from tpudash.accel import hostcheck
from tpudash.engine.inthread import thread_engine_factory
from tpudash.tui.dialogs import ConfirmScreen

JAX_SCRIPT = hostcheck.TpuHolder(1234, "python train.py --steps 1000", ("/dev/accel0", "/dev/accel1"), "JAX")
SMALL_MATMUL = {"m": "64", "k": "64", "n": "64", "repeats": "1"}


def tpu_host_held_by(holders: list[hostcheck.TpuHolder]):
    """A host check of a v4-8 TPU VM with the TPU build, whose holders are whatever ``holders`` holds at each look."""
    chips = hostcheck.Chips(chip_type="TPU v4 chip", count=4, hbm_gib_per_chip=32, cores_per_chip=1)
    distributions = {"tensorflow-tpu": "2.20.0", "libtpu": "0.0.17"}

    def inspect() -> hostcheck.HostCheck:
        return hostcheck.HostCheck(
            chips=chips,
            distributions=distributions,
            holders=list(holders),
            tensorflow_found=True,
            diagnoses=hostcheck.diagnose(chips, distributions, list(holders), tensorflow_found=True),
        )

    return inspect


async def test_beside_a_jax_process_devices_names_it_and_a_launch_asks_to_run_on_the_cpu(
    make_app, settings, runtime, test_specs, isolated_runs_dir
):
    tpu_settings_of_engines: list[str | None] = []
    start_thread_engine = thread_engine_factory(settings, test_specs, lambda: runtime)

    def start_engine(listener):
        tpu_settings_of_engines.append(app.session.engine_settings.tpu)
        return start_thread_engine(listener)

    app = make_app(engine_factory=start_engine, host_check_provider=tpu_host_held_by([JAX_SCRIPT]))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.runtime_settled.is_set())
        summary = str(app.screen.query_one("#runtime-summary", Static).content)
        assert "TPU in use by another process: no engine here" in summary
        assert "The TPU is held by the JAX process pid 1234 (python train.py --steps 1000)" in summary
        assert "asks to run on the CPU (8 logical devices)" in summary and "connecting" not in summary
        host_block = str(app.screen.query_one("#host-summary", Static).content)
        assert "4 × TPU v4 chip" in host_block
        assert "the JAX process pid 1234 (python train.py --steps 1000) via /dev/accel0, /dev/accel1" in host_block
        assert app.runtime_status == "TPU held by JAX (pid 1234)"
        await pilot.press("j", "d")  # Devices again: still no engine
        assert app.session.lane.engine_starts == 0 and tpu_settings_of_engines == []

        await pilot.press("m")
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, ConfirmScreen)
        assert dialog.question == (
            "The TPU is held by the JAX process pid 1234 (python train.py --steps 1000); libtpu admits one process "
            "per host. Run matmul on the CPU (8 logical devices) instead?"
        )
        assert dialog.focused is dialog.query_one("#yes", Button)  # the default
        assert str(dialog.query_one("#yes", Button).label) == "Run on the CPU (y)"
        await pilot.press("n")  # Cancel
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert not app.session.live_runs and app.session.lane.engine_starts == 0
        assert not [path for path in isolated_runs_dir.glob("*") if not path.name.startswith(".")]

        assert app.session.launch_by_name("matmul", SMALL_MATMUL) is None  # the palette's path asks too
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("enter")  # Run on the CPU
        live = shown_live(app)
        assert live is not None and live.job == "matmul"
        await run_settled(pilot, live)
        assert live.model.status == "done", live.model.error
        assert tpu_settings_of_engines == ["none"]
        assert app.runtime is not None and app.runtime_status.startswith("CPU")
