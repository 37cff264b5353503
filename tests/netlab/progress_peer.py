"""A light peer for the network lab: a DHT node only, storing a progress-like record a few times a second.

Run inside a lab host's namespace (``python progress_peer.py --help``). It
starts this peer's DHT as a training worker does (port 31337 on every
interface, relays on, a peer behind NAT asking its bootstrap peer for a relay
slot), writes its addresses to ``--addresses``, then stores its record under
``<run>_progress`` through ``local_reads.store_record`` (what hivemind's
ProgressTracker does through ``LocalFirstDHT``) every ``--period`` seconds until
``--stop`` exists, and shuts the DHT down. With ``P2PTRAIN_REQUEST_LOG`` set,
every request it makes and serves is logged (``request_log.py``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--identity", type=Path, required=True, help="the peer's key file (made if missing)")
    parser.add_argument("--addresses", type=Path, required=True, help="where to write the peer's addresses (JSON)")
    parser.add_argument("--stop", type=Path, required=True, help="stop once this file exists")
    parser.add_argument("--peers", nargs="*", default=[], help="bootstrap addresses; none to start the swarm")
    parser.add_argument("--run", default="lab")
    parser.add_argument("--period", type=float, default=0.3, help="seconds between stores")
    parser.add_argument("--limit-s", type=float, default=600, help="stop after this many seconds in any case")
    options = parser.parse_args()

    from hivemind.utils import get_dht_time

    from p2ptrain.peers.net.dht import own_public_key, start_dht, visible_addresses
    from p2ptrain.peers.net.local_reads import store_record
    from p2ptrain.peers.net.traffic import TrafficMeter

    TrafficMeter().install()  # the request log's hooks, in this process and the DHT's
    dht = start_dht(options.peers, options.identity, host_maddrs=["/ip4/0.0.0.0/tcp/31337"],
                    use_auto_relay=bool(options.peers), start_timeout=120)
    try:
        options.addresses.write_text(json.dumps(visible_addresses(dht)))
        key, subkey, started, samples = f"{options.run}_progress", own_public_key(dht), time.monotonic(), 0
        while not options.stop.exists() and time.monotonic() - started < options.limit_s:
            samples += 8
            record = {"peer_id": dht.peer_id.to_base58(), "samples_accumulated": samples, "time": get_dht_time()}
            store_record(dht, key, subkey, record, get_dht_time() + 60)
            time.sleep(options.period)
    finally:
        dht.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
