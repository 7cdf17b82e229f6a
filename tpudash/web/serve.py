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

This module's job is the server itself: its routes (the page, the
WebSocket, the guard every request passes), the dashboards' places, and its
lifecycle (listen, print the URL, stop everything on a signal). Beside it:
``tpudash.web.serve_flags`` checks the flags, ``tpudash.web.polling`` is
the transport over plain HTTP requests, ``tpudash.web.envelopes`` reads
what a page says to its dashboard, and ``tpudash.web.tabs`` is each tab's
dashboard process (how it starts, how it and its engine end).

This module imports only the standard library (and tpudash's modules that
import nothing more) at the top, so importing it costs nothing; aiohttp and textual-serve load when a server is built.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tpudash.web.access import EMBED_PARAMETER, Access, without_token
from tpudash.web.envelopes import dispatch, terminal_size
from tpudash.web.polling import POLL_ABANDONED_SECONDS, POLL_WAIT_SECONDS, PollingTransport, PollSession
from tpudash.web.serve_flags import (
    DEFAULT_HOST,
    DEFAULT_MAX_DASHBOARDS,
    DEFAULT_PORT,
    PUBLIC_HOST,
    ServeError,
    parse_allowed_hosts,
    parse_max_dashboards,
    parse_port,
    public_warning,
    resolve_host,
)
from tpudash.web.tabs import dashboard_environment, dashboard_service_class

__all__ = [  # the server's, and what callers and tests import from here
    "DEFAULT_HOST",
    "DEFAULT_MAX_DASHBOARDS",
    "DEFAULT_PORT",
    "POLL_ABANDONED_SECONDS",
    "POLL_WAIT_SECONDS",
    "PUBLIC_HOST",
    "QUIT_MARGIN_SECONDS",
    "REFUSED_CLOSE_CODE",
    "DashboardServer",
    "ServeError",
    "parse_allowed_hosts",
    "parse_max_dashboards",
    "parse_port",
    "public_warning",
    "refusal_text",
    "resolve_host",
    "serve_dashboards",
]

# A dashboard asked to quit may first cancel its job (up to the cancel
# grace) and wait for its engine; this much more before it is ended.
QUIT_MARGIN_SECONDS = 5.0
# The WebSocket close code (application range) with which a tab past the cap is refused.
REFUSED_CLOSE_CODE = 4429
PAGE_PATH = Path(__file__).with_name("serve_page.html")
FORBIDDEN_PAGE = (
    "<!DOCTYPE html><title>tpudash: forbidden</title><p>This needs the dashboard's token: open the URL "
    "<code>tpudash serve</code> printed (<code>http://HOST:PORT/?token=…</code>), in this browser.</p>\n"
)


def refusal_text(max_dashboards: int) -> str:
    """What a tab past the cap shows (also a WebSocket close reason: at most 123 bytes)."""
    are = "dashboard is" if max_dashboards == 1 else "dashboards are"
    return f"{max_dashboards} {are} open, the most this server allows (--max-dashboards); close one and reload"


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


class DashboardServer(PollingTransport):
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
        self.poll_sessions: dict[str, PollSession] = {}
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

    async def handle_websocket(self, request):
        from aiohttp import WSMsgType, web

        websocket = web.WebSocketResponse(heartbeat=15)
        await websocket.prepare(request)
        refusal = self._refusal()
        if refusal is not None:
            # The page shows the close reason instead of a dashboard.
            await websocket.close(code=REFUSED_CLOSE_CODE, message=refusal.encode("utf-8"))
            return websocket
        width, height = terminal_size(request)
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
                reply = await dispatch(service, envelope)
                if reply is not None:
                    await websocket.send_str(reply)
        finally:
            self.open_tabs.discard(service)
            await service.stop()
            self.services.discard(service)
            self.websockets.discard(websocket)
            await websocket.close()
        return websocket

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


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
