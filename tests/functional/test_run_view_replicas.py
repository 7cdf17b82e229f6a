"""At 80×24 the per-replica table shows every replica (issue 26, 5.25, second half).

The table's columns ran past 80 columns: a run with 8 replicas showed replicas 0 to 4 and part of a
fifth. Here a run reports one value per replica on 8 replicas; at 80×24 every replica's column
heading and every value are on screen, in the table.
"""

from __future__ import annotations

import re

from jobs.base import JobSpec
from jobs.events import ReplicaValues
from tests.functional.conftest import run_settled, runtime_ready, until
from tests.functional.test_app_80x24 import screen_rows

VALUES = [round(0.1483 + 0.0101 * index, 4) for index in range(8)]
DEVICES = [f"/job:localhost/replica:0/task:0/device:CPU:{index}" for index in range(8)]


def _replica_job() -> JobSpec:
    def run(ctx, params):
        ctx.emit(ReplicaValues("val loss per replica", VALUES, DEVICES))
        return {}

    return JobSpec(name="test-replicas", title="Test replicas", description="8 replica values.", params=(), run=run)


async def test_every_replica_of_eight_is_in_the_table_at_80x24(make_app, test_specs):
    app = make_app(job_specs={**test_specs, "test-replicas": _replica_job()})
    async with app.run_test(size=(80, 24)) as pilot:
        await runtime_ready(pilot)
        live = app.session.launch_by_name("test-replicas")
        await run_settled(pilot, live)
        await until(pilot, lambda: app.current_mode == "run" and app.screen.view.model is live.model)
        view = app.screen.view
        await until(pilot, lambda: view.query_one("#run-tabs").active == "tab-replicas")
        table = view.query_one("#replica-table").region
        assert table.height >= 2, "the table has no room"
        rows = [row[table.x : table.right] for row in screen_rows(app)[table.y : table.bottom]]
        heading, values = rows[0], " ".join(rows[1:])
        # "replica 3" where the columns have room, "r3" where they have not.
        missing = [index for index in range(8) if not re.search(rf"(^|\s)(replica {index}|r{index})(\s|$)", heading)]
        assert not missing, f"replica columns off screen: {missing}\n" + "\n".join(rows)
        assert all(str(value) in values.split() for value in VALUES), "\n".join(rows)
