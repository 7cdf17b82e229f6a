"""The stores' client libraries log to the session log, once per cause, never to the user's terminal.

gcsfs, s3fs, botocore, aiohttp and google-auth log through Python's
``logging``; with no handler configured, Python prints their warnings on
stderr (a retried request's whole traceback: about fifty lines for one
unreachable bucket, and gcsfs's "Could not determine bucket type…" twice per
command). ``route_library_logs`` gives their loggers one handler that writes
each cause once (the same message again, numbers aside, is counted, not
written) into the session log: the dashboard's (where fd 2 already goes), or
else ``<temp>/tpudash-logs/session-<time>-<pid>.log``, made at the first
line. What a client logs while retrying is also kept as the reason a call
that timed out gives (``storeclient.heard_cause``).

A logger the user configured (one with handlers of its own) is left alone.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from tpudash.runs.storeclient import heard_cause

# The loggers of the stores' clients and what they stand on.
LIBRARY_LOGGERS = (
    "gcsfs",
    "s3fs",
    "fsspec",
    "aiohttp",
    "aiobotocore",
    "botocore",
    "boto3",
    "urllib3",
    "google.auth",
    "google.api_core",
    "google.cloud",
    "google_auth_httplib2",
    "grpc",
)
# The clients that say why they retry only at debug level; those records are read for the reason, not written.
RETRYING_LOGGERS = ("gcsfs", "s3fs")
RETRY_CAUSE = re.compile(r"(?:exception|error)(?: \(maybe retryable\))?:\s*(?P<cause>.+)", re.IGNORECASE | re.DOTALL)


def default_log_path() -> Path:
    """The session log: the one fd 2 points at (the dashboard's, its engine's: ``tpudash.accel.nativelog``), else
    ``<temp>/tpudash-logs/session-<UTC time>-<pid>.log``, as nativelog names a session's log of a store's runs."""
    try:
        redirected = Path(os.readlink("/proc/self/fd/2"))  # Linux; elsewhere a file of this process's own
    except OSError:
        redirected = None
    if redirected is not None and redirected.name.startswith("session-") and redirected.suffix == ".log":
        return redirected
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return Path(tempfile.gettempdir()) / "tpudash-logs" / f"session-{stamp}-{os.getpid()}.log"


def cause_key(record: logging.LogRecord) -> tuple[str, int, str]:
    """What makes two records the same cause: their logger, level and message, numbers and addresses aside."""
    text = record.getMessage().splitlines()[0] if record.getMessage() else ""
    return record.name, record.levelno, re.sub(r"\d+", "#", text)[:200]


class OncePerCause(logging.Handler):
    """Writes each cause's first record (with its traceback) to the session log; the rest are counted."""

    def __init__(self, log_path: Callable[[], Path] | None = None) -> None:
        super().__init__(level=logging.DEBUG)
        self._log_path = log_path
        self._path: Path | None = None
        self._seen: dict[tuple[str, int, str], int] = {}
        self._write_lock = threading.Lock()

    @property
    def path(self) -> Path | None:
        """Where records were written, once one was."""
        return self._path

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._hear_cause(record)
            if record.levelno < logging.WARNING:
                return
            key = cause_key(record)
            with self._write_lock:
                self._seen[key] = self._seen.get(key, 0) + 1
                if self._seen[key] > 1:
                    return
                self._write(self._format(record))
        except Exception:  # noqa: BLE001 - a log that cannot be written must never break the store's call
            pass

    def _hear_cause(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            heard_cause(f"{type(error).__name__}: {error}")
        elif record.name.split(".")[0] in RETRYING_LOGGERS:
            match = RETRY_CAUSE.search(record.getMessage())
            if match is not None:
                heard_cause(match["cause"])

    def _format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
        text = f"{stamp} {record.name} {record.levelname}: {record.getMessage()}\n"
        if record.exc_info and record.exc_info[1] is not None:
            text += "".join(traceback.format_exception(*record.exc_info))
        return text

    def _write(self, text: str) -> None:
        if self._path is None:
            self._path = (self._log_path or default_log_path)()
            self._path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._path, "a", encoding="utf-8", errors="backslashreplace") as log:
            log.write(text)


_handler: OncePerCause | None = None
_routing_lock = threading.Lock()


def route_library_logs(log_path: Callable[[], Path] | None = None) -> OncePerCause:
    """Send the stores' clients' logs to the session log, once per cause (once per process; see the module)."""
    global _handler
    with _routing_lock:
        if _handler is not None:
            return _handler
        _handler = OncePerCause(log_path)
        for name in LIBRARY_LOGGERS:
            logger = logging.getLogger(name)
            if any(not isinstance(handler, logging.NullHandler) for handler in logger.handlers):
                continue  # configured by the user: theirs (a library's own NullHandler is no configuration)
            logger.addHandler(_handler)
            logger.propagate = False  # never Python's last resort, which prints on stderr
            if name in RETRYING_LOGGERS and logger.level in (logging.NOTSET, logging.WARNING):
                logger.setLevel(logging.DEBUG)  # their retries' reasons are said at debug level
        return _handler


def routed_log_path() -> Path | None:
    """Where the clients' records went in this process, if any were written."""
    return _handler.path if _handler is not None else None
