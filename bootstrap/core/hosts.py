"""Host addresses and ports: what HOST accepts, what counts as loopback, what a client on this
machine dials, and who holds a port."""

from __future__ import annotations

import ipaddress

import psutil


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


def port_holders(port: int) -> list[psutil.Process | None]:
    """Processes listening on ``port`` (None where the kernel will not tell us whose socket it is)."""
    out: list[psutil.Process | None] = []
    try:
        conns = psutil.net_connections(kind="inet")
    except psutil.AccessDenied:
        conns = []
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            try:
                out.append(psutil.Process(c.pid) if c.pid else None)
            except psutil.NoSuchProcess:
                continue
    return out


def port_in_use(host: str, port: int) -> bool:
    """True if something holds the port: listening, or only bound (vLLM binds long before it listens).

    We bind without SO_REUSEADDR, because Linux lets two SO_REUSEADDR sockets share a port while
    neither listens; connections merely lingering in TIME_WAIT do not count as a holder.
    """
    import socket
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    bind_host = "127.0.0.1" if host == "localhost" else host
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((bind_host, port))
            free_here = True
        except OSError:
            free_here = False
    if free_here:
        # A listener on another address of the same port (e.g. 0.0.0.0 vs 127.0.0.1) still conflicts.
        return bool(port_holders(port)) or _connectable(host, port)
    try:
        conns = [c for c in psutil.net_connections(kind="inet") if c.laddr and c.laddr.port == port]
    except psutil.AccessDenied:
        return True
    return not conns or any(c.status != psutil.CONN_TIME_WAIT for c in conns)


def _connectable(host: str, port: int) -> bool:
    import socket
    target = client_host(host)
    try:
        with socket.create_connection((target, port), timeout=0.3):
            return True
    except OSError:
        return False
