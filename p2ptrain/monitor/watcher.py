"""The run monitor's peer: a hivemind DHT in client mode that reads a run's manifest and its peers' records.

It trains nothing, serves no DHT requests and publishes nothing: it asks the
run's peers for the records the training workers read (the signed manifest,
each peer's signed metrics record, hivemind's progress records) with the
same readers (``peers/swarm/manifest.py``, ``peers/swarm/view.py``), so a record that
fails its signature or the schema is dropped here as in ``p2ptrain peers``.

hivemind is imported only when :meth:`RunWatcher.connect` runs.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from p2ptrain.worker_pipe import Swarm

logger = logging.getLogger(__name__)


class RunWatcher:
    """Watches one run from outside it.

    Args:
        run_id: the run's name.
        initial_peers: multiaddrs of peers in the run (a peer's ``local.addresses``).
        host_maddrs: where this peer's p2pd listens (to dial out; nobody dials a client).
        start_timeout_s: how long to wait for the DHT to reach a peer, and then for the manifest.
    """

    def __init__(self, run_id: str, initial_peers: list[str], host_maddrs: list[str], start_timeout_s: float = 60.0):
        self.run_id = run_id
        self.initial_peers = initial_peers
        self.host_maddrs = host_maddrs
        self.start_timeout_s = start_timeout_s
        self.dht = None
        self.manifest = None
        # The monitor's throwaway identity and hivemind's sockets: TMPDIR is where start_dht puts them.
        self.work_dir = Path(tempfile.mkdtemp(prefix="p2ptrain-monitor-"))

    def connect(self) -> dict:
        """Start the DHT and read the run's manifest (blocking, up to twice ``start_timeout_s``).

        Returns:
            The run's facts, ``status.run``-shaped: id, mode, model, manifest_hash, target_batch_size.

        Raises:
            DHTStartError: no bootstrap peer answered (one line, with ``fix``).
            ManifestError: no run of that name was found through them.
        """
        from p2ptrain.peers.net.dht import start_dht
        from p2ptrain.peers.swarm.run_records import fetch_manifest
        from p2ptrain.peers.swarm.validators import follow_run

        tempfile.tempdir = str(self.work_dir)
        self.dht = start_dht(
            self.initial_peers, self.work_dir / "identity.key", host_maddrs=self.host_maddrs, client_mode=True,
            start_timeout=self.start_timeout_s,
        )
        follow_run(self.dht, self.run_id)  # check its records from the first read on
        self.manifest = fetch_manifest(self.dht, self.run_id, timeout=self.start_timeout_s)
        return {
            "id": self.run_id,
            "mode": self.manifest.mode,
            "model": self.manifest.model,
            "manifest_hash": self.manifest.manifest_hash(),
            "target_batch_size": self.manifest.target_batch_size,
        }

    @property
    def peer_id(self) -> str | None:
        return self.dht.peer_id.to_base58() if self.dht is not None else None

    def read(self) -> Swarm:
        """One read of the run's progress and peers (blocking: run it in a thread)."""
        from p2ptrain.peers.swarm.view import read_swarm

        return read_swarm(self.dht, self.run_id, self.manifest.manifest_hash(), self.manifest.target_batch_size)

    def close(self) -> None:
        """Stop the DHT (its process and p2pd) and remove the throwaway identity and sockets."""
        if self.dht is not None:
            try:
                self.dht.shutdown()
            except Exception:  # a DHT that died already; what is left of it goes with the process group
                logger.warning("the DHT did not shut down cleanly", exc_info=True)
            self.dht = None
        shutil.rmtree(self.work_dir, ignore_errors=True)
