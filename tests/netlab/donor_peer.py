"""A light peer for the network lab: a DHT and a DiLoCo averager that serves its state (a donor) or downloads one (a joiner).

Run inside a lab host's namespace (``python donor_peer.py --help``). It starts
this peer's DHT as a training worker does (``light_peer.start``), then a real
``PseudoGradientAverager`` holding a state of ``--state-mb`` megabytes (DiLoCo's
layout: parameters filled with the epoch plus one, outer momentum zeros).

- ``--role donor``: shares that state at ``--epoch`` (at most ``--max-serves``
  downloads at once); from ``--newer-after-s``
  seconds after ``--go`` exists, at the next epoch (it finished its round later
  than the first donor). Each time its state is taken for a download (hivemind
  asks the host for it, once a serve) it appends the time to ``--serves``.
- ``--role joiner``: once it sees ``--donors`` peers declare their state, it
  writes ``--ready``; once ``--go`` exists, it downloads the state as a joining
  worker does and writes ``--result`` (JSON: the epoch it got, whose state, when
  it began and ended).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import light_peer

PREFIX = "lab_diloco"


def main() -> int:
    parser = light_peer.arguments(__doc__.splitlines()[0])
    parser.add_argument("--role", choices=("donor", "joiner"), required=True)
    parser.add_argument("--state-mb", type=float, default=4.0, help="the state's size in megabytes (float32)")
    parser.add_argument("--go", type=Path, required=True, help="the burst begins once this file exists")
    parser.add_argument("--epoch", type=int, default=1, help="a donor's epoch (a joiner's is 0)")
    parser.add_argument("--newer-after-s", type=float, help="a donor moves to the next epoch this long after --go")
    parser.add_argument("--serves", type=Path, help="a donor appends each serve's time here")
    parser.add_argument("--donors", type=int, default=1, help="the declared donors a joiner waits for")
    parser.add_argument("--ready", type=Path, help="a joiner writes this once it sees --donors donors")
    parser.add_argument("--result", type=Path, help="a joiner's download, as JSON")
    parser.add_argument("--max-serves", type=int, help="a donor's limit on serves at once (0: none, as hivemind's); "
                                                       "p2ptrain's unless given")
    options = parser.parse_args()

    import torch

    from p2ptrain.peers.robust import averager as averager_module
    from p2ptrain.peers.robust.reduce import RobustOptions
    from p2ptrain.peers.training.diloco import PseudoGradientAverager

    if options.max_serves is not None:  # the benchmark's arm without the limit (or with another)
        averager_module.MAX_SERVES_AT_ONCE = options.max_serves or 2**31 - 1
    columns = 1024
    rows = max(1, int(options.state_mb * 1e6 / 4 / 2 / columns))  # parameters and momentum, float32
    epoch = options.epoch if options.role == "donor" else 0
    served = {"epoch": epoch}

    def state():
        if options.serves:
            with options.serves.open("a") as serves:
                serves.write(f"{time.time():.3f}\n")
        # parameters never all zero: a joiner's state is checked against its own by direction (``state_check``)
        return dict(served), [torch.full((rows, columns), served["epoch"] + 1.0), torch.zeros(rows, columns)]

    dht = light_peer.start(options)
    averager = PseudoGradientAverager(
        state_provider=state, averaged_tensors=[torch.zeros(rows, columns)], dht=dht, prefix=PREFIX,
        min_matchmaking_time=3.0, request_timeout=1.5, next_chunk_timeout=30.0, start=True,  # a worker's on the internet allow_state_sharing=options.role == "donor",
        robust=RobustOptions.for_pseudo_gradients(max_weight=1e6, inner_lr=1e-3, rounds_held=1.0, parameter_count=1))
    try:
        if options.role == "donor":
            averager.state_sharing_priority = epoch
            donate(options, averager, served)
        else:
            join(options, dht, averager)
    finally:
        averager.shutdown()
        dht.shutdown()
    return 0


def donate(options, averager, served: dict) -> None:
    """Serve until ``--stop``; move to the next epoch ``--newer-after-s`` after ``--go``."""
    started, moved = time.monotonic(), False
    while not options.stop.exists() and time.monotonic() - started < options.limit_s:
        if not moved and options.newer_after_s is not None and options.go.exists() \
                and time.time() - options.go.stat().st_mtime >= options.newer_after_s:
            served["epoch"] += 1
            averager.state_sharing_priority = served["epoch"]
            moved = True
        time.sleep(0.1)


def join(options, dht, averager) -> None:
    """Wait for the donors' declarations and ``--go``, then download, as a joining worker does."""
    started = time.monotonic()
    while time.monotonic() - started < options.limit_s:
        found = dht.get(f"{PREFIX}.all_averagers", latest=True)
        declared = [entry.value for entry in (found.value.values() if found is not None and isinstance(found.value, dict) else [])
                    if isinstance(entry.value, (int, float))]
        if len(declared) >= options.donors:
            break
        time.sleep(0.5)
    options.ready.write_text("ready")
    while not options.go.exists() and time.monotonic() - started < options.limit_s:
        time.sleep(0.05)
    began = time.time()
    loaded = averager.load_state_from_peers(timeout=120)
    ended = time.time()
    epoch = loaded[0].get("epoch") if loaded is not None else None
    written = options.result.with_name(options.result.name + ".part")  # renamed whole: a reader never sees half of it
    written.write_text(json.dumps({"epoch": epoch, "source": averager.last_state_source, "began": began, "ended": ended}))
    written.rename(options.result)


if __name__ == "__main__":
    raise SystemExit(main())
