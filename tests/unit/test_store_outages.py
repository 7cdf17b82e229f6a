"""A store that stops answering, as this process sees it (``tpudash.runs.storeclient``), and what says so.

Issue 38: with the bucket stopped mid-run the screens froze without a word ("store unreachable
since …" was only in the session log), gcsfs's retries and tracebacks reached the terminal, and
``tpudash watch`` of another host's run sampled this host into it, naming a local pid as its writer.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from datetime import datetime

import pytest

from jobs.events import Metric, RunFinished, RunStarted
from tpudash.cli import main as cli
from tpudash.runs.layout import new_run_id
from tpudash.runs.store import RunStore

pytest_plugins = ["tests.object_stores"]  # gcs_store: a loopback GCS emulator

# (tpudash.runs.storeclient and librarylogs are imported in the tests that use them: the last test here
# runs on code older than them.)

DEADLINE_SECONDS = 20.0


def test_a_store_is_unreachable_from_the_call_that_got_no_answer_until_one_is_answered(gcs_store):
    from tpudash.runs.storeclient import outage

    url = gcs_store.url("tpudash/runs")
    store = RunStore(url)
    assert store.list_runs() == [] and outage(url) is None
    gcs_store.stop()
    before = time.time()
    with pytest.raises(Exception, match="Cannot connect to host"):
        store.list_runs()
    away = outage(f"{url}/20261128-003845-train-4be1c0")  # a run's URL: the same store
    assert away is not None and before <= away.since <= time.time()
    assert away.reason.startswith("connection refused by 127.0.0.1:")
    assert away.line() == f"store unreachable since {datetime.fromtimestamp(away.since):%H:%M:%S}"
    assert outage() == away  # this process's stores: the one a dashboard reads

    gcs_store.start()
    assert store.list_runs() == []
    assert outage(url) is None and outage() is None


def test_a_writer_in_this_process_says_how_many_events_it_holds_while_its_store_is_away(gcs_store, tmp_path):
    from tpudash.runs.storeclient import outage

    url = gcs_store.url("tpudash/runs")
    store = RunStore(url, spill_root=tmp_path / "unsent")
    run_id = new_run_id("fit")
    recorder = store.create(run_id, "fit", {}, {})
    recorder.record(RunStarted(run_id, "fit", {}, {}, time.time()))
    assert recorder.wait_uploaded(DEADLINE_SECONDS)
    gcs_store.stop()
    for step in range(446):
        recorder.record(Metric("loss", 1.0 / (step + 1), step))
    recorder.flush()
    assert recorder.events.wait_for_outage(DEADLINE_SECONDS), "the writer never counted the store as away"

    away = outage(url)
    assert away is not None and away.held == recorder.events.pending >= 446
    assert away.line().endswith(f" · {away.held} events held locally")

    gcs_store.start()
    assert recorder.wait_uploaded(DEADLINE_SECONDS)
    recorder.close()
    assert outage(url) is None


class FollowerWithAStore:
    """What ``StoreAway`` asks of a ``RunFollower``: its store's outage now."""

    def __init__(self) -> None:
        self.away = None

    def store_outage(self):
        return self.away


def test_watch_says_when_the_store_stopped_and_came_back_and_its_clock_stands_still_meanwhile():
    from tpudash.runs.follow import StoreAway
    from tpudash.runs.storeclient import Outage

    follower = FollowerWithAStore()
    clock, wall = [100.0], [1_800_000_000.0]
    away = StoreAway(follower, clock=lambda: clock[0], wall=lambda: wall[0])
    assert away.update() is None and away.time() == 100.0

    reason = "no answer within 8 s (--store-timeout); last error: connection refused by 127.0.0.1:4443"
    follower.away = Outage("gs://b", since=wall[0] - 8, reason=reason, held=446)
    clock[0] += 10
    wall[0] += 10
    since = datetime.fromtimestamp(follower.away.since).strftime("%H:%M:%S")
    assert away.update() == (
        f"store unreachable since {since} · 446 events held locally (connection refused by 127.0.0.1:4443): "
        "shown as of then; the run may have gone on"
    )
    assert away.time() == 92.0  # the moment the store stopped answering, on the bars' clock
    clock[0] += 30
    wall[0] += 30
    assert away.update() is None and away.time() == 92.0

    follower.away = None
    assert away.update() == "the store answers again after 48 s; reading what the run wrote meanwhile"
    assert away.time() == 140.0


def test_the_stores_clients_log_to_the_session_log_once_per_cause_never_to_the_terminal(tmp_path, monkeypatch, capsys):
    from tpudash.runs import librarylogs

    handler = librarylogs.route_library_logs()
    monkeypatch.setattr(handler, "_path", tmp_path / "session.log")
    monkeypatch.setattr(handler, "_seen", {})
    noise = "Could not determine bucket type for bucket name b{}: Your default credentials were not found."
    for bucket in range(2):  # twice per command, issue 38 said
        logging.getLogger("gcsfs").warning(noise.format(bucket))
    try:
        raise ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 4443)")
    except ConnectionRefusedError:
        logging.getLogger("gcsfs").exception("_request out of retries on exception: Cannot connect to host")
    logging.getLogger("google.auth._default").warning("No project ID could be determined.")

    assert capsys.readouterr().err == ""
    log = (tmp_path / "session.log").read_text()
    assert log.count("Could not determine bucket type") == 1
    assert log.count("_request out of retries") == 1 and "ConnectionRefusedError" in log
    assert "No project ID could be determined." in log


def test_a_retrying_clients_reason_is_what_a_timed_out_call_says():
    from tpudash.runs import librarylogs, storeclient

    began = time.monotonic()
    librarylogs.route_library_logs()
    logging.getLogger("gcsfs").debug(
        "_request retrying after exception: Cannot connect to host 127.0.0.1:4443 ssl:default "
        "[Connect call failed ('127.0.0.1', 4443)]"
    )
    assert storeclient.cause_since(began) == "connection refused by 127.0.0.1:4443"


@pytest.mark.parametrize(("host", "sampled"), [("another-host", False), (socket.gethostname(), True)])
def test_watch_samples_telemetry_into_a_run_of_its_own_host_only_and_names_no_local_pid_for_another(
    isolated_runs_dir, monkeypatch, host, sampled
):
    """Issue 38, 7: ``watch`` of another host's running run appended this host's telemetry to it,
    naming a local pid as its writer."""
    import tpudash.telemetry.recorder as recorder_module

    recorded: dict = {}
    sampling = threading.Event()

    class SpyTelemetry:
        def __init__(self, settings, processes, store=None):
            recorded["processes"] = dict(processes)
            self.run_dir = None

        def __enter__(self):
            recorded["run_dir"] = self.run_dir
            sampling.set()
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(recorder_module, "RecordingTelemetry", SpyTelemetry)
    monkeypatch.setattr(socket, "gethostname", lambda: "this-host" if host == "another-host" else host)
    store = RunStore(isolated_runs_dir)
    run_id = new_run_id("fit")
    writer = store.create(run_id, "fit", {}, {})
    writer.record(RunStarted(run_id, "fit", {}, {}, time.time()))
    writer.record(Metric("loss", 0.5, step=0))
    files = store.files(run_id)  # its record says which host it runs on
    record = json.loads(files.read("run.json", 1 << 20))
    files.write("run.json", json.dumps(dict(record, host=host)).encode())
    assert record["pid"] is not None

    watching: dict = {}
    watch = threading.Thread(target=lambda: watching.update(code=cli.main(["watch", run_id, "--json"])))
    watch.start()
    assert sampling.wait(DEADLINE_SECONDS), "watch never started sampling"
    writer.record(RunFinished("done", {}))
    watch.join(DEADLINE_SECONDS)
    assert watching == {"code": 0}
    assert (recorded["run_dir"] is not None) is sampled
    assert ("writer" in recorded["processes"]) is sampled


def test_a_client_slow_to_find_credentials_is_waited_for_within_the_store_timeout_and_no_longer(monkeypatch):
    """Off GCE without a network, gcsfs asks the metadata server for credentials for 15 s as it is made."""
    import fsspec.core

    from tpudash.runs import storeclient

    released = threading.Event()

    class Anonymous:
        def ls(self, path, **kwargs):
            return []

        def exists(self, path, **kwargs):
            return True

    def slow_to_make(url, **options):
        released.wait(DEADLINE_SECONDS)
        return Anonymous(), "slow/runs"

    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setattr(fsspec.core, "url_to_fs", slow_to_make)
    storeclient.set_store_timeout(1.0)
    store = RunStore("gs://slow/runs")  # made at once: the client is made on a thread
    began = time.monotonic()
    with pytest.raises(storeclient.NoAnswer, match=r"no answer within 1 s .*still looking for credentials"):
        store.list_runs()
    assert time.monotonic() - began < 3
    assert storeclient.outage("gs://slow/runs") is not None
    released.set()
    assert store.list_runs() == [] and storeclient.outage() is None
