"""Side-by-side measurement: alternate A and B, take medians, report ratios against targets.

These machines are noisy (two cores, shared), so every benchmark measures its
figure and its baseline in the same run, interleaved A B A B, and compares
medians. A result row says what was measured, the baseline, the ratio and the
target, and whether the target was met.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table


@dataclass
class Result:
    """One line of the report."""

    benchmark: str
    figure: str
    value: float
    unit: str
    baseline_name: str = ""
    baseline: float | None = None
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    samples: dict = field(default_factory=dict)
    notes: str = ""


def alternate(
    measure_a: Callable[[], float], measure_b: Callable[[], float], repeats: int
) -> tuple[list[float], list[float]]:
    """A B A B …: drift and background load hit both sides alike."""
    a_samples, b_samples = [], []
    for _ in range(repeats):
        a_samples.append(measure_a())
        b_samples.append(measure_b())
    return a_samples, b_samples


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


class Stopwatch:
    """``with Stopwatch() as watch: …`` then ``watch.seconds``."""

    def __enter__(self):
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._start


class LoadMonitor:
    """``with LoadMonitor() as load: …`` then ``load.external_cores``: CPU other processes used meanwhile.

    From /proc/stat (every process's busy time) minus this process's own
    time and its waited-for children's (os.times), over the wall time: the
    average number of cores something else kept busy. On a shared
    two-core machine that is what makes two runs of the same thing differ.
    """

    def __enter__(self):
        self._start = (time.perf_counter(), _busy_cpu_seconds(), _own_cpu_seconds())
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self._start[0]
        busy = _busy_cpu_seconds() - self._start[1]
        own = _own_cpu_seconds() - self._start[2]
        self.wall_seconds = wall
        self.own_cores = own / wall if wall > 0 else 0.0
        self.external_cores = max(0.0, busy - own) / wall if wall > 0 else 0.0


def _busy_cpu_seconds() -> float:
    import os

    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    import os

    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used so far, from /proc; None once it is gone.

    For a process that is not this one's waited-for child (the dashboard's
    engine): ``os.times`` does not see it until it has been reaped.
    """
    import os

    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The command name may hold spaces and parentheses: fields start after the last ')'.
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for_engine_exit(engine, timeout: float = 60.0) -> bool:
    """Block until a dashboard's engine process (``tpudash.engine.handle.EngineProcess``) has exited; False on timeout.

    After an app under Pilot has closed, its engine records its job's end and
    exits on its own; the next measurement must not share the cores with it.
    An engine still there after ``timeout`` is killed (and False returned).
    """
    import subprocess

    process = getattr(engine, "_process", None)
    if process is None:
        return True
    try:
        process.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return False


def machine() -> dict:
    import os

    info = {"python": platform.python_version(), "cores": os.cpu_count(), "platform": platform.platform()}
    from tpudash.accel.hostcheck import installed_distributions

    # The TensorFlow build (tensorflow or tensorflow-tpu) and its libtpu, if any.
    info["tensorflow"] = ", ".join(f"{name} {version}" for name, version in installed_distributions().items())
    try:
        from importlib.metadata import version

        for package in ("keras", "textual", "textual-plotext", "plotext"):
            info[package] = version(package)
    except Exception:  # noqa: BLE001 - informative only
        pass
    return info


def report(results: list[Result], json_path: Path | None, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title="tpudash benchmarks", title_justify="left")
    for column in ("benchmark", "figure", "value", "baseline", "ratio", "target", "met"):
        table.add_column(column)
    for result in results:
        baseline = "-" if result.baseline is None else f"{result.baseline:.4g} ({result.baseline_name})"
        ratio = "-" if result.ratio is None else f"{result.ratio:.3f}"
        met = {True: "[green]yes[/]", False: "[red]no[/]", None: "-"}[result.met]
        table.add_row(
            result.benchmark, result.figure, f"{result.value:.4g} {result.unit}", baseline, ratio, result.target, met
        )
    console.print(table)
    # The per-key and per-step figures behind a row, which the table has no room for.
    for result in results:
        if result.notes:
            console.print(
                f"[bold]{result.benchmark}[/] · {result.figure}: {result.notes}", highlight=False, markup=True
            )
    if json_path is not None:
        payload = {
            "machine": machine(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "results": [asdict(result) for result in results],
        }
        json_path.write_text(json.dumps(payload, indent=2))
        console.print(f"written to {json_path}")
