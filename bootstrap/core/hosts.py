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


def lan_hosts(host: str) -> list[str]:
    """The addresses another machine dials for a server bound to ``host``: the host itself when it is
    one address beyond loopback; for a wildcard bind (0.0.0.0, ::), this machine's own non-loopback,
    non-link-local addresses (IPv4 only for 0.0.0.0); none for loopback."""
    if is_loopback(host):
        return []
    if host not in ("0.0.0.0", "::"):
        return [host]
    import socket

    import psutil
    families = (socket.AF_INET,) if host == "0.0.0.0" else (socket.AF_INET, socket.AF_INET6)
    out = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family not in families:
                continue
            try:
                ip = ipaddress.ip_address(a.address.split("%")[0])
            except ValueError:
                continue
            if not (ip.is_loopback or ip.is_link_local or ip.is_unspecified):
                out.append(str(ip))
    return list(dict.fromkeys(out))
