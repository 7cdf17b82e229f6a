"""``tpudash serve``: the dashboard in a web browser, one dashboard process per browser tab.

Textualize's textual-serve does the terminal part: its ``AppService`` starts
the app as a child process under Textual's web driver and relays the
driver's byte protocol, and its xterm.js page (``static/``) draws it. This
module is the server around them:

- Every tab runs ``python -m tpudash`` with this server's settings (runs
  dir, data dir, CPU devices, TPU, telemetry) passed as TPUDASH_* variables,
  so each dashboard is the one the same flags would open in a terminal.
- It listens on 127.0.0.1 unless ``--public`` says otherwise: a dashboard
  launches jobs on this machine's accelerator, so whoever reaches the port
  can run code here.
- A page can reach the dashboard and textual-serve's own scripts and fonts,
  nothing else: no file of the runs directory, no directory listing, no
  download route (textual-serve's serves files an app delivers; tpudash
  delivers none). The terminal's connection needs a token that only the
  page served here carries, so another web site open in the same browser
  cannot drive a dashboard; on loopback the Host header must name loopback
  too (DNS rebinding).
- The page talks over a WebSocket, or, where a proxy passes no WebSocket
  (Colab's port proxy), over plain HTTP requests (``?transport=poll``; the
  default tries the WebSocket first and falls back by itself).
- SIGINT (Ctrl-C) and SIGTERM stop the server and every dashboard it
  started, with their engines: each dashboard is asked to quit (it cancels
  a running job cleanly), then whatever is still running after the cancel
  grace is ended. None is left behind.

Each tab's dashboard process (how it starts, how it and its engine end)
is ``tpudash.web.tabs``.

This module imports only the standard library (and tpudash's modules that
import nothing more) at the top, so importing it costs nothing; aiohttp and textual-serve load when a server is built.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpudash.net import is_loopback_host
from tpudash.web.tabs import dashboard_environment, dashboard_service_class

DEFAULT_HOST = "127.0.0.1"
PUBLIC_HOST = "0.0.0.0"
DEFAULT_PORT = 8000
# A dashboard asked to quit may first cancel its job (up to the cancel
# grace) and wait for its engine; this much more before it is ended.
QUIT_MARGIN_SECONDS = 5.0
# A polling page asks for output at least this often; a session nobody has
# asked for longer than POLL_ABANDONED_SECONDS (its tab was closed) is stopped.
POLL_WAIT_SECONDS = 10.0
POLL_ABANDONED_SECONDS = 45.0
PAGE_PATH = Path(__file__).with_name("serve_page.html")


class ServeError(ValueError):
    """A --host or --port that cannot be served; the message names the flag."""


def parse_port(raw: object) -> int:
    """``--port``: 0 (any free port) to 65535."""
    try:
        port = int(str(raw).strip(), 10)
    except ValueError:
        raise ServeError(f"--port: {raw!r} is not an integer; allowed: 1 to 65535, or 0 for any free port") from None
    if not 0 <= port <= 65535:
        raise ServeError(f"--port: {port} is out of range; allowed: 1 to 65535, or 0 for any free port")
    return port


def resolve_host(host: str | None, public: bool) -> tuple[str, bool]:
    """The address to listen on and whether it is loopback only.

    No --host: 127.0.0.1, or every interface with --public. A --host that
    is not loopback is refused without --public.
    """
    if host is None:
        return (PUBLIC_HOST, False) if public else (DEFAULT_HOST, True)
    text = host.strip()
    if not text:
        raise ServeError("--host: is empty; allowed: an IP address or a host name of this machine, e.g. 127.0.0.1")
    try:
        infos = socket.getaddrinfo(text, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise ServeError(
            f"--host: cannot resolve {text!r} ({error}); allowed: an IP address or a host name "
            "of this machine, e.g. 127.0.0.1"
        ) from None
    loopback = all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)
    if not loopback and not public:
        raise ServeError(
            f"--host: {text} is not a loopback address, and whoever reaches it can launch jobs on "
            "this machine; add --public to serve it anyway, or keep the default 127.0.0.1 and "
            "forward the port over SSH (ssh -L 8000:localhost:8000 HOST)"
        )
    return text, loopback


def public_warning(host: str, port: int) -> str:
    return (
        f"tpudash serve: warning: listening on {host}:{port}, not loopback. Anyone who can reach this port "
        "gets a dashboard that launches jobs on this machine's accelerator and reads its runs. There is no "
        "login; keep it behind a firewall, or serve on 127.0.0.1 and use SSH port forwarding."
    )


def serve_dashboards(args: Any, settings: Any) -> int:
    """``tpudash serve``: serve until SIGINT or SIGTERM; 0 once every dashboard has gone.

    What cannot be used (a port, a host, the runs directory) raises
    ``ServeError`` or ``tpudash.config.SettingsError``; the CLI makes it exit 2.
    """
    port = parse_port(DEFAULT_PORT if args.port is None else args.port)
    host, loopback = resolve_host(args.host, args.public)
    # Each tab's dashboard needs the runs directory: refuse now, not once per tab.
    settings.check_runs_dir()
    server = DashboardServer(
        settings, host=host, port=port, loopback=loopback, check_host_header=loopback and not args.allow_any_host_header
    )
    return server.run()


@dataclass
class _PollSession:
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


class DashboardServer:
    """The aiohttp server: the page, the terminal connections, one dashboard per connection."""

    def __init__(
        self,
        settings: Any,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        loopback: bool = True,
        check_host_header: bool = True,
        environ: Mapping[str, str] | None = None,
    ):
        self.settings = settings
        self.host = host
        self.port = port
        self.loopback = loopback
        self.check_host_header = check_host_header
        self.environment = dashboard_environment(settings, os.environ if environ is None else environ)
        # Only the page served here carries it: another site open in the same
        # browser can open a WebSocket to localhost, but cannot read this page.
        self.token = secrets.token_urlsafe(24)
        self.services: set = set()
        self.websockets: set = set()
        self.poll_sessions: dict[str, _PollSession] = {}
        self.quit_grace = float(getattr(settings, "cancel_grace", 2.0)) + QUIT_MARGIN_SECONDS
        self.poll_abandoned_seconds = POLL_ABANDONED_SECONDS
        self.url: str | None = None
        self._stop: asyncio.Event | None = None

    # -- the web application -------------------------------------------------

    def make_app(self):
        import textual_serve
        from aiohttp import web

        static = Path(textual_serve.__file__).parent / "static"
        app = web.Application(middlewares=[self._make_guard()])
        # The token is a path segment: textual.js appends its own query to the WebSocket URL.
        app.add_routes(
            [
                web.get("/", self.handle_page),
                web.get("/ws/{token}", self.handle_websocket),
                web.post("/poll/{token}/open", self.handle_poll_open),
                web.post("/poll/{token}/read", self.handle_poll_read),
                web.post("/poll/{token}/write", self.handle_poll_write),
                # textual-serve's own scripts, styles and fonts; no listing, no symlinks.
                web.static("/static", static, show_index=False, follow_symlinks=False),
            ]
        )
        return app

    def _make_guard(self):
        from aiohttp import web

        @web.middleware
        async def guard(request, handler):
            if self.check_host_header and not _loopback_host_header(request.host):
                raise web.HTTPForbidden(
                    text="tpudash serve answers only to a loopback host name (localhost, "
                    "127.0.0.1) while it listens on loopback\n"
                )
            if request.path != "/" and not request.path.startswith("/static/"):
                parts = request.path.split("/")
                if len(parts) < 3 or not secrets.compare_digest(parts[2].encode(), self.token.encode()):
                    raise web.HTTPForbidden(text="missing or wrong token: open the dashboard from its page\n")
            response = await handler(request)
            # The page may be shown in an iframe (Colab's cell output), so no X-Frame-Options.
            response.headers.setdefault("Cache-Control", "no-store")
            response.headers.setdefault("X-Content-Type-Options", "nosniff")
            return response

        return guard

    async def handle_page(self, request):
        from aiohttp import web

        font_size = request.query.get("fontsize", "16")
        font_size = font_size if font_size.isdigit() and 6 <= int(font_size) <= 48 else "16"
        page = (
            PAGE_PATH.read_text(encoding="utf-8").replace("{{token}}", self.token).replace("{{font_size}}", font_size)
        )
        return web.Response(text=page, content_type="text/html")

    def _new_service(self, write_bytes, write_str, close):
        from textual_serve.download_manager import DownloadManager

        service = dashboard_service_class()(
            write_bytes=write_bytes,
            write_str=write_str,
            close=close,
            download_manager=DownloadManager(),
            environment=self.environment,
            quit_grace=self.quit_grace,
        )
        self.services.add(service)
        return service

    async def _dispatch(self, service, envelope: Any) -> str | None:
        """One message from the page (textual-serve's envelopes); a reply to send back, if any."""
        if not isinstance(envelope, list) or not envelope:
            return None
        kind = envelope[0]
        if kind == "stdin" and len(envelope) > 1 and isinstance(envelope[1], str):
            await service.send_bytes(envelope[1].encode("utf-8"))
        elif kind == "resize" and len(envelope) > 1 and isinstance(envelope[1], dict):
            width, height = envelope[1].get("width"), envelope[1].get("height")
            if isinstance(width, int) and isinstance(height, int) and 1 <= width <= 1000 and 1 <= height <= 1000:
                await service.set_terminal_size(width, height)
        elif kind == "ping" and len(envelope) > 1:
            return json.dumps(["pong", envelope[1]])
        elif kind == "blur":
            await service.blur()
        elif kind == "focus":
            await service.focus()
        return None

    async def handle_websocket(self, request):
        from aiohttp import WSMsgType, web

        websocket = web.WebSocketResponse(heartbeat=15)
        await websocket.prepare(request)
        width, height = _size(request)
        service = self._new_service(websocket.send_bytes, websocket.send_str, websocket.close)
        self.websockets.add(websocket)
        try:
            await service.start(width, height)
            async for message in websocket:
                if message.type != WSMsgType.TEXT:
                    continue
                try:
                    envelope = json.loads(message.data)
                except ValueError:
                    continue
                reply = await self._dispatch(service, envelope)
                if reply is not None:
                    await websocket.send_str(reply)
        finally:
            await service.stop()
            self.services.discard(service)
            self.websockets.discard(websocket)
            await websocket.close()
        return websocket

    async def handle_poll_open(self, request):
        from aiohttp import web

        session = _PollSession()
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
        width, height = _size(request)
        await session.service.start(width, height)
        return web.json_response({"session": session_id})

    def _poll_session(self, request) -> _PollSession:
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
            envelopes = json.loads(await request.text())
        except ValueError:
            raise web.HTTPBadRequest(text="body: not JSON; expected a list of messages\n") from None
        replies = []
        for envelope in envelopes if isinstance(envelopes, list) else []:
            reply = await self._dispatch(session.service, envelope)
            if reply is not None:
                replies.append(reply)
        for reply in replies:
            session.push(b"S", reply.encode("utf-8"))
        return web.Response(status=204)

    async def _end_poll_session(self, session_id: str) -> None:
        session = self.poll_sessions.pop(session_id, None)
        if session is not None:
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

    # -- running and stopping ------------------------------------------------

    def run(self) -> int:
        """Serve until SIGINT or SIGTERM; then stop every dashboard. Returns the exit code."""
        return asyncio.run(self.serve())

    def request_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def serve(self, on_listening: Callable[[str], None] | None = None, handle_signals: bool = True) -> int:
        """Serve until SIGINT, SIGTERM or ``request_stop()``; ``on_listening(url)`` once it listens."""
        from aiohttp import web

        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM) if handle_signals else ():
            try:
                loop.add_signal_handler(signum, self._stop.set)
            except (RuntimeError, ValueError, NotImplementedError):
                pass  # not the main thread: the caller stops it with request_stop()
        runner = web.AppRunner(self.make_app(), handle_signals=False, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except OSError as error:
            await runner.cleanup()
            reason = error.strerror or str(error)
            hint = "; choose another, or --port 0 for any free port" if self.port else ""
            raise ServeError(f"--port: cannot listen on {self.host}:{self.port}: {reason}{hint}") from None
        self.port = runner.addresses[0][1]  # the port bound, when --port 0 let the system choose
        shown_host = socket.gethostname() if self.host in (PUBLIC_HOST, "::") else self.host
        self.url = f"http://{_url_host(shown_host)}:{self.port}/"
        if not self.loopback:
            print(public_warning(self.host, self.port), file=sys.stderr, flush=True)
        print(
            f"tpudash serve: {self.url}  (each browser tab runs its own dashboard; runs in "
            f"{self.settings.runs_dir}; Ctrl-C stops the server and every dashboard)",
            flush=True,
        )
        if on_listening is not None:
            on_listening(self.url)
        reaper = asyncio.create_task(self._reap_abandoned_polls())
        try:
            await self._stop.wait()
        finally:
            reaper.cancel()
            await self.stop_dashboards()
            await runner.cleanup()
        return 0

    async def stop_dashboards(self) -> None:
        """Ask every dashboard to quit, end what has not, close the pages' connections."""
        services = list(self.services)
        if services:
            print(
                f"tpudash serve: stopping {len(services)} dashboard{'s' if len(services) != 1 else ''}",
                file=sys.stderr,
                flush=True,
            )
        await asyncio.gather(*(service.stop() for service in services), return_exceptions=True)
        for session in self.poll_sessions.values():
            session.closed = True
            session.ready.set()
        for websocket in list(self.websockets):
            await websocket.close()


def _size(request) -> tuple[int, int]:
    def number(name: str, default: int) -> int:
        try:
            value = int(request.query.get(name, default))
        except ValueError:
            return default
        return value if 1 <= value <= 1000 else default

    return number("width", 80), number("height", 24)


def _loopback_host_header(host_header: str | None) -> bool:
    """The Host header names this machine's loopback (any port)."""
    if not host_header:
        return False
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8000
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return is_loopback_host(host)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
