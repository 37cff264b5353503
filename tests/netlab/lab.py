"""A network lab: an isolated "internet" of Linux network namespaces, public hosts, and homes behind NAT routers.

Volunteers sit behind home routers on slow links; this builds that world on one
machine, as root, with nothing connected to the real network:

    internet (namespace with a bridge, no IP, no route anywhere else)
      |-- public host     11.0.0.10            a peer with a global address, dialable by all
      |-- firewalled host 11.0.0.30            a global address, but inbound connections dropped
      |-- router r1       11.0.0.21 | 10.1.0.1   MASQUERADE + stateful firewall (new inbound dropped)
      |     `-- home h1   10.1.0.2
      `-- router r2       11.0.0.22 | 10.2.0.1
            `-- home h2   10.2.0.2

The "internet" is 11.0.0.0/24, a range both Python's ``ipaddress`` and libp2p
classify as global: with RFC 5737 documentation ranges (198.51.100.0/24)
libp2p treats the lab's internet as private and behaves differently (and
Python >= 3.11.10 / 3.12.4 no longer calls 192.0.0.0/24 global). Nothing in
the lab has a route out of it, so no packet reaches the real 11.0.0.0/8.

Shaping of a router's uplink (``Lab.shape``): this kernel has no ``sch_netem``,
so upload rate is a ``tbf`` qdisc on the router's ``wan`` interface, download
rate one on its ``lan`` interface, and loss an iptables ``statistic`` match in
the router's FORWARD chain (both directions). There is no delay: the only way
here would be an NFQUEUE delay line in Python, which costs a core at 20 Mbit/s
on a 2-core machine; tens of milliseconds matter little beside hivemind's
seconds-long matchmaking, which bandwidth and loss already stress.

Processes run inside a namespace with ``ip netns exec`` (``Host.command``);
Unix sockets (the daemons' control sockets) stay reachable from the host.
``Lab.teardown`` kills every process left in the lab's namespaces and deletes
them; ``remove_stale_labs`` does the same for labs whose test process died.

Needs root and the ``iproute2`` and ``iptables`` Debian packages
(``lab_unavailable`` says in one line why a lab cannot be built here).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field

PREFIX = "p2pl"
INTERNET = ipaddress.ip_network("11.0.0.0/24")
_NAMESPACE = re.compile(rf"^{PREFIX}(\d+)-")


class LabError(RuntimeError):
    """A command that builds the lab failed (the message carries the command and its stderr)."""


def _run(*argv: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def lab_unavailable() -> str | None:
    """Why no lab can be built on this machine (one line), or None when it can."""
    if os.geteuid() != 0:
        return "the network lab needs root (network namespaces, iptables)"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            return f"the network lab needs `{tool}`: apt-get install {package}"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        _run("ip", "netns", "add", probe)
        _run("ip", "netns", "exec", probe, "iptables", "-t", "nat", "-L", "-n")
        _run("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "1mbit",
             "burst", "16kb", "latency", "50ms")
    except (LabError, subprocess.TimeoutExpired) as error:
        return f"the network lab cannot be built here: {str(error).splitlines()[0]}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_processes(namespace: str, grace_s: float = 5.0) -> None:
    """SIGTERM every process in ``namespace``, then SIGKILL what is left after ``grace_s``."""
    def pids() -> list[int]:
        result = _run("ip", "netns", "pids", namespace, check=False)
        return [int(pid) for pid in result.stdout.split()]

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        running = pids()
        for pid in running:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while running and time.monotonic() < deadline:
            time.sleep(0.1)
            running = pids()
        if not running:
            return


def _delete_namespace(namespace: str) -> None:
    _kill_namespace_processes(namespace)
    _run("ip", "netns", "del", namespace, check=False)


def remove_stale_labs() -> list[str]:
    """Delete the namespaces of labs whose test process is gone (a SIGKILLed run); returns their names."""
    removed = []
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NAMESPACE.match(name)
        if match and not _pid_alive(int(match.group(1))):
            _delete_namespace(name)
            removed.append(name)
    return removed


@dataclass
class Router:
    """A home router: ``wan`` on the internet (``public_address``), ``lan`` to its home network."""

    name: str
    namespace: str
    public_address: str
    lan_address: str

    def iptables(self, *rule: str) -> None:
        _run("ip", "netns", "exec", self.namespace, "iptables", *rule)

    def uplink_bytes(self) -> dict[str, int]:
        """Bytes the home sent to (``sent``) and received from (``received``) the internet, as the
        router forwarded them (its accounting rules; packets dropped by the firewall not counted)."""
        output = _run("ip", "netns", "exec", self.namespace, "iptables", "-L", "FORWARD", "-v", "-x", "-n").stdout
        counts = {"sent": 0, "received": 0}
        for line in output.splitlines():
            if "/* p2pl-sent */" in line:
                counts["sent"] = int(line.split()[1])
            elif "/* p2pl-received */" in line:
                counts["received"] = int(line.split()[1])
        return counts


@dataclass
class Host:
    """A machine of the lab: its namespace, its own address, and the address the internet sees.

    Attributes:
        name: its role in the lab (``public``, ``h1``...).
        namespace: the network namespace its processes run in.
        address: its interface's IPv4 address.
        public_address: what peers on the internet see as its source address
            (its router's for a home behind NAT).
        router: its home router, None for a host on the internet itself.
    """

    name: str
    namespace: str
    address: str
    public_address: str
    router: Router | None = None

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def run(self, argv: list[str], timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), capture_output=True, text=True, timeout=timeout, **kwargs)

    def interface_bytes(self) -> dict[str, int]:
        """Bytes this host's ``eth0`` has ``sent`` and ``received`` (everything: IP, TCP, ARP)."""
        stats = json.loads(_run("ip", "-n", self.namespace, "-j", "-s", "link", "show", "eth0").stdout)[0]["stats64"]
        return {"sent": stats["tx"]["bytes"], "received": stats["rx"]["bytes"]}


@dataclass
class Lab:
    """One lab: build it with ``add_public``, ``add_firewalled`` and ``add_home``, always end it with ``teardown``.

    Args:
        tag: a short word that tells concurrent labs of one process apart.
    """

    tag: str = "a"
    hosts: dict[str, Host] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    _next_public: int = 10

    def __post_init__(self):
        self.internet = self._namespace("inet")
        _run("ip", "-n", self.internet, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.internet, "link", "set", "dev", "br0", "up")

    def _namespace(self, role: str) -> str:
        name = f"{PREFIX}{os.getpid()}-{self.tag}-{role}"
        _run("ip", "netns", "add", name)
        self.namespaces.append(name)
        _run("ip", "-n", name, "link", "set", "dev", "lo", "up")
        return name

    def _public_ip(self) -> str:
        address = str(INTERNET[self._next_public])
        self._next_public += 1
        assert ipaddress.ip_address(address).is_global, f"{address} must be global for libp2p and Python alike"
        return address

    def _plug_into_internet(self, namespace: str, port: str, interface: str, address: str) -> None:
        """A veth pair: ``interface`` in ``namespace`` (with ``address``), ``port`` on the internet's bridge."""
        _run("ip", "link", "add", interface, "netns", namespace, "type", "veth", "peer", "name", port, "netns",
             self.internet)
        _run("ip", "-n", self.internet, "link", "set", "dev", port, "master", "br0", "up")
        _run("ip", "-n", namespace, "addr", "add", f"{address}/{INTERNET.prefixlen}", "dev", interface)
        _run("ip", "-n", namespace, "link", "set", "dev", interface, "up")

    def add_public(self, name: str) -> Host:
        """A host with a global address on the internet, reachable by everyone."""
        namespace = self._namespace(name)
        address = self._public_ip()
        self._plug_into_internet(namespace, name, "eth0", address)
        self.hosts[name] = Host(name, namespace, address, address)
        return self.hosts[name]

    def add_firewalled(self, name: str) -> Host:
        """A host with a global address whose firewall drops every new inbound connection
        (a cloud VM with a closed security group, a laptop with ufw on)."""
        host = self.add_public(name)
        for rule in (("-A", "INPUT", "-i", "lo", "-j", "ACCEPT"),
                     ("-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"),
                     ("-P", "INPUT", "DROP")):
            _run("ip", "netns", "exec", host.namespace, "iptables", *rule)
        return host

    def add_home(self, name: str) -> Host:
        """A home: a host ``name`` behind its own NAT router ``r<name>`` (MASQUERADE, new inbound dropped)."""
        index = sum(1 for host in self.hosts.values() if host.router is not None) + 1
        lan = ipaddress.ip_network(f"10.{index}.0.0/24")
        router_namespace = self._namespace(f"r{name}")
        public_address = self._public_ip()
        self._plug_into_internet(router_namespace, f"r{name}", "wan", public_address)
        router = Router(f"r{name}", router_namespace, public_address, str(lan[1]))
        namespace = self._namespace(name)
        _run("ip", "link", "add", "eth0", "netns", namespace, "type", "veth", "peer", "name", "lan", "netns",
             router_namespace)
        _run("ip", "-n", router_namespace, "addr", "add", f"{lan[1]}/24", "dev", "lan")
        _run("ip", "-n", router_namespace, "link", "set", "dev", "lan", "up")
        _run("ip", "-n", namespace, "addr", "add", f"{lan[2]}/24", "dev", "eth0")
        _run("ip", "-n", namespace, "link", "set", "dev", "eth0", "up")
        _run("ip", "-n", namespace, "route", "add", "default", "via", str(lan[1]))
        _run("ip", "netns", "exec", router_namespace, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for rule in (
            # accounting first, so the counters see every forwarded byte (dropped ones are not delivered)
            ("-A", "FORWARD", "-i", "lan", "-o", "wan", "-m", "comment", "--comment", "p2pl-sent"),
            ("-A", "FORWARD", "-i", "wan", "-o", "lan", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
             "-m", "comment", "--comment", "p2pl-received"),
            ("-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"),
            ("-A", "FORWARD", "-i", "lan", "-o", "wan", "-j", "ACCEPT"),
            ("-P", "FORWARD", "DROP"),
            ("-A", "INPUT", "-i", "wan", "-m", "conntrack", "--ctstate", "NEW", "-j", "DROP"),
            ("-t", "nat", "-A", "POSTROUTING", "-o", "wan", "-j", "MASQUERADE"),
        ):
            router.iptables(*rule)
        self.hosts[name] = Host(name, namespace, str(lan[2]), public_address, router)
        return self.hosts[name]

    def shape(self, name: str, upload_mbit: float, download_mbit: float | None = None, loss_pct: float = 0.0) -> None:
        """Shape a host's line to the internet: ``upload_mbit`` (and ``download_mbit``) with ``tbf``,
        ``loss_pct`` percent of packets dropped at random in each direction (an iptables ``statistic``
        match). A home's router shapes its ``wan`` (upload) and ``lan`` (download) interfaces; a host on
        the internet its own ``eth0`` (upload) and its port on the internet's bridge (download)."""
        host = self.hosts[name]
        if host.router is not None:
            links = ((host.router.namespace, "wan", upload_mbit), (host.router.namespace, "lan", download_mbit))
        else:
            links = ((host.namespace, "eth0", upload_mbit), (self.internet, name, download_mbit))
        for namespace, interface, mbit in links:
            if mbit:
                # a burst of ~10 ms at the rate, at least one jumbo frame; a queue of ~100 ms, like a home router's
                burst = max(int(mbit * 1e6 / 8 / 100), 16384)
                _run("ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev", interface, "root",
                     "tbf", "rate", f"{mbit}mbit", "burst", str(burst), "latency", "100ms")
        if loss_pct:
            loss = ("-m", "statistic", "--mode", "random", "--probability", f"{loss_pct / 100:.6f}", "-j", "DROP")
            if host.router is not None:
                host.router.iptables("-I", "FORWARD", "3", *loss)
            else:
                for chain in ("INPUT", "OUTPUT"):
                    _run("ip", "netns", "exec", host.namespace, "iptables", "-I", chain, "1", "-o" if chain == "OUTPUT"
                         else "-i", "eth0", *loss)

    def teardown(self) -> None:
        """Kill every process in the lab's namespaces and delete them (never raises)."""
        for namespace in reversed(self.namespaces):
            try:
                _delete_namespace(namespace)
            except Exception:  # a teardown must go on with the rest
                pass
        self.namespaces.clear()
