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
- A symbolic link at ``DEST/<run id>`` or anywhere inside it is never
  written through (nor replaced): the copy is refused before any file is
  written, naming the link (``LinkInTheWay``), and each local file is then
  written through descriptors that follow no link, so one swapped in while
  the copy runs is refused too. The runs directory ``DEST`` itself may be a
  link: that is where the user keeps runs.
- A local run whose writer died without finishing it reads as
  ``interrupted`` here, but a store judges liveness by heartbeats only, and
  a copy has none: its run.json is copied with the status ``interrupted``
  (and the last metrics read from its events), so the copy reads as the
  source does rather than as running forever.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tpudash.runs.backends import RunFiles
from tpudash.runs.layout import (
    EVENTS_STREAM,
    MAX_RUN_FILE_BYTES,
    RUN_FILE,
    STATUS_INTERRUPTED,
    STATUS_RUNNING,
    RefusedFile,
    checked_run_id,
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
    return runs_dir, checked_run_id(run_id, field=None)


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
    source_files, target = source.files(checked_run_id(run_id)), destination.files(run_id)
    report = CopyReport(run_id=run_id, destination=target.where)
    present = {name: size for name, size in source_files.walk().items() if is_copied(name)}
    if not present:
        raise FileNotFoundError(f"{source_files.where}: no such run, or it holds no files")
    if target.local_dir is not None:
        refuse_links_in_the_way(target.local_dir, present)  # before anything is written, or listed through a link
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
        _write(target, name, data)
        report.copied += 1
        report.copied_bytes += len(data)
    report.refused = tuple(refused)
    return report


class LinkInTheWay(RefusedFile):
    """A symbolic link where a copy would write (``DEST/<run id>`` or inside it): never written through."""

    def __init__(self, path: Path) -> None:
        super().__init__(errno.ELOOP, f"{path}: a symbolic link; a copy never writes through one (remove it)")
        self.path = path


def refuse_links_in_the_way(run_dir: Path, names: Iterable[str]) -> None:
    """LinkInTheWay naming the first link at ``run_dir`` or on the way to one of ``names`` (files inside it)."""
    checked: set[Path] = set()
    for name in ["", *names]:
        path = run_dir
        for part in [None, *(name.split("/") if name else [])]:
            path = path / part if part else path
            if path in checked:
                continue
            checked.add(path)
            try:
                if stat.S_ISLNK(os.lstat(path).st_mode):
                    raise LinkInTheWay(path)
            except FileNotFoundError:
                break  # nothing there yet: the copy makes it, and below it nothing is there either


def _write(target: RunFiles, name: str, data: bytes) -> None:
    if target.local_dir is not None:
        write_without_links(target.local_dir, name, data)
    else:
        target.write(name, data)  # a store: an object replaced whole, no links


def write_without_links(run_dir: Path, name: str, data: bytes) -> None:
    """``name`` (a '/'-separated path inside ``run_dir``) written whole, through no symbolic link.

    Folders are made and opened one by one with O_NOFOLLOW from ``run_dir``
    down (its parent, the runs directory, is the user's and may be a link);
    the file goes to a fresh temp file beside its name (O_EXCL), is fsynced,
    then renamed over it, so a reader sees the old file or the new one.
    LinkInTheWay when a link is met, whenever it was put there.
    """
    *folders, leaf = name.split("/")
    run_dir.parent.mkdir(parents=True, exist_ok=True)  # the runs directory: the user's, links and all
    descriptor = _open_folder(None, run_dir, run_dir)
    try:
        shown = run_dir
        for folder in folders:
            shown = shown / folder
            inner = _open_folder(descriptor, folder, shown)
            os.close(descriptor)
            descriptor = inner
        try:
            if stat.S_ISLNK(os.stat(leaf, dir_fd=descriptor, follow_symlinks=False).st_mode):
                raise LinkInTheWay(shown / leaf)
        except FileNotFoundError:
            pass
        temporary = f".{leaf}.{os.getpid()}.{threading.get_ident()}.{secrets.token_hex(4)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        handle = os.open(temporary, flags, 0o644, dir_fd=descriptor)
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write(data)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temporary, leaf, src_dir_fd=descriptor, dst_dir_fd=descriptor)
        except BaseException:
            os.unlink(temporary, dir_fd=descriptor)
            raise
    finally:
        os.close(descriptor)


def _open_folder(parent: int | None, name: str | Path, shown: Path) -> int:
    """A descriptor of the folder ``name`` (in ``parent``), made if absent, never through a link."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
    except FileExistsError:
        pass
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR) and shown.is_symlink():
            raise LinkInTheWay(shown) from None
        raise


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
