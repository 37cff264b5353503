"""A slow sensor never delays the daemon's answers: sensors are read in a thread.

The volunteer's `loginctl` is faked (this machine has no logind session): it
takes 1.8 s a call, under the 2 s timeout, and reports someone at the keyboard.
"""

from __future__ import annotations

import time

import pytest

from daemons import cli
from fake_commands import fake_loginctl


@pytest.mark.timeout(180)
def test_a_slow_loginctl_does_not_delay_status_and_still_pauses_for_the_user(daemons, short_tmp):
    environment = fake_loginctl(short_tmp / "bin", delay_s=1.8)
    home = short_tmp / "slow"
    daemon = daemons.start("slow", env=environment)
    assert cli(home, "config", "set", "policy.pause_cpu_when_user_active", "true").returncode == 0
    assert cli(home, "join", "--new-run", "sensors", "--mode", "sync").returncode == 0

    latencies = []
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:  # every tick reads the sensors: a request must never wait for one
        started = time.monotonic()
        daemon.status()
        latencies.append(time.monotonic() - started)
        time.sleep(0.1)
    # Behind the sensors, two of three requests would wait (1.8 s of every ~2.8 s), up to 1.8 s; a
    # loaded machine can delay any one request as long, so judge the 90th percentile, not the slowest.
    ninetieth = sorted(latencies)[int(0.9 * len(latencies))]
    assert ninetieth < 1.0, f"90 % of status requests took up to {ninetieth:.2f} s (slowest {max(latencies):.2f} s of {len(latencies)})"

    # the readings still reach the policies: the fake session is in use
    status = daemon.wait_until(lambda s: s["state"] == "paused", 60, what="the user-active pause")
    assert status["pause_reason"] == "user-active"
