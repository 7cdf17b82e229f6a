"""The loopback object stores of tests/object_stores.py, as a test that uses them sees them.

Each store is written and read with fsspec (gcsfs for gs://, s3fs for s3://);
a stopped store makes a write fail at once instead of after the clients'
minute of retries; a restarted store is back on the same port with the same
objects; a child process reaches the store through ``environment()`` alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytest_plugins = ["tests.object_stores"]

# A call against a stopped store must fail within this (with the clients' own
# retry settings it takes over 30 s under gcsfs, about 8 s under s3fs).
FAILS_WITHIN_S = 2.0


def connection_errors(scheme: str) -> tuple[type[BaseException], ...]:
    """What a call against a stopped store raises: aiohttp's (an OSError) under gcsfs, botocore's under s3fs."""
    if scheme == "gs":
        import aiohttp

        return (aiohttp.ClientConnectorError,)
    import botocore.exceptions

    return (botocore.exceptions.EndpointConnectionError,)


@pytest.fixture(params=["gcs_store", "s3_store"])
def store(request):
    return request.getfixturevalue(request.param)


def test_an_object_written_is_listed_under_its_run_and_read_back(store):
    fs = store.filesystem()
    assert fs.ls(store.root, refresh=True) == []  # a fresh bucket: no other test's objects

    fs.pipe(store.url("runs/r1/events.jsonl"), b'{"step": 1}\n')
    fs.pipe(store.url("runs/r2/events.jsonl"), b'{"step": 2}\n')

    runs = fs.ls(store.url("runs"), detail=True, refresh=True)
    assert [(entry["name"], entry["type"]) for entry in runs] == [
        (f"{store.bucket}/runs/r1", "directory"),
        (f"{store.bucket}/runs/r2", "directory"),
    ]
    [event_file] = fs.ls(store.url("runs/r1"), detail=True, refresh=True)
    assert event_file["name"] == f"{store.bucket}/runs/r1/events.jsonl"
    assert event_file["type"] == "file" and event_file["size"] == 12
    assert fs.cat(store.url("runs/r1/events.jsonl")) == b'{"step": 1}\n'
    with fs.open(store.url("runs/r1/events.jsonl"), "rb") as f:  # a ranged read
        f.seek(2)
        assert f.read(4) == b"step"


def test_a_write_to_a_stopped_store_fails_fast_and_a_restart_brings_back_the_data(store):
    fs = store.filesystem()
    fs.pipe(store.url("runs/r1/events.jsonl"), b"before\n")
    endpoint = store.server.endpoint

    store.stop()
    started = time.perf_counter()
    with pytest.raises(connection_errors(store.server.scheme)):
        fs.pipe(store.url("runs/r1/more.jsonl"), b"during\n")
    assert time.perf_counter() - started < FAILS_WITHIN_S
    with pytest.raises(connection_errors(store.server.scheme)):
        fs.cat_file(store.url("runs/r1/events.jsonl"))
    with pytest.raises(connection_errors(store.server.scheme)):
        fs.ls(store.url("runs"), refresh=True)

    store.restart()
    assert store.server.endpoint == endpoint
    assert fs.cat(store.url("runs/r1/events.jsonl")) == b"before\n"
    assert fs.ls(store.url("runs/r1"), detail=False, refresh=True) == [f"{store.bucket}/runs/r1/events.jsonl"]


def test_many_small_objects_go_in_and_out_in_one_call_each(store):
    fs = store.filesystem()
    objects = {store.url(f"runs/r{i % 4}/part{i:03d}"): f"{i}\n".encode() for i in range(40)}
    fs.pipe(objects)
    read = fs.cat(list(objects) + [store.url("runs/missing")], on_error="return")
    assert isinstance(read.pop(f"{store.bucket}/runs/missing"), FileNotFoundError)
    assert read == {fs._strip_protocol(url): data for url, data in objects.items()}


def test_a_child_process_reaches_the_store_through_its_environment(store):
    url = store.url("runs/child/events.jsonl")
    write = "import sys, fsspec; fs, path = fsspec.url_to_fs(sys.argv[1]); fs.pipe(path, b'from child')"
    child = subprocess.run(
        [sys.executable, "-c", write, url],
        env={**os.environ, **store.environment()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    assert store.filesystem().cat(url) == b"from child"


@pytest.mark.parametrize("emulator_class", ["GcsEmulator", "S3Emulator"])
def test_an_emulator_starts_and_restarts_on_its_port_in_well_under_a_second(emulator_class):
    from tests import object_stores  # imported by pytest_plugins, for its assertions to be rewritten

    emulator = getattr(object_stores, emulator_class)()
    started = time.perf_counter()
    emulator.start()
    try:
        assert time.perf_counter() - started < 0.5
        bucket = emulator.new_bucket_name()
        emulator.make_bucket(bucket)
        assert emulator.url(f"{bucket}/runs") == f"{emulator.scheme}://{bucket}/runs"
        port = emulator.port
        started = time.perf_counter()
        emulator.restart()
        assert time.perf_counter() - started < 0.5
        assert emulator.port == port and emulator.running
    finally:
        emulator.stop()
    assert not emulator.running
