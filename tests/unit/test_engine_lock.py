"""At most one engine per host holds the accelerator (``tpudash.engine.hostlock``).

The first engine takes the lock and keeps it; a second engine, whatever
dashboard started it, says who holds it and exits before importing
TensorFlow; once the first is gone the next engine gets it. Every test has
its own lock file (``TPUDASH_ENGINE_LOCK``, tests/conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_engine import PATH, FakeRuntime, Messages
from tpudash.engine.handle import EngineExit, EngineProcess
from tpudash.engine.hostlock import LOCK_VARIABLE, EngineLock, LockHolder, engine_lock_path
from tpudash.engine.inthread import EngineThread
from tpudash.engine.protocol import AcceleratorHeld, Hello, JobFinished, JobStarted, Launch, RuntimeReady

HOLDER_SCRIPT = """
import sys
from tpudash.engine.hostlock import EngineLock
lock = EngineLock()
print("held" if lock.acquire(dashboard_pid=4242) is None else "not held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def messages():
    return Messages()


@pytest.fixture
def lock_path() -> Path:
    return Path(os.environ[LOCK_VARIABLE])


@pytest.fixture
def other_dashboards_engine():
    """A process of another dashboard holding the lock until the test ends (or ``.stdin`` is closed)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    yield holder
    if not holder.stdin.closed:
        holder.stdin.close()
    holder.wait(30)


def test_the_lock_path_is_the_variables_else_the_users_runtime_dir_else_a_temporary_dir_of_the_user(tmp_path):
    assert engine_lock_path({LOCK_VARIABLE: str(tmp_path / "x.lock")}) == tmp_path / "x.lock"
    assert engine_lock_path({"XDG_RUNTIME_DIR": str(tmp_path)}) == tmp_path / "tpudash" / "engine.lock"
    assert engine_lock_path({}).parent.name == f"tpudash-{os.getuid()}"


def test_one_lock_holder_at_a_time_and_the_second_learns_who(lock_path):
    first, second = EngineLock(lock_path), EngineLock(lock_path)
    assert first.acquire(dashboard_pid=77) is None
    holder = second.acquire(dashboard_pid=78)
    assert holder is not None and holder.engine_pid == os.getpid() and holder.dashboard_pid == 77
    assert holder.describe().startswith(f"tpudash engine pid {os.getpid()} (dashboard pid 77, user ")
    first.release()
    assert second.acquire(dashboard_pid=78) is None
    second.release()


def test_a_symlink_or_a_fifo_for_a_lock_file_is_refused(tmp_path):
    (tmp_path / "target").write_text("")
    (tmp_path / "link.lock").symlink_to(tmp_path / "target")
    os.mkfifo(tmp_path / "fifo.lock")
    for name in ("link.lock", "fifo.lock"):
        with pytest.raises(OSError):
            EngineLock(tmp_path / name).acquire(None)


@given(st.text(max_size=300) | st.binary(max_size=300).map(lambda data: data.decode("latin-1")))
def test_whatever_a_lock_file_holds_its_holder_is_described_without_an_error(text):
    assert LockHolder.from_text(text).describe()


def test_an_engine_that_finds_the_accelerator_held_names_the_holder_and_serves_nothing(
    messages, settings, other_dashboards_engine
):
    engine = EngineThread(messages, settings, {"path": PATH}, FakeRuntime)
    held = messages.next(AcceleratorHeld)
    assert held.holder.startswith(f"tpudash engine pid {other_dashboards_engine.pid} (dashboard pid 4242, user ")
    assert isinstance(messages.next(EngineExit), EngineExit)
    assert not engine.alive and not engine.send(Launch("r1", "path", {}))


def test_the_engine_process_says_held_and_exits_before_tensorflow_and_the_next_gets_the_lock_once_it_is_free(
    messages, settings, tmp_path, other_dashboards_engine
):
    process = EngineProcess(messages, settings, tmp_path / "engine.log")
    assert messages.next(Hello).pid == process.pid
    held = messages.next(AcceleratorHeld)
    exited = messages.next(EngineExit)
    assert held.holder.startswith(f"tpudash engine pid {other_dashboards_engine.pid} (dashboard pid 4242")
    assert held.lock_path == os.environ[LOCK_VARIABLE]
    assert exited.returncode == 0 and not process.alive
    assert messages.queue.empty()  # no runtime detected nor failed: it left before TensorFlow

    other_dashboards_engine.stdin.close()
    other_dashboards_engine.wait(30)
    engine = EngineThread(messages, settings, {"path": PATH}, FakeRuntime)
    try:
        messages.next(RuntimeReady)
        engine.send(Launch("20261125-000000-path-abcdef", "path", {}))
        messages.next(JobStarted)
        assert messages.next(JobFinished).status == "done"
    finally:
        engine.release()
