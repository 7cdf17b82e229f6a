"""``tpudash serve`` in a child process for tests: start it, find its URL, read its page, watch its processes."""

from __future__ import annotations

import asyncio
import http.client
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from tests.conftest import REPO_ROOT

START_TIMEOUT = 60.0
URL_LINE = re.compile(r"tpudash serve: (http://\S+)")
# What a user's shell on this machine would not have (see tests/unit/test_cli.py).
USER_UNSET = ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_LOAD_LIBRARY", "TPU_SKIP_MDS_QUERY")


@dataclass
class ServerProcess:
    process: subprocess.Popen
    url: str  # as printed: http://127.0.0.1:PORT/?token=…
    log_path: Path

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port is not None, self.url
        return port

    @property
    def base(self) -> str:
        """The URL without the token: http://127.0.0.1:PORT/."""
        return self.url.split("?", 1)[0]

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def token(self) -> str:
        return parse_qs(urlsplit(self.url).query)["token"][0]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_server(
    tmp_path: Path,
    *args: str,
    env: dict | None = None,
    python: str = sys.executable,
    cwd: Path = REPO_ROOT,
    base_env: dict | None = None,
) -> ServerProcess:
    """``python -m tpudash --runs-dir <tmp>/runs serve --port 0 ARGS``, once it listens.

    ``base_env`` replaces this process's environment (less ``USER_UNSET``); ``env`` adds to it.
    """
    environment = {
        key: value for key, value in (os.environ if base_env is None else base_env).items() if key not in USER_UNSET
    }
    environment.update(env or {})
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        # Output to a file, not a pipe nobody drains: the server copies each
        # ended dashboard's stderr to its standard output.
        process = subprocess.Popen(
            [python, "-m", "tpudash", "--runs-dir", str(tmp_path / "runs"), "serve", "--port", "0", *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=environment,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        text = log_path.read_text(encoding="utf-8", errors="replace")
        match = URL_LINE.search(text)
        if match:
            return ServerProcess(process, match.group(1), log_path)
        if process.poll() is not None:
            raise AssertionError(f"tpudash serve exited with {process.returncode}: {text}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"tpudash serve did not listen within {START_TIMEOUT:g} s: {text}")
        try:
            process.wait(0.05)  # returns at once if it dies
        except subprocess.TimeoutExpired:
            pass


def http_get(port: int, path: str = "/", host: str | None = None, cookie: str | None = None) -> tuple[int, bytes]:
    """GET ``path`` from the server on loopback ``port``, with ``host`` as the Host header if given."""
    status, _, body = http_request(port, path, host=host, cookie=cookie)
    return status, body


def http_request(
    port: int, path: str = "/", *, method: str = "GET", host: str | None = None, cookie: str | None = None
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request as curl would send it (no redirect followed): status, headers, body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host=host is not None)
        if host is not None:
            connection.putheader("Host", host)
        if cookie is not None:
            connection.putheader("Cookie", cookie)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


class StubDashboard:
    """Stands in for a tab's dashboard process (``DashboardServer(service_class=StubDashboard)``): starts nothing.

    It writes its greeting when started and echoes the keys it is sent, so a
    test sees a working connection without a dashboard or an engine.
    """

    GREETING = b"tpudash stub dashboard"

    def __init__(self, *, write_bytes, write_str, close, download_manager=None, environment=None, quit_grace=0.0):
        self.write_bytes = write_bytes
        self.write_str = write_str
        self.close = close
        self.started = False
        self.stopped = asyncio.Event()
        """Set when the server stops this tab's dashboard (it gave back the tab's place just before)."""
        self.pid = None

    async def start(self, width: int, height: int) -> None:
        self.started = True
        await self.write_bytes(self.GREETING)

    async def stop(self) -> None:
        self.stopped.set()

    async def send_bytes(self, data: bytes) -> None:
        await self.write_bytes(data)

    async def set_terminal_size(self, width: int, height: int) -> None:
        pass

    async def blur(self) -> None:
        pass

    async def focus(self) -> None:
        pass

    async def ended(self) -> None:
        return None
