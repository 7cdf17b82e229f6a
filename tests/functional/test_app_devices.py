"""The app shell and the Devices screen: first frame, runtime in the header, the device table."""

from __future__ import annotations

from textual.widgets import DataTable

from tests.functional.conftest import SIZE, runtime_ready
from tpudash.tui.bars import SessionBar


async def test_devices_table_lists_the_eight_logical_cpu_devices(make_app, runtime):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        assert "CPU · MirroredStrategy · 8 replicas" in app.runtime_status
        table = app.screen.query_one("#device-table", DataTable)
        names = [table.get_row_at(index)[1] for index in range(table.row_count)]
        assert names == runtime.device_names
        assert len(names) == 8
        assert all(name.endswith(f"CPU:{index}") for index, name in enumerate(names))
        bar = app.screen.query_one(SessionBar)
        assert "8 replicas" in str(bar.content)


async def test_devices_show_the_last_matmul_check_on_disk_from_its_summary(make_app, runtime, store):
    """A check recorded earlier (another session, `tpudash run matmul`) with one wrong device."""
    from jobs.events import RunFinished, RunStarted

    names = runtime.device_names
    recorder = store.create("20261118-120000-matmul-0f0f0f", "matmul", {}, {})
    recorder.record(RunStarted("20261118-120000-matmul-0f0f0f", "matmul", {}, {}, 0.0))
    recorder.record(
        RunFinished(
            "failed",
            {"failed_devices": [names[3]], "gflops": {name: 2.0 + index for index, name in enumerate(names)}},
            "CheckFailed: matmul check failed on " + names[3],
        )
    )
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await runtime_ready(pilot)
        await app.workers.wait_for_complete()
        await pilot.pause()
        table = app.screen.query_one("#device-table", DataTable)
        cells = {table.get_row_at(index)[1]: str(table.get_row_at(index)[-1]) for index in range(table.row_count)}
        assert cells[names[3]] == "✗ FAIL 5.0 GFLOP/s"
        assert cells[names[0]] == "✓ pass 2.0 GFLOP/s"
        assert sum(cell.startswith("✓ pass") for cell in cells.values()) == 7
