"""Compressed averaging in real runs: two training workers on 127.0.0.1 per compression.

Gradients in ``sync``, pseudo-gradients in ``diloco`` (a sparse rung with error feedback too). The fp16 run also trains
with LAMB and a warm-up + cosine schedule, so the large-batch optimizer goes
through hivemind's real optimizer step and state averaging too.
"""

from __future__ import annotations

import pytest
import torch

from p2ptrain.peers.compression.codecs import make_compression
from test_worker_swarm import rounds_with_others, run_manifest, start_swarm, stop_all

pytestmark = pytest.mark.swarm


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("mode", "compression", "settings"),
    [
        ("sync", "fp16", {"optimizer": "lamb", "warmup_epochs": 1, "lr_schedule": "cosine", "total_epochs": 20}),
        ("sync", "blockwise8bit", {}),
        ("diloco", "blockwise8bit", {"local_steps": 6}),
        ("diloco", "sparse2bit-64of4096", {"local_steps": 6}),
    ],
)
def test_two_workers_average_compressed_gradients(tmp_path, mode, compression, settings):
    manifest = run_manifest(f"compressed-{mode}-{compression}", mode=mode, compression=compression, target_batch_size=64, **settings)
    workers = start_swarm(tmp_path, manifest, 2)
    try:
        for worker in workers:
            worker.wait_for(lambda w: rounds_with_others(w) >= 1, 90, f"an averaging round with {compression}")
        for worker in workers:
            assert worker.epoch() >= 1
            assert not [report for report in worker.of_type("error")], worker.of_type("error")
            # compressed honest pieces pass robust aggregation's bounds: nobody is named
            assert [event["message"] for event in worker.events("suspect-peer")] == []
            losses = [report["loss"] for report in worker.of_type("step")]
            assert losses and all(loss == loss and loss < 20 for loss in losses), losses  # finite, not diverged
    finally:
        stop_all(workers)


@pytest.mark.parametrize("name", ["none", "fp16", "uniform8bit", "blockwise8bit"])
def test_every_compression_round_trips_bf16_parameters(name):
    """hivemind's Float16Compression refuses bf16, and its 8-bit decoders failed under numpy >= 2.4:
    bf16 tensors must be sent with every compression and come back close."""
    tensors = [torch.randn(64, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))]
    compression = make_compression(name, tensors)
    for tensor in tensors:
        restored = compression.extract(compression.compress(tensor, info=None))
        assert restored.shape == tensor.shape
        assert restored.dtype == torch.bfloat16
        # 8-bit codes are lossy (uniform clips outliers); on average they stay close
        assert float((restored.float() - tensor.float()).abs().mean()) < 0.03, name
