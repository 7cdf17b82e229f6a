"""Runs in a store (memory://, the same code as gs:// and s3://): written without append, read back, faults.

The store here is fsspec's in-memory filesystem behind ``FlakyStore``, which
can refuse every call (the network is gone) or hold uploads (a store that
hangs) and counts what it is asked. The same paths against real clients
and loopback servers are tests/functional/test_bucket_runs.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import fsspec
import pytest

from jobs.events import Log, Metric, Progress, RunFinished, RunStarted, Telemetry
from tpudash.config import Settings, SettingsError, settings_environment
from tpudash.runs.backends import BucketRunFiles
from tpudash.runs.follow import RunFollower
from tpudash.runs.layout import new_run_id
from tpudash.runs.liveness import WRITERS_FOLDER
from tpudash.runs.location import parse_runs_dir
from tpudash.runs.segments import MAX_LIST_SECONDS, StreamTail
from tpudash.runs.store import RunStore
from tpudash.runs.uploader import StoreRecorder
from tpudash.telemetry.recorder import StoreRun, TelemetryRecorder

DEADLINE_SECONDS = 20.0


class FlakyStore:
    """fsspec's memory filesystem, which can be taken down (every call raises) or made to hold uploads."""

    def __init__(self) -> None:
        self.inner = fsspec.filesystem("memory")
        self.down = False
        self.uploads_open = threading.Event()
        self.uploads_open.set()
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str):
        method = getattr(self.inner, name)

        def call(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            if self.down:
                raise ConnectionError(f"{name}: the store is unreachable")
            if name == "pipe_file":
                self.uploads_open.wait(DEADLINE_SECONDS)
            return method(*args, **kwargs)

        return call


@pytest.fixture
def flaky():
    return FlakyStore()


@pytest.fixture
def bucket(flaky, tmp_path):
    """A RunStore on a fresh memory:// prefix, its calls going through ``flaky``."""
    store = RunStore(f"memory://bucket-{uuid.uuid4().hex[:8]}/runs", spill_root=tmp_path / "unsent")
    store.backend.filesystem = flaky
    return store


def follow_until(follower: RunFollower, condition, what: str) -> None:
    """Poll ``follower`` each time its reading thread has read something new, until ``condition`` holds."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    follower.poll()
    while not condition():
        assert follower.tail.news.wait(max(0.0, deadline - time.monotonic())), f"not within the deadline: {what}"
        follower.tail.news.clear()
        follower.poll()


def start_run(store: RunStore, **options) -> tuple[str, StoreRecorder]:
    run_id = new_run_id("train")
    recorder = store.create(run_id, "train", {"epochs": 2}, {"kind": "CPU"})
    assert isinstance(recorder, StoreRecorder)
    for name, value in options.items():
        setattr(recorder if name == "notify" else recorder.events, name, value)
    recorder.record(RunStarted(run_id, "train", {"epochs": 2}, {}, time.time()))
    return run_id, recorder


def losses(store: RunStore, run_id: str) -> list[int]:
    return [event.step for _, event in store.load(run_id).events if isinstance(event, Metric)]


def test_a_run_in_a_store_is_segments_a_heartbeat_and_a_record_and_reads_back_like_a_local_run(bucket):
    run_id, recorder = start_run(bucket)
    for step in range(300):
        recorder.record(Metric("loss", 1.0 / (step + 1), step))
    recorder.record(Progress(1, 1, "epoch"))
    recorder.record(RunFinished("done", {"steps": 300}))

    files = bucket.files(run_id)
    assert files.list("events") and all(name.startswith(recorder.writer) for name in files.list("events"))
    assert files.list(WRITERS_FOLDER) == [f"{recorder.writer}.json"]
    assert files.key("events.jsonl") is None  # nothing appended: a store has no append
    (info,) = bucket.list_runs()
    assert (info.run_id, info.status, info.live, info.final_metrics) == (run_id, "done", False, {"loss": 1 / 300})
    assert info.path == f"{bucket.where}/{run_id}"
    assert losses(bucket, run_id) == list(range(300))
    assert recorder.kept_locally is None and not recorder.run_dir.exists()  # the store took it all


def test_recording_never_waits_for_a_store_that_holds_every_upload(bucket, flaky):
    flaky.uploads_open.clear()  # every upload hangs until released
    run_id, recorder = start_run(bucket, seal_seconds=0.0)
    returned = threading.Event()

    def train() -> None:
        for step in range(2000):
            recorder.record(Metric("loss", 1.0, step))
        recorder.flush()
        returned.set()

    trainer = threading.Thread(target=train)
    trainer.start()
    # The training thread is done while the store still holds the first upload.
    assert returned.wait(DEADLINE_SECONDS), "record() waited for the store"
    assert not flaky.uploads_open.is_set() and recorder.events.pending > 0
    flaky.uploads_open.set()
    recorder.record(RunFinished("done", {}))
    assert losses(bucket, run_id) == list(range(2000))


def test_a_store_that_goes_away_and_comes_back_gets_every_event_once_and_the_log_says_so(bucket, flaky):
    said: list[str] = []
    run_id, recorder = start_run(bucket, seal_seconds=0.05, notify=said.append)
    recorder.record(Metric("loss", 1.0, 0))
    assert recorder.events.wait_uploaded(DEADLINE_SECONDS), "the first event never reached the store"
    flaky.down = True
    for step in range(1, 500):
        recorder.record(Metric("loss", 1.0, step))
    assert recorder.events.wait_for_outage(DEADLINE_SECONDS), "the outage was not noticed"
    assert list((recorder.run_dir / "events").glob("*.jsonl"))  # what the store did not take is on disk
    assert "store unreachable since" in said[0] and "pending" in said[0] and str(recorder.run_dir) in said[0]
    status = recorder.events.status_line()
    assert status is not None and "events pending" in status
    recorder.events._retry_delay = 0.05  # the test does not wait out a long backoff
    flaky.down = False
    assert recorder.events.wait_uploaded(DEADLINE_SECONDS), "the held events did not go up when the store came back"
    assert "the store answered again after" in said[-1]
    recorder.record(RunFinished("done", {}))
    assert losses(bucket, run_id) == list(range(500))  # every event, once, in order
    logs = [event.text for _, event in bucket.load(run_id).events if isinstance(event, Log)]
    assert any(text.startswith("store unreachable since") and "events pending" in text for text in logs)
    assert any(text.startswith("the store answered again after") for text in logs)
    assert not list(recorder.run_dir.glob("events/*.jsonl"))  # nothing left behind once uploaded


def test_a_wait_for_the_upload_returns_only_once_the_outages_end_is_said(bucket, flaky, monkeypatch):
    # The last held segment is up, and before the outage's end is said another thread wakes the waiter (new
    # events, a seal): the wait must not return in between, or "the store answered again" is not in the run yet.
    said: list[str] = []
    run_id, recorder = start_run(bucket, seal_seconds=0.05, notify=said.append)
    recorder.record(Metric("loss", 1.0, 0))
    assert recorder.events.wait_uploaded(DEADLINE_SECONDS)
    flaky.down = True
    recorder.record(Metric("loss", 1.0, 1))
    assert recorder.events.wait_for_outage(DEADLINE_SECONDS)
    writer = recorder.events
    waiter_returned = threading.Event()
    came_back = type(writer)._came_back

    def woken_before_said(self) -> None:
        with self._lock:
            self._changed.notify_all()  # a wake-up for another reason, before the end is said
        waiter_returned.wait(2.0)  # bounded: with the fix the waiter is still waiting, and this times out
        came_back(self)

    monkeypatch.setattr(type(writer), "_came_back", woken_before_said)
    writer._retry_delay = 0.05
    flaky.down = False
    assert writer.wait_uploaded(DEADLINE_SECONDS)
    waiter_returned.set()
    assert "the store answered again after" in said[-1]
    recorder.record(RunFinished("done", {}))


def test_a_finish_with_the_store_away_keeps_the_run_on_disk_and_says_in_one_line_how_to_upload_it(
    bucket, flaky, tmp_path
):
    said: list[str] = []
    run_id, recorder = start_run(bucket, notify=said.append)
    recorder.finish_wait = 0.3
    for step in range(50):
        recorder.record(Metric("loss", 1.0, step))
    flaky.down = True
    recorder.record(RunFinished("done", {}))  # returns within its bounded wait
    assert recorder.kept_locally == recorder.run_dir
    assert f"kept in {recorder.run_dir}" in said[-1] and "tpudash copy" in said[-1]
    # What was kept is a run any reader opens: the local directory reads it, complete.
    kept = RunStore(recorder.run_dir.parent)
    assert kept.info(run_id).status == "done" and losses(kept, run_id) == list(range(50))


def test_a_finish_against_a_store_that_hangs_returns_within_its_bound_with_the_run_kept_locally(bucket, flaky):
    said: list[str] = []
    run_id, recorder = start_run(bucket, notify=said.append)
    recorder.finish_wait = 0.3
    flaky.uploads_open.clear()  # the client is stuck inside one call (gcsfs retries for half a minute)
    for step in range(20):
        recorder.record(Metric("loss", 1.0, step))
    finished = threading.Event()
    threading.Thread(target=lambda: [recorder.record(RunFinished("done", {})), finished.set()]).start()
    assert finished.wait(DEADLINE_SECONDS / 2), "the finish waited for the store past its bound"
    assert recorder.kept_locally == recorder.run_dir and "tpudash copy" in said[-1]
    flaky.uploads_open.set()
    kept = RunStore(recorder.run_dir.parent)
    assert kept.info(run_id).status == "done" and losses(kept, run_id) == list(range(20))


def test_two_writers_on_one_run_id_never_overwrite_each_other(bucket):
    run_id = new_run_id("train")
    first = bucket.create(run_id, "train", {}, {})
    second = StoreRecorder(bucket.files(run_id), {"run_id": run_id, "job": "train"}, spill_root=bucket.spill_root)
    assert first.writer != second.writer
    for step in range(100):
        first.record(Metric("loss", 1.0, step))
        second.record(Metric("loss", 2.0, 1000 + step))
    second.close()
    first.record(RunFinished("done", {}))
    assert sorted(losses(bucket, run_id)) == list(range(100)) + list(range(1000, 1100))


def test_a_run_whose_writer_stopped_beating_is_stale_and_running_again_when_a_heartbeat_returns(bucket):
    run_id, recorder = start_run(bucket)
    recorder.record(Metric("loss", 1.0, 0))
    assert recorder.record_uploaded.wait(DEADLINE_SECONDS)  # after the first heartbeat
    assert bucket.info(run_id).live
    recorder.close()  # the writer stops without a finish, as a killed process does
    heartbeat = f"{WRITERS_FOLDER}/{recorder.writer}.json"
    old = b'{"heartbeat": %f, "interval": 5.0}' % (time.time() - 60)
    bucket.files(run_id).write(heartbeat, old)
    info = bucket.info(run_id)
    assert (info.status, info.live) == ("stale", False)
    assert info.final_metrics == {"loss": 1.0}  # its last metrics, though it had no epoch
    assert losses(bucket, run_id) == [0]  # what it wrote stays readable
    recorder.beat()  # the writer was only cut off: its next heartbeat makes it live again
    assert bucket.info(run_id).live


def test_telemetry_of_a_run_in_a_store_goes_up_as_segments_of_its_own_and_reads_back_with_the_run(bucket):
    run_id, recorder = start_run(bucket)
    telemetry = TelemetryRecorder()
    for second in range(5):
        telemetry.record(
            1000.0 + second, Telemetry(chips=[], host={"cpu_pct": [float(second)]}), [StoreRun(bucket, run_id)]
        )
    telemetry.close()  # the run is no longer live: its last segment goes up
    recorder.record(RunFinished("done", {}))
    assert bucket.files(run_id).list("telemetry")  # segments, beside the events' own
    samples = bucket.load(run_id).telemetry
    assert [sample.host["cpu_pct"] for _, sample in samples] == [[0.0], [1.0], [2.0], [3.0], [4.0]]


def test_following_a_quiet_run_lists_its_segments_ever_less_often(bucket):
    run_id, recorder = start_run(bucket)
    now = [0.0]
    tail = StreamTail(bucket.files(run_id), appends=False, clock=lambda: now[0])
    listings_at = []
    for tick in range(600):  # a minute of polls, ten a second, and nothing new
        now[0] = tick / 10
        before = tail.listings
        tail.read_new()
        if tail.listings > before:
            listings_at.append(now[0])
    gaps = [later - earlier for earlier, later in zip(listings_at, listings_at[1:], strict=False)]
    assert gaps == sorted(gaps) and max(gaps) == pytest.approx(MAX_LIST_SECONDS, abs=0.11)
    assert len(listings_at) <= 12  # 60 at once a second
    recorder.close()


def test_following_a_live_run_in_a_store_sees_new_events_and_its_end(bucket):
    run_id, recorder = start_run(bucket, seal_seconds=0.05)
    assert recorder.record_uploaded.wait(DEADLINE_SECONDS)
    follower = RunFollower(bucket, run_id)
    for step in range(20):
        recorder.record(Metric("loss", 1.0, step))
    follow_until(follower, lambda: follower.model.final_metrics, "the first points")
    recorder.record(RunFinished("done", {}))
    follow_until(follower, lambda: follower.ended, "the run's end")
    assert follower.model.status == "done"


def test_history_reads_an_ended_runs_record_once(bucket, flaky):
    for _ in range(30):
        run_id, recorder = start_run(bucket)
        recorder.record(RunFinished("done", {}))
    flaky.calls.clear()
    assert [info.status for info in bucket.list_runs()] == ["done"] * 30
    first = dict(flaky.calls)
    assert first.get("cat", 0) == 1 and "cat_file" not in first  # one concurrent batch for thirty records
    flaky.calls.clear()
    assert len(bucket.list_runs()) == 30
    assert set(flaky.calls) == {"ls"}  # then one listing, and no record read again


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gs://bucket/runs/", "gs://bucket/runs"),
        ("s3://bucket", "s3://bucket"),
        ("memory://scratch/runs", "memory://scratch/runs"),
        ("file:///data/runs", Path("/data/runs")),
        ("/data/runs", Path("/data/runs")),
    ],
)
def test_a_runs_directory_is_a_path_or_a_store_url(text, expected):
    assert parse_runs_dir(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("ftp://host/runs", "the scheme 'ftp://' is not supported"),
        ("gcs://bucket/a/b", "the scheme 'gcs://' is not supported (did you mean gs://bucket/a/b?)"),
        ("gs:///runs", "names no bucket"),
        ("s3://bucket/../other", "'..' are not allowed"),
        ("gs://bucket/runs?x=1", "no '?' or '#'"),
        ("file://otherhost/runs", "this host's files"),
    ],
)
def test_a_bad_runs_directory_url_names_the_setting_and_what_is_allowed(text, reason):
    with pytest.raises(SettingsError) as raised:
        Settings.load({"runs_dir": text}, environ={})
    message = str(raised.value)
    assert message.startswith("--runs-dir: ") and reason in message and "gs://BUCKET/PATH" in message


def test_a_store_url_reaches_the_engine_and_the_served_dashboards_as_it_was_given():
    """The engine and ``tpudash serve``'s dashboards are children loading Settings from the environment."""
    settings = Settings.load({"runs_dir": "gs://bucket/tpudash/runs/"}, environ={})
    environment = settings_environment(settings, {})
    assert environment["TPUDASH_RUNS_DIR"] == "gs://bucket/tpudash/runs"
    assert Settings.load({}, environ=environment).runs_dir == "gs://bucket/tpudash/runs"


def test_a_store_url_whose_library_is_missing_says_the_one_line_that_installs_it(monkeypatch):
    import tpudash.runs.location as location

    real = location.importlib.util.find_spec
    monkeypatch.setattr(location.importlib.util, "find_spec", lambda name: None if name == "gcsfs" else real(name))
    settings = Settings.load({"runs_dir": "gs://bucket/runs"}, environ={})
    with pytest.raises(SettingsError, match=r"pip install 'tpudash\[gcs\]'"):
        settings.check_runs_dir()


def test_bucket_files_refuse_a_record_larger_than_the_cap(bucket):
    run_id, recorder = start_run(bucket)
    recorder.record(RunFinished("done", {}))
    files = bucket.files(run_id)
    assert isinstance(files, BucketRunFiles)
    files.write("run.json", b" " * (2 << 20))
    bucket._ended.clear()
    info = bucket.info(run_id)
    assert any("larger than 1 MiB" in problem for problem in info.problems)
