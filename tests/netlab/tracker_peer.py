"""A light training peer for the network lab: a real ``QuietProgressTracker`` that trains nothing.

Run inside a lab host's namespace (``python tracker_peer.py --help``). It
starts this peer's DHT as a training worker does (``light_peer.start``),
writes its addresses to ``--addresses``, and until ``--stop`` exists:

- honest (the default): "trains" ``--batch`` samples every ``--period``
  seconds, reports them to its tracker, moves to the next epoch when the
  tracker says the swarm is ready (as hivemind's Optimizer does: to the
  swarm's epoch, or one past its own), and rests ``--rest-s`` (as a worker
  does after each step at a compute share); each move is a JSON line in
  ``--epochs`` (time, the epoch left and its samples, the epoch moved to, the
  swarm's epoch as the tracker believed it, whether it moved on a return, the
  shards its progress records were in, the peers it counted, and what its
  last read carried: its shard's records and the shards' summaries).
  With ``--return-every-s`` it leaves and comes back that often: its tracker
  shut down, a new one started on the swarm's epoch, with no samples (as a
  worker that downloaded the state);
- ``--lies FILE``: a hostile peer: every second it stores its own signed
  progress record, an honest-looking one on the swarm's epoch (the highest of
  the others' records) with the fields of the lie due now put in (FILE: a
  JSON list of ``[seconds after its DHT started, {record fields}]``, the last
  one due holds; an ``epoch`` is added to the swarm's, a ``time`` to now).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import light_peer


def main() -> int:
    parser = light_peer.arguments(__doc__.splitlines()[0])
    parser.add_argument("--target", type=int, default=320, help="the run's target batch size")
    parser.add_argument("--batch", type=int, default=2, help="samples a step")
    parser.add_argument("--period", type=float, default=0.5, help="seconds a step")
    parser.add_argument("--rest-s", type=float, default=0.0, help="seconds of rest after each step (a compute share)")
    parser.add_argument("--return-every-s", type=float, default=0.0, help="leave and come back this often (0: never)")
    parser.add_argument("--return-after-s", type=float, default=0.0, help="the first time, this long after the start")
    parser.add_argument("--epochs", type=Path, help="append each epoch move here (honest peers)")
    parser.add_argument("--shard-records", type=int, help="the tracker's shard_records (progress_shards; default its own)")
    parser.add_argument("--lifetime-s", type=float, default=60.0, help="the records' lifetime (metadata_expiration)")
    parser.add_argument("--lies", type=Path, help="be hostile: the lies to tell and when (see the module docstring)")
    options = parser.parse_args()
    if not options.lies and not options.epochs:
        parser.error("an honest peer needs --epochs FILE, where its epoch moves are written")

    from p2ptrain.peers.net import request_log
    from p2ptrain.peers.net.dht import signing_key
    from p2ptrain.peers.net.traffic import TrafficMeter

    if request_log.enabled():
        TrafficMeter().install()  # the request log's hooks, in this process and the DHT's
    dht = light_peer.start(options)
    try:
        if options.lies:
            lie(dht, options, json.loads(options.lies.read_text()))
        else:
            train(dht, signing_key(dht), options)
    finally:
        dht.shutdown()
    return 0


def train(dht, key, options) -> None:
    from p2ptrain.peers.training.progress import QuietProgressTracker

    def new_tracker() -> QuietProgressTracker:
        shards = {"shard_records": options.shard_records} if options.shard_records else {}
        return QuietProgressTracker(dht, prefix=options.run, target_batch_size=options.target, start=True, private_key=key,
                                    metadata_expiration=options.lifetime_s, **shards)

    tracker, epoch, samples = new_tracker(), 0, 0
    started = time.monotonic()
    next_return = started + options.return_after_s if options.return_every_s else float("inf")
    try:
        while not options.stop.exists() and time.monotonic() - started < options.limit_s:
            time.sleep(options.period)
            samples += options.batch
            tracker.report_local_progress(epoch, samples)
            if tracker.ready_to_update_epoch:
                epoch, samples = move(tracker, epoch, max(epoch + 1, tracker.global_epoch), samples, options.epochs), 0
            time.sleep(options.rest_s)
            if time.monotonic() >= next_return:
                # leave and come back: a new tracker, on the swarm's epoch (as after a state download), from no samples
                tracker.shutdown()
                tracker = new_tracker()
                epoch, samples = move(tracker, epoch, max(epoch, tracker.global_epoch), samples, options.epochs, returned=True), 0
                next_return += options.return_every_s
    finally:
        tracker.shutdown()


def move(tracker, epoch: int, new_epoch: int, samples: int, epochs: Path, returned: bool = False) -> int:
    """Move ``tracker`` from ``epoch`` (with ``samples``) to ``new_epoch`` and log it to ``epochs``; returns ``new_epoch``."""
    with epochs.open("a") as moves:
        moves.write(json.dumps({"at": time.time(), "left": epoch, "samples": samples, "to": new_epoch,
                                "swarm": tracker.global_epoch, "returned": returned, "shards": tracker.shards,
                                "peers": tracker.global_progress.num_peers, "read": tracker.last_read_entries}) + "\n")
    with tracker.pause_updates():
        tracker.update_epoch(new_epoch)
    return new_epoch


def lie(dht, options, lies: list) -> None:
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.dht.schema import SchemaValidator
    from hivemind.optim.progress_tracker import TrainingProgressSchema
    from hivemind.utils import get_dht_time

    from p2ptrain.peers.net.dht import signing_key

    validator = RSASignatureValidator(signing_key(dht))
    dht.add_validators([SchemaValidator(TrainingProgressSchema, prefix=options.run), validator])
    key, started = f"{options.run}_progress", time.monotonic()
    while not options.stop.exists() and time.monotonic() - started < options.limit_s:
        elapsed, now = time.monotonic() - started, get_dht_time()
        due = [fields for at, fields in lies if at <= elapsed]
        found = dht.get(key, latest=True)
        records = [entry.value for entry in (found.value.values() if found is not None and isinstance(found.value, dict) else ())
                   if isinstance(entry.value, dict)]
        swarm = max((record["epoch"] for record in records if record.get("peer_id") != dht.peer_id.to_bytes()), default=0)
        record = {"peer_id": dht.peer_id.to_bytes(), "epoch": swarm, "samples_accumulated": options.batch,
                  "samples_per_second": options.batch / options.period, "time": now, "client_mode": False}
        if due:
            record.update(due[-1])
            record["epoch"] = swarm + due[-1].get("epoch", 0)  # epochs are told relative to the swarm's
            record["time"] = now + due[-1].get("time", 0.0)  # and times relative to now
        dht.store(key, subkey=validator.local_public_key, value=record, expiration_time=now + 60)
        time.sleep(1.0)


if __name__ == "__main__":
    raise SystemExit(main())
