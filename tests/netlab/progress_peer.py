"""A light peer for the network lab: a DHT node only, storing a progress-like record a few times a second.

Run inside a lab host's namespace (``python progress_peer.py --help``). It
starts this peer's DHT as a training worker does (``light_peer.start``),
writes its addresses to ``--addresses``, then stores its record under
``<run>_progress`` through ``local_reads.store_record`` (what hivemind's
ProgressTracker does through ``LocalFirstDHT``) every ``--period`` seconds until
``--stop`` exists, and shuts the DHT down. With ``--read-period``, it also reads
the key through ``local_reads.read_record`` that often (as the tracker does) and
appends each read's time and the number of peers' records it saw to ``--reads``.
With ``P2PTRAIN_REQUEST_LOG`` set, every request it makes and serves is logged
(``request_log.py``).
"""

from __future__ import annotations

import time
from pathlib import Path

import light_peer


def main() -> int:
    parser = light_peer.arguments(__doc__.splitlines()[0])
    parser.add_argument("--period", type=float, default=0.3, help="seconds between stores")
    parser.add_argument("--read-period", type=float, default=0.0, help="seconds between reads (0: no reads)")
    parser.add_argument("--reads", type=Path, help="append each read's time and how many records it saw here")
    options = parser.parse_args()
    if options.read_period and not options.reads:
        parser.error("--read-period needs --reads FILE, where the reads are written")

    from hivemind.utils import get_dht_time

    from p2ptrain.peers.net.dht import own_public_key
    from p2ptrain.peers.net.local_reads import read_record, store_record
    from p2ptrain.peers.net.traffic import TrafficMeter

    TrafficMeter().install()  # the request log's hooks, in this process and the DHT's
    dht = light_peer.start(options)
    try:
        key, subkey, started, samples = f"{options.run}_progress", own_public_key(dht), time.monotonic(), 0
        next_read = started + options.read_period
        while not options.stop.exists() and time.monotonic() - started < options.limit_s:
            samples += 8
            record = {"peer_id": dht.peer_id.to_base58(), "samples_accumulated": samples, "time": get_dht_time()}
            store_record(dht, key, subkey, record, get_dht_time() + 60)
            if options.read_period and time.monotonic() >= next_read:
                found = read_record(dht, key)
                with options.reads.open("a") as reads:
                    reads.write(f"{time.time():.3f}\t{len(found.value) if found is not None else 0}\n")
                next_read += options.read_period
            time.sleep(options.period)
    finally:
        dht.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
