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
- The Origin header, where a browser sends one, must be the page's own
  origin: the scheme (http, or https behind a TLS proxy) and the host and
  port the Host header names. The cookie is SameSite=Strict, but a browser
  counts every port of a host as the same site, so another page on this
  machine (``http://localhost:9999``) gets the cookie sent with its
  requests; its Origin is what tells it apart. A request that opens or
  drives a dashboard (the WebSocket, ``/poll/…``, any method but GET and
  HEAD) must carry an Origin when only the cookie admits it: a browser
  always sends one there, and a program that is not a browser has the
  token. A request carrying the token itself, with no Origin, is such a
  program. Behind a proxy that rewrites Host (``--allow-any-host-header``,
  as ``colab.show()`` starts it) the frame's origin is the proxy's, so
  there a request with the token is let in from any origin; the cookie never is.

Only the standard library here (psutil when the interfaces are listed); the
server (``tpudash.web.serve``) asks, this module answers.
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterable, Mapping
from urllib.parse import urlencode, urlsplit

from tpudash.net import is_loopback_host

TOKEN_PARAMETER = "token"
EMBED_PARAMETER = "embed"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
# The schemes a page of this server can have: plain HTTP, or HTTPS where a TLS proxy stands in front.
DEFAULT_PORTS = {"http": 80, "https": 443}


def host_name(host_header: str | None) -> str | None:
    """The host name of a Host header, lower case, without port or brackets; None when there is none."""
    if not host_header:
        return None
    host = host_header.strip().lower().rstrip(".")
    if host.startswith("["):  # [::1]:8000
        end = host.find("]")
        return host[1:end] if end > 1 else None
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host or None


def host_and_port(host_header: str | None) -> tuple[str, int | None] | None:
    """A Host header's name (as ``host_name``) and port (None when it names none); None when unreadable."""
    name = host_name(host_header)
    if name is None:
        return None
    text = (host_header or "").strip()
    if text.startswith("["):  # [::1]:8000
        after = text[text.find("]") + 1 :]
        if not after:
            return name, None
        if not after.startswith(":"):
            return None
        port_text = after[1:]
    elif text.count(":") == 1:
        port_text = text.partition(":")[2]
    else:  # a name, or an IPv6 address without brackets
        return name, None
    # ASCII digits only: str.isdigit() also takes "²" and "８", which int() refuses or reads.
    if not (port_text.isascii() and port_text.isdigit()):
        return None
    port = int(port_text)
    return (name, port) if 0 < port < 65536 else None


def origin_parts(origin: str) -> tuple[str, str, int] | None:
    """An Origin header's scheme, host and port (the scheme's default when it names none); None for
    ``null``, a scheme other than http(s), or anything that is not a bare origin."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port  # raises on a port that is not a number in 0…65535
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or "@" in parts.netloc:
        return None
    if parts.path or parts.query or parts.fragment:
        return None
    return parts.scheme, parts.hostname.rstrip("."), DEFAULT_PORTS[parts.scheme] if port is None else port


def is_own_origin(origin: str, host_header: str | None) -> bool:
    """``origin`` is the page this request's Host header names: same host, same port.

    A Host without a port is the default port of the Origin's scheme (a
    proxy serving the page on 443 or 80).
    """
    page = origin_parts(origin)
    host = host_and_port(host_header)
    if page is None or host is None:
        return False
    scheme, origin_host, origin_port = page
    name, port = host
    return origin_host == name and origin_port == (DEFAULT_PORTS[scheme] if port is None else port)


def drives_a_dashboard(path: str, method: str) -> bool:
    """Whether a request opens or drives a dashboard: the WebSocket, the polling routes, any method but GET and HEAD."""
    return path == "/ws" or path.startswith("/poll/") or method not in ("GET", "HEAD")


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

    def origin_refusal(
        self, origins: list[str], host_header: str | None, *, path: str, method: str, by_token: bool
    ) -> str | None:
        """Why a request admitted by its token or cookie is refused for its Origin header(s), or None.

        ``origins``: every Origin header the request carries (a browser sends at most one).
        """
        if not origins:
            if by_token or not drives_a_dashboard(path, method):
                return None  # a navigation or a plain fetch of the page; or a program with the token
            return (
                "this request opens or drives a dashboard and carries only the cookie, without an Origin "
                "header; a browser always sends one here, and a program must carry the token "
                f"(?{TOKEN_PARAMETER}=…) instead of the cookie"
            )
        if len(origins) == 1 and is_own_origin(origins[0], host_header):
            return None
        if by_token and not self.check_host_header:
            return None  # behind a proxy that rewrites Host (Colab's frame): the token is the proof
        shown = ", ".join(origins)
        page = (host_header or "").strip()
        return (
            f"Origin {shown!r} is another page than this dashboard's own (http://{page} or https://{page}); "
            "only the page tpudash serve sent may open or drive a dashboard"
        )


def without_token(path_qs_query: Mapping[str, str]) -> str:
    """``./`` and the query less the token: where the page redirects to (relative, for proxies with a path)."""
    rest = [(key, value) for key, value in path_qs_query.items() if key not in (TOKEN_PARAMETER, EMBED_PARAMETER)]
    return "./" + (f"?{urlencode(rest)}" if rest else "")
