"""The DHT's listening ports: is the configured one free, who holds it, and which one to use instead.

libp2p's p2pd listens with ``SO_REUSEPORT``, so a second p2pd on a port that
is taken does not fail: both listen, the kernel splits incoming connections
between them, and a peer dialling one reaches the other about half the time
(p2pd then says "failed to connect to bootstrap peers", which sends the user
after the wrong problem). Two daemons on one machine with the default config
(TCP 31337) hit exactly this. So the worker checks each fixed port itself
before starting p2pd: a bind without ``SO_REUSEPORT`` fails on a port that
anyone listens on. A taken port is replaced by the next free one, and the
move is reported with who holds the port (another p2ptrain daemon, named by
its home, when it is one).

Stdlib, psutil and the worker pipe's messages only: the doctor uses it too.
"""

from __future__ import annotations

import errno
import re
import socket
from dataclasses import dataclass

import psutil

from p2ptrain.worker_pipe import PortMove

NEXT_PORTS_TRIED = 16
_LISTEN = re.compile(r"^/(ip4|ip6)/([^/]+)/(tcp|udp)/(\d+)")
_IN_USE = re.compile(r"listen (tcp|udp)\d?\s+\[?([^\]\s]*?)\]?:(\d+): bind: address already in use")


@dataclass(frozen=True)
class PortHolder:
    """Who listens on a port.

    Attributes:
        pid: the listening process, None when it cannot be seen (another user's, without root).
        name: its process name (``p2pd``...).
        p2ptrain_daemon_pid: the p2ptrain daemon it belongs to, if any.
        p2ptrain_home: that daemon's ``--home`` (None: its standard directories).
    """

    pid: int | None
    name: str = ""
    p2ptrain_daemon_pid: int | None = None
    p2ptrain_home: str | None = None

    def describe(self) -> str:
        """Who it is, for a one-line message: "another p2ptrain daemon (pid 12, --home /srv/a)"."""
        if self.p2ptrain_daemon_pid is not None:
            home = f"--home {self.p2ptrain_home}" if self.p2ptrain_home else "its standard directories"
            return f"another p2ptrain daemon (pid {self.p2ptrain_daemon_pid}, {home})"
        if self.pid is None:
            return "another program"
        if self.name == "p2pd":
            return f"another hivemind peer (p2pd, pid {self.pid})"
        return f"{self.name or 'a process'} (pid {self.pid})"


def port_move(protocol: str, configured: int, port: int, holder: str) -> PortMove:
    """The pipe's record of a move, with its one-line message and fix.

    Args:
        protocol: ``tcp`` or ``udp``.
        configured: the port of ``dht.host_maddrs``.
        port: the port listened on instead (0: a random one, as the next ones were taken too).
        holder: who held the configured port, in words (``PortHolder.describe``).
    """
    instead = f"port {port}" if port else "a random port"
    forward = (f"forward {protocol.upper()} port {port} in your router to be reachable directly" if port
               else "peers reach this one through relays")
    return PortMove(
        protocol, configured, port, holder,
        message=f"{protocol.upper()} port {configured} is taken by {holder}: listening on {instead} instead",
        fix=(f"{forward}, or give this daemon its own port: p2ptrain config set dht.host_maddrs "
             f"'[\"/ip4/0.0.0.0/{protocol}/{port or configured + 1}\"]'"),
    )


def port_is_free(host: str, port: int, protocol: str = "tcp") -> bool:
    """Whether this process could listen on ``host:port`` now (nobody listens there).

    Args:
        host: the address to listen on (``0.0.0.0``, ``::``, ``127.0.0.1``...).
        port: the port, > 0.
        protocol: ``tcp`` or ``udp``.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    kind = socket.SOCK_STREAM if protocol == "tcp" else socket.SOCK_DGRAM
    with socket.socket(family, kind) as probe:
        if protocol == "tcp":
            # connections of a stopped peer in TIME_WAIT do not make the port taken; a listener does
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def port_holder(port: int, protocol: str = "tcp") -> PortHolder | None:
    """Who listens on ``port`` (any address), or None if nobody this process can see does.

    Args:
        port: the port.
        protocol: ``tcp`` or ``udp``.
    """
    try:
        connections = psutil.net_connections(kind=protocol)
    except (psutil.AccessDenied, OSError):
        return None
    for connection in connections:
        listening = protocol == "udp" or connection.status == psutil.CONN_LISTEN
        if listening and connection.laddr and connection.laddr.port == port:
            return _describe_process(connection.pid)
    return None


def _describe_process(pid: int | None) -> PortHolder:
    if pid is None:
        return PortHolder(None)
    try:
        process = psutil.Process(pid)
        name = process.name()
        for ancestor in [process, *process.parents()]:
            home = _p2ptrain_daemon_home(ancestor)
            if home is not False:
                return PortHolder(pid, name, ancestor.pid, home)
    except psutil.Error:
        return PortHolder(pid)
    return PortHolder(pid, name)


def _p2ptrain_daemon_home(process: psutil.Process) -> str | None | bool:
    """The ``--home`` of a ``p2ptrain daemon`` process (None: its standard
    directories); False when the process is not one."""
    try:
        arguments = process.cmdline()
    except psutil.Error:
        return False
    programs = [part for part in arguments[:3] if part.endswith("/p2ptrain") or part in ("p2ptrain", "p2ptrain.cli")]
    if not programs or "daemon" not in arguments:
        return False
    for index, part in enumerate(arguments):
        if part == "--home" and index + 1 < len(arguments):
            return arguments[index + 1]
        if part.startswith("--home="):
            return part.split("=", 1)[1]
    try:
        return process.environ().get("P2PTRAIN_HOME")
    except psutil.Error:
        return None


def claim_free_ports(host_maddrs: list[str]) -> tuple[list[str], list[PortMove]]:
    """``host_maddrs`` with every taken fixed port replaced by the next free one.

    Tries the next ``NEXT_PORTS_TRIED`` ports (predictable, so a user can
    forward them), then falls back to port 0 (any free port). Port 0 and
    addresses that are not ``/ip4`` or ``/ip6`` are kept as they are.

    Args:
        host_maddrs: the listening multiaddrs, e.g. ``/ip4/0.0.0.0/tcp/31337``.

    Returns:
        (the multiaddrs to listen on, the moves made).
    """
    addresses, moves = [], []
    for address in host_maddrs:
        match = _LISTEN.match(address)
        if match is None or int(match.group(4)) == 0:
            addresses.append(address)
            continue
        host, protocol, configured = match.group(2), match.group(3), int(match.group(4))
        if port_is_free(host, configured, protocol):
            addresses.append(address)
            continue
        holder = port_holder(configured, protocol) or PortHolder(None)
        port = next((candidate for candidate in range(configured + 1, min(configured + 1 + NEXT_PORTS_TRIED, 65536))
                     if port_is_free(host, candidate, protocol)), 0)
        addresses.append(f"/{match.group(1)}/{host}/{protocol}/{port}{address[match.end():]}")
        moves.append(port_move(protocol, configured, port, holder.describe()))
    return addresses, moves


def port_in_use_error(text: str) -> tuple[str, int] | None:
    """(protocol, port) when p2pd's start failure says a listening address is
    in use ("listen tcp4 0.0.0.0:31337: bind: address already in use"), else None."""
    match = _IN_USE.search(text)
    return (match.group(1), int(match.group(3))) if match else None
