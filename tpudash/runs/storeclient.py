"""A store that does not answer: one bounded wait for every call, the outages this process saw, and their words.

Every filesystem a runs directory in a store is read or written through
(``location.open_filesystem``) is a ``BoundedFilesystem``: each call of an
asynchronous client (gcsfs, s3fs) is given ``store_timeout()`` seconds
(``--store-timeout``, ``TPUDASH_STORE_TIMEOUT``, 10 by default), whatever its
own retries would take (gcsfs tries six times over about half a minute). A
call that gets no answer (refused, cut, timed out, a 5xx) marks its store
unreachable since the moment the call began; the next call that is answered
clears it. So whoever in this process draws a run (the run view's header,
``tpudash watch``) can say "store unreachable since 23:39:27" and stop its
clock there, and a writer in this process adds how many events it holds
locally meanwhile (``held_by``).

``failure_line`` is the one line a command prints for a store it could not
reach: the URL, what the store is (GCS, an emulator at an address, S3) and
why. Textual-free, TensorFlow-free; the store's libraries are imported only
by whoever opens a store.
"""

from __future__ import annotations

import inspect
import io
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

DEFAULT_STORE_TIMEOUT = 8.0
STORE_TIMEOUT_RANGE = (1.0, 600.0)
STORE_TIMEOUT_VARIABLE = "TPUDASH_STORE_TIMEOUT"
# A reader of an object asks for this much at a time (gcsfs's own files read ahead 5 MiB).
RANGE_READ_BYTES = 1 << 20
# Names in an error's class hierarchy that mean the store did not answer (aiohttp, botocore, requests, asyncio).
NO_ANSWER_CLASSES = frozenset(
    {
        "TimeoutError",
        "ConnectionError",
        "ClientConnectionError",
        "ServerDisconnectedError",
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ProxyError",
        "ConnectionClosedError",
    }
)

# What a store's client is asked that waits for the store: while the client is still being made, these wait for it
# within their own bounded wait (anything else waits for the client first).
DEFERRED_CALLS = frozenset(
    {"ls", "info", "cat", "cat_file", "pipe", "pipe_file", "find", "exists", "rm", "rm_file", "put_file", "get_file"}
)

_configured_timeout: float | None = None


def parse_store_timeout(text: str) -> float:
    """Seconds from ``text``; ValueError saying what is allowed."""
    low, high = STORE_TIMEOUT_RANGE
    try:
        seconds = float(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a number; allowed: {low:g} to {high:g} seconds") from None
    if not low <= seconds <= high:
        raise ValueError(f"{seconds:g} is out of range; allowed: {low:g} to {high:g} seconds")
    return seconds


def set_store_timeout(seconds: float | None) -> None:
    """This process's wait for a store (the command line's ``--store-timeout``); None: the variable or the default."""
    global _configured_timeout
    _configured_timeout = seconds


def store_timeout() -> float:
    """How long any one call to a store may take: as set, else ``TPUDASH_STORE_TIMEOUT`` (a child's), else 10 s."""
    if _configured_timeout is not None:
        return _configured_timeout
    try:
        return parse_store_timeout(os.environ.get(STORE_TIMEOUT_VARIABLE, ""))
    except ValueError:
        return DEFAULT_STORE_TIMEOUT


class NoAnswer(TimeoutError):
    """A store's call that got no answer within ``store_timeout()``; the text says the wait and the last error."""


def store_key(url: str) -> str:
    """The store a URL is in, as outages are kept: ``gs://bucket`` (a run's URL and its runs directory's agree)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def emulator_endpoint(url: str, environ: dict[str, str] | None = None) -> str | None:
    """The emulator or endpoint a ``gs://`` / ``s3://`` URL is sent to instead of the cloud's, from the environment."""
    environ = dict(os.environ) if environ is None else environ
    scheme = urlsplit(url).scheme
    if scheme == "gs":
        host = environ.get("STORAGE_EMULATOR_HOST", "")
        if host in ("", "default"):
            return None
        return host if host.startswith(("http://", "https://")) else f"http://{host}"
    if scheme == "s3":
        return environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL") or None
    return None


def describe_store(url: str, environ: dict[str, str] | None = None) -> str:
    """What the store is, as a user set it up: ``GCS``, ``the GCS emulator at http://127.0.0.1:4443``, ``S3``…"""
    scheme = urlsplit(url).scheme
    endpoint = emulator_endpoint(url, environ)
    if scheme == "gs":
        return "GCS" if endpoint is None else f"the GCS emulator at {endpoint}"
    if scheme == "s3":
        return "S3" if endpoint is None else f"S3 at {endpoint}"
    return f"{scheme}://"


def no_answer(error: BaseException) -> bool:
    """Whether ``error`` says the store did not answer (rather than answered no: absent, forbidden, bad request)."""
    if isinstance(error, (FileNotFoundError, FileExistsError, PermissionError, NotADirectoryError, IsADirectoryError)):
        return False
    if any(cls.__name__ in NO_ANSWER_CLASSES for cls in type(error).__mro__):
        return True
    status = http_status(error)
    return status is not None and status >= 500


def http_status(error: BaseException) -> int | None:
    """The HTTP status an error carries (gcsfs's ``HttpError.code``, botocore's response), if any."""
    code = getattr(error, "code", None) or getattr(error, "status", None)
    if isinstance(code, int) and 100 <= code < 600:
        return code
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    return None


def one_line(error: BaseException | str, limit: int = 300) -> str:
    """An error (or a text) as one line: ``Type: text`` squeezed, cut at ``limit`` characters."""
    if isinstance(error, BaseException):
        text = " ".join(str(error).split())
        text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    else:
        text = " ".join(error.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- what the store's client said last (tpudash.runs.librarylogs hears it) --------------------

_last_cause: tuple[float, str] | None = None


# What the clients' connection errors say, in the words a user reads.
PLAIN_CAUSES = (
    (
        re.compile(r"Cannot connect to host (?P<host>\S+) .*(Connect call failed|Connection refused)"),
        "connection refused by {host}",
    ),
    (
        re.compile(
            r"Cannot connect to host (?P<host>\S+) .*(Name or service not known|name resolution|nodename nor servname)"
        ),
        "cannot resolve {host}",
    ),
    (re.compile(r"Could not connect to the endpoint URL: \"?(?P<host>[^\"\s]+)"), "cannot connect to {host}"),
)


def plain_cause(text: str) -> str:
    """A client's connection error in plain words (``connection refused by 127.0.0.1:4443``), else as it is."""
    for pattern, words in PLAIN_CAUSES:
        match = pattern.search(text)
        if match is not None:
            return words.format(host=match["host"].removesuffix(":").strip("'\""))
    return text


def heard_cause(text: str) -> None:
    """The latest error a store's client logged while retrying (the reason a timed-out call gave up)."""
    global _last_cause
    _last_cause = (time.monotonic(), plain_cause(one_line(text)))


def cause_since(started: float) -> str | None:
    """The client's latest error if it came after ``started`` (monotonic), else None."""
    cause = _last_cause
    return cause[1] if cause is not None and cause[0] >= started else None


# -- outages ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outage:
    """A store that stopped answering: since when (wall time), why, and what this process's writers hold meanwhile."""

    store: str
    since: float
    reason: str
    held: int = 0

    @property
    def cause(self) -> str:
        """Why, in few words: the client's last error when the reason has one (``connection refused by …``)."""
        return self.reason.rsplit("last error: ", 1)[-1]

    def line(self) -> str:
        """``store unreachable since 23:39:27 · 446 events held locally`` (the count only when a writer here holds some)."""
        since = datetime.fromtimestamp(self.since).strftime("%H:%M:%S")
        held = f" · {self.held} event{'' if self.held == 1 else 's'} held locally" if self.held else ""
        return f"store unreachable since {since}{held}"


_lock = threading.Lock()
_outages: dict[str, tuple[float, str]] = {}
_writers: dict[int, tuple[str, Callable[[], int]]] = {}


def mark_unreachable(url: str, since: float, reason: str) -> None:
    """``url``'s store did not answer a call begun at ``since`` (wall time); the first such call dates the outage."""
    key = store_key(url)
    with _lock:
        first = _outages.get(key)
        _outages[key] = (min(first[0], since) if first else since, reason)


def mark_answered(url: str) -> None:
    with _lock:
        _outages.pop(store_key(url), None)


def outage(url: str | None = None) -> Outage | None:
    """The outage of ``url``'s store now, or with None of any store this process uses (the oldest); None if none."""
    with _lock:
        found = dict(_outages) if url is None else {key: _outages[key] for key in [store_key(url)] if key in _outages}
        writers = list(_writers.values())
    if not found:
        return None
    key, (since, reason) = min(found.items(), key=lambda item: item[1][0])
    held = 0
    for where, pending in writers:
        if store_key(where) == key:
            try:
                held += max(0, int(pending()))
            except Exception:  # noqa: BLE001 - a writer closing meanwhile holds nothing
                continue
    return Outage(key, since, reason, held)


def held_by(url: str, pending: Callable[[], int]) -> Callable[[], None]:
    """Count ``pending()`` (a writer's events not in the store yet) in ``url``'s outages; returns how to stop."""
    token = id(pending)
    with _lock:
        _writers[token] = (url, pending)

    def forget() -> None:
        with _lock:
            _writers.pop(token, None)

    return forget


def forget_outages() -> None:
    """Clear every outage and writer (tests start from a process that saw none)."""
    with _lock:
        _outages.clear()
        _writers.clear()


_spill_counts: dict[Path, tuple[tuple, int]] = {}


def spilled_events(run_dir: Path) -> int:
    """How many events a run's local directory holds for its store (segments spilled while it was away).

    Another process's writer on this host (the dashboard's engine) is seen
    by this: its outage's events are here until they are uploaded. Each
    file is read again only when its size or time changed.
    """
    # Here, not at the top: config imports this module, and layout brings the event protocol (jobs, msgspec),
    # which the dashboard's first frame does without (tests/unit/test_import_graph.py).
    from tpudash.runs.layout import EVENTS_STREAM

    folder = run_dir / EVENTS_STREAM
    try:
        with os.scandir(folder) as scan:
            files = sorted(
                (entry.name, entry.stat(follow_symlinks=False))
                for entry in scan
                if entry.name.endswith(".jsonl") and entry.is_file(follow_symlinks=False)
            )
    except OSError:
        return 0
    signature = tuple((name, status.st_size, status.st_mtime_ns) for name, status in files)
    cached = _spill_counts.get(folder)
    if cached is not None and cached[0] == signature:
        return cached[1]
    count = 0
    for name, _ in files:
        try:
            with open(folder / name, "rb") as segment:
                count += sum(chunk.count(b"\n") for chunk in iter(lambda: segment.read(1 << 16), b""))
        except OSError:
            continue  # uploaded and removed meanwhile
    _spill_counts[folder] = (signature, count)
    return count


class CredentialsMissing(PermissionError):
    """The store refused a request made without credentials, because none were found here; the text says how to."""


def credentials_missing(filesystem: Any, url: str, error: BaseException) -> str | None:
    """Why a refusal is for want of credentials, and what to do, or None when it is not (an emulator needs none)."""
    scheme = urlsplit(url).scheme
    if emulator_endpoint(url) is not None:
        return None
    if scheme == "gs" and http_status(error) in (401, 403):
        method = getattr(getattr(filesystem, "credentials", None), "method", None)
        if method == "anon":
            return (
                "no Google Cloud credentials were found here, and GCS refused the request without them; "
                "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS"
            )
    if scheme == "s3" and any(cls.__name__ == "NoCredentialsError" for cls in type(error).__mro__):
        return (
            "no AWS credentials were found here; run `aws configure`, or set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
        )
    return None


def failure_line(url: str, error: BaseException) -> str:
    """The one line for a store call that failed: ``cannot reach URL (what the store is): why``."""
    where = f"{url} ({describe_store(url)})" if urlsplit(url).scheme in ("gs", "s3") else url
    if isinstance(error, CredentialsMissing):
        return f"{where}: {error}"
    reason = str(error) if isinstance(error, NoAnswer) else plain_cause(one_line(error))
    return f"cannot reach {where}: {reason}"


# -- the bounded filesystem --------------------------------------------------------------------


def _name_store(error: BaseException, url: str) -> BaseException:
    """``error`` carrying the store it came from (``store_url``), so a command reaching two stores names the right one."""
    try:
        if getattr(error, "store_url", None) is None:
            error.store_url = url  # type: ignore[attr-defined]
    except AttributeError:
        pass  # an exception class with slots: the caller names the store it reached
    return error


def _is_async_wrapper(method: Any) -> bool:
    """Whether ``method`` is fsspec's blocking wrapper of a coroutine (it takes ``timeout=``)."""
    return inspect.iscoroutinefunction(getattr(method, "__wrapped__", None))


class BoundedFilesystem:
    """An fsspec filesystem whose calls each wait at most ``store_timeout()`` and report to this process's outages.

    Everything else (attributes, the few calls that do no I/O) passes
    through unchanged. A filesystem without an event loop (``memory://``)
    answers at once and is only reported on. One made on a thread
    (``made_by``) is waited for within the first calls' own bounded wait.
    """

    def __init__(self, filesystem: Any, url: str) -> None:
        self._filesystem = filesystem
        self._making: Future | None = None
        self._url = url

    @classmethod
    def made_by(cls, make: Callable[[], Any], url: str) -> BoundedFilesystem:
        """A client made on a thread of its own: looking for credentials may take long (gcsfs asks the GCE
        metadata server: 15 s off GCE without a network), and a command must not wait for it unbounded."""
        bounded = cls(None, url)
        future: Future = Future()

        def make_it() -> None:
            try:
                future.set_result(make())
            except BaseException as error:  # noqa: BLE001 - said by the first call that needs the client
                future.set_exception(error)

        bounded._making = future
        threading.Thread(target=make_it, name="tpudash-store-client", daemon=True).start()
        return bounded

    def _client(self, deadline: float) -> Any:
        """The client, waited for until ``deadline`` (monotonic) while it is still being made."""
        if self._making is None:
            return self._filesystem
        began_wall = time.time()
        try:
            self._filesystem = self._making.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            failure = NoAnswer(
                f"no answer within {store_timeout():g} s (--store-timeout); "
                "last error: its client was still looking for credentials"
            )
            mark_unreachable(self._url, began_wall, str(failure))
            raise _name_store(failure, self._url) from None
        self._making = None
        return self._filesystem

    @property
    def unwrapped(self) -> Any:
        return self._client(time.monotonic() + store_timeout())

    def __getattr__(self, name: str) -> Any:
        if self._making is not None and name in DEFERRED_CALLS:
            return lambda *args, **kwargs: self._call(name, args, kwargs)  # the client is waited for in the call
        attribute = getattr(self._client(time.monotonic() + store_timeout()), name)
        if name.startswith("_") or not callable(attribute) or name in ("invalidate_cache", "open"):
            return attribute
        return lambda *args, **kwargs: self._call(name, args, kwargs)

    def _call(self, name: str, args: tuple, kwargs: dict) -> Any:
        began_wall, began = time.time(), time.monotonic()
        timeout = store_timeout()
        client = self._client(began + timeout)
        method = getattr(client, name)
        left = max(0.1, timeout - (time.monotonic() - began))
        try:
            result = method(*args, timeout=left, **kwargs) if _is_async_wrapper(method) else method(*args, **kwargs)
        except Exception as error:
            if not no_answer(error):
                mark_answered(self._url)
                missing = credentials_missing(client, self._url, error)
                if missing is not None:
                    raise _name_store(CredentialsMissing(missing), self._url) from error
                _name_store(error, self._url)
                raise
            if isinstance(error, TimeoutError):  # fsspec's FSTimeoutError: the wait ran out
                cause = cause_since(began)
                waited = f"no answer within {timeout:g} s (--store-timeout)"
                failure: BaseException = NoAnswer(f"{waited}; last error: {cause}" if cause else waited)
            else:
                failure = error
            reason = str(failure) if isinstance(failure, NoAnswer) else plain_cause(one_line(failure))
            mark_unreachable(self._url, began_wall, reason)
            _name_store(failure, self._url)
            if failure is error:
                raise
            raise failure from error
        mark_answered(self._url)
        return result


def open_for_reading(filesystem: Any, path: str, size: int | None) -> io.BufferedReader:
    """An object opened for reading: through a ``BoundedFilesystem`` of an asynchronous client, each read is a
    bounded ranged request of its own (the client's own file would retry as long as it likes)."""
    if isinstance(filesystem, BoundedFilesystem) and _is_async_wrapper(getattr(filesystem.unwrapped, "cat_file", None)):
        return io.BufferedReader(_RangeReader(filesystem, path, size), buffer_size=RANGE_READ_BYTES)
    return io.BufferedReader(filesystem.open(path, "rb"))


class _RangeReader(io.RawIOBase):
    """An object read by ranges through ``BoundedFilesystem.cat_file``: every read has the store's bounded wait."""

    def __init__(self, filesystem: BoundedFilesystem, path: str, size: int | None) -> None:
        super().__init__()
        self._filesystem = filesystem
        self._path = path
        self._size = size
        self._position = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        wanted = len(buffer)
        if self._size is not None:
            wanted = min(wanted, self._size - self._position)
        if wanted <= 0:
            return 0
        data = self._filesystem.cat_file(self._path, start=self._position, end=self._position + wanted)
        count = len(data)
        buffer[:count] = data
        self._position += count
        return count
