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
- Only the person who started it gets in: every route needs the token the
  printed URL carries, or the cookie the first good request sets; the Host
  header must name this server (DNS rebinding); the Origin header must be
  the page's own (another page of this machine is sent the cookie too),
  and only a page asked for with the token may be framed by another site.
  ``tpudash.web.access`` holds those rules.
- A page can reach the dashboard and textual-serve's own scripts and fonts,
  nothing else: no file of the runs directory, no directory listing, no
  download route (textual-serve's serves files an app delivers; tpudash
  delivers none).
- At most ``--max-dashboards`` tabs run a dashboard at once (each starts an
  engine); one more gets a page saying so, over either transport.
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

from tpudash.web.access import EMBED_PARAMETER, Access, host_name, without_token
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
DEFAULT_MAX_DASHBOARDS = 4
# The WebSocket close code (application range) with which a tab past the cap is refused.
REFUSED_CLOSE_CODE = 4429
PAGE_PATH = Path(__file__).with_name("serve_page.html")
FORBIDDEN_PAGE = (
    "<!DOCTYPE html><title>tpudash: forbidden</title><p>This needs the dashboard's token: open the URL "
    "<code>tpudash serve</code> printed (<code>http://HOST:PORT/?token=…</code>), in this browser.</p>\n"
)


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


def parse_max_dashboards(raw: object) -> int:
    """``--max-dashboards``: how many tabs may run a dashboard at once, 1 or more."""
    try:
        count = int(str(raw).strip(), 10)
    except ValueError:
        raise ServeError(f"--max-dashboards: {raw!r} is not an integer; allowed: 1 or more") from None
    if count < 1:
        raise ServeError(f"--max-dashboards: {count} is too few; allowed: 1 or more")
    return count


def parse_allowed_hosts(raw: list[str] | None) -> list[str]:
    """``--allowed-host NAME`` (repeatable): a host name or address as the browser's address bar shows it."""
    names = []
    for text in raw or []:
        name = host_name(text)
        if name is None or any(character.isspace() or character in "/?#@\\" for character in text):
            raise ServeError(
                f"--allowed-host: {text!r} is not a host name; allowed: a name or address as the browser's "
                "address bar shows it, e.g. my-tpu-vm or 10.0.0.5"
            )
        names.append(name)
    return names


def refusal_text(max_dashboards: int) -> str:
    """What a tab past the cap shows (also a WebSocket close reason: at most 123 bytes)."""
    are = "dashboard is" if max_dashboards == 1 else "dashboards are"
    return f"{max_dashboards} {are} open, the most this server allows (--max-dashboards); close one and reload"


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
        "with the printed URL gets a dashboard that launches jobs on this machine's accelerator and reads its "
        "runs; the token in it is the only login, and plain HTTP carries it unencrypted. Keep it behind a "
        "firewall, or serve on 127.0.0.1 and use SSH port forwarding."
    )


def serve_dashboards(args: Any, settings: Any) -> int:
    """``tpudash serve``: serve until SIGINT or SIGTERM; 0 once every dashboard has gone.

    What cannot be used (a port, a host, the runs directory) raises
    ``ServeError`` or ``tpudash.config.SettingsError``; the CLI makes it exit 2.
    """
    port = parse_port(DEFAULT_PORT if args.port is None else args.port)
    host, loopback = resolve_host(args.host, args.public)
    max_dashboards = parse_max_dashboards(
        DEFAULT_MAX_DASHBOARDS if args.max_dashboards is None else args.max_dashboards
    )
    allowed_hosts = parse_allowed_hosts(args.allowed_host)
    # Each tab's dashboard needs the runs directory: refuse now, not once per tab.
    settings.check_runs_dir()
    server = DashboardServer(
        settings,
        host=host,
        port=port,
        loopback=loopback,
        check_host_header=not args.allow_any_host_header,
        allowed_hosts=allowed_hosts,
        max_dashboards=max_dashboards,
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
        allowed_hosts: list[str] | tuple[str, ...] = (),
        max_dashboards: int = DEFAULT_MAX_DASHBOARDS,
        environ: Mapping[str, str] | None = None,
        service_class: Callable[..., Any] | None = None,
    ):
        self.settings = settings
        self.host = host
        self.port = port
        self.loopback = loopback
        self.environment = dashboard_environment(settings, os.environ if environ is None else environ)
        # Only the printed URL carries the token; every route asks for it (or its cookie).
        self.access = Access(
            loopback=loopback, bound_host=host, allowed_hosts=allowed_hosts, check_host_header=check_host_header
        )
        self.token = self.access.token
        self.max_dashboards = max_dashboards
        # What starts a tab's dashboard (textual-serve's AppService, tpudash.web.tabs); tests give a stub.
        self.service_class = service_class
        self.services: set = set()
        # The tabs that hold one of the max_dashboards places; a closed tab gives its place back at once.
        self.open_tabs: set = set()
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
        app.add_routes(
            [
                web.get("/", self.handle_page),
                web.get("/ws", self.handle_websocket),
                web.post("/poll/open", self.handle_poll_open),
                web.post("/poll/read", self.handle_poll_read),
                web.post("/poll/write", self.handle_poll_write),
                web.post("/poll/close", self.handle_poll_close),
                # textual-serve's own scripts, styles and fonts; no listing, no symlinks.
                web.static("/static", static, show_index=False, follow_symlinks=False),
            ]
        )
        return app

    def _make_guard(self):
        from aiohttp import web

        @web.middleware
        async def guard(request, handler):
            access = self.access
            if not access.host_allowed(request.headers.get("Host")):
                where = "a loopback host name (localhost, 127.0.0.1)" if self.loopback else "this machine's names"
                raise web.HTTPForbidden(
                    text=f"tpudash serve answers only to {where} and the names given with --allowed-host\n"
                )
            by_query = access.by_query(request.query)
            if not by_query and not access.by_cookie(request.cookies):
                raise web.HTTPForbidden(text=FORBIDDEN_PAGE, content_type="text/html")
            refusal = access.origin_refusal(
                request.headers.getall("Origin", []),
                request.headers.get("Host"),
                path=request.path,
                method=request.method,
                by_token=by_query,
            )
            if refusal is not None:
                raise web.HTTPForbidden(text=f"tpudash serve: refused: {refusal}\n")
            if by_query and request.path == "/" and request.method == "GET" and EMBED_PARAMETER not in request.query:
                # The token leaves the address bar; the cookie admits what follows.
                response = web.Response(status=302, headers={"Location": without_token(request.query)})
                response.set_cookie(access.cookie_name, access.token, httponly=True, samesite="Strict", path="/")
            else:
                response = await handler(request)
            # Only the page asked for with its token (Colab's cell output, ?embed=1) may be shown in
            # another site's frame. A page the cookie admits may not: framed by another page of this
            # machine, it would open a dashboard from its own origin.
            if not by_query:
                response.headers.setdefault("Content-Security-Policy", "frame-ancestors 'self'")
            response.headers.setdefault("Cache-Control", "no-store")
            response.headers.setdefault("X-Content-Type-Options", "nosniff")
            # No address (the framed page's carries the token) leaves for another origin; "same-origin",
            # not "no-referrer", which would make a browser send "Origin: null" with the page's own
            # beacon (poll/close), and the Origin rule refuse it.
            response.headers.setdefault("Referrer-Policy", "same-origin")
            return response

        return guard

    async def handle_page(self, request):
        from aiohttp import web

        font_size = request.query.get("fontsize", "16")
        font_size = font_size if font_size.isascii() and font_size.isdigit() and 6 <= int(font_size) <= 48 else "16"
        # Asked for with the token (a frame, ?embed=1: no cookie reaches it), the page puts
        # the token on its own addresses; asked for with the cookie, it carries none.
        embedded = self.access.by_query(request.query)
        page = (
            PAGE_PATH.read_text(encoding="utf-8")
            .replace("{{token}}", self.token if embedded else "")
            .replace("{{token_query}}", f"?{self.access.token_query()}" if embedded else "")
            .replace("{{font_size}}", font_size)
        )
        return web.Response(text=page, content_type="text/html")

    def _refusal(self) -> str | None:
        """Why a new tab gets no dashboard (every place is taken), or None."""
        return refusal_text(self.max_dashboards) if len(self.open_tabs) >= self.max_dashboards else None

    def _new_service(self, write_bytes, write_str, close):
        from textual_serve.download_manager import DownloadManager

        service = (self.service_class or dashboard_service_class())(
            write_bytes=write_bytes,
            write_str=write_str,
            close=close,
            download_manager=DownloadManager(),
            environment=self.environment,
            quit_grace=self.quit_grace,
        )
        self.services.add(service)
        self.open_tabs.add(service)
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
        refusal = self._refusal()
        if refusal is not None:
            # The page shows the close reason instead of a dashboard.
            await websocket.close(code=REFUSED_CLOSE_CODE, message=refusal.encode("utf-8"))
            return websocket
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
            self.open_tabs.discard(service)
            await service.stop()
            self.services.discard(service)
            self.websockets.discard(websocket)
            await websocket.close()
        return websocket

    async def handle_poll_open(self, request):
        from aiohttp import web

        refusal = self._refusal()
        if refusal is not None:
            return web.json_response({"refused": refusal}, status=503)
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
            envelopes = json.loads(await request.read())
        except ValueError:  # not JSON, or not UTF-8 (UnicodeDecodeError)
            raise web.HTTPBadRequest(text="body: not JSON; expected a list of messages\n") from None
        replies = []
        for envelope in envelopes if isinstance(envelopes, list) else []:
            reply = await self._dispatch(session.service, envelope)
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
        self.url = f"http://{_url_host(shown_host)}:{self.port}/?{self.access.token_query()}"
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


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
