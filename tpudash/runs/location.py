"""Where runs are kept: a local directory, or the URL of an object store read and written through fsspec.

``--runs-dir`` and ``TPUDASH_RUNS_DIR`` take a path, ``file://``, ``gs://``,
``s3://`` or ``memory://`` (the last for tests: a store in this process's
memory). A local directory is a ``Path``; a store is its URL as text,
normalised (``gs://bucket/runs``). Credentials are the filesystem library's
own: Application Default Credentials for gcsfs, the AWS chain for s3fs; an
emulator is reached through the libraries' own variables
(``STORAGE_EMULATOR_HOST``, ``AWS_ENDPOINT_URL``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# The schemes a runs directory may have, and the package (and tpudash extra) that reads each.
STORE_SCHEMES: dict[str, tuple[str | None, str | None]] = {
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "s3": ("s3fs", "s3"),
    "memory": (None, None),
}
ALLOWED = "a directory path, file://PATH, gs://BUCKET/PATH, s3://BUCKET/PATH or memory://PATH"


class StoreUnavailable(RuntimeError):
    """A store URL whose filesystem library is not installed; the text is the one line that installs it."""


def is_store_url(runs_dir: object) -> bool:
    """Whether ``runs_dir`` names an object store (``gs://…``) rather than a local directory."""
    return isinstance(runs_dir, str) and "://" in runs_dir


def parse_runs_dir(text: str) -> Path | str:
    """A local directory as a Path, a store as its normalised URL; ValueError saying what is allowed.

    ``file://`` is a local directory. A store URL needs a bucket (but
    ``memory://``), and may not hold a query, a fragment, ``..`` or an empty
    segment: each would name another place than the one the user read.
    """
    text = text.strip()
    if not text:
        raise ValueError(f"is empty; allowed: {ALLOWED}")
    if "://" not in text:
        return Path(text).expanduser()
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{text!r}: a file:// URL names this host's files (file:///PATH); allowed: {ALLOWED}")
        return Path(parts.path or "/")
    if scheme not in STORE_SCHEMES:
        raise ValueError(f"{text!r}: the scheme {scheme + '://'!r} is not supported; allowed: {ALLOWED}")
    if parts.query or parts.fragment:
        raise ValueError(f"{text!r}: a runs directory URL has no '?' or '#' part; allowed: {ALLOWED}")
    bucket = parts.netloc
    if scheme != "memory" and not bucket:
        raise ValueError(f"{text!r}: names no bucket; allowed: {ALLOWED}")
    segments = [segment for segment in parts.path.split("/") if segment]
    if any(segment in (".", "..") for segment in segments):
        raise ValueError(f"{text!r}: '.' and '..' are not allowed in a store path; allowed: {ALLOWED}")
    if scheme == "memory":
        return "memory://" + "/".join([bucket, *segments] if bucket else segments)
    return f"{'gs' if scheme == 'gcs' else scheme}://" + "/".join([bucket, *segments])


def install_line(url: str) -> str | None:
    """The one line that installs what reads ``url``, or None when it is already importable."""
    package, extra = STORE_SCHEMES[urlsplit(url).scheme]
    if package is None or importlib.util.find_spec(package) is not None:
        return None
    return f"pip install 'tpudash[{extra}]'"


def missing_library(url: str) -> str | None:
    """``gs://b/runs needs a library not installed here: pip install 'tpudash[gcs]'``, or None when it is installed."""
    missing = install_line(url)
    return None if missing is None else f"{url} needs a library not installed here: {missing}"


def open_filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the root path within it; StoreUnavailable when not installed."""
    missing = install_line(url)
    if missing is not None:
        package = STORE_SCHEMES[urlsplit(url).scheme][0]
        raise StoreUnavailable(f"{url}: reading it needs {package}, not installed here: {missing}")
    import fsspec

    filesystem, root = fsspec.core.url_to_fs(url)
    return filesystem, root.rstrip("/")
