"""``python -m tpudash.engine --framework jax`` in an environment without TensorFlow: the engine on JAX.

A real engine process: it takes the host's engine lock, says hello on JAX,
describes the 8 CPU devices XLA splits the CPU into (one row per
``jax.devices()`` entry), answers describe again, and leaves when released,
dropping the lock. Every wait is bounded.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

from tpudash.childproc import decode_line, encode_line
from tpudash.engine.hostlock import EngineLock
from tpudash.engine.protocol import REPLIES, Describe, Hello, Release, RuntimeReady, decode, encode

PROJECT = Path(__file__).resolve().parents[2]
WAIT_SECONDS = 60.0


class EngineOnJax:
    """The engine as a child of this test: commands in on stdin, replies read on a thread."""

    def __init__(self, *flags: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tpudash.engine", *flags],
            cwd=PROJECT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, TPUDASH_NATIVE_STDERR="terminal"),
        )
        self.replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            payload = decode_line(line)
            if payload is not None:
                self.replies.put(decode(payload, REPLIES))

    def send(self, command) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(encode_line(encode(command)))
        self.process.stdin.flush()

    def next(self, kind):
        while True:
            reply = self.replies.get(timeout=WAIT_SECONDS)
            if isinstance(reply, kind):
                return reply


def test_the_engine_on_jax_describes_eight_cpu_devices_and_releases_the_host(tmp_path):
    lock_path = Path(os.environ["TPUDASH_ENGINE_LOCK"])
    engine = EngineOnJax("--framework", "jax", "--tpu", "none")
    try:
        hello = engine.next(Hello)
        assert hello.framework == "jax" and hello.pid == engine.process.pid
        description = engine.next(RuntimeReady).description
        assert description["framework"] == "jax" and description["jax_version"]
        assert (description["kind"], description["strategy"], description["num_replicas"]) == ("CPU", "Mesh", 8)
        assert [device["name"] for device in description["devices"]] == [f"CPU:{index}" for index in range(8)]
        assert {device["platform"] for device in description["devices"]} == {"cpu"}
        assert description["reasons"]["TPU"] == "--tpu none given: the TPU is left alone"
        holder = EngineLock(lock_path).acquire(None)
        assert holder is not None and holder.engine_pid == engine.process.pid  # the engine holds the host's lock

        engine.send(Describe())
        assert engine.next(RuntimeReady).description["devices"] == description["devices"]
        engine.send(Release())
        assert engine.process.wait(WAIT_SECONDS) == 0
    finally:
        if engine.process.poll() is None:
            engine.process.kill()
        engine.process.wait(WAIT_SECONDS)
    lock = EngineLock(lock_path)
    assert lock.acquire(None) is None  # released: the next engine takes it
    lock.release()
    assert "tensorflow" not in sys.modules


def test_tpudash_devices_on_jax_lists_each_jax_device_with_its_platform_and_kind():
    import json

    shown = subprocess.run(
        [sys.executable, "-m", "tpudash", "devices", "--framework", "jax", "--json"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=WAIT_SECONDS,
        env=dict(os.environ, TPUDASH_NATIVE_STDERR="terminal"),
    )
    assert shown.returncode == 0, shown.stderr
    description = json.loads(shown.stdout)
    assert (description["framework"], description["kind"], description["num_replicas"]) == ("jax", "CPU", 8)
    assert [
        (device["name"], device["platform"], device["device_kind"], device["process_index"])
        for device in description["devices"]
    ] == [(f"CPU:{index}", "cpu", "cpu", 0) for index in range(8)]
    assert description["host_check"]["jax_found"] and not description["host_check"]["tensorflow_found"]
