"""The dashboard inside a notebook cell: ``from tpudash import colab; colab.show()``.

``show()`` starts ``tpudash serve`` in the background on a free loopback
port (once; later calls reuse it) and shows it in the cell's output through
Colab's ``google.colab.output.serve_kernel_port_as_iframe``. Outside Colab
(Jupyter, a Python prompt) it prints the URL to open instead. ``stop()``
ends the server and every dashboard it started; so does the end of the
notebook's kernel.

Colab's port proxy passes no WebSocket, so the page there reaches its
dashboard over plain HTTP requests (see tpudash/web/serve_page.html); the
proxy also rewrites the Host header, so this server accepts any (the kernel's
loopback is not reachable from the notebook's browser anyway). The frame is
cross-site, so the browser sends it no SameSite=Strict cookie: its address
carries the server's token with ``embed=1``, and the page puts the token on
every request it makes itself.

Importing this module loads neither TensorFlow nor Textual: the server is a
child process of its own.
"""

from __future__ import annotations

import atexit
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

DEFAULT_HEIGHT = 600
HEIGHT_RANGE = (200, 4000)
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 20.0
_URL_LINE = re.compile(r"tpudash serve: (http://\S+)")


class ColabError(RuntimeError):
    """The server could not be started; the message says why (and where its log is)."""


@dataclass
class _Server:
    process: subprocess.Popen
    url: str  # as the server printed it, with its token
    port: int
    token: str
    options: tuple
    log_path: Path


_server: _Server | None = None


def _colab_output():
    """Colab's output module, or None outside Colab."""
    try:
        from google.colab import output
    except ImportError:
        return None
    return output


def show(
    height: int = DEFAULT_HEIGHT,
    *,
    tpu: str | None = None,
    runs_dir: str | os.PathLike | None = None,
    cpu_devices: int | None = None,
    data_dir: str | os.PathLike | None = None,
) -> None:
    """Show the dashboard in this cell (Colab), or print its URL (elsewhere).

    height: of the cell's frame, in pixels (200 to 4000).
    tpu, runs_dir, cpu_devices, data_dir: as tpudash's flags of the same
        names (None: TPUDASH_* variables, then defaults). ``tpu="none"``
        keeps the dashboard's engine off the TPU this notebook holds.
    A server already running with the same options is reused.
    """
    if isinstance(height, bool) or not isinstance(height, int):
        raise ValueError(
            f"height: {height!r} is not a whole number of pixels; allowed: {HEIGHT_RANGE[0]} to {HEIGHT_RANGE[1]}"
        )
    if not HEIGHT_RANGE[0] <= height <= HEIGHT_RANGE[1]:
        raise ValueError(f"height: {height} is out of range; allowed: {HEIGHT_RANGE[0]} to {HEIGHT_RANGE[1]} pixels")
    output = _colab_output()
    server = _ensure_server(_options(tpu, runs_dir, cpu_devices, data_dir), behind_proxy=output is not None)
    if output is not None:
        output.serve_kernel_port_as_iframe(server.port, path=embed_path(server.token), height=str(height))
    else:
        print(
            f"tpudash: the dashboard is at {server.url} (open it in a browser; each tab runs its own "
            "dashboard; tpudash.web.colab.stop() ends them)"
        )


def embed_path(token: str) -> str:
    """The frame's address on the server: the token in the query, and no redirect to a cookie."""
    return "/?" + urlencode({"token": token, "embed": "1"})


def url() -> str | None:
    """The URL of the server ``show()`` started, while it runs."""
    return _server.url if _server is not None and _server.process.poll() is None else None


def stop() -> None:
    """End the server and every dashboard it started (each is asked to quit first)."""
    global _server
    server, _server = _server, None
    if server is None or server.process.poll() is not None:
        return
    server.process.terminate()  # SIGTERM: the server stops its dashboards, then exits
    try:
        server.process.wait(STOP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


def _options(tpu, runs_dir, cpu_devices, data_dir) -> tuple:
    flags = []
    for flag, value in (
        ("--tpu", tpu),
        ("--runs-dir", runs_dir),
        ("--cpu-devices", cpu_devices),
        ("--data-dir", data_dir),
    ):
        if value is not None:
            flags += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return tuple(flags)


def _ensure_server(options: tuple, behind_proxy: bool) -> _Server:
    global _server
    if _server is not None and _server.process.poll() is None and _server.options == options:
        return _server
    stop()
    _server = _start_server(options, behind_proxy)
    return _server


def _start_server(options: tuple, behind_proxy: bool) -> _Server:
    import signal

    from tpudash.childproc import parent_death_signal

    descriptor, log_name = tempfile.mkstemp(prefix="tpudash-serve-", suffix=".log")
    log_path = Path(log_name)
    command = [sys.executable, "-m", "tpudash", *options, "serve", "--port", "0"]
    if behind_proxy:
        command.append("--allow-any-host-header")
    with os.fdopen(descriptor, "wb") as log:
        # Its own session: the notebook's interrupt (SIGINT to the kernel)
        # must not stop the dashboards; the kernel's end does (parent-death
        # signal, and atexit below).
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=parent_death_signal(signal.SIGTERM),
        )
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        text = log_path.read_text(encoding="utf-8", errors="replace")
        match = _URL_LINE.search(text)
        if match:
            address = match.group(1)
            parts = urlsplit(address)
            tokens = parse_qs(parts.query).get("token")
            if parts.port is None or not tokens:
                raise ColabError(f"the dashboard server printed an address without a port or token: {address}")
            return _Server(process, address, parts.port, tokens[0], options, log_path)
        if process.poll() is not None:
            raise ColabError(
                f"tpudash serve exited with code {process.returncode}: {text.strip()[-2000:]} (log: {log_path})"
            )
        if time.monotonic() > deadline:
            process.terminate()
            raise ColabError(f"tpudash serve did not start within {START_TIMEOUT_SECONDS:g} s (log: {log_path})")
        try:
            # Waits on the process itself: returns at once if it dies.
            process.wait(0.05)
        except subprocess.TimeoutExpired:
            pass


atexit.register(stop)
