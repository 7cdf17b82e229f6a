"""Copying runs between runs directories: a local directory and a store, either way, or store to store.

``copy_run(source, run_id, destination)`` copies every file of one run,
written against ``RunStore`` and ``RunFiles`` alone, so it is the same
from a disk to a bucket, a bucket to a disk, or a spill directory
(``uploader.default_spill_dir``) into the store its writer could not reach.

- A file already in the destination with the same size is left alone:
  segments are immutable and named by writer and sequence number, and an
  appended file only grows, so a copy can be run again (after an outage, or
  while a run goes on) and uploads each piece once. The small records that
  are replaced whole (run.json, the writers' heartbeats) are compared by
  content instead.
- run.json is written last: a reader that finds it finds the events it describes.
- ``writer.lock`` (a local flock, meaningless elsewhere) and names starting
  with "." (a writer's temporary files) are not copied.
- A local run whose writer died without finishing it reads as
  ``interrupted`` here, but a store judges liveness by heartbeats only, and
  a copy has none: its run.json is copied with the status ``interrupted``
  (and the last metrics read from its events), so the copy reads as the
  source does rather than as running forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpudash.runs.layout import (
    EVENTS_STREAM,
    MAX_RUN_FILE_BYTES,
    RUN_FILE,
    RUN_ID_RULE,
    STATUS_INTERRUPTED,
    STATUS_RUNNING,
    RefusedFile,
    is_run_id,
    parse_run_file,
    record_bytes,
)
from tpudash.runs.liveness import WRITER_FILE, WRITERS_FOLDER
from tpudash.runs.store import RunStore

# One file is held in memory while it is copied: a larger one is refused, named, and the rest still copied.
MAX_COPY_FILE_BYTES = 1 << 30


@dataclass
class CopyReport:
    """What one run's copy did."""

    run_id: str
    destination: str
    """Where the copy is, as a user reads it: ``gs://bucket/runs/<run id>`` or a directory."""
    copied: int = 0
    copied_bytes: int = 0
    skipped: int = 0
    """Files already in the destination, the same."""
    still_running: bool = False
    """The source run's writer is still writing it: the copy is of the run as it was; copy again once it ends."""
    refused: tuple[str, ...] = ()
    """Files that were not copied, with why (too large, not a regular file)."""


def is_copied(name: str) -> bool:
    """Whether a run's file goes with the run: not the local lock, not a temporary file."""
    parts = name.split("/")
    return name != WRITER_FILE and not any(part.startswith(".") or not part for part in parts)


def is_record(name: str) -> bool:
    """run.json and the heartbeats: replaced whole by their writer, so a same size says nothing."""
    return name == RUN_FILE or name.startswith(f"{WRITERS_FOLDER}/")


def split_run_location(location: Path | str) -> tuple[Path | str, str]:
    """A run's location (its directory, or its URL) as the runs directory it is in and its id; ValueError if none."""
    if isinstance(location, str):
        parent, _, run_id = location.rstrip("/").rpartition("/")
        runs_dir: Path | str = parent + "/" if parent.endswith(":/") else parent  # memory://RUN: the store's root
    else:
        location = location.absolute()
        runs_dir, run_id = location.parent, location.name
    if not is_run_id(run_id):
        raise ValueError(RUN_ID_RULE)
    return runs_dir, run_id


def same_place(one: Path | str, other: Path | str) -> bool:
    """Whether two runs directories are the same one (a local path however it is spelled)."""
    if isinstance(one, Path) and isinstance(other, Path):
        return one.resolve() == other.resolve()
    return str(one).rstrip("/") == str(other).rstrip("/")


def copy_run(source: RunStore, run_id: str, destination: RunStore) -> CopyReport:
    """Copy run ``run_id`` of ``source`` into ``destination``, each file once; see the module docstring.

    Raises what the stores raise when they cannot be reached (a copy run
    again goes on where this one stopped); a file that cannot be copied (too
    large, not a regular file) is named in the report.
    """
    source_files, target = source.files(run_id), destination.files(run_id)
    report = CopyReport(run_id=run_id, destination=target.where)
    present = {name: size for name, size in source_files.walk().items() if is_copied(name)}
    if not present:
        raise FileNotFoundError(f"{source_files.where}: no such run, or it holds no files")
    there = target.walk()
    refused: list[str] = []
    # run.json last (a reader that finds it finds its events); the events before the rest.
    order = sorted(present, key=lambda name: (name == RUN_FILE, not name.startswith(f"{EVENTS_STREAM}/"), name))
    for name in order:
        try:
            if name == RUN_FILE:
                data = _record_to_copy(source, run_id, report)
            elif name in there and not is_record(name) and there[name] == present[name]:
                report.skipped += 1
                continue
            else:
                data = source_files.read(name, MAX_COPY_FILE_BYTES)
            if is_record(name) and name in there and target.read(name, MAX_COPY_FILE_BYTES) == data:
                report.skipped += 1
                continue
        except FileNotFoundError:
            continue  # removed since the listing (a spill uploaded by its own writer meanwhile)
        except RefusedFile as error:  # too large, or not a regular file: named, and the rest still goes
            refused.append(f"{name}: {error}")
            continue
        target.write(name, data)
        report.copied += 1
        report.copied_bytes += len(data)
    report.refused = tuple(refused)
    return report


def _record_to_copy(source: RunStore, run_id: str, report: CopyReport) -> bytes:
    """run.json as the copy should hold it: as it is, but a dead local writer's ``running`` made ``interrupted``."""
    data = source.files(run_id).read(RUN_FILE, MAX_RUN_FILE_BYTES)
    info = source.info(run_id)
    report.still_running = info.live
    try:
        meta = parse_run_file(data)
    except ValueError:
        return data  # copied as it is: the copy reads it as the source does, from its events
    if not (isinstance(meta, dict) and meta.get("status") == STATUS_RUNNING and info.status == STATUS_INTERRUPTED):
        return data
    # As the source reads it: the last metrics and time come from its events (``RunStore._refresh_from_events``).
    meta["status"] = STATUS_INTERRUPTED
    meta["finished"] = meta.get("finished") or info.finished
    meta["final_metrics"] = {**(meta.get("final_metrics") or {}), **info.final_metrics}
    return record_bytes(meta)
