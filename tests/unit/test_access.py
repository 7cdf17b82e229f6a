"""``tpudash.web.access``, rule by rule: the token, its cookie, the Host header and the Origin header.

Each rule is asked directly, without a server (tests/unit/test_serve.py
reaches the same rules through a running one): what is let in, what is
refused, and the edge of each (ports 0 and 65535, a Host without a port,
two Origin headers, a lone surrogate in a query).
"""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from tpudash.web import access
from tpudash.web.access import (
    Access,
    drives_a_dashboard,
    host_and_port,
    host_name,
    is_own_origin,
    machine_host_names,
    origin_parts,
    without_token,
)

TOKEN = "the-token-0123456789"


def test_a_server_makes_a_token_and_a_cookie_name_of_its_own_unless_given_a_token():
    first, second = Access(), Access()
    assert len(first.token) == 32 and first.token != second.token  # 24 random bytes
    assert first.cookie_name.startswith("tpudash-") and len(first.cookie_name) == len("tpudash-") + 8
    assert first.cookie_name != second.cookie_name
    assert Access(token=TOKEN).token == TOKEN
    assert Access(token="").token not in ("", None)


@pytest.mark.parametrize(
    "header, name",
    [
        (None, None),
        ("", None),
        ("   ", None),
        ("localhost", "localhost"),
        ("LocalHost:8000", "localhost"),
        ("localhost.", "localhost"),
        (" 127.0.0.1:8000 ", "127.0.0.1"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("[]:8000", None),
        ("[a]:8000", "a"),
        ("[::1", None),
        ("::1", "::1"),  # an IPv6 address without brackets: its colons are not a port
        (":8000", None),
        ("my-tpu-vm:8000", "my-tpu-vm"),
    ],
)
def test_host_name_is_the_host_of_a_host_header_in_lower_case(header, name):
    assert host_name(header) == name


@pytest.mark.parametrize(
    "header, parts",
    [
        (None, None),
        ("", None),
        ("localhost", ("localhost", None)),
        ("localhost:8000", ("localhost", 8000)),
        ("LOCALHOST:8000", ("localhost", 8000)),
        ("127.0.0.1:1", ("127.0.0.1", 1)),
        ("127.0.0.1:65535", ("127.0.0.1", 65535)),
        ("127.0.0.1:0", None),
        ("127.0.0.1:65536", None),
        ("127.0.0.1:", None),
        ("127.0.0.1:http", None),
        ("127.0.0.1:-1", None),
        ("127.0.0.1:²", None),  # a digit to str.isdigit(), not to int()
        ("127.0.0.1:８０００", None),  # full-width digits: int() would read 8000
        ("[::1]:8000", ("::1", 8000)),
        ("[::1]", ("::1", None)),
        ("[::1]8000", None),
        ("[::1]x8000", None),
        ("[::1]:", None),
        ("::1", ("::1", None)),
        (" localhost:8000 ", ("localhost", 8000)),
    ],
)
def test_host_and_port_reads_the_port_a_host_header_names(header, parts):
    assert host_and_port(header) == parts


@pytest.mark.parametrize(
    "origin, parts",
    [
        ("http://localhost:9999", ("http", "localhost", 9999)),
        ("http://LOCALHOST:9999", ("http", "localhost", 9999)),
        (" http://127.0.0.1:8000 ", ("http", "127.0.0.1", 8000)),
        ("http://127.0.0.1", ("http", "127.0.0.1", 80)),
        ("https://tpu.example", ("https", "tpu.example", 443)),
        ("https://tpu.example.", ("https", "tpu.example", 443)),
        ("http://[::1]:8000", ("http", "::1", 8000)),
        ("HTTP://127.0.0.1:8000", ("http", "127.0.0.1", 8000)),
        ("null", None),
        ("", None),
        ("file://", None),
        ("ftp://127.0.0.1:8000", None),
        ("chrome-extension://abcdef", None),
        ("http://", None),
        ("http://:8000", None),
        ("http://127.0.0.1:8000/", None),
        ("http://127.0.0.1:8000/path", None),
        ("http://127.0.0.1:8000?x=1", None),
        ("http://127.0.0.1:8000#x", None),
        ("http://user@127.0.0.1:8000", None),
        ("http://user:secret@127.0.0.1:8000", None),
        ("http://127.0.0.1:99999", None),
        ("http://127.0.0.1:port", None),
        ("http://[::1", None),
    ],
)
def test_origin_parts_reads_a_bare_http_origin_and_nothing_else(origin, parts):
    assert origin_parts(origin) == parts


@pytest.mark.parametrize(
    "origin, host, own",
    [
        ("http://127.0.0.1:8000", "127.0.0.1:8000", True),
        ("https://127.0.0.1:8000", "127.0.0.1:8000", True),  # a TLS proxy in front, on the same port
        ("http://LOCALHOST:8000", "localhost:8000", True),
        ("http://localhost:8000", "LOCALHOST:8000", True),
        ("http://[::1]:8000", "[::1]:8000", True),
        ("https://tpu.example", "tpu.example", True),  # a proxy on 443: the Host names no port
        ("http://tpu.example", "tpu.example", True),
        ("https://tpu.example:443", "tpu.example", True),
        ("http://tpu.example:80", "tpu.example", True),
        ("https://tpu.example", "tpu.example:443", True),
        # Another page of this machine: another port, or another name for it.
        ("http://localhost:9999", "localhost:8000", False),
        ("http://127.0.0.1:9999", "127.0.0.1:8000", False),
        ("http://localhost:8000", "127.0.0.1:8000", False),
        ("http://tpu.example", "tpu.example:8000", False),
        ("https://tpu.example", "tpu.example:80", False),
        ("http://tpu.example", "tpu.example:443", False),
        ("http://tpu.example.attacker.example", "tpu.example", False),
        ("null", "127.0.0.1:8000", False),
        ("http://127.0.0.1:8000", None, False),
        ("http://127.0.0.1:8000", "127.0.0.1:0", False),
        ("http://127.0.0.1:8000/", "127.0.0.1:8000", False),
    ],
)
def test_is_own_origin_compares_the_origin_with_the_page_the_host_header_names(origin, host, own):
    assert is_own_origin(origin, host) is own


@pytest.mark.parametrize(
    "path, method, drives",
    [
        ("/ws", "GET", True),
        ("/poll/open", "POST", True),
        ("/poll/read", "GET", True),
        ("/poll/", "GET", True),
        ("/", "POST", True),
        ("/static/js/textual.js", "PUT", True),
        ("/", "OPTIONS", True),
        ("/", "GET", False),
        ("/", "HEAD", False),
        ("/static/js/textual.js", "GET", False),
        ("/ws/", "GET", False),
        ("/wsx", "GET", False),
        ("/poll", "GET", False),
        ("/static/poll/x", "GET", False),
    ],
)
def test_drives_a_dashboard_names_the_websocket_the_polling_routes_and_every_write(path, method, drives):
    assert drives_a_dashboard(path, method) is drives


OWN = "http://127.0.0.1:8000"
HOST = "127.0.0.1:8000"
OTHER_PAGE = "http://localhost:9999"


@pytest.mark.parametrize("check_host_header", [True, False])
@pytest.mark.parametrize(
    "origins, path, method, by_token, refused_because",
    [
        # No Origin: a navigation or a fetch of the page's files; a program that has the token.
        ([], "/", "GET", False, None),
        ([], "/static/js/textual.js", "GET", False, None),
        ([], "/ws", "GET", True, None),
        ([], "/poll/open", "POST", True, None),
        # No Origin where a browser always sends one, and only the cookie to show.
        ([], "/ws", "GET", False, "carries only the cookie, without an Origin header"),
        ([], "/poll/open", "POST", False, "carries only the cookie, without an Origin header"),
        ([], "/", "POST", False, "carries only the cookie, without an Origin header"),
        # The page's own origin, by cookie or by token.
        ([OWN], "/ws", "GET", False, None),
        ([OWN], "/poll/read", "POST", True, None),
        ([OWN], "/", "GET", False, None),
        # Another page, with the owner's cookie: never.
        ([OTHER_PAGE], "/ws", "GET", False, "'http://localhost:9999' is another page than this dashboard's own"),
        ([OTHER_PAGE], "/", "GET", False, "'http://localhost:9999' is another page than this dashboard's own"),
        (["null"], "/poll/open", "POST", False, "'null' is another page"),
        ([OWN, OWN], "/ws", "GET", False, f"'{OWN}, {OWN}' is another page"),
    ],
)
def test_origin_refusal_lets_in_only_the_pages_own_origin(
    origins, path, method, by_token, refused_because, check_host_header
):
    rules = Access(token=TOKEN, check_host_header=check_host_header)
    refusal = rules.origin_refusal(origins, HOST, path=path, method=method, by_token=by_token)
    if refused_because is None:
        assert refusal is None
    else:
        assert refusal is not None and refused_because in refusal


def test_origin_refusal_names_the_page_it_expected_and_how_a_program_gets_in():
    rules = Access(token=TOKEN)
    other = rules.origin_refusal([OTHER_PAGE], f" {HOST} ", path="/ws", method="GET", by_token=False)
    assert other == (
        "Origin 'http://localhost:9999' is another page than this dashboard's own "
        "(http://127.0.0.1:8000 or https://127.0.0.1:8000); only the page tpudash serve sent may open or "
        "drive a dashboard"
    )
    nameless = rules.origin_refusal([OTHER_PAGE], None, path="/ws", method="GET", by_token=False)
    assert nameless is not None and "(http:// or https://)" in nameless
    missing = rules.origin_refusal([], HOST, path="/ws", method="GET", by_token=False)
    assert missing == (
        "this request opens or drives a dashboard and carries only the cookie, without an Origin header; "
        "a browser always sends one here, and a program must carry the token (?token=…) instead of the cookie"
    )


@pytest.mark.parametrize("origin", [OTHER_PAGE, "https://abc-8000-colab.googleusercontent.com", "null"])
def test_another_origin_with_the_token_gets_in_only_behind_a_proxy_that_rewrites_host(origin):
    """Colab's frame: served under the proxy's origin, every address it asks for carries the token."""
    behind_proxy = Access(token=TOKEN, check_host_header=False)
    assert behind_proxy.origin_refusal([origin], HOST, path="/ws", method="GET", by_token=True) is None
    assert behind_proxy.origin_refusal([origin], HOST, path="/ws", method="GET", by_token=False) is not None
    direct = Access(token=TOKEN)
    assert direct.origin_refusal([origin], HOST, path="/ws", method="GET", by_token=True) is not None


def test_the_token_is_taken_from_the_query_or_the_servers_own_cookie_and_nowhere_else():
    rules = Access(token=TOKEN)
    assert rules.by_query({"token": TOKEN})
    assert rules.by_query({}) is False
    assert not rules.by_query({"token": ""})
    assert not rules.by_query({"token": TOKEN[:-1]})
    assert not rules.by_query({"token": TOKEN + "x"})
    assert not rules.by_query({"token": TOKEN.upper()})
    assert not rules.by_query({"Token": TOKEN})
    assert rules.by_query({"token": "\udcff"}) is False  # a lone surrogate, percent-decoded from a query
    assert not rules.by_query({rules.cookie_name: TOKEN})
    assert rules.by_cookie({rules.cookie_name: TOKEN})
    assert not rules.by_cookie({"token": TOKEN})
    assert not rules.by_cookie({Access(token=TOKEN).cookie_name: TOKEN})  # another server's cookie
    assert not rules.by_cookie({rules.cookie_name: ""})
    assert not rules.by_cookie({rules.cookie_name: "guess"})
    assert rules.token_query() == f"token={TOKEN}"
    assert Access(token="a b&c").token_query() == "token=a+b%26c"


def test_on_loopback_the_host_header_must_be_a_loopback_name_or_an_allowed_host():
    rules = Access(token=TOKEN, allowed_hosts=["My-Laptop:8000", "", "[::2]"])
    assert rules.allowed_hosts == {"my-laptop", "::2"}
    for header in ("localhost", "localhost:8000", "127.0.0.1:8000", "127.1.2.3", "[::1]:8000", "my-laptop:8000"):
        assert rules.host_allowed(header), header
    for header in (None, "", "attacker.example", "attacker.example:8000", "10.0.0.5", "[::3]:8000"):
        assert not rules.host_allowed(header), header
    assert rules.host_allowed("[::2]:8000")
    assert Access(token=TOKEN, check_host_header=False).host_allowed("attacker.example")
    assert Access(token=TOKEN, check_host_header=False).host_allowed(None)


def test_under_public_the_host_header_may_name_this_machine(monkeypatch):
    monkeypatch.setattr(access, "machine_host_names", lambda bound_host: {f"machine-of-{bound_host}"})
    public = Access(token=TOKEN, loopback=False, bound_host="0.0.0.0", allowed_hosts=["vm.example"])
    assert public.allowed_hosts == {"machine-of-0.0.0.0", "vm.example"}
    assert public.host_allowed("machine-of-0.0.0.0:8000") and public.host_allowed("localhost")
    assert not public.host_allowed("attacker.example")
    assert Access(token=TOKEN, loopback=False).allowed_hosts == {"machine-of-127.0.0.1"}  # the default bind
    # The names are not looked up when the Host header is not checked, nor on loopback.
    assert Access(token=TOKEN, loopback=False, check_host_header=False).allowed_hosts == set()
    assert Access(token=TOKEN, loopback=True, bound_host="0.0.0.0").allowed_hosts == set()


def _interfaces(*addresses: str) -> dict[str, list[SimpleNamespace]]:
    return {"eth0": [SimpleNamespace(address=address) for address in addresses]}


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::", ""])
def test_a_wildcard_bind_answers_to_this_machines_names_and_every_interface_address(wildcard, monkeypatch):
    import psutil

    monkeypatch.setattr(socket, "gethostname", lambda: "My-VM")
    monkeypatch.setattr(socket, "getfqdn", lambda: "My-VM.Example")
    monkeypatch.setattr(psutil, "net_if_addrs", lambda: _interfaces("10.0.0.5", "FE80::1%eth0"))
    assert machine_host_names(wildcard) == {"my-vm", "my-vm.example", "10.0.0.5", "fe80::1"}


@pytest.mark.parametrize("failure", [OSError("no interfaces"), ImportError("no psutil")])
def test_a_wildcard_bind_without_the_interfaces_still_answers_to_the_machines_names(failure, monkeypatch):
    import psutil

    def fail():
        raise failure

    monkeypatch.setattr(socket, "gethostname", lambda: "my-vm")
    monkeypatch.setattr(socket, "getfqdn", lambda: "my-vm.example")
    monkeypatch.setattr(psutil, "net_if_addrs", fail)
    assert machine_host_names("0.0.0.0") == {"my-vm", "my-vm.example"}


def test_a_named_bind_answers_to_its_name_and_the_addresses_it_resolves_to(monkeypatch):
    resolved = [(socket.AF_INET, 0, 0, "", ("10.0.0.5", 0)), (socket.AF_INET6, 0, 0, "", ("FE80::2%eth0", 0, 0, 2))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, port: resolved)
    monkeypatch.setattr(socket, "gethostname", lambda: "not-asked")
    assert machine_host_names("My-VM") == {"my-vm", "10.0.0.5", "fe80::2"}


@pytest.mark.parametrize("failure", [socket.gaierror("no such name"), UnicodeError("bad name")])
def test_a_named_bind_that_does_not_resolve_answers_to_its_name(failure, monkeypatch):
    def fail(host, port):
        raise failure

    monkeypatch.setattr(socket, "getaddrinfo", fail)
    assert machine_host_names("My-VM") == {"my-vm"}


@pytest.mark.parametrize(
    "query, location",
    [
        ({}, "./"),
        ({"token": TOKEN}, "./"),
        ({"token": TOKEN, "embed": "1"}, "./"),
        ({"token": TOKEN, "transport": "poll", "fontsize": "20"}, "./?transport=poll&fontsize=20"),
        ({"transport": "a b&c"}, "./?transport=a+b%26c"),
    ],
)
def test_without_token_is_the_pages_address_less_the_token_and_the_embed_flag(query, location):
    assert without_token(query) == location
