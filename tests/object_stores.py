"""Loopback object stores for tests: a GCS emulator and an S3 emulator on 127.0.0.1.

tpudash's runs directory may be a URL (gs://, s3://), read and written through
fsspec (gcsfs, s3fs). These stores let tests do that with no network and no
credentials, against pure-Python servers running in the test's own process:

- ``GcsEmulator``: gcp-storage-emulator's request handler over one in-memory
  ``Storage`` kept by the emulator object, served one request at a time;
  gcsfs finds it through ``STORAGE_EMULATOR_HOST``.
- ``S3Emulator``: moto's server application (the one ``ThreadedMotoServer``
  runs) in a threaded werkzeug server; s3fs finds it through ``AWS_ENDPOINT_URL``.

Both run in a thread of the test process: a server starts in about a
millisecond (a child process would pay an interpreter and ~0.5 s of imports,
and moto's data would not outlive it). A test can ``stop()`` a store
mid-run (the port then refuses connections, and open keep-alive connections
are cut) and ``restart()`` it on the same port with the same data: the GCS
data lives in the emulator object's ``Storage``, which outlives the HTTP
server; the S3 data lives in moto's process-wide backends.

The fixtures ``gcs_store`` and ``s3_store`` (use them with
``pytest_plugins = ["tests.object_stores"]`` or by importing them) hand each
test a fresh bucket on a session-wide server, point the environment at it,
make a call against a stopped store fail in milliseconds (see
``GCS_CLIENT_OPTIONS`` and ``S3_CLIENT_OPTIONS``), and clear fsspec's cache of
filesystem instances before and after, so no test reuses a filesystem bound to
another test's settings.

A child process (a writer, ``tpudash`` itself) gets the same settings from
``environment()``: the endpoint, dummy credentials, and fsspec's
``FSSPEC_GS`` / ``FSSPEC_S3`` defaults. One thing the environment cannot
carry is gcsfs's retry count (six attempts, fixed when gcsfs's class is
defined: about 30 s of back-off against a stopped store); only this process
can lower it (``fast_gcsfs_retries``).
"""

from __future__ import annotations

import http.server
import itertools
import json
import os
import socket
import socketserver
import sys
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest

HOST = "127.0.0.1"

# Client settings that make a call against a stopped store fail fast (a
# refused connection is immediate; what costs time is retrying it).
# gcsfs: requests_timeout is aiohttp's total timeout per request, in seconds.
GCS_CLIENT_OPTIONS: dict[str, Any] = {"token": "anon", "requests_timeout": 10}
# gcsfs's attempts per request (its own default is 6, with 1, 2, 4, 8, 16 s
# (+ up to 1 s each) of sleep between them).
GCS_ATTEMPTS = 1
# s3fs: botocore's attempts (total_max_attempts: all attempts; its "max_attempts"
# counts retries only; default 3 attempts in standard mode, 5 in legacy),
# connect and read timeouts (s). A stopped store refuses at once whatever the
# connect timeout; 1 s was too short for a burst of 40 connections to a store
# in a test process that shares two busy cores with another worker (CI saw a
# loopback connect time out).
S3_CLIENT_OPTIONS: dict[str, Any] = {
    "config_kwargs": {
        "connect_timeout": 5,
        "read_timeout": 10,
        "retries": {"total_max_attempts": 1, "mode": "standard"},
    },
}
# s3fs's own attempts per call (class attribute S3FileSystem.retries, default
# 5; it sleeps 0.1 * 1.7**i s between attempts only after timeouts and
# dropped connections, not after a refused one).
S3_ATTEMPTS = 1
S3_REGION = "us-east-1"


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on now (the kernel's pick; free until someone binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class _CutsConnectionsOnClose:
    """Server mixin: remember accepted connections, and cut them all at ``server_close``.

    A stopped HTTP server still holds keep-alive connections in handler
    threads, which would go on answering a client's pooled connection; cutting
    them makes a stopped store look like a stopped store.
    """

    request_queue_size = 1024  # a burst of concurrent clients must not overflow the backlog (SYN retries cost 1 s)
    allow_reuse_address = True  # restart on the same port while old connections sit in TIME_WAIT
    daemon_threads = True

    def get_request(self):  # type: ignore[no-untyped-def]
        conn, addr = super().get_request()  # type: ignore[misc]
        with self._connections_lock:
            self._connections.add(conn)
        return conn, addr

    def shutdown_request(self, request):  # type: ignore[no-untyped-def]
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)  # type: ignore[misc]

    def handle_error(self, request, client_address):  # type: ignore[no-untyped-def]
        # A client that hangs up before its answer is normal here (gcsfs's
        # info() asks two questions at once and cancels the slower one).
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)  # type: ignore[misc]

    def server_close(self) -> None:
        super().server_close()  # type: ignore[misc]
        with self._connections_lock:
            open_connections = list(self._connections)
            self._connections.clear()
        for conn in open_connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _track_connections(server: Any) -> Any:
    server._connections = set()
    server._connections_lock = threading.Lock()
    return server


class _LoopbackStore:
    """One HTTP server on 127.0.0.1 that can stop and start again on the same port, keeping its data."""

    scheme = ""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._httpd: Any = None
        self._thread: threading.Thread | None = None
        self._bucket_numbers = itertools.count()

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        return self._httpd is not None

    def _make_server(self) -> Any:
        raise NotImplementedError

    def start(self) -> None:
        if self._httpd is not None:
            return
        httpd = self._make_server()  # binds now: a taken port fails here, in the caller
        thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"{type(self).__name__}:{self.port}",
            daemon=True,
        )
        thread.start()
        self._httpd, self._thread = httpd, thread

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        self._httpd = self._thread = None
        if httpd is None:
            return
        httpd.shutdown()  # ends serve_forever (within poll_interval)
        httpd.server_close()  # closes the listening socket and cuts open connections
        if thread is not None:
            thread.join(timeout=5)

    def restart(self) -> None:
        """Stop (if running) and start again on the same port, with the same data."""
        self.stop()
        self.start()

    def url(self, bucket_path: str) -> str:
        """``"bucket/prefix"`` as a URL of this store, e.g. ``"gs://bucket/prefix"``."""
        return f"{self.scheme}://{bucket_path.lstrip('/')}"

    def new_bucket_name(self, stem: str = "t") -> str:
        """A bucket name no other test of this process uses (valid on GCS and S3)."""
        return f"{stem}-{next(self._bucket_numbers)}-{uuid.uuid4().hex[:8]}"

    def make_bucket(self, name: str) -> None:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        raise NotImplementedError

    def client_config(self) -> dict[str, Any]:
        """fsspec's defaults for this store's protocol (what ``fsspec.config.conf[scheme]`` should hold)."""
        raise NotImplementedError

    def __enter__(self) -> _LoopbackStore:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class GcsEmulator(_LoopbackStore):
    """gcp-storage-emulator's JSON API on 127.0.0.1, in memory, keeping its data across restarts."""

    scheme = "gs"

    def __init__(self, port: int | None = None) -> None:
        super().__init__(port)
        from gcp_storage_emulator.storage import Storage

        class InMemoryStorage(Storage):
            def _write_config_to_file(self) -> None:
                # The emulator rewrites its whole index as JSON after every
                # change (for reloading from disk), which makes each write cost
                # as much as the objects of the session. In memory there is
                # nothing to reload: the dictionaries are the index.
                pass

        # The data: in memory, owned by this object, so it outlives each HTTP server.
        self.storage = InMemoryStorage(use_memory_fs=True)
        # The emulator's Storage is not thread-safe: the server's requests and
        # make_bucket (from a test's thread) take turns.
        self._storage_lock = threading.Lock()

    def _make_server(self) -> Any:
        from gcp_storage_emulator.server import RequestHandler

        lock = self._storage_lock

        class Handler(RequestHandler):
            def _serve(self, method: str) -> None:
                with lock:
                    getattr(super(), f"do_{method}")()

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def do_PATCH(self) -> None:
                self._serve("PATCH")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        # One request at a time, in the server's thread: 3x the throughput of a
        # thread per connection (which contend for the GIL and the storage lock).
        class Server(_CutsConnectionsOnClose, http.server.HTTPServer):
            def server_bind(self) -> None:
                # http.server's server_bind looks the host's name up (getfqdn); nobody needs it.
                socketserver.TCPServer.server_bind(self)
                self.server_name, self.server_port = HOST, self.server_address[1]

        return _track_connections(Server((HOST, self.port), partial(Handler, self.storage)))

    def make_bucket(self, name: str) -> None:
        from gcp_storage_emulator.handlers.buckets import create_bucket

        with self._storage_lock:
            create_bucket(name, self.storage)

    def environment(self) -> dict[str, str]:
        return {
            "STORAGE_EMULATOR_HOST": self.endpoint,
            # Else gcsfs's "zonal / hierarchical namespace" layer probes every
            # bucket over gRPC, and waits about a minute per call for an answer.
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            # fsspec's defaults for gs:// (read when fsspec is imported).
            "FSSPEC_GS": json.dumps(self.client_config()),
        }

    def client_config(self) -> dict[str, Any]:
        return dict(GCS_CLIENT_OPTIONS)


class S3Emulator(_LoopbackStore):
    """moto's S3 (the app ``ThreadedMotoServer`` runs) on 127.0.0.1, keeping its data across restarts.

    moto keeps every bucket in process-wide backends, so all S3Emulators of a
    process share their buckets; a fresh bucket name per test keeps tests apart.
    """

    scheme = "s3"

    def _make_server(self) -> Any:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import ThreadedWSGIServer

        class Handler(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass

        class Server(_CutsConnectionsOnClose, ThreadedWSGIServer):
            pass

        app = DomainDispatcherApplication(create_backend_app)
        try:
            server = Server(HOST, self.port, app, handler=Handler)
        except SystemExit as e:  # werkzeug prints a bind error and exits
            raise OSError(f"cannot listen on {HOST}:{self.port}") from e
        return _track_connections(server)

    def make_bucket(self, name: str) -> None:
        # moto reads, but does not verify, a SigV4 authorization header; it names the service.
        request = urllib.request.Request(
            f"{self.endpoint}/{name}",
            method="PUT",
            data=b"",
            headers={
                "Authorization": (
                    "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, "
                    "SignedHeaders=host, Signature=0"
                ),
                "x-amz-content-sha256": "UNSIGNED-PAYLOAD",
            },
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            response.read()

    def environment(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": S3_REGION,
            # No shared config or credentials file of a developer's may take part.
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
            # botocore's own retries, for clients made without s3fs (boto3).
            "AWS_MAX_ATTEMPTS": "1",
            "AWS_RETRY_MODE": "standard",
            # fsspec's defaults for s3:// (read when fsspec is imported).
            "FSSPEC_S3": json.dumps(self.client_config()),
        }

    def client_config(self) -> dict[str, Any]:
        return json.loads(json.dumps(S3_CLIENT_OPTIONS))  # a deep copy


def clear_filesystem_caches() -> None:
    """Forget every cached fsspec filesystem instance (they hold sessions bound to settings and ports)."""
    import fsspec

    fsspec.AbstractFileSystem.clear_instance_cache()
    for module_name, class_name in (("gcsfs.core", "GCSFileSystem"), ("s3fs.core", "S3FileSystem")):
        try:
            module = __import__(module_name, fromlist=[class_name])
        except ImportError:
            continue
        getattr(module, class_name).clear_instance_cache()


def fast_gcsfs_retries(monkeypatch: pytest.MonkeyPatch, attempts: int = GCS_ATTEMPTS) -> None:
    """Make gcsfs try each request ``attempts`` times (its class fixes 6, with back-off up to ~30 s in all)."""
    from gcsfs.core import GCSFileSystem
    from gcsfs.retry import retry_request

    for name in ("_request", "_get_file_request", "_get_file_concurrent"):
        method = getattr(GCSFileSystem, name, None)
        undecorated = getattr(method, "__wrapped__", None)
        if undecorated is not None:
            monkeypatch.setattr(GCSFileSystem, name, retry_request(retries=attempts)(undecorated))


def plain_gcsfs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make gs:// and gcs:// use gcsfs's plain GCSFileSystem, even if gcsfs was imported before
    ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` was set (its experimental class probes over gRPC)."""
    from fsspec.registry import _registry  # (fsspec.registry is a read-only view of it)
    from gcsfs.core import GCSFileSystem

    for protocol in ("gs", "gcs"):
        monkeypatch.setitem(_registry, protocol, GCSFileSystem)


def fast_s3fs_retries(monkeypatch: pytest.MonkeyPatch, attempts: int = S3_ATTEMPTS) -> None:
    """Make s3fs try each call ``attempts`` times (class attribute ``retries``, 5 by default; no init argument)."""
    from s3fs.core import S3FileSystem

    monkeypatch.setattr(S3FileSystem, "retries", attempts)


@dataclass
class StoreHandle:
    """What a test gets from ``gcs_store`` / ``s3_store``: a fresh bucket on a running store."""

    server: GcsEmulator | S3Emulator
    bucket: str

    @property
    def root(self) -> str:
        """The bucket's URL, e.g. ``"gs://t-3-0a1b2c3d"``."""
        return self.server.url(self.bucket)

    def url(self, path: str = "") -> str:
        """A URL in this test's bucket: ``url("runs/r1")`` is ``"gs://<bucket>/runs/r1"``."""
        return self.server.url(f"{self.bucket}/{path.lstrip('/')}" if path else self.bucket)

    def filesystem(self) -> Any:
        """The fsspec filesystem for this store (with the fixture's fast-failing settings)."""
        import fsspec

        return fsspec.filesystem(self.server.scheme)

    def environment(self) -> dict[str, str]:
        """Variables a child process needs to reach this store (merge them into ``os.environ``)."""
        return self.server.environment()

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        self.server.start()

    def restart(self) -> None:
        self.server.restart()


def _store_handle(server: GcsEmulator | S3Emulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[StoreHandle]:
    import fsspec.config

    server.start()  # an earlier test may have left it stopped
    for name, value in server.environment().items():
        monkeypatch.setenv(name, value)
    # fsspec read FSSPEC_GS / FSSPEC_S3 when it was imported: set its defaults here too.
    monkeypatch.setitem(fsspec.config.conf, server.scheme, server.client_config())
    if isinstance(server, GcsEmulator):
        plain_gcsfs(monkeypatch)
        fast_gcsfs_retries(monkeypatch)
    else:
        fast_s3fs_retries(monkeypatch)
    clear_filesystem_caches()
    bucket = server.new_bucket_name()
    server.make_bucket(bucket)
    try:
        yield StoreHandle(server, bucket)
    finally:
        clear_filesystem_caches()
        server.start()


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsEmulator]:
    with GcsEmulator() as server:
        yield server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Emulator]:
    with S3Emulator() as server:
        yield server


@pytest.fixture
def gcs_store(gcs_server: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[StoreHandle]:
    """A fresh bucket on the session's GCS emulator; gcsfs (``gs://``) points at it and fails fast when it is stopped."""
    yield from _store_handle(gcs_server, monkeypatch)


@pytest.fixture
def s3_store(s3_server: S3Emulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[StoreHandle]:
    """A fresh bucket on the session's S3 emulator; s3fs (``s3://``) points at it and fails fast when it is stopped."""
    yield from _store_handle(s3_server, monkeypatch)
