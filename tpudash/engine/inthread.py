"""The engine's loop on a thread of this process, over real pipes: tests that run jobs defined in the test.

The dashboard starts ``python -m tpudash.engine`` (``tpudash.engine.handle.EngineProcess``);
a test hands ``TpudashApp`` an ``engine_factory`` that builds an ``EngineThread``
instead, so its jobs share the test's runtime. It lives apart from
``tpudash.engine.handle`` because it imports the engine's server (and so, lazily,
the runner and the jobs), which the dashboard itself never needs.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from tpudash.engine.handle import EngineExit, EngineHandle, Listener
from tpudash.engine.hostlock import EngineLock
from tpudash.engine.server import EngineServer, ReplySender, serve


class EngineThread(EngineHandle):
    """The engine's loop on a thread of this process, over real pipes (tests with in-test jobs).

    It shares this process's runtime, so it cannot be killed: ``kill``
    cancels its job and closes the pipe instead. It takes the host's engine
    lock as the engine process does (``host_lock``; the tests' own lock file,
    ``TPUDASH_ENGINE_LOCK``), with this process as its dashboard.
    """

    def __init__(
        self,
        listener: Listener,
        settings: Any,
        job_specs: Mapping[str, Any],
        runtime_provider: Callable[[], Any],
        *,
        host_lock: bool = True,
    ):
        super().__init__(listener)
        command_read, command_write = os.pipe()
        reply_read, reply_write = os.pipe()
        self._commands = os.fdopen(command_write, "w", encoding="utf-8", buffering=1)
        replies = os.fdopen(reply_read, "r", encoding="utf-8")
        self._server: EngineServer | None = None

        def make_server(send: ReplySender) -> EngineServer:
            self._server = EngineServer(
                send,
                settings,
                job_specs,
                runtime_provider,
                grace_seconds=0.0,
                host_lock=EngineLock() if host_lock else None,
                dashboard_pid=os.getpid(),
            )
            return self._server

        def run_engine() -> None:
            # Closed in reverse order: the commands' end before the replies', so once the reader sees the
            # replies end (the engine's exit), a command sent fails, as one sent to an exited process does.
            with (
                os.fdopen(reply_write, "w", encoding="utf-8", buffering=1) as reply_stream,
                os.fdopen(command_read, "r", encoding="utf-8") as commands,
            ):
                serve(commands, reply_stream, make_server)

        self._engine = threading.Thread(target=run_engine, name="tpudash-engine-thread", daemon=True)
        self._engine.start()

        def report_exit() -> None:
            replies.close()
            self._listener(EngineExit(0, None, [], self.release_requested or self.kill_reason is not None))

        self._read_replies(replies, report_exit, "tpudash-engine-thread-reader")
        self.pid = os.getpid()

    @property
    def alive(self) -> bool:
        return self._reader is not None and self._reader.alive

    @property
    def server(self) -> EngineServer | None:
        """The engine's loop (a test may add a sink to its runner, as a job's own code would)."""
        return self._server

    def kill(self, reason: str) -> None:
        self.kill_reason = reason
        if self._server is not None:
            self._server.runner.cancel_all()
        self.release()


def thread_engine_factory(
    settings: Any, job_specs: Mapping[str, Any], runtime_provider: Callable[[], Any]
) -> Callable[[Listener], EngineThread]:
    """An ``engine_factory`` for ``TpudashApp``: each engine it starts is an ``EngineThread`` on that runtime."""

    def start(listener: Listener) -> EngineThread:
        return EngineThread(listener, settings, job_specs, runtime_provider)

    return start
