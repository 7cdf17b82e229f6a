"""Where runs are kept: a local directory, or the URL of an object store read and written through fsspec.

``--runs-dir`` and ``TPUDASH_RUNS_DIR`` take a path, ``file://``, ``gs://``,
``s3://`` or ``memory://`` (the last for tests: a store in this process's
memory). A local directory is a ``Path``; a store is its URL as text,
normalised (``gs://bucket/runs``). Credentials are the filesystem library's
own: Application Default Credentials for gcsfs, the AWS chain for s3fs; an
emulator is reached through the libraries' own variables
(``STORAGE_EMULATOR_HOST``, ``AWS_ENDPOINT_URL``), and with
``STORAGE_EMULATOR_HOST`` set no credentials are looked for (an emulator
takes none, and gcsfs's bucket-type probe would only fail at length).

A URL that cannot be meant as written is refused with a hint: ``gcs://``
(did you mean ``gs://``), ``gs//bucket`` or ``gs:/bucket`` (the colon or a
slash missing), a scheme one letter off. A bucket that does not exist is
``MissingBucket`` (exit 2), not an empty runs directory. Every filesystem
opened here waits for its store a bounded time (``tpudash.runs.storeclient``)
and logs to the session log (``tpudash.runs.librarylogs``).
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# The schemes a runs directory may have, and the package (and tpudash extra) that reads each.
STORE_SCHEMES: dict[str, tuple[str | None, str | None]] = {
    "gs": ("gcsfs", "gcs"),
    "s3": ("s3fs", "s3"),
    "memory": (None, None),
}
# Schemes other tools spell for the same stores: refused, naming the one tpudash reads (one spelling per store).
SCHEME_SPELLINGS = {"gcs": "gs", "s3a": "s3", "s3n": "s3"}
ALLOWED = "a directory path, file://PATH, gs://BUCKET/PATH, s3://BUCKET/PATH or memory://PATH"
# ``gs//bucket``, ``gs:/bucket``, ``gs:bucket``: a store URL with its colon or a slash lost.
MANGLED_URL = re.compile(r"^(?P<scheme>gs|gcs|s3|memory)(?P<sep>:/?|//)(?P<rest>[^/].*)$", re.IGNORECASE)


class StoreUnavailable(RuntimeError):
    """A store URL whose filesystem library is not installed; the text is the one line that installs it."""


class MissingBucket(LookupError):
    """A store URL whose bucket does not exist (or is not visible with these credentials); the text names it."""


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
        mangled = mangled_url_hint(text)
        if mangled is not None:
            raise ValueError(f"{text!r}: {mangled}")
        return Path(text).expanduser()
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{text!r}: a file:// URL names this host's files (file:///PATH); allowed: {ALLOWED}")
        return Path(parts.path or "/")
    if scheme not in STORE_SCHEMES:
        meant = SCHEME_SPELLINGS.get(scheme) or next(
            iter(difflib.get_close_matches(scheme, [*STORE_SCHEMES, "file"], n=1, cutoff=0.6)), None
        )
        hint = f" (did you mean {meant}://{text.split('://', 1)[1]}?)" if meant else ""
        raise ValueError(f"{text!r}: the scheme {scheme + '://'!r} is not supported{hint}; allowed: {ALLOWED}")
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
    return f"{scheme}://" + "/".join([bucket, *segments])


def mangled_url_hint(text: str) -> str | None:
    """For a path that reads as a store URL missing its colon or a slash (``gs//b/runs``): what was meant."""
    match = MANGLED_URL.match(text)  # ``gs/runs`` (a folder named gs) is a path, and matches not
    if match is None:
        return None
    scheme = SCHEME_SPELLINGS.get(match["scheme"].lower(), match["scheme"].lower())
    lost = {"//": "its colon", ":/": "a slash", ":": "its slashes"}[match["sep"]]
    return (
        f"reads as a store URL missing {lost}: did you mean {scheme}://{match['rest']}? "
        f"(a directory of that name: ./{text})"
    )


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
    """The fsspec filesystem of ``url`` (its calls bounded: ``storeclient.BoundedFilesystem``) and the root path
    within it; StoreUnavailable when not installed."""
    missing = install_line(url)
    if missing is not None:
        package = STORE_SCHEMES[urlsplit(url).scheme][0]
        raise StoreUnavailable(f"{url}: reading it needs {package}, not installed here: {missing}")
    import fsspec

    from tpudash.runs.librarylogs import route_library_logs
    from tpudash.runs.storeclient import BoundedFilesystem, emulator_endpoint

    route_library_logs()  # before the client is made: it logs while it looks for credentials
    emulated = urlsplit(url).scheme == "gs" and emulator_endpoint(url) is not None
    if emulated:
        from gcsfs.core import GCSFileSystem

        root = GCSFileSystem._strip_protocol(url)
    else:
        root = fsspec.get_filesystem_class(urlsplit(url).scheme)._strip_protocol(url)

    def make() -> Any:
        return _emulated_gcs() if emulated else fsspec.core.url_to_fs(url)[0]

    # Made on a thread: gcsfs looks for credentials as it is made (the GCE metadata server: 15 s off GCE without
    # a network), and every wait for a store is bounded, that one too.
    return BoundedFilesystem.made_by(make, url), root.rstrip("/")


def _emulated_gcs() -> Any:
    """gcsfs's plain filesystem, anonymous unless fsspec's config names a token: what an emulator takes.

    gcsfs's default class first asks GCS's control plane (over gRPC, with
    credentials) what kind each bucket is: an emulator has no such service,
    so every command logged "Could not determine bucket type… credentials
    were not found", and waited for it.
    """
    import fsspec.config
    from gcsfs.core import GCSFileSystem

    options = dict(fsspec.config.conf.get("gs", {}))
    options.setdefault("token", "anon")
    return GCSFileSystem(**options)


def bucket_of(url: str) -> str:
    """The bucket a store URL names (``gs://b/runs`` → ``b``); '' for ``memory://``."""
    parts = urlsplit(url)
    return "" if parts.scheme == "memory" else parts.netloc
