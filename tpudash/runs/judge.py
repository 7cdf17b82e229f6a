"""Whether running runs' writers are still writing them, judged for a whole scan of a runs directory at once.

A run whose run.json says ``running`` is live while its writer is: locally
by its lock (``liveness.writer_alive``, a system call, judged at every
scan), in a store by its writers' heartbeats (``writers/<writer>.json``).
One run alone is judged as it always was (``judge_one``: a listing of its
``writers/`` and a read per heartbeat). A scan of many runs in a store is
judged from one recursive listing of the runs directory instead
(``listing``, when it costs fewer requests than asking the runs one by one;
``judge_listed``, fed by ``RunsRoot.files_by_run``): every run.json's key
and every heartbeat's key come from it, the heartbeats not read before (or
replaced since) are fetched in one concurrent batch, and a heartbeat whose
key did not change is not read again, so a crashed writer's run costs no
request of its own.

A run judged not alive is *silent*: its verdict is kept and it is not due
(``due``) for ``SILENT_FIRST_SECONDS``, then twice as long each time it is
found silent again, up to ``SILENT_MAX_SECONDS``. Whenever a scan lists the
store anyway (more than ``ONE_BY_ONE_RUNS`` runs are due), every running run
is judged again from that listing at no cost of its own, and a run whose
run.json's key changed starts its backoff over. So a writer that comes back
(it was cut off from the store) is seen live at most ``SILENT_MAX_SECONDS``
after its heartbeat returns, by the next scan after that; ``info`` of one
run always judges it at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tpudash.runs import heartbeat, liveness
from tpudash.runs.backends import ListedFile, RunsRoot
from tpudash.runs.layout import RefusedFile
from tpudash.runs.liveness import MAX_HEARTBEAT_BYTES, WRITERS_FOLDER
from tpudash.runs.records import RunInfo, copy_info

ONE_BY_ONE_RUNS = 8
"""Up to this many runs due in a scan are judged one by one (a few requests each); more, from one listing …"""
REQUESTS_PER_RUN = 3
"""… unless that listing takes more requests than judging them one by one would (a key, a listing, a read each) …"""
OBJECTS_PER_PAGE = 1000
"""… a listing's request bringing this many objects (GCS and S3 page by a thousand)."""
SILENT_FIRST_SECONDS = 15.0
"""How long a run found silent (no live heartbeat) keeps its verdict before it is due again …"""
SILENT_MAX_SECONDS = 120.0
"""… doubling each time it is still silent, up to this: the longest a returning writer can go unseen by scans."""

Listing = dict[str, dict[str, ListedFile]]
"""What ``RunsRoot.files_by_run`` gives: each run's files by name, with their keys and times."""


@dataclass
class Verdict:
    """What was judged of a run's writer: alive (None: it could not be told) and the problems seen on the way."""

    alive: bool | None
    problems: list[str] = field(default_factory=list)


@dataclass
class _Silence:
    due_at: float
    delay: float
    record_key: tuple | None


class WriterJudge:
    """The judge of one runs directory's running runs; keeps verdicts, silences and heartbeats between scans."""

    def __init__(self, root: RunsRoot, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.root = root
        self._clock = clock
        self._verdicts: dict[str, Verdict] = {}
        self._silent: dict[str, _Silence] = {}
        self._beats: dict[str, dict[str, tuple[tuple, bytes | Exception]]] = {}
        """Per run, each heartbeat read (by name in ``writers/``) with the key it had: read again only when it changes."""
        self._live_until: dict[str, tuple[float, tuple | None]] = {}
        """Runs found live from a listing: until when (unix time) that heartbeat stays live, and their run.json's key."""
        self.objects_listed = 0
        """How many objects the last listing of the runs directory held: what the next one will cost."""

    def listing(self, due_runs: int) -> Listing | None:
        """One listing of the runs directory when ``due_runs`` are more than a few and it costs fewer requests than
        judging them one by one; None otherwise, or when the store did not answer it (then: one by one)."""
        pages = -(-self.objects_listed // OBJECTS_PER_PAGE)
        if due_runs <= ONE_BY_ONE_RUNS or pages > REQUESTS_PER_RUN * due_runs:
            return None
        try:
            listing = self.root.files_by_run()
        except Exception:  # noqa: BLE001 - the runs are asked one by one, and say what the store said
            return None
        self.objects_listed = sum(len(files) for files in listing.values())
        return listing

    def due(self, run_id: str) -> bool:
        """Whether a scan should judge the run now: never judged, not silent, or its silence is over."""
        silence = self._silent.get(run_id)
        return run_id not in self._verdicts or silence is None or self._clock() >= silence.due_at

    def last(self, run_id: str) -> Verdict | None:
        """The run's last verdict, kept while it is not due."""
        return self._verdicts.get(run_id)

    def silent_for(self, run_id: str) -> float | None:
        """How long the run keeps its verdict from its last judgment (seconds), None when it is not silent."""
        silence = self._silent.get(run_id)
        return None if silence is None else silence.delay

    def judge_one(self, info: RunInfo) -> Verdict:
        """The run judged now by its own requests (``RunInfo.writer_alive``)."""
        probe = copy_info(info)
        probe.problems = []
        verdict = Verdict(probe.writer_alive(), probe.problems)
        self._remember(info.run_id, verdict, info.record_key)
        return verdict

    def judge_listed(self, runs: Iterable[RunInfo], listing: Listing, now: float | None = None) -> dict[str, Verdict]:
        """Every run of ``runs`` judged from ``listing``, the heartbeats not read before fetched in one batch.

        A run found live stays live without a read until the heartbeat that made it live turns stale by
        the one rule (``heartbeat.judge``): a newer beat only moves that later. Its run.json changing ends that.
        """
        wall = time.time() if now is None else now
        verdicts: dict[str, Verdict] = {}
        judged = []
        for info in runs:
            kept_live = self._live_until.get(info.run_id)
            last = self._verdicts.get(info.run_id)
            if kept_live is not None and last is not None and wall <= kept_live[0] and kept_live[1] == info.record_key:
                verdicts[info.run_id] = last
            else:
                judged.append(info)
        return verdicts | self._judge_listed(judged, listing, now)

    def _judge_listed(self, runs: list[RunInfo], listing: Listing, now: float | None) -> dict[str, Verdict]:
        names: dict[str, list[str]] = {}
        wanted: list[tuple[str, str]] = []
        for info in runs:
            listed = listing.get(info.run_id, {})
            timed = [
                (file.written, name.partition("/")[2])
                for name, file in listed.items()
                if name.startswith(f"{WRITERS_FOLDER}/") and name.count("/") == 1
            ]
            names[info.run_id] = heartbeat.newest_first(timed)
            kept = self._beats.get(info.run_id, {})
            fresh: dict[str, tuple[tuple, bytes | Exception]] = {}
            for name in names[info.run_id][: liveness.MAX_WRITERS_READ]:
                key = listed[f"{WRITERS_FOLDER}/{name}"].key
                if name in kept and kept[name][0] == key:
                    fresh[name] = kept[name]
                elif name.endswith(".json"):
                    wanted.append((info.run_id, f"{WRITERS_FOLDER}/{name}"))
            self._beats[info.run_id] = fresh
        unanswered: list[tuple[str, str]] = []
        for (run_id, path), data in self.root.read_files(wanted, MAX_HEARTBEAT_BYTES).items():
            name = path.partition("/")[2]
            self._beats[run_id][name] = (listing[run_id][path].key, data)
            if isinstance(data, Exception) and not isinstance(data, (FileNotFoundError, RefusedFile)):
                unanswered.append((run_id, name))  # the store did not answer: asked again next time
        verdicts: dict[str, Verdict] = {}
        for info in runs:
            problems: list[str] = []
            try:
                alive: bool | None = liveness.writers_alive(
                    names[info.run_id], _reader(self._beats[info.run_id]), now, problems
                )
            except Exception:  # noqa: BLE001 - the store did not answer for this run: nothing can be told
                alive = None
            verdicts[info.run_id] = verdict = Verdict(alive, problems)
            self._remember(info.run_id, verdict, info.record_key)
            if alive:
                until = _live_until(self._beats[info.run_id], now)
                if until is not None:
                    self._live_until[info.run_id] = (until, info.record_key)
        for run_id, name in unanswered:
            self._beats[run_id].pop(name, None)
        return verdicts

    def forget(self, run_id: str) -> None:
        """The run ended: nothing of it is judged again."""
        self._verdicts.pop(run_id, None)
        self._silent.pop(run_id, None)
        self._beats.pop(run_id, None)
        self._live_until.pop(run_id, None)

    def _remember(self, run_id: str, verdict: Verdict, record_key: tuple | None) -> None:
        self._verdicts[run_id] = verdict
        self._live_until.pop(run_id, None)
        if verdict.alive is not False:
            self._silent.pop(run_id, None)  # live, or the store could not be asked: due at the next scan
            return
        before = self._silent.get(run_id)
        if before is not None and before.record_key == record_key:
            delay = min(before.delay * 2, SILENT_MAX_SECONDS)
        else:
            delay = SILENT_FIRST_SECONDS  # newly silent, or its run.json changed: looked at again soon
        self._silent[run_id] = _Silence(self._clock() + delay, delay, record_key)


def _live_until(beats: dict[str, tuple[tuple, bytes | Exception]], now: float | None) -> float | None:
    """Until when (unix time) the latest live beat of a chief or sole writer among ``beats`` stays live; None: none."""
    until = None
    for _, data in beats.values():
        if isinstance(data, Exception) or liveness.beat_state(data, now) != heartbeat.LIVE:
            continue
        payload = heartbeat.parse_beat(data)
        if payload is None or liveness.beats_for_another_worker(data):
            continue
        interval = heartbeat.interval_or(payload.get("interval"), liveness.HEARTBEAT_INTERVAL_SECONDS)
        ends = float(payload["heartbeat"]) + heartbeat.stale_after(interval)
        until = ends if until is None else max(until, ends)
    return until


def _reader(beats: dict[str, tuple[tuple, bytes | Exception]]) -> Callable[[str], bytes]:
    def read(name: str) -> bytes:
        found = beats.get(name)
        if found is None:
            raise FileNotFoundError(name)  # not fetched: gone since the listing
        data = found[1]
        if isinstance(data, Exception):
            raise data
        return data

    return read
