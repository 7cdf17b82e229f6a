"""``tpudash serve``'s flags checked: where it listens (host, port), who it answers (allowed hosts), how many tabs.

Each ``parse_*`` turns what was typed into its value or raises
``ServeError``, whose message names the flag and what is allowed; the CLI
makes it exit 2. ``resolve_host`` keeps the server on loopback unless
``--public`` says otherwise: whoever reaches the port can launch jobs here.
"""

from __future__ import annotations

import ipaddress
import socket

from tpudash.web.access import host_name

DEFAULT_HOST = "127.0.0.1"
PUBLIC_HOST = "0.0.0.0"
DEFAULT_PORT = 8000
DEFAULT_MAX_DASHBOARDS = 4


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
