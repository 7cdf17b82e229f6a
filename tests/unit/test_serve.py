"""``tpudash serve``: bad flags, loopback by default, who gets in, what a page can reach, the cap on tabs,
and stopping leaves nothing behind.

The server runs as a user starts it (``python -m tpudash serve``); its
dashboards are reached the way the page reaches them, over its WebSocket
and over its HTTP polling transport, with aiohttp's client. The real
browser is in tests/functional/test_serve_browser.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket

import psutil
import pytest

from tests.serve_process import USER_UNSET, StubDashboard, http_get, http_request, start_server
from tpudash.cli import main as cli
from tpudash.web.tabs import WEB_DRIVER, is_served

DASHBOARD_TEXT = b"tpudash"  # the header's title, in the first frame
RUNTIME_READY_TEXT = b"4 replicas"  # the runtime line, once the engine has detected it (holding the host's lock)
HELD_TEXT = b"held by another dashboard"  # the runtime line of a dashboard whose engine found the lock taken


@pytest.mark.parametrize(
    "port, why",
    [("abc", "is not an integer"), ("65536", "is out of range"), ("-1", "is out of range"), ("", "is not an integer")],
)
def test_a_bad_port_exits_2_naming_the_flag(port, why, tmp_path, capsys):
    assert cli.main(["--runs-dir", str(tmp_path), "serve", "--port", port]) == 2
    error = capsys.readouterr().err
    assert f"--port: {port!r} {why}" in error or f"--port: {port} {why}" in error
    assert "allowed: 1 to 65535, or 0 for any free port" in error


def test_a_port_in_use_exits_2_naming_the_flag(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["--runs-dir", str(tmp_path), "serve", "--port", str(port)]) == 2
    error = capsys.readouterr().err
    assert f"--port: cannot listen on 127.0.0.1:{port}" in error and "--port 0 for any free port" in error


@pytest.mark.parametrize(
    "host, why",
    [
        ("0.0.0.0", "0.0.0.0 is not a loopback address"),
        ("", "is empty"),
    ],
)
def test_a_host_beyond_loopback_needs_public_and_a_bad_host_exits_2(host, why, tmp_path, capsys):
    assert cli.main(["--runs-dir", str(tmp_path), "serve", "--host", host]) == 2
    error = capsys.readouterr().err
    assert f"--host: {why}" in error
    if host:
        assert "add --public" in error and "ssh -L 8000:localhost:8000" in error


def log_in(server) -> str:
    """Open the printed URL as a browser does the first time; the Cookie header it then sends."""
    status, headers, _ = http_request(server.port, f"/?token={server.token()}")
    assert status == 302, status
    return headers["Set-Cookie"].split(";", 1)[0]


def test_the_default_bind_is_loopback_only(tmp_path):
    server = start_server(tmp_path)
    try:
        assert server.url.startswith("http://127.0.0.1:")
        assert server.url == f"http://127.0.0.1:{server.port}/?token={server.token()}"
        listening = [
            connection.laddr
            for connection in psutil.Process(server.process.pid).net_connections("inet")
            if connection.status == psutil.CONN_LISTEN
        ]
        assert listening and {address.ip for address in listening} == {"127.0.0.1"}
        assert "warning" not in server.log()
    finally:
        server.stop()
    assert server.process.returncode == 0


def test_public_listens_on_every_interface_and_warns(tmp_path):
    server = start_server(tmp_path, "--public")
    try:
        listening = [
            connection.laddr
            for connection in psutil.Process(server.process.pid).net_connections("inet")
            if connection.status == psutil.CONN_LISTEN
        ]
        assert {address.ip for address in listening} == {"0.0.0.0"}
        assert "warning: listening on 0.0.0.0" in server.log()
        assert "Anyone who can reach this port with the printed URL gets a dashboard that launches jobs" in server.log()
        assert "the token in it is the only login" in server.log()
    finally:
        server.stop()


def test_a_page_reaches_the_dashboard_and_nothing_of_the_runs_directory(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "run.json").write_text("SECRET-RUN-RECORD")
    server = start_server(tmp_path)
    try:
        cookie = log_in(server)
        status, page = http_get(server.port, "/", cookie=cookie)
        assert status == 200 and b"static/js/textual.js" in page
        assert http_get(server.port, "/static/js/textual.js", cookie=cookie)[0] == 200
        for path in [
            "/run.json",
            "/runs/run.json",
            f"{runs}/run.json",
            "/static/",
            "/static/css/",
            "/static/../run.json",
            "/static/%2e%2e/%2e%2e/run.json",
            f"/static/{'../' * 12}{runs}/run.json",
            f"/static/{'%2e%2e/' * 12}{str(runs).lstrip('/')}/run.json",
            "/download/run.json",
            "/ws/not-the-token",
            "/poll/not-the-token/read",
        ]:
            status, body = http_get(server.port, path, cookie=cookie)
            assert status in (403, 404, 405), (path, status)
            assert b"SECRET-RUN-RECORD" not in body
        # Another site open in the same browser cannot reach the page under
        # its own name (DNS rebinding), even with the cookie.
        assert http_get(server.port, "/", host="attacker.example", cookie=cookie)[0] == 403
        assert http_get(server.port, "/", host=f"localhost:{server.port}", cookie=cookie)[0] == 200
    finally:
        server.stop()


def test_is_served_names_textual_serves_web_driver():
    assert is_served({"TEXTUAL_DRIVER": WEB_DRIVER})
    assert not is_served({})
    assert not is_served({"TEXTUAL_DRIVER": "textual.drivers.linux_driver:LinuxDriver"})


async def _read_until(receive, text: bytes, timeout: float) -> bytes:
    async def read() -> bytes:
        seen = b""
        while text not in seen:
            seen += await receive()
        return seen

    return await asyncio.wait_for(read(), timeout)


class _PolledTab:
    """A polling page: it asks again as soon as a read returns, as serve_page.html does.

    A test that stopped asking while it waited for something else would have
    its dashboard ended as abandoned (POLL_ABANDONED_SECONDS) on a slow machine.
    """

    def __init__(self, receive) -> None:
        self.receive = receive
        self.seen = b""
        self.grew = asyncio.Condition()

    async def keep_asking(self) -> None:
        while True:
            chunk = await self.receive()
            async with self.grew:
                self.seen += chunk
                self.grew.notify_all()

    async def until(self, text: bytes, timeout: float) -> None:
        async def shown() -> None:
            async with self.grew:
                await self.grew.wait_for(lambda: text in self.seen)

        await asyncio.wait_for(shown(), timeout)


def _family(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _gone(process: psutil.Process) -> bool:
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _engines(processes: list[psutil.Process]) -> list[psutil.Process]:
    engines = []
    for process in processes:
        try:
            if "tpudash.engine" in process.cmdline():
                engines.append(process)
        except psutil.Error:
            pass
    return engines


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_stopping_the_server_leaves_no_dashboard_behind(signum, tmp_path):
    import aiohttp

    server = await asyncio.to_thread(start_server, tmp_path, "--cpu-devices", "4")
    try:
        token = await asyncio.to_thread(server.token)
        async with aiohttp.ClientSession() as http_session:
            # One tab over the WebSocket, one over HTTP polling.
            websocket = await http_session.ws_connect(f"{server.base}ws?width=100&height=30&token={token}")

            async def from_websocket() -> bytes:
                message = await websocket.receive()
                return message.data if message.type == aiohttp.WSMsgType.BINARY else b""

            # Its engine detects the runtime only once it holds the host's engine lock.
            await _read_until(from_websocket, RUNTIME_READY_TEXT, 60)
            opened = await http_session.post(f"{server.base}poll/open?width=100&height=30&token={token}")
            session_id = (await opened.json())["session"]

            async def from_polling() -> bytes:
                response = await http_session.post(f"{server.base}poll/read?session={session_id}&token={token}")
                return await response.read()

            polled_tab = _PolledTab(from_polling)
            asking = asyncio.create_task(polled_tab.keep_asking())
            # One engine per host: the second tab's engine finds the lock taken,
            # says so and exits; that dashboard goes on watching.
            await polled_tab.until(HELD_TEXT, 60)
            dashboards = [process for process in _family(server.process.pid) if process.ppid() == server.process.pid]
            assert len(dashboards) == 2
            # The WebSocket tab's dashboard started first.
            closed_tab, watching_tab = sorted(dashboards, key=lambda process: process.create_time())
            _, alive = await asyncio.to_thread(psutil.wait_procs, watching_tab.children(recursive=True), 30)
            assert alive == [], "the engine that found the lock taken still runs"
            environment = closed_tab.environ()
            assert environment["TPUDASH_RUNS_DIR"] == str(tmp_path / "runs")
            assert environment["TPUDASH_CPU_DEVICES"] == "4"
            assert environment["TEXTUAL_DRIVER"] == WEB_DRIVER and environment["TPUDASH_SERVED"] == "1"

            everyone = [process for process in _family(server.process.pid) if not _gone(process)]
            engines = _engines(everyone)
            assert len(everyone) == 3 and len(engines) == 1 and engines[0].ppid() == closed_tab.pid

            # Closing a tab ends its dashboard and that dashboard's engine; the other tab runs on.
            closed_family = [closed_tab, *closed_tab.children(recursive=True)]
            await websocket.close()
            _, alive = await asyncio.to_thread(psutil.wait_procs, closed_family, 30)
            assert alive == [], "the closed tab's dashboard and engine still run"
            assert [process for process in everyone if not _gone(process)] == [watching_tab], server.log()

            server.process.send_signal(signum)
            code = await asyncio.to_thread(server.process.wait, 60)
            asking.cancel()  # the server is gone: its reads fail, or wait
            await asyncio.gather(asking, return_exceptions=True)
        assert code == 0, server.log()
        left = [process for process in everyone if not _gone(process)]
        assert left == [], f"left running: {[process.cmdline() for process in left]}"
        assert "tpudash serve: stopping" in server.log()
        assert "Unknown child process" not in server.log()  # asyncio's watcher kept the dashboards' exit codes
    finally:
        server.stop()


async def test_a_polling_page_that_stops_asking_has_its_dashboard_ended(tmp_path):
    import aiohttp

    from tpudash.config import Settings
    from tpudash.web.serve import DashboardServer

    settings = Settings.load({"runs_dir": str(tmp_path / "runs")})
    server = DashboardServer(
        settings, port=0, environ={key: value for key, value in os.environ.items() if key not in USER_UNSET}
    )
    server.poll_abandoned_seconds = 1.0
    listening = asyncio.get_running_loop().create_future()
    serving = asyncio.create_task(server.serve(on_listening=listening.set_result, handle_signals=False))
    try:
        url = (await asyncio.wait_for(listening, 30)).split("?")[0]
        async with aiohttp.ClientSession() as http_session:
            opened = await http_session.post(f"{url}poll/open?width=100&height=30&token={server.token}")
            session_id = (await opened.json())["session"]

            async def from_polling() -> bytes:
                response = await http_session.post(f"{url}poll/read?session={session_id}&token={server.token}")
                return await response.read()

            await _read_until(from_polling, DASHBOARD_TEXT, 60)
        # The tab is gone: nobody asks any more.
        (service,) = server.services
        engine_and_the_rest = _family(service.pid)
        await asyncio.wait_for(service.ended(), 30)
        _, alive = await asyncio.to_thread(psutil.wait_procs, engine_and_the_rest, 30)
        assert alive == [], "the abandoned dashboard's engine still runs"
        assert server.poll_sessions == {}
    finally:
        server.request_stop()
        await asyncio.wait_for(serving, 30)


# -- who gets in (issue 25) ------------------------------------------------------


@pytest.mark.parametrize(
    "flags, error",
    [
        (["--max-dashboards", "0"], "--max-dashboards: 0 is too few; allowed: 1 or more"),
        (["--max-dashboards", "four"], "--max-dashboards: 'four' is not an integer; allowed: 1 or more"),
        (["--allowed-host", ""], "--allowed-host: '' is not a host name"),
        (["--allowed-host", "http://x/"], "--allowed-host: 'http://x/' is not a host name"),
    ],
)
def test_bad_serve_flags_exit_2_naming_the_flag(flags, error, tmp_path, capsys):
    # A port in use: were the flag taken, the command would still end (naming the port), not serve.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert cli.main(["--runs-dir", str(tmp_path), "serve", "--port", port, *flags]) == 2
    assert error in capsys.readouterr().err


def test_a_local_user_without_the_token_gets_403_on_every_route_and_never_the_token(tmp_path):
    server = start_server(tmp_path)
    try:
        token = server.token()
        for method, path in [
            ("GET", "/"),
            ("GET", "/?transport=poll"),
            ("GET", "/static/js/textual.js"),
            ("GET", "/static/css/xterm.css"),
            ("GET", "/ws?width=80&height=24"),
            ("POST", "/poll/open"),
            ("POST", "/poll/read?session=x"),
            ("GET", "/?token=not-the-token"),
            ("GET", f"/?token={token[:-1]}"),
        ]:
            status, _, body = http_request(server.port, path, method=method)
            assert status == 403, (method, path, status)
            assert token.encode() not in body
        status, body = http_get(server.port, "/")
        assert b"open the URL <code>tpudash serve</code> printed" in body
        # A cookie of the right name with another value is no better.
        cookie_name = log_in(server).split("=", 1)[0]
        assert http_get(server.port, "/", cookie=f"{cookie_name}=guess")[0] == 403
    finally:
        server.stop()


def test_the_printed_url_sets_a_strict_cookie_and_the_token_leaves_the_address(tmp_path):
    server = start_server(tmp_path)
    try:
        token = server.token()
        status, headers, _ = http_request(server.port, f"/?transport=poll&token={token}&fontsize=20")
        assert status == 302
        assert headers["Location"] == "./?transport=poll&fontsize=20"
        cookie = headers["Set-Cookie"]
        attributes = {part.strip().split("=")[0].lower(): part.strip() for part in cookie.split(";")}
        assert cookie.split(";", 1)[0].endswith(f"={token}")
        assert "httponly" in attributes and attributes["samesite"].lower() == "samesite=strict"
        assert attributes["path"] == "Path=/"
        # What follows is admitted by the cookie alone, and the page it gets carries no token.
        sent = cookie.split(";", 1)[0]
        status, page = http_get(server.port, "/?transport=poll&fontsize=20", cookie=sent)
        assert status == 200 and token.encode() not in page
        assert http_get(server.port, "/static/js/textual.js", cookie=sent)[0] == 200
    finally:
        server.stop()


def test_public_refuses_a_rebinding_host_and_admits_the_allowed_ones(tmp_path):
    server = start_server(tmp_path, "--public", "--allowed-host", "my-tpu-vm.example")
    try:
        token = server.token()
        port = server.port
        # DNS rebinding: the attacker's name resolves to this machine, the browser sends that name.
        assert http_get(server.port, f"/?token={token}", host=f"attacker.example:{port}")[0] == 403
        assert http_get(server.port, f"/?token={token}", host="attacker.example")[0] == 403
        for host in [f"my-tpu-vm.example:{port}", "MY-TPU-VM.example", f"127.0.0.1:{port}", f"localhost:{port}"]:
            assert http_get(server.port, f"/?token={token}", host=host)[0] == 302, host
        # The printed URL names this machine: it is admitted too.
        assert http_get(server.port, f"/?token={token}", host=f"{socket.gethostname()}:{port}")[0] == 302
    finally:
        server.stop()


async def _stub_server(tmp_path, **options):
    """An in-process server whose tabs get ``StubDashboard``s; its task and its URL (no token)."""
    from tpudash.config import Settings
    from tpudash.web.serve import DashboardServer

    settings = Settings.load({"runs_dir": str(tmp_path / "runs")})
    environ = {key: value for key, value in os.environ.items() if key not in USER_UNSET}
    server = DashboardServer(settings, port=0, environ=environ, service_class=StubDashboard, **options)
    listening = asyncio.get_running_loop().create_future()
    serving = asyncio.create_task(server.serve(on_listening=listening.set_result, handle_signals=False))
    url = await asyncio.wait_for(listening, 30)
    return server, serving, url.split("?")[0]


async def test_a_tab_past_the_cap_gets_a_page_saying_why_over_both_transports(tmp_path):
    import aiohttp

    from tpudash.web.serve import REFUSED_CLOSE_CODE

    server, serving, url = await _stub_server(tmp_path, max_dashboards=4)
    why = "4 dashboards are open, the most this server allows (--max-dashboards); close one and reload"
    try:
        token = f"token={server.token}"
        async with aiohttp.ClientSession() as http_session:
            tabs = [await http_session.ws_connect(f"{url}ws?width=80&height=24&{token}") for _ in range(3)]
            for tab in tabs:
                assert (await tab.receive_bytes(timeout=10)) == StubDashboard.GREETING
            opened = await http_session.post(f"{url}poll/open?width=80&height=24&{token}")
            assert opened.status == 200
            polling_session = (await opened.json())["session"]

            # The fifth tab, over the WebSocket: closed with the reason the page shows.
            fifth = await http_session.ws_connect(f"{url}ws?width=80&height=24&{token}")
            message = await fifth.receive(timeout=10)
            assert message.type == aiohttp.WSMsgType.CLOSE
            assert (message.data, message.extra) == (REFUSED_CLOSE_CODE, why)
            # Over HTTP polling: the same words, and no dashboard.
            refused = await http_session.post(f"{url}poll/open?width=80&height=24&{token}")
            assert refused.status == 503 and (await refused.json()) == {"refused": why}
            assert len(server.open_tabs) == 4

            # A closed tab frees its place, whichever transport it used.
            holding = list(server.open_tabs)
            await tabs[0].close()
            stops = [asyncio.ensure_future(stub.stopped.wait()) for stub in holding]
            done, pending = await asyncio.wait(stops, timeout=10, return_when=asyncio.FIRST_COMPLETED)
            for waiting in pending:
                waiting.cancel()
            assert done and len(server.open_tabs) == 3
            sixth = await http_session.ws_connect(f"{url}ws?width=80&height=24&{token}")
            assert (await sixth.receive_bytes(timeout=10)) == StubDashboard.GREETING
            closed = await http_session.post(f"{url}poll/close?session={polling_session}&{token}")
            assert closed.status == 204 and len(server.open_tabs) == 3
            reopened = await http_session.post(f"{url}poll/open?width=80&height=24&{token}")
            assert reopened.status == 200
    finally:
        server.request_stop()
        await asyncio.wait_for(serving, 30)


def test_the_page_in_a_cross_site_frame_keeps_the_token_on_its_own_addresses(tmp_path):
    server = start_server(tmp_path)
    try:
        token = server.token()
        # Colab's frame: no cookie is sent, so the embed page is served as is, carrying the token.
        status, page = http_get(server.port, f"/?token={token}&embed=1")
        assert status == 200
        assert f'static/js/textual.js?token={token}"'.encode() in page
        assert f'const token = "{token}"'.encode() in page
        assert http_get(server.port, f"/static/js/textual.js?token={token}")[0] == 200
        assert http_get(server.port, "/?embed=1")[0] == 403
    finally:
        server.stop()


# -- whose page may open a dashboard (issue 38) ------------------------------------


def _upgrade_headers(**more: str) -> dict[str, str]:
    """A browser's WebSocket upgrade request, as far as the server's guard reads it."""
    return {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        **more,
    }


@pytest.mark.parametrize(
    "other_page",
    [
        "http://localhost:9999",  # another local web page: the browser sends it the owner's cookie all the same
        "http://127.0.0.1:9999",
        "https://127.0.0.1:9999",
        "http://attacker.example",
        "null",  # a sandboxed frame, a file:// page
        "http://127.0.0.1:PORT/path",  # not an origin at all
        "http://127.0.0.1:PORT, http://localhost:9999",  # two Origin values in one header
    ],
)
async def test_another_local_page_with_the_owners_cookie_cannot_open_a_dashboard(other_page, tmp_path):
    import aiohttp

    server, serving, url = await _stub_server(tmp_path)
    other_page = other_page.replace("PORT", str(server.port))
    cookie = {"Cookie": f"{server.access.cookie_name}={server.token}"}
    try:
        async with aiohttp.ClientSession() as http_session:
            async with http_session.get(
                f"{url}ws?width=80&height=24", headers=_upgrade_headers(Origin=other_page, **cookie)
            ) as refused:
                assert refused.status == 403
                reason = await refused.text()
            assert f"tpudash serve: refused: Origin {other_page!r} is another page than this dashboard's own" in reason
            assert f"http://127.0.0.1:{server.port}" in reason
            with pytest.raises(aiohttp.WSServerHandshakeError) as handshake:
                await http_session.ws_connect(f"{url}ws?width=80&height=24", origin=other_page, headers=cookie)
            assert handshake.value.status == 403
            # Over HTTP polling too: no session is opened.
            opened = await http_session.post(f"{url}poll/open", headers={"Origin": other_page, **cookie})
            assert opened.status == 403 and "another page than this dashboard's own" in await opened.text()
            assert server.services == set() and server.poll_sessions == {}

            # The page the server sent, under the name in the address bar, gets in with the same cookie.
            for own_page in (f"http://127.0.0.1:{server.port}", f"HTTP://127.0.0.1:{server.port}"):
                tab = await http_session.ws_connect(f"{url}ws?width=80&height=24", origin=own_page, headers=cookie)
                assert (await tab.receive_bytes(timeout=10)) == StubDashboard.GREETING
                await tab.close()
            named = await http_session.post(
                f"{url}poll/open",
                headers={"Origin": f"http://localhost:{server.port}", "Host": f"localhost:{server.port}", **cookie},
            )
            assert named.status == 200 and "session" in await named.json()
    finally:
        server.request_stop()
        await asyncio.wait_for(serving, 30)


async def test_only_the_cookie_and_no_origin_opens_nothing_but_the_token_needs_no_origin(tmp_path):
    """A browser always sends Origin on a WebSocket upgrade and a POST: a cookie without one is not a page of ours.

    A program that is not a browser (a script, curl) sends none and has the token: the token is its proof.
    """
    import aiohttp

    server, serving, url = await _stub_server(tmp_path)
    cookie = {"Cookie": f"{server.access.cookie_name}={server.token}"}
    try:
        async with aiohttp.ClientSession() as http_session:
            async with http_session.get(f"{url}ws?width=80&height=24", headers=_upgrade_headers(**cookie)) as refused:
                assert refused.status == 403
                reason = await refused.text()
            assert "carries only the cookie, without an Origin header" in reason
            assert "a program must carry the token (?token=…) instead of the cookie" in reason
            opened = await http_session.post(f"{url}poll/open", headers=cookie)
            assert opened.status == 403 and "without an Origin header" in await opened.text()
            assert server.services == set()
            # The page itself and its files are fetched without an Origin: still served by the cookie.
            page = await http_session.get(url, headers=cookie)
            assert page.status == 200 and "static/js/textual.js" in await page.text()

            tab = await http_session.ws_connect(f"{url}ws?width=80&height=24&token={server.token}")
            assert (await tab.receive_bytes(timeout=10)) == StubDashboard.GREETING
            await tab.close()
            opened = await http_session.post(f"{url}poll/open?token={server.token}")
            assert opened.status == 200
    finally:
        server.request_stop()
        await asyncio.wait_for(serving, 30)


async def test_a_polling_session_is_driven_only_from_its_own_page(tmp_path):
    import aiohttp

    server, serving, url = await _stub_server(tmp_path)
    own = {"Cookie": f"{server.access.cookie_name}={server.token}", "Origin": f"http://127.0.0.1:{server.port}"}
    other = {**own, "Origin": "http://localhost:9999"}
    try:
        async with aiohttp.ClientSession() as http_session:
            opened = await http_session.post(f"{url}poll/open", headers=own)
            session = (await opened.json())["session"]
            for route in ("read", "write", "close"):
                answer = await http_session.post(f"{url}poll/{route}?session={session}", headers=other, data=b"[]")
                assert answer.status == 403, route
                assert "'http://localhost:9999' is another page" in await answer.text()
            assert list(server.poll_sessions) == [session]  # the other page's close ended nothing
            written = await http_session.post(
                f"{url}poll/write?session={session}", headers=own, data=b'[["stdin", "key from the page"]]'
            )
            assert written.status == 204
            read = await http_session.post(f"{url}poll/read?session={session}", headers=own)
            assert StubDashboard.GREETING in await read.read()
            closed = await http_session.post(f"{url}poll/close?session={session}", headers=own)
            assert closed.status == 204 and server.poll_sessions == {}
    finally:
        server.request_stop()
        await asyncio.wait_for(serving, 30)


async def test_a_page_of_another_origin_with_the_token_gets_in_only_behind_colabs_proxy(tmp_path):
    """Colab's frame is served under its proxy's origin, with the token on every address (embed path)."""
    import aiohttp

    colab_frame = "https://abc-8000-colab.googleusercontent.com"
    for check_host_header in (True, False):
        server, serving, url = await _stub_server(tmp_path, check_host_header=check_host_header)
        try:
            async with aiohttp.ClientSession() as http_session:
                token = f"token={server.token}"
                opened = await http_session.post(f"{url}poll/open?{token}", headers={"Origin": colab_frame})
                if check_host_header:  # not behind a proxy: only the page's own origin, token or not
                    assert opened.status == 403 and f"Origin {colab_frame!r} is another page" in await opened.text()
                    with pytest.raises(aiohttp.WSServerHandshakeError):
                        await http_session.ws_connect(f"{url}ws?{token}", origin=colab_frame)
                    continue
                assert opened.status == 200
                tab = await http_session.ws_connect(f"{url}ws?{token}", origin=colab_frame)
                assert (await tab.receive_bytes(timeout=10)) == StubDashboard.GREETING
                await tab.close()
                # Behind the proxy too, the cookie alone never admits another origin.
                cookie = {"Cookie": f"{server.access.cookie_name}={server.token}", "Origin": colab_frame}
                assert (await http_session.post(f"{url}poll/open", headers=cookie)).status == 403
        finally:
            server.request_stop()
            await asyncio.wait_for(serving, 30)


async def test_only_the_page_asked_for_with_the_token_may_be_framed_by_another_site(tmp_path):
    """Framed by another local page, the cookie's page would open a dashboard from its own origin."""
    import aiohttp

    server, serving, url = await _stub_server(tmp_path)
    try:
        async with aiohttp.ClientSession() as http_session:
            by_cookie = await http_session.get(url, headers={"Cookie": f"{server.access.cookie_name}={server.token}"})
            assert by_cookie.status == 200
            assert by_cookie.headers["Content-Security-Policy"] == "frame-ancestors 'self'"
            # The page's own beacon must carry its real Origin: no "no-referrer" (which makes it "null").
            assert by_cookie.headers["Referrer-Policy"] == "same-origin"
            embedded = await http_session.get(f"{url}?token={server.token}&embed=1")
            assert embedded.status == 200 and "Content-Security-Policy" not in embedded.headers
    finally:
        server.request_stop()
        await asyncio.wait_for(serving, 30)
