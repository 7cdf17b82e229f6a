"""``tpudash advise RUN`` and the MFU of ``tpudash runs``: what a user reads of a run's advice, and its exit codes.

Runs are made as the other CLI tests make them (``RunStore.create`` and its recorder), their advice.json
written as a run's writer writes it (``AdviceReport.of`` + ``write_report``); profiles are XProf's summaries
of real captures (``tests/functional/profile_summaries``). No TensorFlow here.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from pathlib import Path

import pytest

from jobs.events import Metric, Progress, RunFinished, Telemetry, dumps
from tpudash.advice.inputbound import TELEMETRY_TAIL_BYTES, duty_hint, recent_samples
from tpudash.advice.mfu import Mfu
from tpudash.advice.report import ADVICE_FILE, AdviceReport, CompileMark, write_report
from tpudash.advice.rules import RULE_IDS, Advice, padding, small_batch
from tpudash.cli import main as cli
from tpudash.runs.layout import RUN_FILE, new_run_id
from tpudash.runs.store import RunStore

SUMMARIES = Path(__file__).parents[1] / "functional" / "profile_summaries"
PEAK_SOURCE = "measured: tpudash run matmul 20261128-090000-matmul-abc123 on this host, float32"
FLOPS_SOURCE = "XLA cost analysis of the compiled step"
CPU_RUNTIME = {"kind": "CPU", "mfu_peak": {"flops_per_second": 2.0e11, "source": PEAK_SOURCE}}
PREFETCH = Advice(
    "prefetch",
    "fires",
    "the pipeline does not end with prefetch (last stage: MapDataset)",
    "dataset = dataset.prefetch(tf.data.AUTOTUNE)",
    {"stage": "MapDataset"},
)


def memory_url() -> str:
    """A store no other test shares (fsspec's memory filesystem is process-wide)."""
    return f"memory://advise-{uuid.uuid4().hex[:8]}/tpudash/runs"


def pitfalls_report(run_id: str) -> AdviceReport:
    """What the pitfalls script's writer records: batch 100 on 8 cores into Dense(1000), no prefetch."""
    found = [
        padding([(784, 1000), (1000, 10)], 100, on_tpu=False),
        small_batch(100, on_tpu=False),
        PREFETCH,
        Advice("cache", "quiet", "the dataset is cached"),
    ]
    mfu = Mfu(0.229, PEAK_SOURCE, FLOPS_SOURCE, flops_per_step=4.6e9, steps_per_second=10.0, peak_flops_per_second=2e11)
    marks = (
        CompileMark(step=40, time=time.time(), function="one_step_on_data", count=2, cause="batch 50, before 100"),
    )
    return AdviceReport.of(run_id, found, mfu=mfu, marks=marks, framework="tensorflow", on_tpu=False)


def finished_run(store: RunStore, job: str = "train", runtime: dict | None = None, summary: dict | None = None) -> str:
    run_id = new_run_id(job)
    recorder = store.create(run_id, job, {}, runtime if runtime is not None else {"kind": "CPU"})
    recorder.record(Metric("loss", 0.5, step=10))
    recorder.record(RunFinished(status="done", summary=summary or {}))
    return run_id


def advise(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["advise", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def lines_of(out: str) -> list[str]:
    return [" ".join(line.split()) for line in out.splitlines()]


# -- tpudash advise ------------------------------------------------------------------------------


def test_advise_prints_the_firing_rules_first_each_with_its_fix_then_the_mfu_sources_and_the_recompiles(
    isolated_runs_dir, capsys
):
    store = RunStore(isolated_runs_dir)
    run_id = finished_run(store, runtime=CPU_RUNTIME)
    write_report(store.files(run_id), pitfalls_report(run_id))

    code, out, err = advise(capsys, run_id[:22])  # a prefix, as `tpudash show` takes it

    assert (code, err) == (0, "")
    lines = lines_of(out)
    assert lines[0].startswith(f"advice for {run_id} (tensorflow, not on a TPU; judged ")
    assert "MFU 22.9 %" in lines
    assert f"peak: {PEAK_SOURCE}" in lines and f"FLOPs per step: {FLOPS_SOURCE}" in lines
    padding_line = next(index for index, line in enumerate(lines) if line.startswith("▲ padding "))
    assert "would waste" in lines[padding_line] and "on a TPU" in lines[padding_line]
    assert lines[padding_line + 1].startswith("fix: use layer widths that are multiples of 128")
    prefetch_line = lines.index("▲ prefetch the pipeline does not end with prefetch (last stage: MapDataset)")
    assert lines[prefetch_line + 1] == "fix: dataset = dataset.prefetch(tf.data.AUTOTUNE)"
    assert any(line.startswith("▲ small-batch 100 examples per core would underfeed a TPU core") for line in lines)
    # Firing rules, then those not checked (with why), then the quiet ones: every rule listed once.
    marks = [line.split()[0] for line in lines if line[:2] in ("▲ ", "? ", "✓ ")]
    assert marks == sorted(marks, key=["▲", "?", "✓"].index) and len(marks) == len(RULE_IDS)
    assert "✓ cache the dataset is cached" in lines
    assert any(line.startswith("? recompiles not checked: ") for line in lines)
    assert "step 40 one_step_on_data (compile 2): batch 50, before 100" in lines


def test_advise_json_is_the_report_with_the_run_and_reads_back(isolated_runs_dir, capsys):
    store = RunStore(isolated_runs_dir)
    run_id = finished_run(store, runtime=CPU_RUNTIME)
    write_report(store.files(run_id), pitfalls_report(run_id))

    code, out, _ = advise(capsys, run_id, "--json")

    assert code == 0
    payload = json.loads(out)
    assert payload["run"] == run_id
    assert [item["rule"] for item in payload["advice"]] == list(RULE_IDS)
    assert {item["rule"] for item in payload["advice"] if item["state"] == "fires"} == {
        "padding",
        "prefetch",
        "small-batch",
    }
    assert payload["mfu"]["mfu"] == 0.229 and payload["mfu"]["peak_source"] == PEAK_SOURCE
    assert payload["marks"][0]["function"] == "one_step_on_data"
    assert AdviceReport.from_json(payload).rule("padding").state == "fires"  # the bus's own format


def test_a_run_given_by_its_path_is_advised_too(isolated_runs_dir, tmp_path, capsys, monkeypatch):
    store = RunStore(isolated_runs_dir)
    run_id = finished_run(store)
    write_report(store.files(run_id), pitfalls_report(run_id))
    monkeypatch.delenv("TPUDASH_RUNS_DIR")  # the path alone says where the run is

    code, out, _ = advise(capsys, str(isolated_runs_dir / run_id), "--json")

    assert (code, json.loads(out)["run"]) == (0, run_id)


def test_a_run_without_advice_says_so_and_exits_2(isolated_runs_dir, capsys):
    run_id = finished_run(RunStore(isolated_runs_dir), job="gradient-descent")

    code, out, err = advise(capsys, run_id)

    assert (code, out) == (2, "")
    assert err.startswith(f"tpudash: no advice recorded for {run_id} (runs recorded before tpudash kept advice.json")


def test_no_such_run_is_bad_input_naming_it(isolated_runs_dir, capsys):
    finished_run(RunStore(isolated_runs_dir))

    code, _, err = advise(capsys, "20991231")

    assert code == 2
    assert "RUN: no run '20991231'" in err


@pytest.mark.parametrize(
    "stored, named",
    [
        ({"run_id": "r", "updated": 1.0, "advice": "all good"}, "advice.json: advice must be a list"),
        (
            {"run_id": "r", "updated": 1.0, "advice": [{"rule": "padding", "state": "burning"}]},
            "advice.json: unknown state 'burning'",
        ),
        ("{not json", "advice.json: not JSON"),
    ],
)
def test_an_unreadable_advice_json_is_named_and_exits_1(stored, named, isolated_runs_dir, capsys):
    store = RunStore(isolated_runs_dir)
    run_id = finished_run(store)
    data = stored if isinstance(stored, str) else json.dumps(stored)
    store.files(run_id).write(ADVICE_FILE, data.encode())

    code, out, err = advise(capsys, run_id)

    assert (code, out) == (1, "")
    assert err.startswith(f"tpudash: run {run_id}: {named}")


def test_a_bucket_runs_advice_is_read_by_id_and_by_url(capsys):
    url = memory_url()
    store = RunStore(url)
    run_id = finished_run(store, runtime=CPU_RUNTIME)
    write_report(store.files(run_id), pitfalls_report(run_id))

    code, out, _ = advise(capsys, run_id[:22], "--runs-dir", url)
    assert code == 0 and "MFU 22.9 %" in lines_of(out)

    code, out, _ = advise(capsys, f"{url}/{run_id}", "--json")
    assert code == 0 and json.loads(out)["run"] == run_id


def put_profile(store: RunStore, run_id: str, fixture: str) -> str:
    """An XProf summary of a real capture, where ``tpudash profile`` leaves it in the run."""
    summary = json.loads((SUMMARIES / fixture).read_text())
    folder = f"profile/plugins/profile/{summary['capture']}"
    store.files(run_id).write(f"{folder}/vm.xplane.pb", b"")
    store.files(run_id).write(f"{folder}/summary.json", json.dumps(summary).encode())
    return summary["capture"]


def input_bound_rule(out: str) -> dict:
    return next(item for item in json.loads(out)["advice"] if item["rule"] == "input-bound")


def test_input_bound_is_judged_from_the_runs_newest_profile_and_says_where_from(isolated_runs_dir, capsys):
    store = RunStore(isolated_runs_dir)
    run_id = finished_run(store)
    write_report(store.files(run_id), pitfalls_report(run_id))  # the writer leaves input-bound not checked

    code, out, _ = advise(capsys, run_id, "--json")
    rule = input_bound_rule(out)
    assert (code, rule["state"]) == (0, "not checked")
    assert rule["summary"] == "not checked: no duty-cycle reading or profile yet"
    assert rule["detail"]["duty_hint_source"] == "no telemetry recorded"
    assert rule["detail"]["input_percent_source"] == "no profile with a summary (tpudash profile RUN makes one)"

    capture = put_profile(store, run_id, "input_bound.json")
    rule = input_bound_rule(advise(capsys, run_id, "--json")[1])
    assert rule["state"] == "fires"
    assert rule["summary"] == "input-bound: 95 % of step time waits on input"
    assert rule["detail"]["input_percent"] == 95.0
    assert rule["detail"]["input_percent_source"] == f"profile {capture}: input-bound"
    assert "prefetch(tf.data.AUTOTUNE)" in rule["fix"]

    code, out, _ = advise(capsys, run_id)
    lines = lines_of(out)
    verdict = lines.index("▲ input-bound input-bound: 95 % of step time waits on input")
    assert f"profile: profile {capture}: input-bound" in lines[verdict + 1 : verdict + 4]


def test_a_newer_compute_bound_profile_keeps_input_bound_quiet(isolated_runs_dir, capsys):
    store = RunStore(isolated_runs_dir)
    run_id = finished_run(store)
    write_report(store.files(run_id), pitfalls_report(run_id))
    put_profile(store, run_id, "input_bound.json")  # captured 08:27:43
    newest = put_profile(store, run_id, "compute_bound.json")  # captured 08:27:45

    rule = input_bound_rule(advise(capsys, run_id, "--json")[1])

    assert rule["state"] == "quiet"
    assert rule["detail"]["input_percent_source"] == f"profile {newest}: not input-bound"


def write_telemetry(store: RunStore, run_id: str, duty_cycles: list[float | None]) -> None:
    """Samples one a second, as an observer appends them to the run's telemetry.jsonl."""
    start = time.time() - len(duty_cycles)
    lines = [
        dumps(Telemetry(chips=[{"chip": 0, "duty_cycle_pct": duty}], host={"cpu_pct": [20.0]}), start + index)
        for index, duty in enumerate(duty_cycles)
    ]
    store.files(run_id).write("telemetry.jsonl", ("\n".join(lines) + "\n").encode())


def test_an_idle_tpu_in_the_runs_telemetry_makes_input_bound_fire(isolated_runs_dir, capsys):
    store = RunStore(isolated_runs_dir)
    run_id = finished_run(store)
    write_report(store.files(run_id), pitfalls_report(run_id))
    write_telemetry(store, run_id, [95.0] * 100 + [12.0] * 40)  # busy long ago, idle over the last 40 s

    rule = input_bound_rule(advise(capsys, run_id, "--json")[1])

    assert (rule["state"], rule["summary"]) == ("fires", "input-bound: accelerator idle between steps")
    assert rule["detail"]["duty_hint"] is True
    assert rule["detail"]["duty_hint_source"] == "telemetry: the TPU was busy 12% of the last 30 s while training"


def test_a_cpu_runs_telemetry_has_no_duty_cycle_and_says_so(isolated_runs_dir, capsys):
    store = RunStore(isolated_runs_dir)
    run_id = finished_run(store)
    write_report(store.files(run_id), pitfalls_report(run_id))
    write_telemetry(store, run_id, [None] * 40)

    rule = input_bound_rule(advise(capsys, run_id, "--json")[1])

    assert rule["state"] == "not checked"
    assert rule["detail"]["duty_hint_source"].startswith("telemetry has 0 duty-cycle samples in its last 30 s")


# -- tpudash runs: MFU -------------------------------------------------------------------------------


def runs_listed(capsys, *argv: str) -> dict[str, dict]:
    assert cli.main(["runs", "--json", *argv]) == 0
    return {run["run_id"]: run for run in json.loads(capsys.readouterr().out)}


def test_runs_shows_the_mfu_of_a_finished_run_a_live_run_and_a_dash_without(isolated_runs_dir, capsys):
    store = RunStore(isolated_runs_dir)
    summary = {"mfu": Mfu(0.229, "TPU v4: 275 teraflops (bf16) x 4 chips", FLOPS_SOURCE).to_json()}
    finished = finished_run(store, runtime=CPU_RUNTIME, summary=summary)
    without = finished_run(store, job="matmul")
    live = new_run_id("train")
    recorder = store.create(live, "train", {}, CPU_RUNTIME)
    recorder.record(Metric("mfu", 0.0412, step=100, epoch=0))
    recorder.record(Progress(done=1, total=3, unit="epoch"))  # run.json is rewritten at each epoch's end

    listed = runs_listed(capsys)

    # The finish's MFU and its peak; a live run's newest epoch and the peak said at its start; none.
    assert (listed[finished]["mfu"], listed[finished]["peak_source"]) == (0.229, summary["mfu"]["peak_source"])
    assert (listed[live]["mfu"], listed[live]["peak_source"]) == (0.0412, PEAK_SOURCE)
    assert listed[live]["live"] is True
    assert (listed[without]["mfu"], listed[without]["peak_source"]) == (None, None)

    assert cli.main(["runs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[header.index("status") + 1] == "MFU"
    row = {run_id: next(line for line in lines if line.startswith(run_id)) for run_id in (finished, live, without)}
    assert " 22.9 % " in row[finished] and " 4.12 % " in row[live] and " — " in row[without]
    recorder.record(RunFinished(status="done"))


def test_a_malformed_mfu_in_run_json_is_a_named_problem_not_a_crash(isolated_runs_dir, capsys):
    store = RunStore(isolated_runs_dir)
    run_id = finished_run(store)
    path = isolated_runs_dir / run_id / RUN_FILE
    record = json.loads(path.read_text())
    record["summary"] = {"mfu": {"mfu": "lots", "peak_source": "x"}, "examples_per_second": 10.0}
    record["runtime"] = {"kind": "CPU", "mfu_peak": {"flops_per_second": 1.0, "source": 42}}
    path.write_text(json.dumps(record))

    run = runs_listed(capsys)[run_id]

    assert (run["mfu"], run["peak_source"]) == (None, None)
    assert run["summary"] == {"examples_per_second": 10.0}  # the rest of the summary kept
    assert any(problem.startswith("run.json: summary.mfu must be") for problem in run["problems"])
    assert "run.json: runtime.mfu_peak.source must be text, not 42" in run["problems"]


# -- the telemetry read: its tail only ------------------------------------------------------------------


class Unseekable(io.RawIOBase):
    """An object read by ranged requests, as ``storeclient`` reads a bucket's: it cannot seek."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data, self.position = data, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self.data[self.position : self.position + len(buffer)]
        buffer[: len(chunk)] = chunk
        self.position += len(chunk)
        return len(chunk)


class OneFile:
    """A run's files holding only telemetry.jsonl, opened seekable or not."""

    def __init__(self, data: bytes, seekable: bool) -> None:
        self.data, self.seekable = data, seekable

    def open(self, name: str):
        assert name == "telemetry.jsonl"
        return io.BufferedReader(Unseekable(self.data)) if not self.seekable else io.BytesIO(self.data)


@pytest.mark.parametrize("seekable", [True, False])
def test_a_long_runs_telemetry_is_judged_from_its_tail_alone(seekable):
    busy = dumps(Telemetry(chips=[{"chip": 0, "duty_cycle_pct": 97.0}], host={}), 1_700_000_000.0)
    idle = [
        dumps(Telemetry(chips=[{"chip": 0, "duty_cycle_pct": 8.0}], host={}), 1_800_000_000.0 + second)
        for second in range(40)
    ]
    days = (busy + "\n") * (4 * TELEMETRY_TAIL_BYTES // len(busy))  # what a long run's file begins with
    files = OneFile((days + "\n".join(idle) + "\n").encode(), seekable)

    samples = recent_samples(files)  # type: ignore[arg-type]
    hint = duty_hint(files)  # type: ignore[arg-type]

    assert len(samples) <= TELEMETRY_TAIL_BYTES // len(busy) + 1  # the tail read, not the whole file
    assert samples[-1][0] == 1_800_000_039.0
    assert hint.value is True and "busy 8% of the last 30 s" in hint.source
