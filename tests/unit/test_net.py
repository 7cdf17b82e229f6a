"""One loopback rule: ``tpudash serve``'s Host check and ``--tpu-metrics`` agree on which hosts are this machine."""

from __future__ import annotations

import pytest

from tpudash.net import is_loopback_host
from tpudash.telemetry.sources import AddressError, parse_metrics_address
from tpudash.web.access import Access


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST", "localhost.localdomain", "ip6-localhost", "127.0.0.1", "127.1.2.3", "::1"]
)
def test_loopback_names_and_addresses_are_loopback_for_serve_and_for_the_metrics_address(host):
    assert is_loopback_host(host)
    bracketed = f"[{host}]" if ":" in host else host
    assert Access().host_allowed(f"{bracketed}:8000")
    assert parse_metrics_address(f"{bracketed}:8431") == f"{bracketed}:8431"


@pytest.mark.parametrize("host", ["attacker.example", "10.0.0.1", "::2", "localhost.attacker.example", ""])
def test_other_hosts_are_refused_by_both(host):
    assert not is_loopback_host(host)
    bracketed = f"[{host}]" if ":" in host else host
    assert not Access().host_allowed(f"{bracketed}:8000")
    with pytest.raises(AddressError):
        parse_metrics_address(f"{bracketed}:8431")
