"""Who ``tpudash serve`` lets in: the token, the cookie it becomes, and the Host header.

- Every route needs the server's token, ``/`` and the static files included:
  in the query (``?token=…``, as the printed URL carries it) or in the
  cookie the first good request sets (HttpOnly, SameSite=Strict, Path=/).
  The page asked for with the token answers with that cookie and a redirect
  to the same address without the token, so the token leaves the address
  bar (and the history). ``?embed=1`` skips the redirect: a cross-site
  frame (Colab's cell output) is sent no SameSite=Strict cookie, so that
  page keeps the token and puts it on every address it asks for itself.
- The Host header must name this server (against DNS rebinding): on
  loopback a loopback name; under ``--public`` the bound address, this
  machine's names and addresses, loopback, or an ``--allowed-host``.

Only the standard library here (psutil when the interfaces are listed); the
server (``tpudash.web.serve``) asks, this module answers.
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterable, Mapping
from urllib.parse import urlencode

from tpudash.net import is_loopback_host

TOKEN_PARAMETER = "token"
EMBED_PARAMETER = "embed"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def host_name(host_header: str | None) -> str | None:
    """The host name of a Host header, lower case, without port or brackets; None when there is none."""
    if not host_header:
        return None
    host = host_header.strip().lower().rstrip(".")
    if host.startswith("["):  # [::1]:8000
        end = host.find("]")
        return host[1:end] if end > 1 else None
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host or None


def machine_host_names(bound_host: str) -> set[str]:
    """The names a browser may use for a server bound to ``bound_host`` beyond loopback."""
    names = {bound_host.lower()} if bound_host not in WILDCARD_HOSTS else set()
    if bound_host in WILDCARD_HOSTS:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        try:
            import psutil

            for addresses in psutil.net_if_addrs().values():
                names |= {address.address.split("%")[0].lower() for address in addresses}
        except (ImportError, OSError):
            pass
    else:
        try:
            names |= {str(info[4][0]).split("%")[0].lower() for info in socket.getaddrinfo(bound_host, None)}
        except (socket.gaierror, UnicodeError):
            pass
    return names


class Access:
    """The token, its cookie and the Host names one server answers to."""

    def __init__(
        self,
        *,
        token: str | None = None,
        loopback: bool = True,
        bound_host: str = "127.0.0.1",
        allowed_hosts: Iterable[str] = (),
        check_host_header: bool = True,
    ):
        self.token = token or secrets.token_urlsafe(24)
        # A name of its own per server: two servers on one host name (SSH
        # forwards to localhost:8000 and :9000) must not overwrite each other's.
        self.cookie_name = f"tpudash-{secrets.token_hex(4)}"
        self.check_host_header = check_host_header
        self.allowed_hosts = {name for name in (host_name(host) for host in allowed_hosts) if name}
        if not loopback and check_host_header:
            self.allowed_hosts |= machine_host_names(bound_host)

    def host_allowed(self, host_header: str | None) -> bool:
        if not self.check_host_header:
            return True
        name = host_name(host_header)
        return name is not None and (is_loopback_host(name) or name in self.allowed_hosts)

    def _matches(self, candidate: str | None) -> bool:
        if not candidate:
            return False
        try:
            return secrets.compare_digest(candidate.encode("utf-8"), self.token.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate from a percent-decoded query
            return False

    def by_query(self, query: Mapping[str, str]) -> bool:
        return self._matches(query.get(TOKEN_PARAMETER))

    def by_cookie(self, cookies: Mapping[str, str]) -> bool:
        return self._matches(cookies.get(self.cookie_name))

    def token_query(self) -> str:
        return urlencode({TOKEN_PARAMETER: self.token})


def without_token(path_qs_query: Mapping[str, str]) -> str:
    """``./`` and the query less the token: where the page redirects to (relative, for proxies with a path)."""
    rest = [(key, value) for key, value in path_qs_query.items() if key not in (TOKEN_PARAMETER, EMBED_PARAMETER)]
    return "./" + (f"?{urlencode(rest)}" if rest else "")
