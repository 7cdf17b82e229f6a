"""The 64 simulated agents of bench_hosts, and the GCS emulator they write into, in a process of their own.

Real agents run on other hosts, and a real bucket is Google's machines: none
of their work is the dashboard's. So ``bench_hosts`` starts this module as a
child (``python -m tests.benchmarks.hosts_agents_process --hosts 64``), and
the dashboard's process only reads the store. This process:

1. starts the loopback GCS emulator (``tests.object_stores.GcsEmulator``, in
   memory, one request at a time) and makes a bucket;
2. writes every host once (so all of them report before anything is
   measured), then prints one JSON line on stdout: ``{"store": "gs://…",
   "environment": {…}, "client_config": {…}}``, what a reader needs;
3. runs the agents: each replaces its ``hosts/<name>/host.json``
   (``tpudash.runs.hosts.host_record``, 4 TPU chips) and adds a sample
   segment (``samples/bench-<seq>.jsonl``) every ``--interval`` seconds, at
   its own phase (the writes are spread evenly over the interval);
4. stops when its stdin closes (the parent exits or closes the pipe), and
   prints ``{"writes": N}`` as its last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time

HOSTS = 64
CHIPS_PER_HOST = 4
GIB = 1024**3


class SimulatedAgents:
    """``count`` agents writing host.json and a sample segment each, every interval, at their own phases."""

    def __init__(self, runs_dir: str, count: int, interval: float):
        from tpudash.runs.backends import runs_root

        self.root = runs_root(runs_dir)
        self.count, self.interval = count, interval
        self.stop = threading.Event()
        self.writes = 0
        self.thread = threading.Thread(target=self._run, name="bench simulated agents", daemon=True)

    def write_all(self) -> None:
        """Every host once: all of them report before the first measurement."""
        for index in range(self.count):
            self.write(index, 0)

    def start(self) -> None:
        self.thread.start()

    def close(self, timeout: float) -> None:
        self.stop.set()
        self.thread.join(timeout)

    def write(self, index: int, tick: int) -> None:
        from tpudash.runs.hosts import ChipStatus, HostStatus, host_record

        name = f"tpu-vm-{index:02d}"
        duty = [float((index * 7 + tick * 13 + chip * 29) % 100) for chip in range(CHIPS_PER_HOST)]
        status = HostStatus(
            name=name,
            hostname=f"{name}.internal",
            heartbeat=time.time(),
            interval=self.interval,
            cpu_percent=float((index + tick) % 100),
            memory_used=int((40 + tick % 5) * GIB),
            memory_total=188 * GIB,
            chips=tuple(
                ChipStatus(chip, duty[chip], int((2 + duty[chip] / 10) * GIB), 16 * GIB)
                for chip in range(CHIPS_PER_HOST)
            ),
            runs=(),
            problem=None,
        )
        filesystem, prefix = self.root.filesystem, f"{self.root.root}/hosts/{name}"
        filesystem.pipe_file(f"{prefix}/host.json", host_record(status))
        sample = {"t": status.heartbeat, "cpu": status.cpu_percent, "duty": duty}
        filesystem.pipe_file(f"{prefix}/samples/bench-{tick:06d}.jsonl", (json.dumps(sample) + "\n").encode())
        self.writes += 1

    def _run(self) -> None:
        started, slot = time.monotonic(), 0
        spacing = self.interval / self.count
        while not self.stop.is_set():
            slot += 1
            # A write that falls behind (a slow emulator) is made at once; the schedule is not shifted.
            self.stop.wait(max(0.0, started + slot * spacing - time.monotonic()))
            if not self.stop.is_set():
                self.write(slot % self.count, slot // self.count)


def point_gcsfs_at(server) -> None:
    """This process's gcsfs talks to ``server`` (as bench_bucket.gcs_emulator does, for good: the process is ours)."""
    import os

    import fsspec.config
    from fsspec.registry import _registry
    from gcsfs.core import GCSFileSystem

    from tests.object_stores import clear_filesystem_caches

    os.environ.update(server.environment())
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="tpudash-bench-hosts-agents-cache-")
    fsspec.config.conf["gs"] = server.client_config()
    for protocol in ("gs", "gcs"):  # the plain class, never gcsfs's gRPC-probing one
        _registry[protocol] = GCSFileSystem
    clear_filesystem_caches()


def main(argv: list[str] | None = None) -> int:
    from tpudash.runs.hosts import HOST_INTERVAL_SECONDS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=HOSTS, help="how many agents (default %(default)s)")
    parser.add_argument("--interval", type=float, default=HOST_INTERVAL_SECONDS, help="seconds between writes")
    args = parser.parse_args(argv)
    if args.hosts < 1:
        parser.error(f"--hosts must be at least 1, not {args.hosts}")
    if args.interval <= 0:
        parser.error(f"--interval must be a positive number of seconds, not {args.interval}")

    from tests.object_stores import GcsEmulator

    with GcsEmulator() as server:
        point_gcsfs_at(server)
        bucket = server.new_bucket_name("bench-hosts")
        server.make_bucket(bucket)
        store = f"gs://{bucket}/runs"
        agents = SimulatedAgents(store, args.hosts, args.interval)
        agents.write_all()
        agents.start()
        print(
            json.dumps({"store": store, "environment": server.environment(), "client_config": server.client_config()}),
            flush=True,
        )
        sys.stdin.read()  # until the parent closes the pipe (or exits)
        agents.close(timeout=30.0)
        print(json.dumps({"writes": agents.writes}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
