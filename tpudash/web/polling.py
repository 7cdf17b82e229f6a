"""The polling transport: a dashboard reached through plain HTTP requests where a proxy passes no WebSocket.

Colab's port proxy is one such (``?transport=poll`` on the page; the default
tries the WebSocket first and falls back by itself). The page opens a
session (``/poll/open``), long-polls the dashboard's output
(``/poll/read``), posts its keys and resizes (``/poll/write``) and says
when it goes (``/poll/close``); a session nobody has read for
``POLL_ABANDONED_SECONDS`` (its tab was closed) is stopped.

``PollingTransport`` is a mixin of ``tpudash.web.serve.DashboardServer``,
which gives it the places (``_refusal``, ``_new_service``) and the tabs.
aiohttp loads inside the handlers, as in the server.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from tpudash.web.envelopes import dispatch, terminal_size

# A polling page asks for output at least this often; a session nobody has
# asked for longer than POLL_ABANDONED_SECONDS (its tab was closed) is stopped.
POLL_WAIT_SECONDS = 10.0
POLL_ABANDONED_SECONDS = 45.0


@dataclass
class PollSession:
    """A dashboard reached through plain HTTP requests instead of a WebSocket."""

    service: Any = None
    frames: list[bytes] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False
    last_seen: float = field(default_factory=time.monotonic)
    reads_waiting: int = 0

    def push(self, kind: bytes, payload: bytes) -> None:
        # One frame: b"B" (terminal bytes) or b"S" (a JSON string), 4-byte length, payload.
        self.frames.append(kind + len(payload).to_bytes(4, "big") + payload)
        self.ready.set()


class PollingTransport:
    """The ``/poll/*`` routes and the reaper of abandoned sessions (a mixin of ``DashboardServer``)."""

    poll_sessions: dict[str, PollSession]
    poll_abandoned_seconds: float
    open_tabs: set
    services: set

    def _refusal(self) -> str | None:  # DashboardServer's
        raise NotImplementedError

    def _new_service(self, write_bytes, write_str, close) -> Any:  # DashboardServer's
        raise NotImplementedError

    async def handle_poll_open(self, request):
        from aiohttp import web

        refusal = self._refusal()
        if refusal is not None:
            return web.json_response({"refused": refusal}, status=503)
        session = PollSession()
        session_id = secrets.token_urlsafe(16)

        async def write_bytes(data: bytes) -> None:
            session.push(b"B", data)

        async def write_str(text: str) -> None:
            session.push(b"S", text.encode("utf-8"))

        async def close() -> None:
            session.closed = True
            session.ready.set()

        session.service = self._new_service(write_bytes, write_str, close)
        self.poll_sessions[session_id] = session
        width, height = terminal_size(request)
        await session.service.start(width, height)
        return web.json_response({"session": session_id})

    def _poll_session(self, request) -> PollSession:
        from aiohttp import web

        session = self.poll_sessions.get(request.query.get("session", ""))
        if session is None:
            raise web.HTTPGone(text="no such session (it ended)\n")
        session.last_seen = time.monotonic()
        return session

    async def handle_poll_read(self, request):
        """Long poll: whatever the dashboard wrote, as soon as there is some (or after POLL_WAIT_SECONDS)."""
        from aiohttp import web

        session = self._poll_session(request)
        session.reads_waiting += 1
        try:
            if not session.frames and not session.closed:
                try:
                    await asyncio.wait_for(session.ready.wait(), POLL_WAIT_SECONDS)
                except asyncio.TimeoutError:
                    pass
        finally:
            session.reads_waiting -= 1
            session.last_seen = time.monotonic()
        frames, session.frames = session.frames, []
        session.ready.clear()
        if not frames and session.closed:
            await self._end_poll_session(request.query["session"])
            raise web.HTTPGone(text="the dashboard has ended\n")
        return web.Response(body=b"".join(frames), content_type="application/octet-stream")

    async def handle_poll_write(self, request):
        from aiohttp import web

        session = self._poll_session(request)
        try:
            envelopes = json.loads(await request.read())
        except ValueError:  # not JSON, or not UTF-8 (UnicodeDecodeError)
            raise web.HTTPBadRequest(text="body: not JSON; expected a list of messages\n") from None
        replies = []
        for envelope in envelopes if isinstance(envelopes, list) else []:
            reply = await dispatch(session.service, envelope)
            if reply is not None:
                replies.append(reply)
        for reply in replies:
            session.push(b"S", reply.encode("utf-8"))
        return web.Response(status=204)

    async def handle_poll_close(self, request):
        """The polling page is going away (its tab closed or reloaded): its dashboard ends now."""
        from aiohttp import web

        self._poll_session(request)
        await self._end_poll_session(request.query["session"])
        return web.Response(status=204)

    async def _end_poll_session(self, session_id: str) -> None:
        session = self.poll_sessions.pop(session_id, None)
        if session is not None:
            self.open_tabs.discard(session.service)
            await session.service.stop()
            self.services.discard(session.service)

    async def _reap_abandoned_polls(self) -> None:
        """A polling page asks again as soon as a read returns; one that stopped asking was closed."""
        while True:
            await asyncio.sleep(min(POLL_WAIT_SECONDS, self.poll_abandoned_seconds / 2))
            now = time.monotonic()
            for session_id, session in list(self.poll_sessions.items()):
                if not session.reads_waiting and now - session.last_seen > self.poll_abandoned_seconds:
                    await self._end_poll_session(session_id)
