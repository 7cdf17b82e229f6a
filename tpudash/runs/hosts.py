"""Hosts in the runs directory: what each host's agent writes, and reading every host at once.

``tpudash agent`` (``tpudash.telemetry.agent``) runs once per host and
writes under ``<runs dir>/hosts/<name>/``:

- ``host.json``, replaced whole every agent interval (``HOST_INTERVAL_SECONDS``
  by default): its heartbeat and the latest snapshot of the host (chips'
  duty cycle and HBM, CPU, memory, the live runs on it, and why chips are
  missing when they are);
- ``samples/<writer>-<seq>.jsonl``, the host's stream of full telemetry
  samples, in segments as a run's streams are (``tpudash.runs.uploader``).

``hosts`` is reserved in a runs directory: it is never listed as a run
(``backends.RESERVED_FOLDERS``).

``HostsReader.read`` lists ``hosts/`` once and fetches the host.json files
in concurrent batches (a bucket's ``read_many``; plain reads locally),
newest folder first where the listing tells (locally: a folder's time
changes whenever its host.json is replaced). A host.json comes from another
host, perhaps another user: its size is capped, every field's type and
range is checked, and a file that fails is skipped and named in
``problems``; reading never raises for one bad host. Folders without a
host.json are counted and named in one problem line and never take a real
host's place: reading goes on past them, up to ``MAX_HOST_FOLDERS_READ``
folders, until ``MAX_HOSTS`` hosts are found.

A host's state is the one staleness rule's (``tpudash.runs.heartbeat``):
live, stale after ``STALE_AFTER_INTERVALS`` of its own intervals, ``clock
ahead`` when its heartbeat is from the future, and ``stopped`` when its
agent stopped cleanly (its last host.json says so, with no figures).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.events import is_finite_number, is_sane_timestamp
from tpudash.runs import heartbeat
from tpudash.runs.backends import HOSTS_FOLDER, BucketRoot, LocalRoot, runs_root
from tpudash.runs.heartbeat import INTERVAL_RANGE_SECONDS as INTERVAL_RANGE_SECONDS
from tpudash.runs.heartbeat import STALE_AFTER_INTERVALS as STALE_AFTER_INTERVALS
from tpudash.runs.layout import RefusedFile, is_run_id, parse_run_file

__all__ = [
    "HOSTS_FOLDER",
    "HOST_FILE",
    "HOST_INTERVAL_SECONDS",
    "SAMPLES_STREAM",
    "STALE_AFTER_INTERVALS",
    "ChipStatus",
    "HostStatus",
    "HostsReader",
]

HOST_FILE = "host.json"
SAMPLES_STREAM = "samples"
HOST_INTERVAL_SECONDS = 5.0
# A host.json names a few chips and runs: anything larger is not one an agent wrote.
MAX_HOST_FILE_BYTES = 64 << 10
# At most this many hosts are read (the Hosts view is built for 1 to 64; a pod slice has at most a few hundred).
MAX_HOSTS = 1024
# At most this many folders are tried for a host.json in one read: folders without one never hide the hosts behind.
MAX_HOST_FOLDERS_READ = 4 * MAX_HOSTS
MAX_CHIPS = 256
MAX_RUNS = 64
MAX_TEXT_CHARS = 500
# Bytes of HBM or memory a field may hold: far beyond any machine, short of nonsense.
MAX_BYTES = 1 << 60
HOST_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
HOST_NAME_RULE = "a plain name of 1 to 64 letters, digits, '-', '_' and '.', not starting with '.' or '-'"


def is_host_name(name: object) -> bool:
    """Whether ``name`` may name a host in the store (a folder under ``hosts/`` in every store)."""
    return isinstance(name, str) and HOST_NAME_PATTERN.match(name) is not None


def host_prefix(name: str) -> str:
    """A host's folder relative to the runs directory: ``runs_root(…).files(host_prefix(name))`` gives its files."""
    return f"{HOSTS_FOLDER}/{name}"


@dataclass(frozen=True)
class ChipStatus:
    """One accelerator chip of a host, as its agent last sampled it."""

    index: int
    duty_cycle: float | None
    """Percent of the last interval the chip's TensorCores were busy."""
    hbm_used: int | None
    """Bytes."""
    hbm_total: int | None
    """Bytes."""


@dataclass(frozen=True)
class HostStatus:
    """One host as its agent last reported it (``host.json``)."""

    name: str
    hostname: str
    heartbeat: float
    """When the agent last wrote host.json (unix time, the agent's clock)."""
    interval: float
    """Seconds between the agent's writes."""
    cpu_percent: float | None
    memory_used: int | None
    memory_total: int | None
    chips: tuple[ChipStatus, ...]
    runs: tuple[str, ...]
    """Ids of the live runs on this host that the agent found."""
    problem: str | None
    """Why chips are missing (libtpu's service unreachable, no chips on the host…), in words; None when read."""
    pid: int | None = field(default=None, compare=False)
    stopped: bool = False
    """Its agent stopped cleanly and said so in this, its last host.json (whose figures are then not current)."""

    def age(self, now: float) -> float:
        """Seconds since the heartbeat (0 when the agent's clock is ahead of this one)."""
        return max(0.0, now - self.heartbeat)

    def state(self, now: float) -> str:
        """``live``, ``stale``, ``clock ahead`` or ``stopped`` at ``now``: the one rule (``heartbeat.judge``)."""
        return heartbeat.judge(self.heartbeat, self.interval, now, stopped=self.stopped)

    def stale(self, now: float) -> bool:
        """The agent stopped writing without a word: more than ``STALE_AFTER_INTERVALS`` intervals since its heartbeat."""
        return self.state(now) == heartbeat.STALE

    def live(self, now: float) -> bool:
        """Its agent reports: its figures are current."""
        return self.state(now) == heartbeat.LIVE

    def to_dict(self, now: float) -> dict[str, Any]:
        """The host as ``tpudash hosts --json`` prints it: its fields, its heartbeat's age and whether it is stale."""
        return {
            "name": self.name,
            "hostname": self.hostname,
            "heartbeat": self.heartbeat,
            "age": round(self.age(now), 3),
            "interval": self.interval,
            "state": self.state(now),
            "stale": self.stale(now),
            "cpu_percent": self.cpu_percent,
            "memory_used": self.memory_used,
            "memory_total": self.memory_total,
            "chips": [
                {
                    "index": chip.index,
                    "duty_cycle": chip.duty_cycle,
                    "hbm_used": chip.hbm_used,
                    "hbm_total": chip.hbm_total,
                }
                for chip in self.chips
            ],
            "runs": list(self.runs),
            "problem": self.problem,
        }


# -- writing (the agent's side) -----------------------------------------------------------------


def host_record(status: HostStatus) -> bytes:
    """host.json's bytes for ``status``: what ``parse_host_record`` reads back."""
    payload = {
        "version": 1,
        "name": status.name,
        "hostname": status.hostname,
        "heartbeat": round(status.heartbeat, 3),
        "interval": status.interval,
        "pid": status.pid,
        "cpu_percent": status.cpu_percent,
        "memory_used": status.memory_used,
        "memory_total": status.memory_total,
        "chips": [
            {"index": chip.index, "duty_cycle": chip.duty_cycle, "hbm_used": chip.hbm_used, "hbm_total": chip.hbm_total}
            for chip in status.chips
        ],
        "runs": list(status.runs),
        "problem": status.problem,
    }
    if status.stopped:
        payload["stopped"] = True
    return json.dumps(payload, sort_keys=True).encode("utf-8")


# -- reading ------------------------------------------------------------------------------------


class BadHostFile(ValueError):
    """A host.json that is not one an agent wrote; the text names the field and what it may hold."""


def _number(record: dict, name: str, low: float, high: float, *, integer: bool = False, required: bool = False) -> Any:
    value = record.get(name)
    if value is None and not required:
        return None
    kind = "a whole number" if integer else "a number"
    ok = is_finite_number(value) and (not integer or isinstance(value, int)) and low <= value <= high
    if not ok:
        raise BadHostFile(f"{name} must be {kind} from {low:g} to {high:g}, not {value!r:.40}")
    number: Any = value  # checked above: a finite int or float
    return int(number) if integer else float(number)


def _text(record: dict, name: str, *, required: bool = False) -> str | None:
    value = record.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT_CHARS:
        raise BadHostFile(f"{name} must be text of 1 to {MAX_TEXT_CHARS} characters, not {value!r:.40}")
    return value


def _chips(value: Any) -> tuple[ChipStatus, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_CHIPS:
        raise BadHostFile(f"chips must be a list of at most {MAX_CHIPS} chips")
    chips = []
    for position, chip in enumerate(value):
        if not isinstance(chip, dict):
            raise BadHostFile(f"chips[{position}] must be an object")
        try:
            chips.append(
                ChipStatus(
                    index=_number(chip, "index", 0, MAX_CHIPS * 16, integer=True, required=True),
                    duty_cycle=_number(chip, "duty_cycle", 0.0, 100.0),
                    hbm_used=_number(chip, "hbm_used", 0, MAX_BYTES, integer=True),
                    hbm_total=_number(chip, "hbm_total", 0, MAX_BYTES, integer=True),
                )
            )
        except BadHostFile as error:
            raise BadHostFile(f"chips[{position}].{error}") from None
    return tuple(chips)


def _runs(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_RUNS:
        raise BadHostFile(f"runs must be a list of at most {MAX_RUNS} run ids")
    for run_id in value:
        if not isinstance(run_id, str) or len(run_id) > MAX_TEXT_CHARS or not is_run_id(run_id):
            raise BadHostFile(f"runs must hold run ids, not {run_id!r:.40}")
    return tuple(value)


def parse_host_record(data: bytes, name: str) -> HostStatus:
    """host.json's bytes as a HostStatus; BadHostFile naming the field that breaks its rule.

    ``name`` is the host's folder: a record that names another host is refused.
    """
    try:
        record = parse_run_file(data)
    except ValueError as error:
        raise BadHostFile(f"not JSON ({error})") from None
    if not isinstance(record, dict):
        raise BadHostFile("not a JSON object")
    if record.get("name") != name:
        raise BadHostFile(f"name must be the host's folder name {name!r}, not {record.get('name')!r:.40}")
    beat = record.get("heartbeat")
    if not is_sane_timestamp(beat):
        raise BadHostFile(f"heartbeat must be a unix time (1970 to 9999), not {beat!r:.40}")
    stopped = record.get("stopped", False)
    if not isinstance(stopped, bool):
        raise BadHostFile(f"stopped must be true or false, not {stopped!r:.40}")
    return HostStatus(
        name=name,
        hostname=_text(record, "hostname") or name,
        heartbeat=float(beat),  # type: ignore[arg-type]  # checked above: a sane unix time
        interval=_number(record, "interval", *INTERVAL_RANGE_SECONDS, required=True),
        cpu_percent=_number(record, "cpu_percent", 0.0, 100.0),
        memory_used=_number(record, "memory_used", 0, MAX_BYTES, integer=True),
        memory_total=_number(record, "memory_total", 0, MAX_BYTES, integer=True),
        chips=_chips(record.get("chips")),
        runs=_runs(record.get("runs")),
        problem=_text(record, "problem"),
        pid=_number(record, "pid", 1, 2**22, integer=True),
        stopped=stopped,
    )


class HostsReader:
    """Every host of a runs directory (a local directory or a store URL); see the module docstring.

    ``problems``: after each ``read``, the host.json files that were skipped, each named with why.
    """

    def __init__(self, runs_dir: Path | str) -> None:
        self.root: LocalRoot | BucketRoot = runs_root(runs_dir)
        self.where = f"{self.root.where.rstrip('/')}/{HOSTS_FOLDER}"
        self.problems: list[str] = []

    def host_names(self) -> list[str]:
        """The hosts' folders under ``hosts/`` (one listing), newest first where the listing tells, else by name.

        A folder that is no host name is named in ``problems``.
        """
        try:
            # Locally by the folders' times; a store's folders have none (all 0): by name.
            timed = self.root.folders_by_time(HOSTS_FOLDER)
        except (FileNotFoundError, NotADirectoryError):
            return []
        names = {name for _, name in timed}
        bad = sorted(name for name in names if not is_host_name(name))
        for name in bad[:10]:
            if not name.startswith("."):
                self.problems.append(f"{HOSTS_FOLDER}/{name!r:.80}: not a host name ({HOST_NAME_RULE}); skipped")
        good = [(stamp, name) for stamp, name in timed if is_host_name(name)]
        return [name for _, name in sorted(good, key=lambda pair: (-pair[0], pair[1]))]

    def read(self, now: float | None = None) -> list[HostStatus]:
        """Every host that reports (sorted by name), stale ones included; ``now`` is accepted for the callers' symmetry.

        Staleness is the caller's to judge at its own ``now`` (``HostStatus.state``).
        Batches of host.json are read until ``MAX_HOSTS`` hosts are found or
        ``MAX_HOST_FOLDERS_READ`` folders were tried; the folders that hold no
        host.json, and those left unread, are counted in ``problems``.
        """
        del now  # a host's record does not depend on when it is read
        self.problems = []
        names = self.host_names()
        empty = heartbeat.Junk(HOSTS_FOLDER, "host reports")
        hosts: list[HostStatus] = []
        tried = 0
        while tried < len(names) and len(hosts) < MAX_HOSTS and tried < MAX_HOST_FOLDERS_READ:
            batch = names[tried : tried + min(MAX_HOSTS - len(hosts), MAX_HOST_FOLDERS_READ - tried)]
            tried += len(batch)
            hosts.extend(self._read_batch(batch, empty))
        # A folder is empty for a moment while an agent writes its first host.json; many of them are junk.
        if empty.count:
            self.problems.append(
                f"{HOSTS_FOLDER}/: {empty.count:,} {'folder holds' if empty.count == 1 else 'folders hold'} "
                f"no {HOST_FILE} ({', '.join(empty.named)}{', …' if empty.count > len(empty.named) else ''}); skipped"
            )
        if tried < len(names):
            self.problems.append(
                f"{HOSTS_FOLDER}/: {len(names) - tried:,} more folders not read "
                f"(at most {MAX_HOSTS} hosts and {MAX_HOST_FOLDERS_READ} folders are read)"
            )
        return sorted(hosts, key=lambda host: host.name)

    def _read_batch(self, names: list[str], empty: heartbeat.Junk) -> list[HostStatus]:
        """The host.json of each of ``names`` in one concurrent batch; a folder without one is added to ``empty``."""
        prefixes = {host_prefix(name): name for name in names}
        found = self.root.read_many(prefixes, HOST_FILE, MAX_HOST_FILE_BYTES)
        hosts = []
        for prefix, name in prefixes.items():
            data = found.get(prefix)
            where = f"{prefix}/{HOST_FILE}"
            if data is None or isinstance(data, FileNotFoundError):
                empty.add(name)
                continue
            if isinstance(data, Exception):
                reason = str(data) if isinstance(data, RefusedFile) else f"unreadable ({type(data).__name__}: {data})"
                self.problems.append(f"{where}: {reason:.300}; skipped")
                continue
            try:
                hosts.append(parse_host_record(data, name))
            except BadHostFile as error:
                self.problems.append(f"{where}: {error}; skipped")
        return hosts
