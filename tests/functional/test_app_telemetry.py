"""Telemetry in the dashboard: a fake libtpu metrics service's numbers on Devices, in the run view and in the record.

The fake (``tests.fake_tpu_metrics``, built on tpu-info's servicer) serves
scripted per-chip values on 127.0.0.1; the app samples it five times a
second. A run written by another process (``tests.writer_process``, the
``tpudash.record`` API) is watched live: its telemetry plot shows the
scripted duty cycle on the run's time axis, the samples land in its
telemetry.jsonl, the service going away mid-run is a reason on screen while
the run goes on, and the values come back with the service.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
from rich.console import Console
from textual.widgets import Static

from screens.run_detail import RunDetailScreen
from tests.fake_tpu_metrics import GIB, FakeTpuMetrics
from tests.functional.conftest import SIZE, run_settled, until
from tests.unit.test_telemetry import DUTY, USED
from tpudash.runs.layout import TELEMETRY_FILE
from tpudash.runs.tail import read_events
from tpudash.tui.plots import MetricPlot

REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
LOW_DUTY = {chip: 12.5 for chip in range(4)}


@pytest.fixture
def fake():
    with FakeTpuMetrics(chips=4) as server:
        server.set(duty=DUTY, used=USED, bandwidth={0: 40.0, 1: 30.0, 2: 20.0, 3: 10.0})
        yield server


@pytest.fixture
def settings(settings, fake):
    return replace(settings, tpu_metrics=fake.address, telemetry_interval=0.2)


def rendered(widget: Static, width: int = 118) -> str:
    """What a Static shows, as text (its renderable drawn at the screen's width)."""
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(widget.content)
    return console.export_text()


def duty_line(screen) -> list[float]:
    """The duty-cycle values the screen's telemetry plot drew last."""
    plot = screen.query_one("#telemetry-plot", MetricPlot)
    return plot.drawn_series.get("TPU duty cycle", ([], []))[1] if plot.display else []


def duty_values(model) -> list[float]:
    """The duty-cycle values the run's model holds (plots redraw on the display beat)."""
    series = model.telemetry.get("TPU duty cycle")
    return series.points()[1] if series is not None else []


async def test_devices_shows_every_chips_duty_cycle_and_hbm_with_the_host(make_app, fake):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: len(app.session.telemetry.history) >= 3)
        shown: dict[str, str] = {}

        def answered_sample_shown() -> bool:
            # Under load a sample can miss its 0.5 s deadline, and the panel then says so in place of the
            # chips (a CI-like run drew one here): the chips are read from a sample that was answered.
            shown["text"] = rendered(app.screen.query_one("#telemetry", Static))
            return "metrics service at" in shown["text"] and "did not answer" not in shown["text"]

        await until(pilot, answered_sample_shown)
        text = shown["text"]
        assert f"TPU — libtpu's metrics service at {fake.address}" in text
        rows = {line.split()[0]: line for line in text.splitlines() if line.strip()[:1].isdigit()}
        assert "88%" in rows["0"] and "4.0/16.0 GiB" in rows["0"] and "40%" in rows["0"]
        assert "12%" in rows["3"] and "0.0/16.0 GiB" in rows["3"]
        assert "█" in rows["0"].split("GiB")[-1]  # the sparkline of the last samples
        assert "CPU (" in text and "memory" in text

        fake.stop()  # a sample's call may be in flight: that one says the service stopped while answering
        await until(pilot, lambda: "connection refused" in app.telemetry[1].unavailable.get("tpu", ""))
        await pilot.pause()
        text = " ".join(rendered(app.screen.query_one("#telemetry", Static)).split())
        assert f"TPU no TPU metrics service at {fake.address}: connection refused" in text
        assert "CPU (" in text  # the host side goes on


async def test_a_watched_run_gets_telemetry_on_its_time_axis_in_its_record_and_survives_the_service_going(
    make_app, fake, store
):
    fake.set(duty=LOW_DUTY)
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.writer_process", "watched"],
        cwd=REPO_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def say(command: str) -> str:
        writer.stdin.write(command + "\n")
        writer.stdin.flush()
        return writer.stdout.readline().strip()

    try:
        run_id = writer.stdout.readline().split()[1]
        app = make_app()
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.session.live_on_disk)
            await pilot.press("w")
            detail = app.screen
            assert isinstance(detail, RunDetailScreen)
            await until(pilot, lambda: detail.loaded)
            assert say("metric 1.0") == "metric 1"
            # Five samples at 12.5%: the idle-TPU advice, and the plot at the scripted value.
            await until(pilot, lambda: len(duty_values(detail.view.model)) >= 5 and detail.view.model.final_metrics)

            def telemetry_note() -> str:
                return str(detail.query_one("#telemetry-note", Static).content)

            # The fake service lives in this busy test process: one sample may miss its 0.5 s and say
            # so in the note until the next one answers; the advice is what must come.
            await until(
                pilot,
                lambda: (
                    detail.query_one("#telemetry-note", Static).display
                    and duty_line(detail)
                    and "input-bound?" in telemetry_note()
                ),
            )
            note = telemetry_note()
            assert "input-bound? the TPU was busy 12% of the last 30 s while training" in note
            assert "prefetch(tf.data.AUTOTUNE)" in note
            assert set(duty_line(detail)) == {12.5}
            xs = detail.query_one("#telemetry-plot", MetricPlot).drawn_series["TPU duty cycle"][0]
            assert xs == sorted(xs) and 0 <= xs[0] < 30  # seconds since the run started

            recorded, problems = read_events(store.root / run_id / TELEMETRY_FILE)
            assert problems == [] and len(recorded) >= 5
            # As above, the newest sample may be one that missed its deadline: the newest answered one holds the HBM.
            answered = [sample for _, sample in recorded if sample.chips]
            assert answered and [chip["hbm_used"] for chip in answered[-1].chips] == list(USED.values())
            assert recorded[-1][1].host["processes"]["writer"] > 0  # the writer's resident memory

            fake.stop()
            await until(pilot, lambda: "connection refused" in str(detail.query_one("#telemetry-note", Static).content))
            assert say("metric 0.5") == "metric 2"  # the run goes on
            await until(pilot, lambda: detail.view.model.final_metrics.get("loss") == 0.5)

            fake.start()
            fake.set(duty={chip: 75.0 for chip in range(4)}, used={chip: 8 * GIB for chip in range(4)})
            await until(pilot, lambda: duty_values(detail.view.model)[-1] == 75.0)
            assert detail.view.model.telemetry_unavailable == {}

            assert say("finish done") == "finished"
            await until(pilot, lambda: detail.view.model.status == "done")
        recorded = [sample for _, sample in read_events(store.root / run_id / TELEMETRY_FILE)[0]]
        assert {sample.chips[0]["duty_cycle_pct"] for sample in recorded if sample.chips} == {12.5, 75.0}
        assert any("connection refused" in sample.unavailable.get("tpu", "") for sample in recorded)
        assert store.info(store.root / run_id).status == "done"
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait(30)


async def test_a_tpudash_job_records_telemetry_and_its_run_view_plots_it(make_app, fake, store, job_gate):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        live = app.session.launch_by_name("test-steps")
        await pilot.press("v")
        await until(pilot, lambda: job_gate.reached.is_set() and len(duty_line(app.screen)) >= 2)
        assert duty_line(app.screen)[-1] == sum(DUTY.values()) / 4  # the mean over the chips
        assert app.screen.query_one("#telemetry-plot", MetricPlot).display
        job_gate.release.set()
        await run_settled(pilot, live)
    recorded, _ = read_events(store.root / live.run_id / TELEMETRY_FILE)
    answered = [sample for _, sample in recorded if sample.chips]  # a sample that missed its deadline has none
    assert answered and [chip["duty_cycle_pct"] for chip in answered[0].chips] == list(DUTY.values())


def chip_row(app, chip: str) -> str:
    """Chip ``chip``'s row in the Devices screen's telemetry panel, as drawn."""
    screen = app.get_screen_stack("devices")[0]
    text = rendered(screen.query_one("#telemetry", Static))
    return next((line for line in text.splitlines() if line.split()[:1] == [chip]), "")


async def test_devices_telemetry_lays_the_screen_out_only_when_its_height_changes_and_waits_while_hidden(
    make_app, fake, screen_layouts
):
    # Telemetry comes five times a second here (every second by default): laying the whole screen out for
    # each sample costs the key pressed meanwhile its frame, and a hidden screen laid itself out again on
    # its next visit.
    layouts = screen_layouts
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:

        def samples() -> int:
            return len(app.session.telemetry.history)

        await until(pilot, lambda: samples() >= 3)  # the sparklines' column is there from the second on
        await pilot.pause()
        layouts.clear()
        fake.set(duty=LOW_DUTY)
        await until(pilot, lambda: "12%" in chip_row(app, "0"))
        seen = samples()
        await until(pilot, lambda: samples() >= seen + 3)
        assert "DevicesScreen" not in layouts  # new figures, the same lines: repainted, not laid out

        await pilot.press("j")
        await pilot.pause()
        layouts.clear()
        fake.set(duty=DUTY)
        seen = samples()
        await until(pilot, lambda: samples() >= seen + 3)
        assert "12%" in chip_row(app, "0")  # hidden: not drawn meanwhile
        await pilot.press("d")
        await pilot.pause()
        assert "88%" in chip_row(app, "0")  # the newest sample, on the first frame back
        assert "DevicesScreen" not in layouts

        fake.stop()  # the TPU's table becomes one line saying why: the panel is shorter
        await until(pilot, lambda: app.telemetry[1].unavailable.get("tpu"))
        await pilot.pause()
        assert "DevicesScreen" in layouts
        panel = app.screen.query_one("#telemetry", Static)
        assert panel.content_size.height == len(rendered(panel).rstrip("\n").splitlines())
