"""An averaging round does not re-announce a peer as a state source; a new priority does.

Every averager that shares its state keeps a record under ``<prefix>.all_averagers``
in the DHT (its priority, re-stored when it expires). hivemind re-stored it after
every tensor of every averaging round as well, with the same priority: in the
network lab that was 4 stores a second at a sync peer (``benchmarks/RESULTS.md``).
Two real averagers on 127.0.0.1 (real DHTs, in this process) run rounds; the
record's expiration time tells whether it was stored again.
"""

from __future__ import annotations

import time

import pytest
import torch

from test_rogue_reducer import SHAPES, honest_averager, outcome
from test_state_download_check import start_dhts, wait_for_sharers

pytestmark = [pytest.mark.swarm]

PREFIX = "reducer_diloco"  # test_rogue_reducer's averagers


def declared_until(dht, averager) -> float:
    """When ``averager``'s announcement as a state source expires, as the DHT holds it."""
    found = dht.get(f"{PREFIX}.all_averagers", latest=True)
    return found.value[averager.peer_id.to_bytes()].expiration_time


@pytest.mark.timeout(120)
def test_rounds_do_not_re_announce_a_state_source_and_a_new_priority_does():
    dhts = start_dhts(2)
    averagers = []
    try:
        averagers = [honest_averager(dht, [torch.zeros(shape) for shape in SHAPES]) for dht in dhts]
        wait_for_sharers(dhts[0], PREFIX, 2)
        before = [declared_until(dhts[0], averager) for averager in averagers]
        rounds = 0
        for _ in range(4):
            for averager in averagers:
                with averager.get_tensors() as tensors:
                    for tensor in tensors:
                        tensor.copy_(torch.randn_like(tensor) * 1e-3)  # fresh pieces: a repeated one is a replay
            futures = [averager.step(weight=8.0, wait=False, timeout=20) for averager in averagers]
            groups = [outcome(future) for future in futures]
            rounds += all(group is not None and len(group) == 2 for group in groups)
            if rounds == 2:
                break
        assert rounds == 2, "the two averagers formed fewer than 2 groups in 4 attempts"
        time.sleep(1.0)  # a store the rounds triggered would be done by now
        assert [declared_until(dhts[0], averager) for averager in averagers] == before

        averagers[0].state_sharing_priority = 5.0  # the control: a new priority is announced at once
        deadline = time.monotonic() + 10
        while declared_until(dhts[0], averagers[0]) == before[0] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert declared_until(dhts[0], averagers[0]) > before[0]
    finally:
        for averager in averagers:
            averager.shutdown()
        for dht in dhts:
            dht.shutdown()
