"""The lab's request log: what each process writes, and how ``benchmarks/request_counts.py`` sums it by key."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest
from hivemind.dht.routing import DHTID

from p2ptrain.peers.net import request_log

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "request_counts.py"


@pytest.fixture
def request_counts():
    spec = importlib.util.spec_from_file_location("request_counts", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Request:
    """What a served DHT request looks like to the log: the hashes of its keys."""

    def __init__(self, key: str):
        self.keys = [DHTID.generate(source=key).to_bytes()]


def test_nothing_is_logged_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(request_log.ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.chdir(tmp_path)
    request_log.log_read("run_progress", "local")
    assert not request_log.enabled() and list(tmp_path.iterdir()) == []


def test_requests_are_summed_per_peer_by_key_and_served_hashes_named(tmp_path, monkeypatch, request_counts):
    peer = tmp_path / "home1"
    monkeypatch.setenv(request_log.ENVIRONMENT_VARIABLE, str(peer))
    since = time.time() - 0.01  # a line's time is rounded to the microsecond: it may print a hair early
    for _ in range(3):
        request_log.record("call", "progress", "DHTProtocol.rpc_store", "run_progress", 1000, 10)
    request_log.record("serve", "dht", "DHTProtocol.rpc_find", request_log.served_key(Request("run_progress")), 3800, 200)
    request_log.log_read("run_metrics", "network: no local copy")
    until = time.time() + 1e-3

    rows = request_counts.summarize(tmp_path, since, until)["home1"]
    seconds = until - since
    by_key = {(row[2], row[4], row[5]): row for row in rows}
    stores = by_key["call", "DHTProtocol.rpc_store", "run_progress"]
    assert stores[0] == pytest.approx(3030 / seconds) and stores[1] == pytest.approx(3 / seconds)
    # the server saw only the key's hash: named after the key a caller logged
    assert by_key["serve", "DHTProtocol.rpc_find", "run_progress"][0] == pytest.approx(4000 / seconds)
    assert ("read", "network: no local copy", "run_metrics") in by_key
    # a window that ends before the lines leaves them out
    assert request_counts.summarize(tmp_path, since - 10, since - 5)["home1"] == []


def test_a_process_that_is_pointed_at_another_directory_logs_there(tmp_path, monkeypatch):
    for peer in ("home1", "home2"):
        monkeypatch.setenv(request_log.ENVIRONMENT_VARIABLE, str(tmp_path / peer))
        request_log.record("call", "progress", "DHTProtocol.rpc_store", peer, 10, 1)
    for peer in ("home1", "home2"):
        lines = [line.split("\t") for file in (tmp_path / peer).iterdir() for line in file.read_text().splitlines()]
        assert [line[4] for line in lines] == [peer]
