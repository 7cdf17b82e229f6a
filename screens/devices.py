"""The Devices screen: what the session sees — host, runtime, strategy, topology, logical devices.

First the host block: what the host scan found before TensorFlow was
imported (chip type, count and HBM per chip, the TensorFlow build installed,
any process holding the TPU, and each problem with its fix), shown as soon
as the scan answers, in a few milliseconds. Then telemetry, every second:
per-chip duty cycle and HBM as bars with sparklines of the last samples
(or why the TPU gives none), host CPU and memory, and the engine's
resident memory. Below it "connecting…" until the
runtime worker answers, then the kind, strategy (``worker i of N`` and the
cluster's addresses under MultiWorkerMirroredStrategy), replicas in sync, TPU
topology (hosts × chips on a pod), versions, time to initialize, why every other kind was not used,
and a table of logical devices with the last matmul check's verdict and
speed per device when there is one. On JAX the runtime names the framework
(``JAX 0.10.2 · 8 CPU devices``) and has one row per ``jax.devices()``
entry: id, platform, ``device_kind``, process index, coords, memory. Without
the framework the engine would run on, its install line (both, when neither
TensorFlow nor JAX is there) takes the runtime's place; beside another process that holds the TPU (a
JAX script), who holds it and what a launch here does take it: no engine
is started there (``tpudash.tui.hostgate``), and the chips and their
telemetry still show. A line says which engine process holds
TensorFlow, or that it was released or crashed and what happens next.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.visual import visualize
from textual.widgets import DataTable, Static

from screens.base import DashScreen
from tpudash.config import FRAMEWORK_NAMES
from tpudash.format import format_bytes, format_seconds, telemetry_view
from tpudash.tui.hostgate import RUNTIME_HELD_STATUS, TPU_HELD_STATUS_PREFIX
from tpudash.tui.quiet_widgets import Spinner

if TYPE_CHECKING:
    from textual.css.styles import RulesMap

DEVICE_COLUMNS = ("index", "name", "type", "job", "replica", "task", "memory", "last check")
JAX_DEVICE_COLUMNS = ("index", "name", "platform", "kind", "process", "coords", "memory", "last check")
"""A JAX runtime's rows: ``jax.devices()``'s id (``CPU:3``), platform, ``device_kind``, process index and coords."""
# Local devices (the CPU default, one GPU box) are named ``/device:CPU:3``, without
# a job, replica or task: those columns show only when some device has one.
PLACEMENT_COLUMNS = ("job", "replica", "task")
NOT_CHECKED = "not checked"


def format_memory(memory: dict | None) -> str:
    if not memory:
        return "n/a"
    current, peak = memory.get("current"), memory.get("peak")
    return f"{format_bytes(current)} (peak {format_bytes(peak)})" if peak is not None else format_bytes(current)


def describe_host(host_check: dict, leave_out: str | None = None, framework: str = "tensorflow") -> Text:
    """The host scan's lines (``tpudash.accel.hostcheck.host_lines``, as the CLI prints them), labelled like the runtime's.

    ``leave_out``: a message shown elsewhere on the screen (the no-TensorFlow
    diagnosis is the reason detection gave up), so it is not shown twice.
    """
    # Here, not at the top: this screen is imported before the first frame.
    from tpudash.accel.hostcheck import host_lines

    text = Text()
    for label, value, style in host_lines(host_check, framework):
        if leave_out and value in leave_out.splitlines():
            continue
        text.append(f"{label:>16}  ", "bold")
        text.append(f"{value}\n", style)
    return text


def describe_missing_framework(message: str, status: str = "no TensorFlow") -> Text:
    """What the Devices screen says instead of the runtime when the framework jobs need is not installed.

    ``status`` names what is missing (``no TensorFlow``, ``no JAX``, ``no
    TensorFlow or JAX``). Each line of the message ends with its fix (``…:
    pip install …``), which gets a line of its own: it is the one thing to
    copy from this screen.
    """
    which = "one is" if " or " in status else "it is"
    text = Text.assemble((f"{status}: jobs cannot run until {which} installed\n", "bold yellow"))
    for line in message.splitlines():
        reason, separator, command = line.rpartition(": pip ")
        if separator:
            text.append(f"{reason}:\n")
            text.append(f"    pip {command}\n", "bold cyan")
        else:
            text.append(f"{line}\n", "bold")
    text.append("then re-initialise from the command palette (ctrl+p), or start tpudash again", "dim")
    return text


def describe_runtime(description) -> Text:
    """The runtime as labelled lines, for the top of the screen."""
    text = Text()

    def line(label: str, value: str, style: str = "") -> None:
        text.append(f"{label:>16}  ", "bold")
        text.append(f"{value}\n", style)

    kind = description.kind + (" (simulated replicas on CPU)" if description.simulated else "")
    if description.framework == "jax":
        line("framework", description.framework_text(), "bold cyan")
    line("kind", kind, "bold cyan")
    line("strategy", description.strategy_text())
    line("replicas in sync", str(description.num_replicas))
    cluster = description.cluster_text()
    if cluster:
        line("cluster", cluster)
    if description.tpu_address:
        line("TPU address", description.tpu_address)
    topology = description.topology_text()
    if topology:
        line("TPU topology", topology)
        hosts = (description.topology or {}).get("host_addresses") or []
        if len(hosts) > 1:
            line("TPU hosts", ", ".join(hosts))
    else:
        line("TPU topology", "n/a (no TPU)", "dim")
    framework = (
        f"JAX {description.jax_version}" if description.framework == "jax" else f"TensorFlow {description.tf_version}"
    )
    line("versions", f"{framework}, Keras {description.keras_version}")
    line("host", description.host)
    line("init time", format_seconds(description.init_seconds))
    for kind_name, reason in description.reasons.items():
        line(f"why not {kind_name}", reason, "dim")
    for note in description.notes:
        line("note", note, "yellow")
    return text


class DevicesScreen(DashScreen):
    """The runtime description and the logical devices."""

    CSS_PATH = "devices.tcss"

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="devices-body"):
            yield Static("", id="host-summary")
            yield Static("", id="engine-line")
            yield Static(Text("telemetry: the first sample comes within a second", style="dim"), id="telemetry")
            yield Static(
                Text("connecting… (detecting the accelerator; TensorFlow is loading)", style="bold"),
                id="runtime-summary",
            )
            yield Spinner(id="runtime-loading")
            yield Static("", id="device-check-title")
            yield DataTable(id="device-table", zebra_stripes=True, cursor_type="row")

    def on_mount(self) -> None:
        self._set_columns(DEVICE_COLUMNS)
        self.watch(self.app, "host_check", self._show_host)
        self.watch(self.app, "runtime", self._show_runtime)
        self.watch(self.app, "runtime_error", self._show_error)
        self.watch(self.app, "device_check", self._show_device_check, init=False)
        self.watch(self.app, "engine_status", self._show_engine)
        self.watch(self.app, "telemetry", self._show_telemetry)

    def _show_telemetry(self, stamped) -> None:
        """The newest sample as bars, with the samples before it as sparklines; why a source gives nothing."""
        panel = self.query_one("#telemetry", Static)
        settings = self.dashboard.settings
        if not settings.telemetry_interval:
            panel.update(Text("telemetry off (--telemetry-interval 0)", style="dim"))
            return
        if stamped is None:
            return
        if not self.is_current:
            self._telemetry_behind = stamped  # drawn when shown again: a hidden screen neither draws nor lays out
            return
        self._telemetry_behind = None
        history = [sample for stamp, sample in self.dashboard.session.telemetry.history if stamp < stamped[0]]
        view = telemetry_view(stamped[1], history, settings.tpu_metrics)
        # The panel's height follows its content (auto): the screen is laid out again only when that
        # height changes, not every second as the figures do (a layout of the whole screen costs a key's frame).
        width, rules = panel.content_size.width, cast("RulesMap", panel.styles)  # Textual measures it so too
        height = visualize(panel, view).get_height(rules, width) if width else None
        panel.update(view, layout=height != panel.content_size.height)

    _telemetry_behind: tuple | None = None
    """The newest telemetry, when it came while this screen was hidden."""

    def on_screen_resume(self, event: events.ScreenResume) -> None:
        # (DashScreen's handler runs too: Textual calls each class's own.)
        if self._telemetry_behind is not None:
            self._show_telemetry(self._telemetry_behind)

    def _show_engine(self, status: str) -> None:
        """Which process holds the framework (TensorFlow, or JAX), and what to do when none does."""
        pid = self.dashboard.session.engine_pid
        line = self.query_one("#engine-line", Static)
        if status.startswith("released"):
            text = Text.assemble(
                ("engine released", "bold"),
                (status[len("released") :], "dim"),
                (
                    " — the accelerator is free for another process; below is what the engine saw. "
                    "A launch starts a new engine (or ctrl+p: re-initialise).",
                    "dim",
                ),
            )
        elif status.startswith("crashed"):
            text = Text.assemble(
                (f"engine {status}", "bold red"),
                (
                    " — its run is recorded as failed; the session log (l) has its last lines. "
                    "A launch starts a new engine.",
                    "dim",
                ),
            )
        elif pid is not None:
            text = Text.assemble(
                ("engine ", "bold"),
                (status, "cyan"),
                (
                    f" — pid {pid} owns {FRAMEWORK_NAMES[self.dashboard.session.framework]} and the accelerator; "
                    "E releases it",
                    "dim",
                ),
            )
        else:
            text = Text("")
        line.update(text)

    def _show_host(self, _value: object = None) -> None:
        """One host block: the runtime's own scan once it exists (fresher after a re-init), else the app's."""
        runtime = self.dashboard.runtime
        host_check = getattr(runtime.description, "host_check", None) if runtime is not None else None
        host_check = host_check or self.dashboard.host_check
        block = self.query_one("#host-summary", Static)
        block.display = host_check is not None
        if host_check is not None:
            framework = self.dashboard.session.framework
            block.update(describe_host(host_check, leave_out=self.dashboard.framework_missing, framework=framework))

    def _show_error(self, error: str | None) -> None:
        if error:
            self.query_one("#runtime-loading").display = False
            if self.dashboard.runtime_status == RUNTIME_HELD_STATUS:
                self.query_one("#runtime-summary", Static).update(
                    Text.assemble(("accelerator in use\n", "bold yellow"), (error, "yellow"))
                )
                return
            if self.dashboard.runtime_status.startswith(TPU_HELD_STATUS_PREFIX):
                self.query_one("#runtime-summary", Static).update(
                    Text.assemble(
                        ("TPU in use by another process: no engine here\n", "bold yellow"),
                        (error, "yellow"),
                        ("\nonce it lets go, re-initialise from the command palette (ctrl+p)", "dim"),
                    )
                )
                self._show_device_check(None)
                return
            missing = self.dashboard.framework_missing
            if missing:
                status = self.dashboard.runtime_status
                self.query_one("#runtime-summary", Static).update(
                    describe_missing_framework(missing, status if status.startswith("no ") else "no TensorFlow")
                )
                self._show_host()
                self._show_device_check(None)
                return
            self.query_one("#runtime-summary", Static).update(
                Text.assemble(
                    ("runtime failed\n", "bold red"),
                    (error, "red"),
                    ("\nfix the cause, then re-initialise from the command palette (ctrl+p)", "dim"),
                )
            )

    def _show_runtime(self, runtime) -> None:
        loading = self.query_one("#runtime-loading")
        summary = self.query_one("#runtime-summary", Static)
        table = self.query_one("#device-table", DataTable)
        table.clear()
        self._show_host()
        if runtime is None:
            if not self.dashboard.runtime_error:
                loading.display = True
                summary.update(Text("connecting… (detecting the accelerator; TensorFlow is loading)", style="bold"))
            elif self.dashboard.framework_missing:
                self._show_device_check(None)  # the error came while the last runtime was still shown
            return
        loading.display = False
        description = runtime.description
        summary.update(describe_runtime(description))
        rows = {
            device.name: {
                "index": str(device.index),
                "name": device.name,
                "type": device.device_type,
                "job": device.job or "",
                "replica": "" if device.replica is None else str(device.replica),
                "task": "" if device.task is None else str(device.task),
                "platform": device.platform or "",
                "kind": device.device_kind or "",
                "process": "" if device.process_index is None else str(device.process_index),
                "coords": "" if device.coords is None else ",".join(str(value) for value in device.coords),
                "memory": format_memory(device.memory),
                "last check": "",
            }
            for device in description.devices
        }
        columns = JAX_DEVICE_COLUMNS if description.framework == "jax" else DEVICE_COLUMNS
        shown = [
            column
            for column in columns
            if column not in (*PLACEMENT_COLUMNS, "coords") or any(row[column] for row in rows.values())
        ]
        self._set_columns(shown)
        for name, row in rows.items():
            table.add_row(*(row[column] for column in shown), key=name)
        self._show_device_check(self.dashboard.device_check)

    def _set_columns(self, columns: list[str] | tuple[str, ...]) -> None:
        table = self.query_one("#device-table", DataTable)
        if [column.key.value for column in table.ordered_columns] != list(columns):
            table.clear(columns=True)
            for column in columns:
                table.add_column(column, key=column)

    def _show_device_check(self, check: dict | None) -> None:
        title = self.query_one("#device-check-title", Static)
        table = self.query_one("#device-table", DataTable)
        if self.dashboard.framework_missing and self.dashboard.runtime is None:
            title.update(Text("Logical devices — none: the engine lists them, and cannot start here", style="dim"))
            return
        if self.dashboard.runtime is None and self.dashboard.runtime_status.startswith(TPU_HELD_STATUS_PREFIX):
            title.update(
                Text("Logical devices — none: an engine lists them, and none runs beside the TPU's holder", style="dim")
            )
            return
        if not check or self.dashboard.runtime is None:
            title.update(Text("Logical devices — press m to run the matmul check on every device", style="bold"))
            for device in self.dashboard.runtime.description.devices if self.dashboard.runtime else ():
                table.update_cell(device.name, "last check", Text(NOT_CHECKED, style="dim"), update_width=True)
            return
        results = check["results"]
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(check["finished"])) if check.get("finished") else "?"
        title.update(
            Text.assemble(
                ("Logical devices", "bold"),
                f" — last matmul check {check['run_id']} ({when}): ",
                (check.get("status", ""), "bold green" if check.get("status") == "done" else "bold red"),
            )
        )
        for device in self.dashboard.runtime.description.devices:
            result = match_device(results, device.name)
            if result is None:
                cell = Text(NOT_CHECKED, style="dim")
            else:
                speed = f" {result['gflops']:.1f} GFLOP/s" if "gflops" in result else ""
                cell = Text(
                    ("✓ pass" if result["passed"] else "✗ FAIL") + speed,
                    style="green" if result["passed"] else "bold red",
                )
            # The column was sized for the empty cells the rows started with: widen it.
            table.update_cell(device.name, "last check", cell, update_width=True)


def match_device(results: dict[str, dict], name: str) -> dict | None:
    """The result for a device, whether the check named it in full or as ``CPU:3``."""
    if name in results:
        return results[name]
    suffix = name.rsplit("device:", 1)[-1]
    for key, value in results.items():
        if key.rsplit("device:", 1)[-1] == suffix:
            return value
    return None
