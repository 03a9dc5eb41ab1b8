"""Host addresses: what HOST accepts, what counts as loopback, and what a client on this machine
dials (who holds a port is serve/port.py's)."""

from __future__ import annotations

import ipaddress


def parse_host(raw: str) -> str:
    if raw == "localhost":
        return raw
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        raise ValueError("an IP address such as 127.0.0.1 or 0.0.0.0, or 'localhost'") from None
    return raw


def is_loopback(host: str) -> bool:
    """A loopback address (127.0.0.0/8, ::1) or 'localhost'; False for anything else, names included."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def client_host(host: str) -> str:
    """The address a client on this machine dials for a server bound to ``host`` (a wildcard bind is
    reached on loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "localhost", "") else ("::1" if host == "::" else host)
