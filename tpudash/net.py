"""What counts as this machine's loopback: the one rule for host names and addresses.

``tpudash serve`` listens on loopback by default and then answers only to a
loopback Host header (against DNS rebinding); libtpu's metrics service
speaks only over loopback, so ``--tpu-metrics`` must name a loopback host.
Both ask this module, so they agree on which names are loopback. A leaf: it
imports nothing of tpudash.
"""

from __future__ import annotations

import ipaddress

# Names that mean loopback on a usual /etc/hosts, compared in lower case; any
# loopback IP address (127.0.0.0/8, ::1) counts too.
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def is_loopback_host(host: str) -> bool:
    """``host`` (a name or an IP address, without port or brackets) is this machine's loopback."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
