"""The dial-back protocol: peers of the swarm check whether they can dial this one (Petals' reachability idea).

A peer cannot tell from its own addresses whether others reach it: behind a
NAT or a firewall it still sees its own interfaces. So it asks up to
``HELPERS`` peers it is connected to ("dial me back at these addresses"). A
helper answers from a *fresh* libp2p host (a short-lived p2pd that listens
nowhere): a connection that already exists between the two peers proves
nothing, since the asking peer may have opened it. The helper tries the
direct addresses one at a time (best first) and, only if none answers, the
relayed ones (``/p2p-circuit``), and says which one it reached.

Guard rails for the helper (it dials what a stranger asks it to): only
addresses that end in the asking peer's own id (the libp2p handshake then
proves it is that peer), at most ``MAX_ADDRESSES`` of them, one request per
peer every ``MIN_REQUEST_INTERVAL_S``.

``DialBack`` runs in the training worker, on its own thread and asyncio loop,
over a replica of the DHT's p2pd connection. ``check`` returns a result dict
(``reachability``, ``checked_at``, ``asked``, ``answered``, ``reached``,
``addresses``); ``watch`` checks again every ``interval_s``, sooner while the
verdict is not ``direct`` (a relay slot appears ~15 s after joining) and when
this peer's addresses change, and hands each result to a callback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import random
import re
import threading
import time
from typing import Callable

from p2ptrain.peers.net.reachability import DIRECT, UNKNOWN, is_relayed, verdict

logger = logging.getLogger(__name__)

PROTOCOL = "p2ptrain.dial-back.v1"
HELPERS = 3
MAX_ADDRESSES = 8
MAX_REQUEST_BYTES = 16384
MIN_REQUEST_INTERVAL_S = 10.0
DIRECT_DIAL_TIMEOUT_S = 5.0
RELAYED_DIAL_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 60.0
CHECK_INTERVAL_S = 600.0  # a verdict of `direct` holds for a while; the others are checked again sooner
RETRY_INTERVALS_S = (20.0, 40.0, 80.0, 160.0, 320.0)
ADDRESS_POLL_S = 10.0


def _varint(number: int) -> bytes:
    out = b""
    while True:
        low, number = number & 0x7F, number >> 7
        if not number:
            return out + bytes([low])
        out += bytes([low | 0x80])


def wire_multiaddr(text: str):
    """``text`` as a hivemind Multiaddr whose bytes p2pd reads.

    hivemind's multiaddr encodes a ``/p2p/<id>`` inside an address as a CID,
    which p2pd rejects ("length greater than remaining number of bytes in
    buffer"); a relayed address carries the relay's id inside. This encodes
    those ids as plain multihashes, as go-multiaddr does.
    """
    from hivemind.p2p import PeerID
    from hivemind.utils.multiaddr import Multiaddr

    encoded = b""
    for piece in re.split(r"(/p2p/[^/]+)", text):
        if piece.startswith("/p2p/"):
            multihash = PeerID.from_base58(piece[len("/p2p/"):]).to_bytes()
            encoded += _varint(421) + _varint(len(multihash)) + multihash
        elif piece:
            encoded += Multiaddr(piece).to_bytes()
    return Multiaddr(encoded)


def _without_peer_id(address: str, peer_id: str) -> str | None:
    """The address to dial (its trailing ``/p2p/<peer_id>`` removed), None if it is someone else's."""
    suffix = f"/p2p/{peer_id}"
    return address[: -len(suffix)] if address.endswith(suffix) and address != suffix else None


async def _reaches(probe, peer_id, address: str, timeout: float) -> bool:
    """Whether the fresh host ``probe`` connects to ``peer_id`` at ``address`` within ``timeout``."""
    try:
        await asyncio.wait_for(probe._client.connect(peer_id, [wire_multiaddr(address)]), timeout)
    except Exception as error:  # a refused, timed-out or malformed dial all mean "not reached"
        logger.debug("dial-back to %s at %s failed: %r", peer_id, address, error)
        return False
    try:
        await asyncio.wait_for(probe._client.disconnect(peer_id), timeout)
    except Exception:
        pass
    return True


async def dial_from_fresh_host(peer_id, addresses: list[str]) -> dict:
    """Dial ``peer_id`` at ``addresses`` (its own, ranked best first) from a new p2pd that listens nowhere.

    Returns ``{"direct": bool, "relayed": bool, "reached": address or None}``.
    """
    from hivemind.p2p import P2P

    probe = await P2P.create(initial_peers=[], dht_mode="client", use_relay=True, auto_nat=False,
                             nat_port_map=False, no_listen=True, conn_manager=False, startup_timeout=30)
    try:
        for relayed, timeout in ((False, DIRECT_DIAL_TIMEOUT_S), (True, RELAYED_DIAL_TIMEOUT_S)):
            for address in addresses:
                if is_relayed(address) != relayed:
                    continue
                target = _without_peer_id(address, peer_id.to_base58())
                if target and await _reaches(probe, peer_id, target, timeout):
                    return {"direct": not relayed, "relayed": relayed, "reached": address}
        return {"direct": False, "relayed": False, "reached": None}
    finally:
        await probe.shutdown()


async def _daemon_listen_maddr(dht, node):
    """Run in the DHT process: where its p2pd takes control connections."""
    return node.p2p.daemon_listen_maddr


class DialBack:
    """Answers other peers' dial-back requests and checks this peer's own reachability.

    Args:
        dht: this worker's running hivemind DHT (its p2pd is shared through a replica).
        helpers: how many connected peers to ask per check.
    """

    def __init__(self, dht, helpers: int = HELPERS):
        self.dht = dht
        self.helpers = helpers
        self.p2p = None
        self._served_at: dict[str, float] = {}
        self._loop = asyncio.new_event_loop()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dial-back", daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        """Start the thread and serve requests; raises if the p2pd replica cannot be had within ``timeout``."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout)

    async def _serve(self) -> None:
        from hivemind.p2p import P2P

        # our own connection to the DHT's p2pd (not the DHT's cached replica, which we would close)
        self.p2p = await P2P.replicate(self.dht.run_coroutine(_daemon_listen_maddr))
        await self.p2p.add_binary_stream_handler(PROTOCOL, self._answer)

    # --- the helper's side ---------------------------------------------------
    async def _answer(self, stream, reader, writer) -> None:
        caller = stream.peer_id
        try:
            request = json.loads(await asyncio.wait_for(self._read(reader), DIRECT_DIAL_TIMEOUT_S))
            now = time.monotonic()
            if now - self._served_at.get(caller.to_base58(), -MIN_REQUEST_INTERVAL_S) < MIN_REQUEST_INTERVAL_S:
                answer = {"error": f"at most one request every {MIN_REQUEST_INTERVAL_S:.0f} s"}
            else:
                self._served_at[caller.to_base58()] = now
                addresses = [address for address in request.get("addresses", [])[:MAX_ADDRESSES]
                             if isinstance(address, str) and _without_peer_id(address, caller.to_base58())]
                answer = await dial_from_fresh_host(caller, addresses)
            from hivemind.p2p import P2P

            await P2P.send_raw_data(json.dumps(answer).encode(), writer)
        except Exception as error:
            logger.info("Could not answer a dial-back request of %s: %r", caller, error)
        finally:
            writer.close()

    @staticmethod
    async def _read(reader) -> bytes:
        """``P2P.receive_raw_data`` with a cap on the size a stranger may make us buffer."""
        from hivemind.p2p import P2P

        size = int.from_bytes(await reader.readexactly(P2P.HEADER_LEN), P2P.BYTEORDER)
        if size > MAX_REQUEST_BYTES:
            raise ValueError(f"a dial-back request of {size} bytes")
        return await reader.readexactly(size)

    # --- the asking side -------------------------------------------------------
    def check(self, timeout: float = ANSWER_TIMEOUT_S + 10) -> dict:
        """Ask up to ``helpers`` connected peers to dial this one back; blocks until they answered."""
        return self.result(self.start_check(), timeout)

    def start_check(self) -> concurrent.futures.Future:
        """:meth:`check` without waiting: the future of its result (give it to :meth:`result`)."""
        return asyncio.run_coroutine_threadsafe(self._check(), self._loop)

    @staticmethod
    def result(checking: concurrent.futures.Future, timeout: float = ANSWER_TIMEOUT_S + 10) -> dict:
        """The result of a check that :meth:`start_check` began, waiting up to ``timeout`` seconds for it."""
        return checking.result(timeout)

    async def _addresses(self) -> list[str]:
        from p2ptrain.peers.net.dht import rank_addresses

        return rank_addresses([str(address) for address in await self.p2p.get_visible_maddrs(latest=True)])

    async def _check(self) -> dict:
        addresses = await self._addresses()
        own_id = self.p2p.peer_id
        connected = list({info.peer_id for info in await self.p2p.list_peers() if info.peer_id != own_id})
        asked = random.sample(connected, min(self.helpers, len(connected)))
        answers = await asyncio.gather(*(self._ask(helper, addresses) for helper in asked))
        answers = [answer for answer in answers if answer is not None]
        result = {
            "reachability": verdict(answers), "checked_at": time.time(), "asked": len(asked),
            "answered": len(answers), "addresses": addresses,
            "reached": [answer["reached"] for answer in answers if answer.get("reached")],
        }
        logger.info("Reachability %s: %d of %d asked peers answered, reached %s", result["reachability"],
                    len(answers), len(asked), ", ".join(result["reached"]) or "nothing")
        return result

    async def _ask(self, helper, addresses: list[str]) -> dict | None:
        from hivemind.p2p import P2P

        try:
            _, reader, writer = await asyncio.wait_for(self.p2p.call_binary_stream_handler(helper, PROTOCOL),
                                                       DIRECT_DIAL_TIMEOUT_S)
            try:
                await P2P.send_raw_data(json.dumps({"addresses": addresses}).encode(), writer)
                answer = json.loads(await asyncio.wait_for(P2P.receive_raw_data(reader), ANSWER_TIMEOUT_S))
            finally:
                writer.close()
        except Exception as error:  # an older peer, a peer that left, a timeout: no answer
            logger.debug("%s gave no dial-back answer: %r", helper, error)
            return None
        if not isinstance(answer, dict) or "error" in answer:
            logger.debug("%s refused to dial back: %r", helper, answer)
            return None
        return answer

    def watch(self, on_result: Callable[[dict], None], first: dict | None = None,
              interval_s: float = CHECK_INTERVAL_S) -> None:
        """Check again and again in the background, calling ``on_result`` with each result.

        ``first`` is the result of a check already made (at join). After a
        ``direct`` verdict the next check is ``interval_s`` later; after any
        other, after ``RETRY_INTERVALS_S`` (then ``interval_s``), and at once
        when this peer's announced addresses change (a relay slot was reserved).
        """
        asyncio.run_coroutine_threadsafe(self._watch(on_result, first, interval_s), self._loop)

    async def _watch(self, on_result, result: dict | None, interval_s: float) -> None:
        retries = 0
        while not self._stopping.is_set():
            if result is None:
                try:
                    result = await self._check()
                    on_result(result)
                except Exception:
                    logger.exception("Reachability check failed")
                    result = {"reachability": UNKNOWN, "addresses": []}
            if result["reachability"] == DIRECT:
                wait_s = interval_s
            else:
                wait_s = RETRY_INTERVALS_S[retries] if retries < len(RETRY_INTERVALS_S) else interval_s
                retries += 1
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and not self._stopping.is_set():
                await asyncio.sleep(min(ADDRESS_POLL_S, max(0.0, deadline - time.monotonic())))
                try:
                    if await self._addresses() != result.get("addresses"):
                        break
                except Exception:
                    pass
            result = None

    def shutdown(self) -> None:
        """Stop checking and serving; ends the thread."""
        self._stopping.set()
        if self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(5)
            except Exception:
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    async def _close(self) -> None:
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        if self.p2p is not None:
            try:
                await self.p2p.remove_binary_stream_handler(PROTOCOL)
            except Exception:
                pass
            await self.p2p.shutdown()
