"""What the CLI and the dashboard both print, written one way: durations, device names, values, statuses, telemetry.

Textual-free, so the run model, the lane, every screen and the headless
commands share it without importing the app; of tpudash it imports only the
leaf ``tpudash.telemetry_summary``. Statuses and telemetry are rich
renderables (``Text``, tables) because the dashboard needs them as they are:
Textual draws rich's objects, so the Devices screen and ``tpudash
telemetry``, History and ``tpudash runs`` show the very same ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.table import Table as RichTable
from rich.text import Text

from tpudash.telemetry_summary import summarize

if TYPE_CHECKING:
    from collections.abc import Callable

    from jobs.events import Table, Telemetry
    from tpudash.runs.workers import WorkerStatus

# What a running job changes (clocks, progress bars, log, live plots) is
# redrawn when the clock enters a new second, so all of it lands in one frame
# instead of each change costing its own: during training every frame is CPU
# the training step could have had. (nvitop refreshes every 2 s.)
DISPLAY_BEAT_SECONDS = 1.0

# Each status's glyph and colour, the one table for the CLI and the dashboard
# (the run view, History). "live": still being written by a process on this host.
STATUS_GLYPHS = {
    "queued": ("◌", "dim"),
    "running": ("▶", "bold cyan"),
    "live": ("●", "bold yellow"),
    "done": ("✓", "bold green"),
    "failed": ("✗", "bold red"),
    "cancelled": ("■", "bold magenta"),
    "interrupted": ("!", "bold bright_blue"),
    # A run in a store whose writer stopped beating: dead, or cut off from the store.
    "stale": ("…", "bold bright_black"),
}
UNKNOWN_STATUS_GLYPH = ("?", "")

SPARK_LEVELS = "▁▂▃▄▅▆▇█"
# Sized so a telemetry table fits an 80-column terminal.
METER_WIDTH = 10
SPARK_WIDTH = 16


def display_beat() -> int:
    """Which second of the monotonic clock it is (see ``DISPLAY_BEAT_SECONDS``)."""
    return int(time.monotonic() / DISPLAY_BEAT_SECONDS)


def format_timestamp(stamp: object, pattern: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A unix time in local time by ``pattern``; ``?`` for anything that is not a time between 1970 and 9999.

    Times come from files any process may have written (run.json, events):
    ``time.localtime`` raises on 1e300 or infinity, so nothing else formats them.
    """
    from jobs.events import is_sane_timestamp  # the event protocol (msgspec): after the dashboard's first frame

    if not is_sane_timestamp(stamp):
        return "?"
    try:
        return time.strftime(pattern, time.localtime(float(stamp)))  # type: ignore[arg-type]
    except (OverflowError, OSError, ValueError):  # a platform narrower than the checked range
        return "?"


def format_seconds(seconds: float | None, precise: bool = True) -> str:
    """``1.7s`` (when ``precise``, under 10 s), ``00:07``, ``03:25``, ``1:02:03``.

    Every duration a user reads (a run's in the run view, History and
    ``tpudash runs``; a clock) goes through here, rounded to the nearest unit
    shown (half up), so 19.998 s and 20.003 s both read ``00:20``. A running
    clock is shown to the second: a text that changes ten times a second
    would repaint the screen ten times a second.
    """
    if seconds is None or not math.isfinite(seconds):
        return "--:--"
    seconds = max(0.0, seconds)
    tenths = math.floor(seconds * 10 + 0.5)
    if precise and tenths < 100:
        return f"{tenths // 10}.{tenths % 10}s"
    minutes, rest = divmod(math.floor(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{rest:02d}"
    return f"{minutes:02d}:{rest:02d}"


def counted(count: object, noun: str, plural: str | None = None) -> str:
    """``1 replica``, ``8 replicas``, ``0 problems``: a count and its noun in the right number.

    ``plural``: for a noun that does not just take an ``s``. A count that is
    not a number (a field missing from a record: None) keeps the plural.
    """
    one = isinstance(count, int) and not isinstance(count, bool) and count == 1
    return f"{count} {noun if one else plural or noun + 's'}"


def status_text(status: str) -> Text:
    """``✓ done`` in the status's colour, as every front end shows a run's status."""
    glyph, style = STATUS_GLYPHS.get(status, UNKNOWN_STATUS_GLYPH)
    return Text(f"{glyph} {status}", style=style)


# -- what a run ran on ------------------------------------------------------------------------

# The framework a run computed with, as its runtime names it (``backend``), and the keys of its version: a
# recorded run's (``tpudash.recording``), then a job's (``Runtime.summary``).
FRAMEWORKS = {
    "tensorflow": ("TensorFlow", ("tensorflow", "tf_version")),
    "jax": ("JAX", ("jax",)),
    "torch": ("PyTorch", ("torch",)),
}


def runtime_line(runtime: Mapping[str, Any]) -> str:
    """A run's runtime in one line, as the run view and ``tpudash watch`` show it.

    ``JAX 0.10.2 · 8 CPU devices (simulated) · DataParallel, 8 replicas, mesh batch=8 · Keras 3.15.1``
    or ``TensorFlow 2.21.0 · CPU · MirroredStrategy, 8 replicas (simulated)``; a process or worker of
    several adds ``process 1 of 4`` before Keras. Reads a record written by anyone: a missing or odd field is left out.
    """
    backend = runtime.get("backend")
    if backend is None and (runtime.get("tensorflow") or runtime.get("tf_version")):
        backend = "tensorflow"  # a run recorded before runtimes named their framework
    parts = []
    name, version_keys = FRAMEWORKS.get(str(backend), (None, ()))
    if name is not None:
        version = next((runtime[key] for key in version_keys if isinstance(runtime.get(key), str)), "")
        parts.append(f"{name} {version}" if version else name)
    kind = runtime.get("kind")
    kind = kind if isinstance(kind, str) and kind and kind != "unknown" else None
    device_kind = runtime.get("device_kind")
    if kind == "TPU" and isinstance(device_kind, str) and device_kind.upper().startswith("TPU"):
        kind = device_kind  # "TPU v5 lite" says more than "TPU"
    simulated = " (simulated)" if runtime.get("simulated") else ""
    count = runtime.get("device_count")
    if kind is not None and isinstance(count, int) and not isinstance(count, bool) and count > 0:
        parts.append(f"{counted(count, f'{kind} device')}{simulated}")
        simulated = ""
    elif kind is not None:
        parts.append(kind)
    strategy = runtime.get("strategy")
    replicas = runtime.get("num_replicas")
    if isinstance(strategy, str) and strategy and (strategy != "none" or isinstance(replicas, int)):
        text = strategy if strategy != "none" else "no distribution"
        if isinstance(replicas, int) and not isinstance(replicas, bool):
            text += f", {counted(replicas, 'replica')}"
        axes = (runtime.get("mesh") or {}).get("axes") if isinstance(runtime.get("mesh"), Mapping) else None
        if isinstance(axes, Mapping) and axes:
            text += ", mesh " + " ".join(f"{axis}={size}" for axis, size in axes.items())
        parts.append(text + simulated)
    # A JAX process, a recording worker, a job's cluster: each says where it stands as it can.
    places = (("process", "index", "count"), ("worker", "index", "count"), ("cluster", "worker", "workers"))
    for key, index_key, count_key in places:
        place = runtime.get(key)
        if isinstance(place, Mapping) and isinstance(place.get(count_key), int) and place[count_key] > 1:
            parts.append(f"{'process' if key == 'process' else 'worker'} {place.get(index_key)} of {place[count_key]}")
            break
    # Last: a line cut at a narrow terminal keeps the framework, the devices and the strategy.
    keras_version = runtime.get("keras") or runtime.get("keras_version")
    if isinstance(keras_version, str) and keras_version:
        parts.append(f"Keras {keras_version}")
    return " · ".join(parts)


# -- device names ----------------------------------------------------------------------------


def short_device_names(names: Iterable[str]) -> dict[str, str]:
    """Each device name shortened to what tells it apart from the others.

    ``/job:localhost/replica:0/task:0/device:CPU:3`` → ``CPU:3``; devices of
    several tasks keep the task (``task:1/TPU:0``). Other text is kept as it is.
    """
    segments = {name: [part.removeprefix("device:") for part in name.strip("/").split("/")] for name in names}
    for kept in range(1, max(map(len, segments.values()), default=0) + 1):
        short = {name: "/".join(parts[-kept:]) for name, parts in segments.items()}
        if len(set(short.values())) == len(short):
            return short
    return {name: name for name in segments}


class DeviceNames:
    """The devices a run has named so far, each shortened as ``short_device_names`` does.

    A run names its devices bit by bit (a table, then per-replica values);
    the short names are worked out over all of them, so ``CPU:3`` means the
    same device in every table of a run, in the CLI and in the dashboard.
    """

    def __init__(self) -> None:
        self._seen: dict[str, None] = {}

    def add(self, devices: Iterable[object]) -> dict[str, str]:
        """Remember ``devices``; the short name of every device seen so far."""
        self._seen.update(dict.fromkeys(str(device) for device in devices))
        return self.short

    @property
    def short(self) -> dict[str, str]:
        return short_device_names(self._seen)


def column_key(name: str) -> str:
    """A name as it compares with a column title: ``gflops`` is ``GFLOP/s``, ``median_ms`` is ``median ms``."""
    return "".join(character for character in name.casefold() if character.isalnum())


def table_devices(event: Table) -> list[str]:
    """The device column of a result table, if it has one (matmul's per-device check)."""
    keys = [column_key(str(column)) for column in event.columns]
    if "device" not in keys:
        return []
    column = keys.index("device")
    return [str(row[column]) for row in event.rows if len(row) > column]


# -- values ----------------------------------------------------------------------------------


def format_value(value: object, device_names: Mapping[str, str] | None = None) -> str:
    """Numbers compact, matrices and lists as nested brackets, mappings as ``key=value, …``.

    ``device_names`` (from ``short_device_names``) shortens device names
    wherever they appear as text or as keys.
    """
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(item, device_names) for item in value) + "]"
    if isinstance(value, dict):
        return ", ".join(
            f"{format_value(key, device_names)}={format_value(item, device_names)}" for key, item in value.items()
        )
    if isinstance(value, str) and device_names:
        return device_names.get(value, value)
    return str(value)


# The range a live metric is written out in full: `{:.4g}` turns 14080 into `1.408e+04` while 6042
# stays `6042`, so one series (examples/s epoch after epoch) read in two formats.
PLAIN_NUMBER_RANGE = (1e-8, 1e15)


def format_reading(value: float, digits: int = 4) -> str:
    """A live metric as ``tpudash run`` and ``watch`` print it: ``digits`` significant digits, never an exponent.

    ``14080``, ``6042``, ``2.303``, ``0.09375``, ``0.00005``: the digits of
    ``{:.4g}``, without its switch to ``1.408e+04`` at 10,000 or ``5e-05``
    under 0.0001, so the numbers of one column or one series share one
    format. Only what is outside ``PLAIN_NUMBER_RANGE`` (or not finite) is
    ``{:.4g}``'s.
    """
    low, high = PLAIN_NUMBER_RANGE
    if not math.isfinite(value) or value == 0 or not low <= abs(value) < high:
        return f"{value:.{digits}g}"
    exponent = math.floor(math.log10(abs(value)))
    text = f"{value:.{max(0, digits - 1 - exponent)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def brief_metrics(metrics: Mapping[str, Any], limit: int = 4) -> str:
    """A run's final metrics in a runs list, ``name=value``, at most ``limit``.

    Losses and accuracies first, held-out splits before training (test, then
    val), and per-batch values only when a run has nothing else.
    """
    items = [(name, value) for name, value in metrics.items() if isinstance(value, (int, float))]
    items = [item for item in items if not item[0].startswith("batch_")] or items
    split_rank = {"test": 0, "val": 1}

    from jobs.events import split_final_name

    def rank(item: tuple[str, float]) -> tuple[bool, int]:
        split, name = split_final_name(item[0])
        return ("loss" not in name and "acc" not in name, split_rank.get(split, 2))

    return "  ".join(f"{name}={format_value(float(value))}" for name, value in sorted(items, key=rank)[:limit])


def format_bytes(count: float | None) -> str:
    if count is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return str(count)


def format_used_of(used: float | None, total: float | None) -> str:
    """``4.0/16.0 GiB``: both in the total's unit."""
    if used is None or not total:
        return format_bytes(used if used is not None else total)
    unit_total = format_bytes(total)
    number, unit = unit_total.split(" ", 1)
    scale = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}[unit]
    return f"{used / scale:.1f}/{number} {unit}"


# -- telemetry -------------------------------------------------------------------------------


def percent_style(percent: float) -> str:
    return "red" if percent >= 90 else "yellow" if percent >= 70 else "green"


def meter(percent: float | None, width: int = METER_WIDTH, label: str | None = None) -> Text:
    """``█████░░░░░ 47%``: a bar for a percentage, as nvitop draws one; ``n/a`` when not measured."""
    if percent is None:
        return Text("n/a".ljust(width + 5), style="dim")
    clamped = min(100.0, max(0.0, percent))
    filled = round(width * clamped / 100)
    text = Text("█" * filled, style=percent_style(clamped))
    text.append("░" * (width - filled), style="dim")
    text.append(f" {percent:3.0f}%" if label is None else f" {label}")
    return text


def sparkline(values: Iterable[float | None], width: int = SPARK_WIDTH, top: float = 100.0) -> Text:
    """The last ``width`` values (0 to ``top``) as ``▁▃▅█``; a gap where a value was not measured."""
    cells = list(values)[-width:]
    text = Text()
    for value in cells:
        if value is None:
            text.append(" ")
        else:
            level = min(len(SPARK_LEVELS) - 1, max(0, int(value / top * len(SPARK_LEVELS))))
            text.append(SPARK_LEVELS[level], style=percent_style(100 * value / top))
    return text


def telemetry_view(sample: Telemetry, history: Iterable[Telemetry] = (), tpu_address: str | None = None) -> Group:
    """One telemetry sample as tables: TPU chips (duty cycle, HBM, bandwidth), host CPU and memory.

    ``history``: the samples before it, oldest first, drawn as sparklines
    (no sparkline column without them). A source that gave nothing is a line
    saying why. The Devices screen and ``tpudash telemetry`` show the same.
    """
    past = list(history)[-(SPARK_WIDTH - 1) :]
    trend_of: Callable[[Iterable[float | None]], Text] | None = sparkline if past else None
    past.append(sample)

    def table(title: str, columns: tuple[str, ...]) -> RichTable:
        grid = RichTable(title=title, title_justify="left", title_style="bold", box=None, padding=(0, 1))
        for column in columns + (("last samples",) if trend_of else ()):
            grid.add_column(column, no_wrap=True)
        return grid

    def row(grid: RichTable, *cells: RenderableType, trend: Iterable[float | None] | None = None) -> None:
        grid.add_row(*cells, *((trend_of(trend or ()),) if trend_of else ()))

    parts: list[RenderableType] = []
    if sample.chips:
        source = f" — libtpu's metrics service at {tpu_address}" if tpu_address else ""
        tensorcore = any(chip.get("tensorcore_util_pct") is not None for chip in sample.chips)
        chips = table(
            f"TPU{source}", ("chip", "duty cycle", "HBM used", "HBM BW") + (("TensorCore",) if tensorcore else ())
        )
        for chip in sample.chips:
            number = chip.get("chip")
            used, total = chip.get("hbm_used"), chip.get("hbm_total")
            hbm = meter(100.0 * used / total if used is not None and total else None, label=format_used_of(used, total))
            trend = [
                next((item.get("duty_cycle_pct") for item in old.chips if item.get("chip") == number), None)
                for old in past
            ]
            percents = [
                Text("n/a", style="dim") if value is None else Text(f"{value:.0f}%")
                for value in [chip.get("hbm_bandwidth_pct")] + ([chip.get("tensorcore_util_pct")] if tensorcore else [])
            ]
            row(chips, str(number), meter(chip.get("duty_cycle_pct")), hbm, *percents, trend=trend)
        parts.append(chips)
        if sample.unavailable.get("tensorcore"):
            parts.append(Text(f"TensorCore utilisation: {sample.unavailable['tensorcore']}", style="dim"))
    elif sample.unavailable.get("tpu"):
        parts.append(Text.assemble(("TPU  ", "bold"), (sample.unavailable["tpu"], "yellow")))
    host = sample.host
    if host:
        summaries = [summarize(old) for old in past]
        grid = table("host", ("", "now"))
        cores = host.get("cpu_pct") or []
        row(
            grid,
            f"CPU ({counted(len(cores), 'core')})",
            meter(summaries[-1].cpu_pct),
            trend=[item.cpu_pct for item in summaries],
        )
        for index, core in enumerate(cores if len(cores) <= 16 else ()):
            row(grid, Text(f"  core {index}", style="dim"), meter(core))
        memory = format_used_of(host.get("memory_used"), host.get("memory_total"))
        row(
            grid,
            "memory",
            meter(summaries[-1].memory_used_pct, label=memory),
            trend=[item.memory_used_pct for item in summaries],
        )
        for label, rss in (host.get("processes") or {}).items():
            row(grid, f"{label} resident", Text(format_bytes(rss)))
        parts.append(grid)
    if sample.unavailable.get("host"):
        parts.append(Text.assemble(("host  ", "bold"), (sample.unavailable["host"], "yellow")))
    return Group(*parts)


# -- a run's workers (the run view's Workers tab, ``tpudash watch``) -------------------------------

WORKER_STATE_STYLES = {"straggler": "bold yellow", "stale": "bold red", "failed": "bold red", "live": "green"}


def worker_state(status: WorkerStatus) -> str:
    """One word: ``straggler``, ``stale`` (its heartbeat stopped), how it ended, or ``live``."""
    if status.straggler:
        return "straggler"
    if status.ended:
        return status.status or "ended"
    return "live" if status.alive else "stale"


def worker_task(status: WorkerStatus) -> str:
    """The task as TF_CONFIG names it, but worker 0 is the chief (it writes the run) whatever its task is called."""
    return "chief" if status.index == 0 else status.task


def worker_progress(status: WorkerStatus) -> str:
    """``step 40/64``, ``epoch 2/5``; ``—`` before any."""
    if status.progress is None:
        return "—" if status.step is None else f"step {status.step:,}"
    done, total, unit = status.progress
    return f"{unit} {done:,}/{total:,}" if total else f"{unit} {done:,}"


def worker_step_time(seconds: float | None) -> str:
    """``32 ms``, ``1.5 s``; ``—`` before the first steps are timed."""
    if seconds is None:
        return "—"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else format_seconds(seconds)


def heartbeat_age(age: float) -> str:
    return "now" if age < 1 else f"{format_seconds(age, precise=False)} ago"


def workers_heading(
    statuses: Iterable[WorkerStatus], margin: float, expected: int | None = None, explain: bool = False
) -> Text:
    """``workers: 3 of 4 live · straggler: worker 2 (…) · stale: worker 3``; ``explain`` says what stale means.

    ``margin``: how far over the median step time a straggler is (``runs.workers.STRAGGLER_MARGIN``:
    the bus imports this module, not this module the bus).
    """
    statuses = list(statuses)
    count = max([expected or 0, len(statuses), *(status.count or 0 for status in statuses)])
    live = sum(status.alive for status in statuses)
    ended = sum(status.ended for status in statuses)
    line = Text("workers: ", style="bold")
    line.append(f"{live} of {count} live" + (f", {ended} ended" if ended else ""))
    stragglers = [status for status in statuses if status.straggler]
    if stragglers:
        line.append(" · ")
        line.append("straggler: ", style=WORKER_STATE_STYLES["straggler"])
        line.append(", ".join(f"worker {status.index}" for status in stragglers))
        line.append(f" (step time over the median by more than {margin:.0%})", style="dim")
    stale = [status for status in statuses if worker_state(status) == "stale"]
    if stale:
        line.append(" · ")
        line.append("stale: ", style=WORKER_STATE_STYLES["stale"])
        line.append(", ".join(f"worker {status.index}" for status in stale))
        if explain:
            line.append(" (its heartbeat stopped: the process is gone, or cut off)", style="dim")
    return line
