"""Whether the dashboard starts its engine, from the host check; what the runtime panel says while no engine answers.

The engine runs its jobs on the framework ``Settings.framework`` resolves
to, judged here from the host check's facts (``tensorflow_found``,
``jax_found``; ``resolve_framework`` rules): on Colab's TPU runtime (JAX, no
TensorFlow) it runs on JAX. Without the framework it needs (neither, or the
one asked for), the dashboard watches and says what to install; on a TPU VM
where another process (a JAX script) holds the chips, the Devices screen
shows the chips and libtpu's telemetry, and an engine would only reach for a
TPU that libtpu gives to one process per host. So the Devices screen's need for the runtime waits for the host
check (a few milliseconds after the first frame), and ``HostGate.withheld``
says why no engine starts. A launch beside a foreign holder asks first
(the holders looked for again: it may have gone); "Run on the CPU" starts
the engine with ``tpu="none"``, so libtpu is never loaded, until the
runtime is re-initialised. Another *dashboard's* engine holding the
accelerator is not a foreign holder: its engine lock names it
(``tpudash.engine.hostlock``), and the lane says so (``show_engine_lock_held``).

Textual-free, as the session it serves (``tpudash.tui.session.DashboardSession``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tpudash.config import FRAMEWORK_NAMES, Settings, resolve_framework
from tpudash.format import counted

if TYPE_CHECKING:  # the host check and the jobs load after the first frame
    from jobs.base import JobSpec
    from tpudash.accel.hostcheck import TpuHolder

NO_TPU = "none"
RUNTIME_HELD_STATUS = "held by another dashboard"
"""The runtime status while another dashboard's engine holds the accelerator (Devices says who)."""
TPU_HELD_STATUS_PREFIX = "TPU held by "
"""The runtime status while a process other than tpudash holds the TPU and no engine runs (Devices says who)."""
CONNECTING_STATUS = "connecting…"


@dataclass(frozen=True)
class Withheld:
    """Why no engine starts on the Devices screen's need: no framework to run jobs on, or the TPU held elsewhere.

    ``status``: the session bar's words (``no TensorFlow``, ``no JAX``, ``no TensorFlow or JAX``) when no framework.
    """

    reason: Literal["no-framework", "tpu-held"]
    message: str
    holder: TpuHolder | None = None
    status: str = ""


def framework_of(check: Mapping | None, choice: str) -> str:
    """``tensorflow`` or ``jax``: what the engine runs on with ``Settings.framework`` = ``choice`` on this host.

    Judged from the host check's facts (``resolve_framework``'s rule); before any check, from this process's look.
    """
    if check is None:
        return resolve_framework(choice)
    found = {"tensorflow": check.get("tensorflow_found", True), "jax": check.get("jax_found", False)}
    return resolve_framework(choice, lambda name: True if found.get(name) else None)


def missing_framework(check: Mapping, choice: str) -> Withheld | None:
    """No engine without the framework it would run on: the status and what to install; None when it is there.

    ``auto`` with neither framework names both install lines, one a line, TensorFlow's first.
    """
    framework = framework_of(check, choice)
    if framework == "jax":
        if check.get("jax_found", False):
            return None
        return Withheld(
            "no-framework", f"JAX is not installed; jobs on JAX need it: {_jax_line(check)}", status="no JAX"
        )
    if check.get("tensorflow_found", True):
        return None
    if choice == "auto":
        message = f"{_no_tensorflow_message(check)}\nor run the jobs on JAX instead: {_jax_line(check)}"
        return Withheld("no-framework", message, status="no TensorFlow or JAX")
    return Withheld("no-framework", _no_tensorflow_message(check), status="no TensorFlow")


def accelerator_held_note(holder: str) -> str:
    """What a dashboard says when another engine on the host holds the accelerator: who, and what it does instead."""
    return (
        f"The accelerator is held by {holder}. This dashboard watches: runs started there show in History; "
        "press w to watch one. The next launch here tries again."
    )


def tpu_held_status(holder: TpuHolder) -> str:
    """The session bar's words: ``TPU held by JAX (pid 1234)``."""
    return f"{TPU_HELD_STATUS_PREFIX}{holder.framework or 'another process'} (pid {holder.pid})"


def tpu_held_note(holder: TpuHolder, cpu_devices: int) -> str:
    """What Devices and the notice say while another process holds the TPU: who, and what a launch here does."""
    return (
        f"The TPU is held by {holder.describe()}; libtpu admits one process per host, so this dashboard starts "
        f"no engine beside it and watches: the chips and their telemetry show here, that process's runs "
        f"(TpudashCallback, tpudash.record) in History. A job launched here asks to run on the CPU "
        f"({counted(cpu_devices, 'logical device')}) instead."
    )


def run_on_cpu_question(job: str, holder: TpuHolder, cpu_devices: int) -> str:
    """The launch dialog's question beside a foreign holder."""
    return (
        f"The TPU is held by {holder.describe()}; libtpu admits one process per host. "
        f"Run {job} on the CPU ({counted(cpu_devices, 'logical device')}) instead?"
    )


class GatedSession(Protocol):
    """What the gate uses of ``tpudash.tui.session.DashboardSession`` (named here: the session imports the gate)."""

    settings: Settings
    view: Any
    """The session's ``SessionView``."""

    @property
    def engine_pid(self) -> int | None: ...

    def inspect_host(self) -> dict: ...

    def launch(self, spec: JobSpec, params: dict) -> Any: ...


class HostGate:
    """The last host check, the user's choice to run on the CPU beside a TPU's holder, and what the view says."""

    def __init__(self, session: GatedSession):
        self._session = session
        self.host_check: dict | None = None
        """``HostCheck.to_dict()`` of the last scan, or None before the first answers (or when it failed)."""
        self.checked_once = False
        """The first host scan has answered (or failed): from then on the Devices screen's need decides at once."""
        self.engine_wanted = False
        """The Devices screen asked for the runtime before the host check answered."""
        self.on_cpu = self._left_alone_by_settings
        """Engines start with the TPU left alone: ``--tpu none``, or "Run on the CPU" (until re-initialised)."""

    @property
    def _settings(self) -> Settings:
        return self._session.settings

    @property
    def _left_alone_by_settings(self) -> bool:
        return (self._settings.tpu or "").lower() == NO_TPU

    def engine_settings(self) -> Settings:
        """The settings an engine starts with: the TPU left alone once the user chose the CPU."""
        return dataclasses.replace(self._settings, tpu=NO_TPU) if self.on_cpu else self._settings

    @property
    def tpu_host(self) -> bool:
        """The last check found TPU chips (only then are the TPU's holders looked for)."""
        chips = (self.host_check or {}).get("chips") or {}
        return bool(chips.get("count"))

    def foreign_holder(self) -> TpuHolder | None:
        """A process other than tpudash's that holds the TPU, at the last check."""
        if self.host_check is None:
            return None
        from tpudash.accel.hostcheck import foreign_holder

        return foreign_holder(self.host_check)

    @property
    def framework(self) -> str:
        """``tensorflow`` or ``jax``: what an engine started now runs its jobs on."""
        return framework_of(self.host_check, self._settings.framework)

    def withheld(self) -> Withheld | None:
        """Why the engine does not start on the Devices screen's need, or None: it may."""
        check = self.host_check
        if check is None:
            return None
        missing = missing_framework(check, self._settings.framework)
        if missing is not None:
            return missing
        holder = None if self.on_cpu else self.foreign_holder()
        if holder is not None:
            return Withheld("tpu-held", tpu_held_note(holder, self._settings.cpu_devices), holder)
        return None

    # -- the engine's first need ----------------------------------------------------------------
    def engine_may_start(self) -> bool:
        """Whether the Devices screen's need starts the engine now; before the host check, it waits for it."""
        if not self.checked_once:
            self.engine_wanted = True  # a few ms away: ``checked`` starts the engine if it may
            return False
        return self.withheld() is None

    def checked(self, host_check: dict | None) -> bool:
        """The host scan answered (None: it failed, and the engine starts as it did before there was a gate).

        Shows why no engine starts, if none may; True when the engine was wanted meanwhile and may start now.
        """
        self.checked_once = True
        session, view = self._session, self._session.view
        if host_check is not None:
            self.host_check = view.host_check = host_check
        withheld = self.withheld() if session.engine_pid is None else None
        if withheld is not None and withheld.reason == "no-framework":
            self.show_missing_framework(withheld.message, withheld.status)
        elif withheld is not None:
            self._show_tpu_held(withheld)
        wanted, self.engine_wanted = self.engine_wanted, False
        return wanted and withheld is None

    # -- launching beside a process that holds the TPU ----------------------------------------
    def asked_to_run_on_cpu(self, spec: JobSpec, params: dict) -> bool:
        """No engine of this session runs and another process holds the TPU: ask to run on the CPU (True: asked).

        The holders are looked for again first (a few ms, on a TPU host only): one gone since the last
        look lets the launch go ahead, the engine looking for the TPU as usual.
        """
        session = self._session
        if self.on_cpu or session.engine_pid is not None or not self.tpu_host:
            return False
        was_held = self.foreign_holder() is not None
        self.host_check = session.view.host_check = session.inspect_host()
        holder = self.foreign_holder()
        if holder is None:
            if was_held:
                self.show_connecting()  # the holder has gone: the launch's engine answers next
            return False

        def answered(run_on_cpu: bool) -> None:
            if not run_on_cpu:
                session.view.notify(
                    f"{spec.name} not launched: the TPU stays with pid {holder.pid}.", title="Cancelled"
                )
                return
            self.on_cpu = True  # until re-initialised: this session's engines never load libtpu
            self.show_connecting()
            session.launch(spec, params)

        question = run_on_cpu_question(spec.name, holder, self._settings.cpu_devices)
        session.view.ask(question, yes="Run on the CPU", no="Cancel", answered=answered)
        return True

    def before_restart(self) -> TpuHolder | None:
        """Re-initialising: forget the CPU choice, look for the TPU's holders again; the holder still there, if any."""
        self.on_cpu = self._left_alone_by_settings
        if self.tpu_host:
            self.host_check = self._session.view.host_check = self._session.inspect_host()
        return self.foreign_holder()

    # -- what the view says while no engine answers ---------------------------------------------
    def show_connecting(self, beside: TpuHolder | None = None) -> None:
        """A new engine is starting: the runtime is unknown again (``beside``: a process still holds the TPU)."""
        view = self._session.view
        view.runtime_settled.clear()
        # Errors first: screens redraw on ``runtime`` and show "connecting…" only without one.
        view.runtime_error = None
        view.framework_missing = None
        view.runtime = None
        view.runtime_status = CONNECTING_STATUS
        if beside is not None and not self.on_cpu:
            view.notify(
                f"The TPU is held by {beside.describe()}: the new engine leaves it alone and runs "
                f"{FRAMEWORK_NAMES[self.framework]} on the CPU (with --tpu naming the TPU, it fails and says so).",
                title="Re-initialising",
                severity="warning",
            )

    def show_missing_framework(self, missing: str, status: str = "no TensorFlow") -> None:
        """No framework to run jobs on (``status`` names what is missing): everything but launching works; launches
        are refused with the install line(s)."""
        title = f"{status[0].upper()}{status[1:]}: jobs cannot run"
        self._show_without_runtime(status, missing, title, missing=missing)

    def _show_tpu_held(self, withheld: Withheld) -> None:
        assert withheld.holder is not None
        self._show_without_runtime(tpu_held_status(withheld.holder), withheld.message, "The TPU is in use")

    def show_engine_lock_held(self, holder: str) -> None:
        """Another dashboard's engine holds the accelerator (its lock names it): this dashboard watches."""
        self._show_without_runtime(RUNTIME_HELD_STATUS, accelerator_held_note(holder), "The accelerator is in use")

    def _show_without_runtime(self, status: str, note: str, title: str, missing: str | None = None) -> None:
        """No runtime comes until a launch or a re-initialise: the status, why (``missing``: no framework), a notice."""
        view = self._session.view
        view.runtime_settled.set()
        view.runtime_status = status
        view.framework_missing = missing
        view.runtime_error = note
        view.runtime = None
        view.notify(note, title=title, severity="warning", timeout=15 if missing else 20)


def _no_tensorflow_message(check: Mapping) -> str:
    """The host check's own no-TensorFlow diagnosis (what the engine would fail with), ending with the fix."""
    for diagnosis in check.get("diagnoses") or ():
        if diagnosis.get("code") == "no-tensorflow":
            return str(diagnosis["message"])
    return f"TensorFlow is not installed; jobs need it: {check.get('install_line', '')}"


def _jax_line(check: Mapping) -> str:
    """The line that installs JAX for this host (its TPU build on a TPU host), from the host check."""
    from tpudash.accel.hostcheck import jax_install_line

    chips = check.get("chips") or {}
    return str(check.get("jax_install_line") or jax_install_line("tpu" if chips.get("count") else "cpu"))
