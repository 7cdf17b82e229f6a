"""``tpudash serve``'s routes under generated requests: paths, Host headers, cookies, tokens, queries, bodies.

Whatever arrives, the server answers it (never a 500, never an exception
past a handler), and nothing without the right token or cookie gets
anything but a refusal. The server is real and listens on 127.0.0.1; its
tabs get ``StubDashboard``s, so no dashboard process is started.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import threading
from urllib.parse import quote, urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.serve_process import USER_UNSET, StubDashboard
from tpudash.config import Settings
from tpudash.web import polling, serve

ROUTES = ["/", "/ws", "/poll/open", "/poll/read", "/poll/write", "/poll/close", "/static/js/textual.js", "/static/"]
LIVE_SESSION = "<a live polling session>"


class _ErrorLog(logging.Handler):
    """What aiohttp logs when a handler raises (it answers 500 and logs 'Error handling request')."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        from aiohttp.http_exceptions import HttpProcessingError

        # A request aiohttp cannot parse (a byte not allowed in a header) is answered 400 before any
        # handler of ours runs; aiohttp logs it all the same.
        if record.exc_info and isinstance(record.exc_info[1], HttpProcessingError):
            return
        self.records.append(record)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server on a loop of its own thread, with stub dashboards; a read with nothing to send returns at once."""
    saved_wait = polling.POLL_WAIT_SECONDS
    polling.POLL_WAIT_SECONDS = 0.01
    settings = Settings.load({"runs_dir": str(tmp_path_factory.mktemp("fuzz") / "runs")})
    environ = {key: value for key, value in os.environ.items() if key not in USER_UNSET}
    dashboard_server = serve.DashboardServer(
        settings, port=0, environ=environ, service_class=StubDashboard, max_dashboards=3
    )
    errors = _ErrorLog()
    loggers = [logging.getLogger(name) for name in ("aiohttp.server", "aiohttp.web", "asyncio")]
    for logger in loggers:
        logger.addHandler(errors)
    listening = threading.Event()
    loop = asyncio.new_event_loop()

    def run() -> None:
        loop.run_until_complete(dashboard_server.serve(on_listening=lambda url: listening.set(), handle_signals=False))

    thread = threading.Thread(target=run, name="serve-fuzz")
    thread.start()
    assert listening.wait(30)
    dashboard_server.errors = errors
    yield dashboard_server
    loop.call_soon_threadsafe(dashboard_server.request_stop)
    thread.join(30)
    loop.close()
    for logger in loggers:
        logger.removeHandler(errors)
    polling.POLL_WAIT_SECONDS = saved_wait


def request(port: int, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=40)
segments = st.lists(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x2FF), max_size=12), max_size=4)
paths = st.one_of(
    st.sampled_from(ROUTES),
    st.builds(lambda route, more: route.rstrip("/") + "/" + "/".join(more), st.sampled_from(ROUTES), segments),
).map(lambda path: quote(path, safe="/%.~:@!$&'()*+,;="))
query_values = st.dictionaries(
    st.sampled_from(["embed", "session", "width", "height", "transport", "fontsize", "x"]),
    st.one_of(st.text(max_size=20), st.sampled_from([LIVE_SESSION, "0", "1000", "-1", "16", "99999999999999"])),
    max_size=4,
)
hosts = st.one_of(st.sampled_from(["127.0.0.1", "localhost", "[::1]:1", "attacker.example", ""]), header_text)
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS", "HEAD"])
bodies = st.one_of(
    st.binary(max_size=100),
    st.sampled_from([b'[["stdin", "q"]]', b'[["resize", {"width": 5, "height": 5}]]', b'[["ping", 1]]', b"[]"]),
)
content_types = st.sampled_from(["", "application/json", "text/plain; charset=no-such-charset", "text/plain"])


def build(server, method, path, query, host, cookie, content_type, token=None):
    query = dict(query)
    if query.get("session") == LIVE_SESSION:
        query["session"] = next(iter(list(server.poll_sessions)), "none")
    if token is not None:
        query["token"] = token
    headers = {"Host": host}
    if cookie is not None:
        headers["Cookie"] = cookie
    if content_type:
        headers["Content-Type"] = content_type
    return method, path + ("?" + urlencode(query) if query else ""), headers


def assert_no_error_logged(server):
    errors, server.errors.records[:] = list(server.errors.records), []
    assert not errors, [record.getMessage() for record in errors]


@given(
    method=methods,
    path=paths,
    query=query_values,
    host=hosts,
    token=st.one_of(st.none(), st.text(max_size=40)),
    cookie_value=st.one_of(st.none(), header_text),
    cookie_name_is_the_servers=st.booleans(),
    content_type=content_types,
    body=bodies,
)
def test_without_the_token_or_its_cookie_every_route_refuses(
    server, method, path, query, host, token, cookie_value, cookie_name_is_the_servers, content_type, body
):
    if token == server.token or cookie_value == server.token:
        token = cookie_value = None
    name = server.access.cookie_name if cookie_name_is_the_servers else "tpudash"
    cookie = None if cookie_value is None else f"{name}={cookie_value}"
    method, target, headers = build(server, method, path, query, host, cookie, content_type, token)
    status, answer = request(server.port, method, target, headers, body)
    assert 400 <= status < 500, (method, target, headers, status)
    assert server.token.encode() not in answer
    assert_no_error_logged(server)


@given(
    method=methods,
    path=paths,
    query=query_values,
    host=hosts,
    by_cookie=st.booleans(),
    content_type=content_types,
    body=bodies,
)
def test_with_the_token_no_route_fails_on_what_it_is_sent(
    server, method, path, query, host, by_cookie, content_type, body
):
    cookie = f"{server.access.cookie_name}={server.token}" if by_cookie else None
    method, target, headers = build(
        server, method, path, query, host, cookie, content_type, None if by_cookie else server.token
    )
    status, _ = request(server.port, method, target, headers, body)
    # 503: every dashboard place is taken (the cap is 3 here); anything else of 5xx is the server failing.
    assert status < 500 or status == 503, (method, target, headers, status)
    if not server.access.host_allowed(host):
        assert status in (400, 403)  # 400: a Host aiohttp cannot parse, refused before the guard
    assert_no_error_logged(server)


@given(
    messages=st.one_of(
        bodies,
        st.lists(
            st.one_of(
                st.lists(st.one_of(st.sampled_from(["stdin", "resize", "ping", "blur", "focus"]), st.text())),
                st.dictionaries(st.text(max_size=5), st.integers()),
                st.integers(),
                st.none(),
            ),
            max_size=4,
        ).map(lambda envelopes: json.dumps(envelopes).encode()),
    ),
    content_type=content_types,
)
def test_a_live_polling_session_takes_any_body_it_is_sent(server, messages, content_type):
    """What a page writes to its dashboard: bad JSON or bad messages are refused or skipped, never a failure."""
    token = f"token={server.token}"
    status, answer = request(server.port, "POST", f"/poll/open?{token}", {"Host": "127.0.0.1"}, b"")
    session = json.loads(answer)["session"] if status == 200 else next(iter(list(server.poll_sessions)))
    headers = {"Host": "127.0.0.1", **({"Content-Type": content_type} if content_type else {})}
    status, _ = request(server.port, "POST", f"/poll/write?session={session}&{token}", headers, messages)
    assert status in (204, 400), status
    status, _ = request(server.port, "POST", f"/poll/read?session={session}&{token}", {"Host": "127.0.0.1"}, b"")
    assert status == 200
    assert_no_error_logged(server)


origins = st.one_of(
    st.sampled_from(
        ["null", "http://localhost:9999", "http://127.0.0.1:9999", "https://127.0.0.1", "http://127.0.0.1", ""]
    ),
    st.builds(
        lambda scheme, port: f"{scheme}://127.0.0.1:{port}", st.sampled_from(["http", "https"]), st.integers(0, 70000)
    ),
    header_text,
)


@given(
    origin=origins,
    route=st.sampled_from(
        ["/ws", "/poll/open", "/poll/read", "/poll/write", "/poll/close", "/", "/static/js/textual.js"]
    ),
    method=methods,
    query=query_values,
)
def test_with_the_owners_cookie_no_other_origin_gets_anything(server, origin, route, method, query):
    """Another page of this machine is sent the owner's cookie: whatever its Origin, it is refused (issue 38)."""
    own = f"http://127.0.0.1:{server.port}"
    if origin.strip().lower() in (own, f"https://127.0.0.1:{server.port}"):
        origin = "http://localhost:9999"
    sessions = set(server.poll_sessions)
    cookie = f"{server.access.cookie_name}={server.token}"
    method, target, headers = build(server, method, route, query, f"127.0.0.1:{server.port}", cookie, "")
    status, answer = request(server.port, method, target, {**headers, "Origin": origin}, b"[]")
    # 400: an Origin aiohttp cannot parse, refused before the guard.
    assert status in (400, 403), (method, target, origin, status)
    assert set(server.poll_sessions) <= sessions  # no dashboard was opened for it
    assert server.token.encode() not in answer
    assert_no_error_logged(server)
