"""Starting this peer's hivemind DHT, with a persistent identity, and describing how others reach it.

One key file is this peer's identity for everything: libp2p derives the peer
id from it, and the same key (Ed25519; RSA for identities made before, see
``identity``) signs our DHT records (manifest, metrics, hivemind's progress).
So a restart keeps the peer id *and* ownership of our records, and validators
can check that a record's ``peer_id`` belongs to the key that signed it.

Addresses are checked with :func:`p2ptrain.multiaddr.validate_multiaddr`;
hivemind is imported inside the functions.
"""

from __future__ import annotations

import ipaddress
import logging
import tempfile
from pathlib import Path

from p2ptrain.multiaddr import validate_multiaddr
from p2ptrain.peers.net.ports import claim_free_ports, port_holder, port_in_use_error

logger = logging.getLogger(__name__)

DEFAULT_HOST_MADDRS = ("/ip4/0.0.0.0/tcp/0",)


class DHTStartError(RuntimeError):
    """The DHT could not start: a one-line ``message`` and a ``fix``."""

    def __init__(self, message: str, fix: str):
        super().__init__(f"{message}; {fix}")
        self.message = message
        self.fix = fix


def load_or_create_identity(identity_path: Path):
    """This peer's key (``identity.Ed25519PrivateKey``, or hivemind's RSAPrivateKey for an identity
    made before Ed25519), read from ``identity_path`` or created there (see ``identity``).

    :raises DHTStartError: if the file exists but is not a peer identity.
    """
    from p2ptrain.peers.net.identity import create_identity, read_identity

    identity_path = Path(identity_path)
    if not identity_path.exists():
        return create_identity(identity_path)
    try:
        return read_identity(identity_path.read_bytes())
    except ValueError as error:
        raise DHTStartError(
            f"{identity_path} is not a peer identity ({error})",
            "move the file away and start again to create a new identity",
        ) from None


def _relay_only_through(original):
    """hivemind's ``P2P._make_process_args`` that also turns off p2pd's relay discovery
    when relays are named (``trustedRelays``).

    A peer behind NAT that looks for a relay in the swarm (discovery, p2pd's
    default) gets none for ~3 minutes: go-libp2p's autorelay waits up to 3
    minutes for 4 candidates before it reserves a slot on fewer, and a run has
    often one public peer. With its bootstrap peers as static relays (discovery
    off) it reserves one as soon as AutoNAT says it is private (~15 s in the
    network lab). hivemind's ``P2P.create`` has no parameter for this flag.
    """
    def make_process_args(*args, **kwargs):
        if kwargs.get("trustedRelays"):
            kwargs["relayDiscovery"] = 0
        return original(*args, **kwargs)

    make_process_args.relays_only_named = True
    return make_process_args


def _use_named_relays_only() -> None:
    """Install :func:`_relay_only_through` once in this process (and the DHT process forked from it)."""
    from hivemind.p2p import P2P

    if not getattr(P2P._make_process_args, "relays_only_named", False):
        P2P._make_process_args = staticmethod(_relay_only_through(P2P._make_process_args))


def _explain_start_failure(error: BaseException, initial_peers: list[str], identity_path: Path) -> DHTStartError:
    text = str(error) or type(error).__name__
    in_use = port_in_use_error(text)
    if in_use:
        protocol, port = in_use
        holder = port_holder(port, protocol)
        return DHTStartError(
            f"cannot listen on {protocol.upper()} port {port}: it is already in use"
            + (f" by {holder.describe()}" if holder else ""),
            "stop the program that holds it, or set another port: p2ptrain config set dht.host_maddrs "
            f"'[\"/ip4/0.0.0.0/{protocol}/{port + 1}\"]'",
        )
    if "already taken" in text:
        return DHTStartError(
            f"another peer is already running with the identity in {identity_path}",
            "stop the other p2ptrain daemon that uses this state directory, or use another --home",
        )
    if "bootstrap" in text.lower() or "initial_peers" in text:
        return DHTStartError(
            f"none of the bootstrap peers answered ({', '.join(initial_peers)})",
            "check the address (copy it from `p2ptrain status` on that peer) and that it is running and reachable",
        )
    return DHTStartError(f"the DHT did not start: {text}", "see the worker log for details")


def start_dht(
    initial_peers: list[str],
    identity_path: Path,
    host_maddrs: list[str] | None = None,
    announce_maddrs: list[str] | None = None,
    use_relay: bool = True,
    use_auto_relay: bool = False,
    client_mode: bool = False,
    start_timeout: float = 60,
    check_identity_free: bool = True,
):
    """Start this peer's hivemind DHT (in hivemind's background process) and return it.

    :param initial_peers: multiaddrs of peers already in the swarm; empty to start a new swarm.
    :param identity_path: this peer's key file, created (0600) if missing; the same
        file gives the same peer id and record ownership across restarts.
    :param host_maddrs: where to listen; default every interface on a random TCP
        port. Tests pass ``["/ip4/127.0.0.1/tcp/0"]``. A fixed port that is taken
        is replaced by the next free one (:func:`port_moves` says which).
    :param announce_maddrs: addresses to advertise instead of the listening ones,
        e.g. a public IP with a forwarded port (the port cannot be 0).
    :param use_relay: allow reaching peers behind NAT through libp2p relays.
    :param use_auto_relay: look for relays that make *this* peer reachable when it is behind NAT:
        the bootstrap peers (``initial_peers``) are asked for a relay slot as soon as libp2p finds
        this peer private (~15 s), see :func:`_relay_only_through`.
    :param client_mode: take part without serving DHT requests (for peers nobody can dial).
        This, not ``hivemind.Optimizer(client_mode=...)``, is what counts.
    :param start_timeout: give up after this many seconds.
    :param check_identity_free: before starting, check that no peer of the swarm uses the identity
        (hivemind's probe: a second p2pd tries to reach its peer id). Never for a key made now.
    :raises DHTStartError: one line saying what went wrong and how to fix it (a
        listening port taken while ``announce_maddrs`` names it, too).
    :raises ValueError: if an address is not a multiaddr.

    Side effect: the key becomes hivemind's process-wide signing key, so the
    ProgressTracker that hivemind.Optimizer creates signs with it too (there is
    one DHT per training worker; in a process with several DHTs, pass
    :func:`signing_key` explicitly to ProgressTracker).
    """
    import hivemind
    from hivemind.p2p import P2P
    from hivemind.utils.crypto import RSAPrivateKey

    from p2ptrain.peers.net.identity import OwnerSignatureValidator, install_peer_ids_of_ed25519_identities
    from p2ptrain.peers.net.local_reads import mark_joined

    peers = [validate_multiaddr(address) for address in initial_peers]
    hosts = [validate_multiaddr(address) for address in (host_maddrs or DEFAULT_HOST_MADDRS)]
    announced = [validate_multiaddr(address) for address in announce_maddrs] if announce_maddrs else None
    identity_path = Path(identity_path)
    new_identity = not identity_path.exists()
    private_key = load_or_create_identity(identity_path)
    RSAPrivateKey._process_wide_key = private_key  # hivemind's ProgressTracker signs with it
    install_peer_ids_of_ed25519_identities()  # hivemind's check that the identity is free reads it
    # hivemind puts p2pd's and its clients' sockets in /tmp, and leaves them there when killed:
    # follow TMPDIR instead (the daemon gives each worker its own, and removes it)
    P2P._UNIX_SOCKET_PREFIX = f"/unix{tempfile.gettempdir()}/hivemind-"
    # p2pd would share a taken port (SO_REUSEPORT) and then fail to reach its peers: see ports.py
    hosts, port_moves = claim_free_ports(hosts)
    for move in port_moves:
        logger.warning("%s", move.message)
    if port_moves and announced:
        raise DHTStartError(
            f"{port_moves[0].message}, but dht.announce_maddrs announces the configured port",
            "stop the program that holds the port, or change dht.host_maddrs and dht.announce_maddrs together",
        )
    relays = {}
    if use_relay and use_auto_relay and peers:
        _use_named_relays_only()
        relays["trusted_relays"] = peers
    try:
        dht = hivemind.DHT(
            initial_peers=peers,
            start=True,
            await_ready=False,
            identity_path=str(identity_path),
            host_maddrs=hosts,
            announce_maddrs=announced,
            use_relay=use_relay,
            use_auto_relay=use_auto_relay,
            client_mode=client_mode,
            startup_timeout=start_timeout,
            # A key made a moment ago cannot be in use elsewhere: skip hivemind's probe (an extra p2pd).
            check_if_identity_free=check_identity_free and not new_identity,
            record_validators=[OwnerSignatureValidator(private_key)],
            **relays,
        )
    except Exception as error:
        raise _explain_start_failure(error, peers, identity_path) from error
    try:
        dht.wait_until_ready(timeout=start_timeout)
    except Exception as error:
        dht.shutdown()
        if isinstance(error, TimeoutError) or type(error).__name__ == "TimeoutError":
            raise DHTStartError(
                f"the DHT did not start within {start_timeout:.0f} s",
                "check the bootstrap addresses and the network, or raise it: p2ptrain config set dht.start_timeout_s 180",
            ) from error
        raise _explain_start_failure(error, peers, identity_path) from error
    dht.p2ptrain_private_key = private_key
    mark_joined(dht)
    dht.p2ptrain_port_moves = port_moves
    logger.info("DHT started as %s, reachable at %s", dht.peer_id, ", ".join(visible_addresses(dht)))
    return dht


def port_moves(dht) -> list:
    """The configured ports that were taken when this DHT started (``worker_pipe.PortMove``s);
    empty when it listens where it was told to."""
    return list(getattr(dht, "p2ptrain_port_moves", ()))


def signing_key(dht):
    """The key that signs this DHT's records (give it to a ProgressTracker as ``private_key``)."""
    from hivemind.utils.crypto import RSAPrivateKey

    return getattr(dht, "p2ptrain_private_key", None) or RSAPrivateKey.process_wide()


def own_public_key(dht) -> bytes:
    """The subkey under which this peer publishes signed records (``b"[owner:ssh-ed25519 ...]"``)."""
    from hivemind.dht.crypto import RSASignatureValidator

    return RSASignatureValidator(signing_key(dht)).local_public_key


def _address_rank(address: str) -> tuple[int, int, int]:
    parts = address.split("/")
    loopback = private = 0
    if parts[1] in ("ip4", "ip6"):
        ip = ipaddress.ip_address(parts[2])
        loopback = int(ip.is_loopback)
        private = int(not ip.is_global)
    return loopback, int("p2p-circuit" in parts), private


def rank_addresses(addresses: list[str]) -> list[str]:
    """Addresses without duplicates, best first: public, then private, relayed, loopback last."""
    return sorted(dict.fromkeys(addresses), key=_address_rank)


def visible_addresses(dht) -> list[str]:
    """Multiaddrs (with ``/p2p/<peer id>``) that other peers can dial: public first, loopback last."""
    return rank_addresses([str(address) for address in dht.get_visible_maddrs(latest=True)])


def stop_serving(dht) -> bool:
    """Turn a running DHT into a client: it stops answering other peers' DHT requests and no longer
    asks to be put in their routing tables, but stores and reads as before. Returns whether it served.

    For a peer nobody can dial directly (behind NAT): every request to it comes through a relay,
    which costs it and the relaying peer the request's bytes again, plus a relayed connection's
    own framing for each (measured in the scale lab: issue 25). The routing tables that already
    hold it drop it at the first request it no longer answers. It takes a new DHT node id: until
    they do, searches still find its old one, and hivemind's searches fail when they find the
    searching node's own id among the nearest nodes of a client.

    Args:
        dht: a running hivemind DHT (made by :func:`start_dht`).
    """
    served = dht.run_coroutine(_stop_serving)
    dht._client_mode = True  # hivemind's cached answer to ``dht.client_mode`` in this process
    return served


async def _stop_serving(dht, node) -> bool:
    """Run in the DHT process: hivemind's client mode, taken on after start (see :func:`stop_serving`)."""
    from hivemind.dht.routing import DHTID
    from hivemind.proto import dht_pb2

    protocol = node.protocol
    if protocol.client_mode:
        return False
    protocol.client_mode = True
    protocol.node_info = dht_pb2.NodeInfo()  # an empty one: the peers it asks do not add it to their tables
    node.node_id = protocol.node_id = DHTID.generate()  # the old one stays in other tables a while
    await protocol.remove_p2p_handlers(protocol.p2p)
    return True
