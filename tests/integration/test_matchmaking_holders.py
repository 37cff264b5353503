"""Averaging groups found by reading the group key from its holders (``install_matchmaking``):
eight real hivemind averagers on 127.0.0.1, their DHT requests logged (``request_log``).

hivemind's ``GroupKeyManager`` read the group key with a search that asks every node
among the 20 nearest (7 requests a fetch at 8 peers) and searched before each
declaration; the scale model projects that as the largest part of a peer's
background past about 84 peers (issue 25). Installed, a fetch reads this peer's
own copy or one holder, and a declaration goes straight to the holders.
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest
import torch
from hivemind.utils import get_dht_time

from metered_peers import loopback_dhts
from p2ptrain.peers.net.local_reads import FULL_COPY_AFTER_S
from p2ptrain.peers.net.request_log import ENVIRONMENT_VARIABLE
from p2ptrain.peers.robust.matchmaking import install_matchmaking

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(240)]

PEERS, CLIENTS = 8, 2  # the last CLIENTS average as clients (never lead), as peers behind NAT do
PREFIX = "run_diloco"  # as p2ptrain names a DiLoCo run's averager
GROUP_KEY = f"{PREFIX}.0b"  # hivemind's key for a swarm that averages in one group


def logged_lines(directory: Path, since: float, until: float) -> list[list[str]]:
    """Every request-log line of every process between two times: time, direction, kind, what, key, sent, received."""
    lines = []
    for path in directory.glob("*.tsv"):
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            if since <= float(fields[0]) <= until:
                lines.append(fields)
    return lines


def average_once(averagers) -> list:
    """One round of every averager at once; each one's gathered data (None where it found no group)."""
    when = get_dht_time() + 2.0
    controls = [averager.step(wait=False, scheduled_time=when, timeout=30.0, allow_retries=False) for averager in averagers]
    return [control.result(timeout=60.0) for control in controls]


def test_eight_averagers_find_one_group_with_a_request_a_fetch_at_most(tmp_path, monkeypatch, meter):
    from hivemind.averaging import DecentralizedAverager
    from hivemind.averaging.key_manager import GroupKeyManager

    logs = tmp_path / "requests"
    monkeypatch.setenv(ENVIRONMENT_VARIABLE, str(logs))  # before the DHT processes fork: they log too
    install_matchmaking()
    fetches, declarations = multiprocessing.Value("i", 0), multiprocessing.Value("i", 0)
    original_get, original_declare = GroupKeyManager.get_averagers, GroupKeyManager.declare_averager

    async def counted_get(self, *args, **kwargs):  # runs in the averager processes, forked below
        with fetches.get_lock():
            fetches.value += 1
        return await original_get(self, *args, **kwargs)

    async def counted_declare(self, *args, **kwargs):
        with declarations.get_lock():
            declarations.value += 1
        return await original_declare(self, *args, **kwargs)

    monkeypatch.setattr(GroupKeyManager, "get_averagers", counted_get)
    monkeypatch.setattr(GroupKeyManager, "declare_averager", counted_declare)
    averagers = []
    with loopback_dhts(tmp_path, PEERS) as dhts:
        try:
            for dht in dhts:  # each peer trusts its own copy as after a minute in the swarm (not waited for)
                dht.p2ptrain_started -= FULL_COPY_AFTER_S + 1
            averagers += [DecentralizedAverager([torch.full((4,), float(index))], dht, prefix=PREFIX,
                                                client_mode=index >= PEERS - CLIENTS, min_matchmaking_time=3.0,
                                                request_timeout=1.0, allow_state_sharing=False, start=True)
                          for index, dht in enumerate(dhts)]
            # the first round finds each key's holders (one search a peer, remembered 30 s)
            assert all(gathered is not None and len(gathered) == PEERS for gathered in average_once(averagers))

            fetches.value = declarations.value = 0
            started = time.time()
            gathered = average_once(averagers)
            ended = time.time()
            assert all(each is not None and len(each) == PEERS for each in gathered), \
                f"groups of {[len(each) if each else 0 for each in gathered]}"
            for averager in averagers:
                with averager.get_tensors() as tensors:
                    assert torch.allclose(tensors[0], torch.full((4,), (PEERS - 1) / 2))
        finally:
            for averager in averagers:
                averager.shutdown()

    lines = logged_lines(logs, started, ended)
    calls = [fields for fields in lines if fields[1] == "call" and fields[4] == GROUP_KEY]
    reads = [fields[3] for fields in lines if fields[1] == "read" and fields[4] == GROUP_KEY]
    finds = sum(1 for fields in calls if fields[3].endswith("rpc_find"))
    stores = sum(1 for fields in calls if fields[3].endswith("rpc_store"))
    print(f"fetches {fetches.value} (reads: {len(reads)}, local {reads.count('local')}), "
          f"declarations {declarations.value}; requests rpc_find {finds}, rpc_store {stores}")
    assert fetches.value >= PEERS and declarations.value >= PEERS - CLIENTS
    assert {fields[2] for fields in calls} == {"matchmaking"}  # the meter's kind for them
    # hivemind's search asked all 7 other nodes at each fetch, and searched before each declaration
    assert finds <= fetches.value, f"{finds} rpc_find for {fetches.value} fetches"
    assert stores <= 5 * declarations.value
    assert not [how for how in reads if how.startswith("network")]
    # the key's holders among the peers read their own copy
    assert reads.count("local") >= fetches.value // 4
