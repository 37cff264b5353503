"""Two daemons side by side on one machine with the default configuration (no config file at all).

Both want TCP 31337 (``dht.host_maddrs = /ip4/0.0.0.0/tcp/31337``): the second
one says the port is taken and by whom, listens on the next free port, shows
it in ``status`` and ``doctor``, and the two train together. The default
listens on every interface; the traffic still stays on this machine. If
31337 is taken by something else on this machine, both move, and the test
still holds: that is the point.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from daemons import cli

pytestmark = [pytest.mark.swarm]

DEFAULT_PORT = 31337


def tcp_port(address: str) -> int:
    return int(re.search(r"/tcp/(\d+)", address).group(1))


@pytest.mark.timeout(420)
def test_two_daemons_without_a_config_file_train_together(daemons):
    a = daemons.start("a", configure=False)
    b = daemons.start("b", configure=False)
    assert not (a.home / "config.toml").exists() and not (b.home / "config.toml").exists()

    created = cli(a.home, "join", "--new-run", "side-by-side")
    assert created.returncode == 0, created.stderr
    a_status = a.wait_until(lambda s: (s.get("local") or {}).get("addresses"), 180, what="A to create the run")
    address = json.loads(cli(a.home, "status", "--json").stdout)["local"]["addresses"][0]
    a_port = tcp_port(address)

    joined_at = time.monotonic()
    joined = cli(b.home, "join", "side-by-side", "--peers", address)
    assert joined.returncode == 0, joined.stderr
    for daemon in (a, b):
        daemon.wait_until(
            lambda s: s["state"] == "training" and (s.get("run") or {}).get("num_peers") == 2,
            max(1.0, 180 - (time.monotonic() - joined_at)),
            what="training with 2 peers within 3 minutes of the join",
        )

    b_status = json.loads(cli(b.home, "status", "--json").stdout)
    b_port = tcp_port(b_status["local"]["addresses"][0])
    assert b_port != a_port
    taken = [line for line in b_status["health"] if f"TCP port {DEFAULT_PORT} is taken by" in line["message"]]
    assert taken, b_status["health"]
    assert f"listening on port {b_port} instead" in taken[0]["message"]
    assert f"forward TCP port {b_port}" in taken[0]["fix"] and "dht.host_maddrs" in taken[0]["fix"]
    if a_port == DEFAULT_PORT:  # A holds B's port (not some other program of this machine)
        assert f"another p2ptrain daemon (pid {a.process.pid}, --home {a.home})" in taken[0]["message"]
    events = json.loads(cli(b.home, "events", "--json").stdout)["events"]
    assert any(event["kind"] == "port-taken" and event["data"]["port"] == b_port for event in events)

    doctor = cli(b.home, "doctor", "--json", timeout=120)
    port_check = next(item for item in json.loads(doctor.stdout)["checks"] if item["name"] == "dht-port")
    assert port_check["level"] == "warning"
    assert port_check["message"] == taken[0]["message"] and port_check["fix"] == taken[0]["fix"]
    assert a_status["local"]["addresses"]
