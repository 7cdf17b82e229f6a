"""One browser tab's dashboard: the process ``tpudash serve`` starts for it, and how that process ends.

Every tab runs ``python -m tpudash`` with the server's settings passed as
TPUDASH_* variables, so each dashboard is the one the same flags would open
in a terminal. textual-serve's ``AppService`` relays its terminal; the
subclass here starts it without a shell, ties it to the server's life, and
stops it by asking it to quit (it cancels a running job cleanly), then
ending whatever still runs after the grace, its engine included.

A served dashboard is recognised by ``is_served()``: textual-serve starts it
with ``TEXTUAL_DRIVER`` naming Textual's web driver, and the server also
sets ``TPUDASH_SERVED=1``. Its standard input and output are pipes, not a
terminal, and that is expected.

Only the standard library at the top: the CLI asks ``is_served()`` before
anything heavy is imported.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any

# What textual-serve sets for every app process it starts (app_service.py).
WEB_DRIVER = "textual.drivers.web_driver:WebDriver"
SERVED_VARIABLE = "TPUDASH_SERVED"


def is_served(environ: Mapping[str, str] | None = None) -> bool:
    """True in a dashboard started for a browser tab: its terminal is a web page, not a tty."""
    environ = os.environ if environ is None else environ
    return environ.get("TEXTUAL_DRIVER") == WEB_DRIVER


def dashboard_command() -> list[str]:
    """What each browser tab runs: this Python's ``python -m tpudash``."""
    return [sys.executable, "-m", "tpudash"]


def dashboard_environment(settings: Any, environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` carrying every setting as its TPUDASH_* variable, and the served marker."""
    from tpudash.config import settings_environment

    environment = settings_environment(settings, dict(environ))
    environment[SERVED_VARIABLE] = "1"
    return environment


def _descendants(pid: int) -> list:
    """The process and everything under it now (the engine starts a session of its own)."""
    import psutil

    try:
        process = psutil.Process(pid)
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return []


def _running(processes: list) -> list:
    """Those still running; a zombie has ended (the engine's new parent may reap it late, or never)."""
    import psutil

    running = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
        except psutil.Error:
            pass
    return running


def _wait_until_ended(processes: list, timeout: float) -> list:
    # A bounded poll, not psutil.wait_procs: that reaps the server's own
    # children, and asyncio's child watcher, which owns the dashboard's exit
    # status, would then warn "Unknown child process" on the user's terminal.
    deadline = time.monotonic() + timeout
    alive = _running(processes)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = _running(alive)
    return alive


def _end_processes(processes: list, grace: float) -> list:
    """Wait up to ``grace`` for ``processes`` to exit, then SIGTERM, then SIGKILL. Returns what had to be ended."""
    import psutil

    alive = _wait_until_ended(processes, grace)
    for process in alive:
        try:
            process.terminate()
        except psutil.Error:
            pass
    for process in _wait_until_ended(alive, 2.0):
        try:
            process.kill()
        except psutil.Error:
            pass
    _wait_until_ended(alive, 2.0)
    return alive


@functools.cache
def dashboard_service_class() -> type:
    """textual-serve's AppService, starting ``python -m tpudash`` directly with this server's settings."""
    from textual_serve.app_service import AppService

    class DashboardService(AppService):
        """One browser tab's dashboard process."""

        def __init__(self, *args: Any, environment: dict[str, str], quit_grace: float, **kwargs: Any):
            super().__init__(" ".join(dashboard_command()), *args, **kwargs)
            self.environment = environment
            self.quit_grace = quit_grace

        async def _open_app_process(self, width: int = 80, height: int = 24):
            # The server's environment with its settings as TPUDASH_* variables,
            # and over it what textual-serve sets (the web driver, colours, size).
            environment = dict(self.environment)
            environment.update(
                {
                    key: value
                    for key, value in self._build_environment(width=width, height=height).items()
                    if os.environ.get(key) != value
                }
            )
            # No shell (textual-serve's default): paths with spaces need no
            # quoting, and the pid is the dashboard's own. It gets SIGTERM when
            # the server dies, even by SIGKILL: the web driver does not quit when
            # its input ends, so it would go on running unseen.
            from tpudash.childproc import parent_death_signal

            self._process = process = await asyncio.create_subprocess_exec(
                *dashboard_command(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=environment,
                preexec_fn=parent_death_signal(signal.SIGTERM),
            )
            self._stdin = process.stdin
            return process

        @property
        def pid(self) -> int | None:
            return None if self._process is None else self._process.pid

        async def ended(self) -> int | None:
            """Wait until the dashboard process has exited; its exit code (None if it never started)."""
            return None if self._process is None else await self._process.wait()

        async def stop(self) -> None:
            """Ask the dashboard to quit; end it, its engine included, if it has not within the grace."""
            if self._task is None or self._process is None:
                return
            task, self._task = self._task, None
            family = _descendants(self._process.pid)
            await self.send_meta({"type": "quit"})
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, _end_processes, family, self.quit_grace)
            try:
                # Its output ends with the process; a pipe some grandchild still holds may not.
                await asyncio.wait_for(task, 5.0)
            except asyncio.TimeoutError:
                pass  # wait_for has cancelled the relay

    return DashboardService
