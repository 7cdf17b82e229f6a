"""The runs directory's files, wherever they are: a local directory, or an object store through fsspec.

``runs_root(runs_dir)`` gives a ``LocalRoot`` or a ``BucketRoot``; both list
run ids and hand out a ``RunFiles`` per run: open a file, list a folder's
files, read a capped file, replace a file whole, and a key that changes
when a file does. Everything above (``store``, ``follow``, ``segments``)
is written against these, so a run reads the same from a disk or a bucket.

Locally only regular files are opened and links are never followed
(``layout.open_regular``). In a store there are no links or devices; sizes
are still capped, and an object's generation (GCS) or ETag (S3) is its key.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from jobs.events import is_finite_number
from tpudash.runs.layout import HOSTS_FOLDER as HOSTS_FOLDER  # defined with the run id's rule, used from here too
from tpudash.runs.layout import RESERVED_FOLDERS as RESERVED_FOLDERS
from tpudash.runs.layout import RefusedFile, is_run_id, open_regular, size_words, write_bytes_atomically
from tpudash.runs.location import MissingBucket, bucket_of, is_store_url, open_filesystem
from tpudash.runs.storeclient import describe_store, open_for_reading

# How many objects a store is asked for at once when many small files are read (History's first look).
STORE_READ_CONCURRENCY = 64
# How many objects one call of a batch read asks for: a call is timed out whole (--store-timeout, 8 s by
# default), and ten thousand run.json take longer than that; a thousand take about a second.
STORE_READS_PER_CALL = 1_000


def is_listed_run_id(name: str) -> bool:
    """Whether a runs directory's entry named ``name`` is listed as a run: a run id, and no reserved folder."""
    return is_run_id(name)  # which refuses the reserved folders (``layout.is_reserved_name``)


TimedNames = list[tuple[float, str]]
"""(when written, name) pairs: what a listing of a folder gives, newest first once sorted (``heartbeat.newest_first``)."""


@dataclass(frozen=True)
class ListedFile:
    """One file as a listing shows it, without reading it: what changes when it does, and when it was written."""

    key: tuple
    written: float
    """Unix time, by the store's clock (locally the file's mtime); 0 when the listing does not say."""


class RunFiles(Protocol):
    """One run's files; names are relative to the run (``run.json``, ``events/w-00000001.jsonl``)."""

    where: str
    """The run's location as a user reads it: a directory, or a URL."""

    @property
    def local_dir(self) -> Path | None:
        """The run's directory on this host's disk (where locks, links and appends exist); None in a store."""
        ...

    def open(self, name: str) -> BinaryIO: ...

    def list(self, folder: str) -> list[str]: ...

    def read(self, name: str, max_bytes: int) -> bytes: ...

    def write(self, name: str, data: bytes) -> None: ...

    def key(self, name: str) -> tuple | None: ...

    def exists(self) -> bool: ...

    def walk(self) -> dict[str, int]: ...

    def list_by_time(self, folder: str) -> TimedNames: ...


class RunsRoot(Protocol):
    """A runs directory: its runs by id, and each run's files."""

    where: str
    local: bool

    @property
    def runs_dir(self) -> Path | str:
        """The runs directory as given: a Path on this host, a URL in a store."""
        ...

    def folders_by_time(self, folder: str) -> list[tuple[float, str]]: ...

    def files_by_run(self) -> dict[str, dict[str, ListedFile]]: ...

    def read_files(
        self, wanted: Iterable[tuple[str, str]], max_bytes: int
    ) -> dict[tuple[str, str], bytes | Exception]: ...

    def run_ids(self) -> list[str]: ...

    def files(self, run_id: str) -> RunFiles: ...

    def read_many(self, run_ids: Iterable[str], name: str, max_bytes: int) -> dict[str, bytes | Exception]: ...

    def prepare(self) -> None: ...


def too_large(name: str, max_bytes: int) -> RefusedFile:
    return RefusedFile(errno.EFBIG, f"{Path(name).name}: larger than {size_words(max_bytes)}")


class LocalRunFiles:
    """A run directory on this host's disk."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.where = str(run_dir)

    @property
    def local_dir(self) -> Path:
        return self.run_dir

    def open(self, name: str) -> BinaryIO:
        return open_regular(self.run_dir / name)

    def list_by_time(self, folder: str) -> list[tuple[float, str]]:
        """(modification time, name) of the regular files in ``folder`` (one scan); [] when it is absent."""
        try:
            return entries_by_time(self.run_dir / folder, folders=False)
        except OSError:
            return []

    def list(self, folder: str) -> list[str]:
        """The regular files in ``folder``, by name (links and anything else are left out); [] when absent."""
        try:
            with os.scandir(self.run_dir / folder) as scan:
                return sorted(entry.name for entry in scan if entry.is_file(follow_symlinks=False))
        except OSError:
            return []

    def read(self, name: str, max_bytes: int) -> bytes:
        with open_regular(self.run_dir / name, max_bytes) as handle:
            # As much as the file holds, not the cap: read(n) reserves n bytes first, and the cap is a
            # GiB where a writer reads back its spilled segments. One byte past what fstat said, and
            # the rest up to one past the cap if the file grew since: a file over the cap is still refused.
            size = min(os.fstat(handle.fileno()).st_size, max_bytes)
            data = handle.read(size + 1)
            if len(data) > size:
                data += handle.read(max_bytes + 1 - len(data))
        if len(data) > max_bytes:
            raise too_large(name, max_bytes)
        return data

    def write(self, name: str, data: bytes) -> None:
        path = self.run_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomically(path, data)

    def key(self, name: str) -> tuple | None:
        try:
            status = os.lstat(self.run_dir / name)  # a link is not followed here either
        except OSError:
            return None
        return name, status.st_mtime_ns, status.st_size

    def exists(self) -> bool:
        return self.run_dir.is_dir() and not self.run_dir.is_symlink()

    def walk(self) -> dict[str, int]:
        """Every regular file of the run at any depth, by name relative to it, with its size (links never followed)."""
        found: dict[str, int] = {}
        for folder, folders, names in os.walk(self.run_dir):  # os.walk follows no links to directories
            folders[:] = [name for name in folders if not name.startswith(".")]
            for name in names:
                path = Path(folder, name)
                try:
                    status = path.lstat()
                except OSError:
                    continue  # gone since the listing
                if stat.S_ISREG(status.st_mode):
                    found[path.relative_to(self.run_dir).as_posix()] = status.st_size
        return found


class LocalRoot:
    """A runs directory on this host."""

    local = True

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.where = str(self.path)

    @property
    def runs_dir(self) -> Path:
        return self.path

    def folders_by_time(self, folder: str) -> list[tuple[float, str]]:
        """(modification time, name) of the folders in ``folder``; FileNotFoundError or NotADirectoryError when absent."""
        return entries_by_time(self.path / folder, folders=True)

    def files_by_run(self) -> dict[str, dict[str, ListedFile]]:
        """Every run's files at any depth by name (a walk of each run): what one listing of a store gives."""
        found: dict[str, dict[str, ListedFile]] = {}
        for run_id in self.run_ids():
            files = self.files(run_id)
            listed = found.setdefault(run_id, {})
            for name in files.walk():
                key = files.key(name)
                if key is not None:
                    listed[name] = ListedFile(key, key[1] / 1e9)
        return found

    def run_ids(self) -> list[str]:
        """Every run directory's name; a symbolic link to a directory is listed (the store says it is not read)."""
        try:
            with os.scandir(self.path) as scan:
                names = [
                    entry.name
                    for entry in scan
                    if is_listed_run_id(entry.name) and (entry.is_dir(follow_symlinks=False) or _links_to_dir(entry))
                ]
        except OSError:
            return []
        return sorted(names)

    def files(self, run_id: str) -> LocalRunFiles:
        return LocalRunFiles(self.path / run_id)

    def read_many(self, run_ids: Iterable[str], name: str, max_bytes: int) -> dict[str, bytes | Exception]:
        found = self.read_files(((run_id, name) for run_id in run_ids), max_bytes)
        return {run_id: data for (run_id, _), data in found.items()}

    def read_files(self, wanted: Iterable[tuple[str, str]], max_bytes: int) -> dict[tuple[str, str], bytes | Exception]:
        """Files of many runs, by (run id, name): the bytes, or the error reading them."""
        found: dict[tuple[str, str], bytes | Exception] = {}
        for run_id, name in wanted:
            try:
                found[run_id, name] = self.files(run_id).read(name, max_bytes)
            except OSError as error:
                found[run_id, name] = error
        return found

    def prepare(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)


def entries_by_time(folder: Path, *, folders: bool) -> list[tuple[float, str]]:
    """(modification time, name) of the regular files, or the folders, directly in ``folder``; links left out.

    One scan; an entry gone between the scan and its stat is left out. Raises
    what ``os.scandir`` raises (a missing folder: FileNotFoundError), so each
    caller says what a missing folder means to it.
    """
    timed: list[tuple[float, str]] = []
    with os.scandir(folder) as scan:
        for entry in scan:
            try:
                wanted = entry.is_dir(follow_symlinks=False) if folders else entry.is_file(follow_symlinks=False)
                if wanted:
                    timed.append((entry.stat(follow_symlinks=False).st_mtime, entry.name))
            except OSError:
                continue  # gone since the scan
    return timed


def _links_to_dir(entry: os.DirEntry) -> bool:
    """A symbolic link to a directory: listed so the user sees it, never read through."""
    try:
        return entry.is_symlink() and entry.is_dir()
    except OSError:
        return False


def listed_time(entry: dict[str, Any]) -> float:
    """When a store's listing says an object was written (unix time); 0 when it does not say."""
    for name in ("mtime", "LastModified", "updated", "created", "last_modified"):
        value = entry.get(name)
        if isinstance(value, datetime):
            return value.timestamp()
        if is_finite_number(value):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0


def object_key(info: dict[str, Any]) -> tuple:
    """What changes when an object does: its generation (GCS), ETag (S3), else its time, with its size."""
    for field in ("generation", "ETag", "etag", "mtime", "LastModified", "updated", "created"):
        if info.get(field) is not None:
            return field, str(info[field]), info.get("size")
    return "size", None, info.get("size")


class BucketRunFiles:
    """A run's prefix in an object store."""

    def __init__(self, filesystem: Any, prefix: str, url: str) -> None:
        self.filesystem = filesystem
        self.prefix = prefix
        self.where = url

    local_dir = None
    """A store's run has no directory on this host."""

    def _path(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def list_by_time(self, folder: str) -> list[tuple[float, str]]:
        """(time the listing gives, name) of the objects directly in ``folder``; [] when there are none."""
        try:
            entries = self.filesystem.ls(self._path(folder), detail=True, refresh=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [
            (listed_time(entry), str(entry["name"]).rpartition("/")[2])
            for entry in entries
            if entry.get("type") == "file"
        ]

    def open(self, name: str) -> BinaryIO:
        info = self.filesystem.info(self._path(name), refresh=True)  # FileNotFoundError when absent
        if info.get("type") != "file":
            raise RefusedFile(errno.EINVAL, f"{Path(name).name}: not a file")
        size = info.get("size")
        # Each read a bounded request of its own (``storeclient``): a client's file would retry as long as it likes.
        return open_for_reading(self.filesystem, self._path(name), size if isinstance(size, int) else None)

    def list(self, folder: str) -> list[str]:
        """The objects directly in ``folder``, by name; [] when there are none."""
        try:
            entries = self.filesystem.ls(self._path(folder), detail=True, refresh=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        names = (entry["name"].rsplit("/", 1)[-1] for entry in entries if entry.get("type") == "file")
        return sorted(name for name in names if name and not name.startswith("."))

    def read(self, name: str, max_bytes: int) -> bytes:
        data = self.filesystem.cat_file(self._path(name), start=0, end=max_bytes + 1)
        if len(data) > max_bytes:
            raise too_large(name, max_bytes)
        return bytes(data)

    def write(self, name: str, data: bytes) -> None:
        # An object is replaced whole by one upload: a reader sees the old or the new one, never half.
        self.filesystem.pipe_file(self._path(name), data)

    def key(self, name: str) -> tuple | None:
        try:
            return object_key(self.filesystem.info(self._path(name), refresh=True))
        except FileNotFoundError:
            return None

    def exists(self) -> bool:
        try:
            return bool(self.filesystem.ls(self.prefix, detail=False, refresh=True))
        except (FileNotFoundError, NotADirectoryError):
            return False

    def walk(self) -> dict[str, int]:
        """Every object under the run's prefix, by name relative to it, with its size (one paged listing)."""
        self.filesystem.invalidate_cache(self.prefix)  # what another process wrote since this one last listed
        try:
            listed = self.filesystem.find(self.prefix, detail=True)
        except FileNotFoundError:
            return {}
        base = self.prefix.strip("/") + "/"
        return {
            path.strip("/")[len(base) :]: int(info.get("size") or 0)
            for path, info in listed.items()
            if info.get("type", "file") == "file" and path.strip("/").startswith(base)
        }


class BucketRoot:
    """A runs directory in an object store (``gs://``, ``s3://``, ``memory://``)."""

    local = False

    def __init__(self, url: str) -> None:
        self.url = url
        self.where = url
        self.filesystem, self.root = open_filesystem(url)

    @property
    def runs_dir(self) -> str:
        return self.url

    def folders_by_time(self, folder: str) -> list[tuple[float, str]]:
        """The folders in ``folder`` (one listing), all at time 0: a store's folders have no time of their own.

        FileNotFoundError or NotADirectoryError when there is none.
        """
        entries = self.filesystem.ls(f"{self.root}/{folder}", detail=True, refresh=True)
        return [
            (0.0, entry["name"].rstrip("/").rsplit("/", 1)[-1]) for entry in entries if entry.get("type") == "directory"
        ]

    def files_by_run(self) -> dict[str, dict[str, ListedFile]]:
        """Every object under the runs directory by run and name, from one recursive listing (paged by the library).

        What a judge of many runs asks once instead of once per run: each
        run.json's key and each heartbeat's time, in a request per thousand objects.
        """
        try:
            listed = self.filesystem.find(self.root, detail=True)
        except FileNotFoundError:
            return {}
        finally:
            # The listing filled the client's cache of folders, which its ``info`` answers from even when
            # asked to refresh: a key asked later must come from the store, not from this listing.
            self.filesystem.invalidate_cache()
        base = self.root.strip("/") + "/"
        found: dict[str, dict[str, ListedFile]] = {}
        for path, entry in listed.items():
            relative = path.strip("/")
            if entry.get("type", "file") != "file" or not relative.startswith(base):
                continue
            run_id, _, name = relative[len(base) :].partition("/")
            if name and is_listed_run_id(run_id):
                found.setdefault(run_id, {})[name] = ListedFile(object_key(entry), listed_time(entry))
        return found

    def run_ids(self) -> list[str]:
        """Every run prefix (one listing, paged by the library), by name; MissingBucket when there is no bucket."""
        try:
            entries = self.filesystem.ls(self.root, detail=True, refresh=True)
        except FileNotFoundError:
            entries = []
        if not entries:
            self.check_bucket()  # an empty listing: no runs yet, or a bucket that is not there (a typo)
        names = (entry["name"].rstrip("/").rsplit("/", 1)[-1] for entry in entries if entry.get("type") == "directory")
        return sorted(name for name in names if is_listed_run_id(name))

    def check_bucket(self) -> None:
        """MissingBucket naming it when the URL's bucket does not exist (one request; a prefix needs none)."""
        bucket = bucket_of(self.url)
        if not bucket:
            return
        try:
            there = self.filesystem.exists(bucket)
        except PermissionError:
            return  # it exists, these credentials may not look at it: the listing said what they may see
        if not there:
            store = describe_store(self.url)
            unseen = "" if "emulator" in store or store.startswith("memory") else " (or none these credentials may see)"
            raise MissingBucket(f"{self.url}: there is no bucket {bucket!r} in {store}{unseen}; check its name")

    def files(self, run_id: str) -> BucketRunFiles:
        return BucketRunFiles(self.filesystem, f"{self.root}/{run_id}", f"{self.url}/{run_id}")

    def read_many(self, run_ids: Iterable[str], name: str, max_bytes: int) -> dict[str, bytes | Exception]:
        """One file of many runs, fetched concurrently (fsspec batches them): History's first look at a bucket."""
        found = self.read_files(((run_id, name) for run_id in run_ids), max_bytes)
        return {run_id: data for (run_id, _), data in found.items()}

    def read_files(self, wanted: Iterable[tuple[str, str]], max_bytes: int) -> dict[tuple[str, str], bytes | Exception]:
        """Files of many runs by (run id, name), fetched concurrently in one batch: the bytes, or the error."""
        paths = {f"{self.root}/{run_id}/{name}": (run_id, name) for run_id, name in wanted}
        if not paths:
            return {}
        found: dict[tuple[str, str], bytes | Exception] = {}
        listed = list(paths)
        results: dict[str, Any] = {}
        for first in range(0, len(listed), STORE_READS_PER_CALL):
            # Each call within the store's timeout (--store-timeout), however many runs the bucket holds.
            batch = listed[first : first + STORE_READS_PER_CALL]
            results.update(self.filesystem.cat(batch, on_error="return", batch_size=STORE_READ_CONCURRENCY))
        for path, data in results.items():
            wanted_as = paths.get(path) or paths.get(path.lstrip("/")) or paths.get("/" + path)
            if wanted_as is None:
                continue
            if isinstance(data, Exception):
                found[wanted_as] = data
            elif len(data) > max_bytes:
                found[wanted_as] = too_large(wanted_as[1], max_bytes)
            else:
                found[wanted_as] = bytes(data)
        return found

    def prepare(self) -> None:
        """Nothing to create: a prefix exists once an object is written under it."""


def runs_root(runs_dir: Path | str) -> LocalRoot | BucketRoot:
    """The root of ``runs_dir``: a store URL (see ``tpudash.runs.location``) or a local directory."""
    if is_store_url(runs_dir):
        return BucketRoot(str(runs_dir))
    return LocalRoot(Path(runs_dir))
