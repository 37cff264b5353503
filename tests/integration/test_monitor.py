"""``p2ptrain monitor`` on a real local run: three daemons train, a monitor process watches from outside.

The monitor is a separate process with its own hivemind peer (client mode),
bootstrapped from one daemon's address like an organiser's would be. Its
``/metrics`` and the first daemon's (``[metrics] listen``) are read by
``prometheus_client``'s OpenMetrics parser; its page by headless Chromium.
With ``P2PTRAIN_SCREENSHOT_DIR=docs`` the page's screenshot is kept there
(``docs/monitor.png`` is one).

Cost: about 3 minutes (a 3-peer run, then a minute for each peer to publish
two metrics records, 30 s apart, so each has a loss curve).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from html.parser import HTMLParser
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from browser import chromium, page_dom, screenshot
from daemons import (P2PTRAIN, child_environment, local_swarm, processes_marked, still_running, wait_for,
                     write_local_config)

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(600)]

RUN = "monitored"
NICKNAMES = ("ada", "bob", "cy")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str, timeout: float = 10) -> tuple[int, str, str]:
    """(status, content type, body) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def families(text: str) -> dict:
    """The OpenMetrics text parsed by prometheus_client (it raises on any deviation from the format)."""
    return {family.name: family for family in text_string_to_metric_families(text)}


class Monitor:
    """A ``p2ptrain monitor`` process in its own session, ended with everything it started."""

    def __init__(self, root: Path, run: str, peers: list[str], interval_s: float = 2):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.mark = uuid.uuid4().hex
        self.log_path = root / "monitor.log"
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [*P2PTRAIN, "monitor", run, "--peers", *peers, "--listen", f"127.0.0.1:{self.port}",
                 "--interval", str(interval_s), "--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--log-level", "info"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env=child_environment({"P2PTRAIN_TEST_MARK": self.mark}),
            )

    def run_json(self) -> dict:
        try:
            status, _, body = get(f"{self.url}/api/run.json")
        except OSError:
            return {}
        return json.loads(body) if status == 200 else {}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        return self.process.returncode


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    """Three daemons training one sync run; the first also serves its own /metrics."""
    metrics_port = free_port()

    def configure(home: Path) -> None:
        write_local_config(home)
        if home.name == NICKNAMES[0]:
            with open(home / "config.toml", "a") as config:
                config.write(f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n')

    run_options = ["--mode", "sync", "--target-batch-size", "128", "--micro-batch", "8"]
    with local_swarm(tmp_path_factory.mktemp("monitored"), RUN, run_options, NICKNAMES, configure) as (daemons, address):
        yield daemons, address, f"http://127.0.0.1:{metrics_port}/metrics"


@pytest.fixture(scope="module")
def monitor(swarm, tmp_path_factory):
    _, address, _ = swarm
    watching = Monitor(tmp_path_factory.mktemp("monitor"), RUN, [address])
    try:
        yield watching
    finally:
        watching.stop()


def three_peers_with_loss_curves(run: dict) -> bool:
    peers = [peer for peer in run.get("peers", []) if peer["present"]]
    curves = (run.get("series") or {}).get("loss", {})
    return len(peers) == 3 and all(len(curves.get(peer["peer_id"], [])) >= 2 for peer in peers)


def test_the_monitor_shows_the_runs_three_peers_with_their_loss_over_time(monitor):
    run = wait_for(monitor.run_json, three_peers_with_loss_curves, 300, "three peers with two loss points each")
    assert run["run"]["id"] == RUN and run["run"]["mode"] == "sync" and run["run"]["target_batch_size"] == 128
    assert sorted(peer["nickname"] for peer in run["peers"]) == sorted(NICKNAMES)
    for peer in run["peers"]:
        assert peer["device"] == "cpu" and peer["precision"] == "fp32" and peer["quantization"] == "none"
        assert peer["compatible"] and peer["reachability"] in ("direct", "unknown")
        assert peer["trained_samples"] >= peer["contributed_samples"] >= 0
        assert peer["last_seen"] > time.time() - 120
    assert run["series"]["throughput"] and run["reads"]["count"] >= 2
    assert "watching run 'monitored'" in monitor.log()
    # the records of a run of today's manifest format say each peer's last averaging group, and whom it bans
    assert any(2 <= peer["last_group"] <= 3 for peer in run["peers"]), run["peers"]
    assert run["rounds"] and all(1 <= size <= 3 for round_ in run["rounds"] for size in round_["groups"].values())
    assert run["bans"] == [] and all(peer["bans"] == [] for peer in run["peers"])


def test_the_monitors_metrics_parse_as_openmetrics_with_every_peer(monitor):
    wait_for(monitor.run_json, lambda run: len([p for p in run.get("peers", []) if p["present"]]) == 3, 300, "three peers")
    status, content_type, text = get(f"{monitor.url}/metrics")
    assert status == 200 and content_type.startswith("application/openmetrics-text"), (status, content_type)
    found = families(text)
    (run_info,) = found["p2ptrain_run"].samples
    assert run_info.labels["run"] == RUN and run_info.labels["mode"] == "sync"
    assert {sample.labels["nickname"] for sample in found["p2ptrain_peer"].samples} == set(NICKNAMES)
    peers = {sample.labels["peer"] for sample in found["p2ptrain_peer"].samples}
    assert {sample.labels["peer"] for sample in found["p2ptrain_peer_trained_samples"].samples} == peers
    assert found["p2ptrain_peer_trained_samples"].type == "counter"
    assert found["p2ptrain_run_peers"].samples[0].value == 3
    assert found["p2ptrain_monitor_reads"].samples[0].value >= 1


def test_the_daemons_own_metrics_parse_as_openmetrics(swarm):
    daemons, _, url = swarm
    daemons[0].wait_until(lambda s: s["state"] == "training" and (s.get("local") or {}).get("trained_samples"), 180,
                          what="training samples")
    status, content_type, text = get(url)
    assert status == 200 and content_type.startswith("application/openmetrics-text")
    found = families(text)
    states = {sample.labels["p2ptrain_daemon_state"]: sample.value for sample in found["p2ptrain_daemon_state"].samples}
    assert states["training"] == 1 and sum(states.values()) == 1, states
    assert found["p2ptrain_local_trained_samples"].samples[0].value > 0
    assert found["p2ptrain_run"].samples[0].labels["run"] == RUN
    assert found["p2ptrain_run_banned_peers"].samples[0].value == 0
    assert status == 200 and get(url.replace("/metrics", "/nothing"))[0] == 404


class _PageParts(HTMLParser):
    """The rows of the peers table and the lines of the loss chart in a dumped DOM."""

    def __init__(self):
        super().__init__()
        self.peer_rows, self.loss_lines, self._in_loss_chart = [], [], False

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "tr" and "peer" in (attributes.get("class") or "").split():
            self.peer_rows.append(attributes["data-peer"])
        if tag == "svg":
            self._in_loss_chart = attributes.get("class") == "loss-chart"
        if tag == "polyline" and self._in_loss_chart:
            self.loss_lines.append((attributes["data-series"], int(attributes["data-points"])))


def test_the_run_page_in_chromium_shows_three_peers_and_their_loss_curves(monitor, tmp_path):
    executable, why = chromium()
    if executable is None:
        pytest.skip(why)
    run = wait_for(monitor.run_json, three_peers_with_loss_curves, 300, "three peers with two loss points each")
    dom = page_dom(executable, f"{monitor.url}/")
    parts = _PageParts()
    parts.feed(dom)
    peer_ids = {peer["peer_id"] for peer in run["peers"]}
    assert set(parts.peer_rows) == peer_ids, dom[:3000]
    assert {series for series, points in parts.loss_lines if points >= 2} == peer_ids, parts.loss_lines
    for nickname in NICKNAMES:
        assert re.search(rf">{nickname}</td>", dom), nickname
    assert re.search(r'class="groups">[a-z]+: [23]', dom), "no round with its group sizes on the page"
    assert "nobody is banned" in dom
    picture = tmp_path / "monitor.png"
    screenshot(executable, f"{monitor.url}/", picture)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("P2PTRAIN_SCREENSHOT_DIR"):
        shutil.copy(picture, Path(os.environ["P2PTRAIN_SCREENSHOT_DIR"]) / "monitor.png")


def test_records_failing_their_signature_or_schema_are_not_shown(swarm, monitor, tmp_path):
    """A peer without p2ptrain's validators publishes three records of its own, signed by its key: an honest one
    (shown: its records reach the monitor), one claiming another peer's id, one outside the schema."""
    import hivemind
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.utils import get_dht_time
    from hivemind.utils.crypto import RSAPrivateKey

    from p2ptrain.peers.swarm.records import metrics_key
    from p2ptrain.peers.net.identity import peer_id_of_public_key

    _, address, _ = swarm
    signing_key = RSAPrivateKey()
    validator = RSASignatureValidator(signing_key)
    rogue = hivemind.DHT(initial_peers=[address], host_maddrs=["/ip4/127.0.0.1/tcp/0"], record_validators=[validator], start=True)
    try:
        victim = monitor.run_json()["peers"][0]
        # a record's peer id is the one of the key that signs it
        honest = {"peer_id": peer_id_of_public_key(signing_key.get_public_key()), "nickname": "rogue", "time": get_dht_time()}
        forgeries = [
            {**honest, "peer_id": victim["peer_id"], "nickname": "impostor"},  # another peer's id under the rogue's key
            {**honest, "nickname": "negative", "samples_per_second": -5.0},  # outside the schema
        ]
        key, expiration = metrics_key(RUN), get_dht_time() + 60
        # one subkey per record: the rogue's key (which signs it), then a distinct suffix. The daemons refuse the
        # forgeries; the rogue keeps them and answers them to whoever asks it
        for index, record in enumerate([honest, *forgeries]):
            stored = rogue.store(key, subkey=validator.local_public_key + f"{index}".encode(), value=record, expiration_time=expiration)
            assert stored or record is not honest
        shown = wait_for(monitor.run_json, lambda run: "rogue" in {peer["nickname"] for peer in run["peers"]}, 60,
                         "the rogue's honest record")
        time.sleep(5)  # more reads, which would show the others too
        shown = monitor.run_json()
        nicknames = {peer["nickname"] for peer in shown["peers"]}
        assert "impostor" not in nicknames and "negative" not in nicknames, nicknames
        assert {peer["nickname"] for peer in shown["peers"] if peer["peer_id"] == victim["peer_id"]} == {victim["nickname"]}
    finally:
        rogue.shutdown()


def test_the_monitor_stops_at_sigterm_and_leaves_nothing(monitor):
    assert monitor.stop() == 0, monitor.log()[-3000:]
    # torch's shared-memory manager (hivemind imports torch) ends a moment after its last client
    assert still_running(processes_marked(monitor.mark), timeout=30) == []
