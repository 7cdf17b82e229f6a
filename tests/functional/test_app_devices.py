"""The app shell and the Devices screen: first frame, runtime in the header, the device table."""

from __future__ import annotations

from textual.widgets import DataTable

from tests.functional.conftest import SIZE, runtime_ready
from screens.base import SessionBar


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
