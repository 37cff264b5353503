"""The systemd units under a real systemd: a Debian container boots systemd as PID 1 (``container.py``),
the wheel is installed into a venv in ``/opt``, and ``p2ptrain service install`` (then the commands it
prints) installs the system service, and ``--user`` the user service of a lingering user.

Checked, as shipped (WatchdogSec=60, TimeoutStopSec=120): the service is ``active (running)`` only
once the daemon said READY over sd_notify; it runs as ``p2ptrain`` at nice 19 and idle I/O with the
hardening in force (read-only system, no home directories, private /tmp, no new privileges), and its
training worker inherits the priority; a hung daemon (SIGSTOP) is killed by the watchdog and
restarted, and rejoins its run; ``systemctl stop`` checkpoints the worker and ends cleanly before its
timeout. The user service the same way (it trains nothing: notify, priority, watchdog, stop).

Opt-in, since it takes about 1.5 minutes (the watchdog alone waits a minute) plus a minute to
debootstrap the cached root file system the first time (.ci/run turns it on as root): ``P2PTRAIN_SYSTEMD_LAB=1 pytest
tests/systemd``. Its output on one machine: docs/findings/systemd-lab.md.
"""

from __future__ import annotations

import json
import os
import shlex
import site
from pathlib import Path

import pytest

from container import Container, cached_rootfs, missing_tools
from daemons import local_config, wait_for
from release import build_release

pytestmark = [pytest.mark.systemd, pytest.mark.timeout(1800)]

if os.environ.get("P2PTRAIN_SYSTEMD_LAB") != "1":
    pytest.skip("the systemd lab is opt-in (root, about 1.5 minutes): P2PTRAIN_SYSTEMD_LAB=1 pytest tests/systemd",
                allow_module_level=True)

VENV = "/opt/p2ptrain"
P2PTRAIN = f"{VENV}/bin/p2ptrain"
DEPENDENCIES = "/opt/p2ptrain-dependencies"
USER = "volunteer"
# The daemon's events table, read with the container's Python once the daemon is gone: kind and data since argv[1].
EVENTS_SINCE = (
    "import sqlite3, sys; db = sqlite3.connect('/var/lib/p2ptrain/p2ptrain.db');"
    "print(*db.execute('SELECT kind, data FROM events WHERE ts >= ? ORDER BY ts', (float(sys.argv[1]),)), sep='\\n')"
)
# Loopback only (the container has no other network), one thread: the lab shares the machine.
CONFIG = local_config("lab")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The booted container with the wheel installed in /opt/p2ptrain (its dependencies: this environment's)."""
    why = missing_tools()
    if why:
        pytest.skip(why)
    rootfs = cached_rootfs()
    work = tmp_path_factory.mktemp("systemd-lab")
    release = build_release(work / "release")
    dependencies = next(path for path in site.getsitepackages() if Path(path, "hivemind").is_dir())
    container = Container(rootfs, {str(release.wheel.parent): "/mnt/dist", dependencies: DEPENDENCIES}, work / "console.log")
    try:
        container.boot()
        container.run(f"python3 -m venv {VENV} && echo {DEPENDENCIES} > {VENV}/lib/python3.11/site-packages/dependencies.pth")
        container.run(f"{VENV}/bin/pip install --quiet --no-deps --no-index --ignore-installed /mnt/dist/{release.wheel.name}")
        assert container.run(f"{VENV}/bin/python -c 'import p2ptrain; print(p2ptrain.__file__)'").stdout.startswith(f"{VENV}/lib/")
        yield container
    finally:
        container.shutdown()


def report(what: str, seen) -> None:
    """One line of what the lab saw (``pytest -s`` shows them; docs/findings/systemd-lab.md keeps a run's)."""
    print(f"\nlab: {what}: {seen}")


def commands_printed(output: str) -> list[str]:
    """The commands ``p2ptrain service install`` prints after "now run:", comments dropped."""
    lines = output.split("now run:", 1)[1].splitlines()
    return [line.split("  #")[0].strip() for line in lines if line.strip()]


def show(lab: Container, unit: str, *properties: str, user: str | None = None) -> dict:
    systemctl = "systemctl --user" if user else "systemctl"
    text = lab.run(f"{systemctl} show {unit} " + " ".join(f"-p {name}" for name in properties), user=user).stdout
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def status_json(lab: Container, user: str | None = None) -> dict:
    result = lab.run(f"{P2PTRAIN} status --json", user=user, check=False)
    return json.loads(result.stdout) if result.stdout.strip().startswith("{") else {}


def process_facts(lab: Container, pid: int) -> dict:
    """Owner, nice value, I/O class and no_new_privs of a process in the container."""
    user = lab.run(f"ps -o user= -p {pid}").stdout.strip()
    nice = int(lab.run(f"ps -o ni= -p {pid}").stdout.strip())
    io_class = lab.run(f"ionice -p {pid}").stdout.strip()
    no_new_privileges = "NoNewPrivs:\t1" in lab.run(f"cat /proc/{pid}/status").stdout
    return {"user": user, "nice": nice, "io": io_class, "no_new_privileges": no_new_privileges}


@pytest.fixture(scope="module")
def system_service(lab):
    """`sudo p2ptrain service install` and the commands it prints, with the lab's config."""
    lab.run(f"mkdir -p /etc/p2ptrain && printf %s {shlex.quote(CONFIG)} > /etc/p2ptrain/config.toml")
    installed = lab.run(f"{P2PTRAIN} service install")
    for command in commands_printed(installed.stdout):
        lab.run(command)
    return installed


def test_the_system_service_is_active_running_once_the_daemon_said_ready(lab, system_service):
    facts = show(lab, "p2ptrain.service", "Type", "ActiveState", "SubState", "StatusText", "NRestarts")
    report("system service", facts)
    assert (facts["Type"], facts["ActiveState"], facts["SubState"]) == ("notify", "active", "running"), facts
    assert facts["StatusText"] == "idle" and facts["NRestarts"] == "0", facts  # the STATUS= of the daemon's READY=1
    assert "Active: active (running)" in lab.run("systemctl status p2ptrain --no-pager", check=False).stdout
    # the control socket answers a member of the p2ptrain group (root here)
    assert status_json(lab)["state"] == "idle"


def test_the_system_daemon_runs_as_p2ptrain_at_idle_priority_with_its_hardening(lab, system_service):
    pid = int(show(lab, "p2ptrain.service", "MainPID")["MainPID"])
    report("system daemon process", process_facts(lab, pid))
    assert process_facts(lab, pid) == {"user": "p2ptrain", "nice": 19, "io": "idle", "no_new_privileges": True}
    # ProtectHome hides /home, root's home and /run/user; a user's runtime directory stands for them
    lab.run("mkdir -p /run/user/4242 && echo owner-only > /run/user/4242/secret && echo shared > /tmp/outside")
    inside = f"nsenter --target={pid} --mount"
    refused = lab.run(f"{inside} touch /usr/lib/p2ptrain-probe", check=False)
    report("writing /usr from the service's mounts", refused.stderr.strip())
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr, refused
    assert lab.run(f"{inside} cat /run/user/4242/secret", check=False).returncode != 0  # ProtectHome
    assert lab.run(f"{inside} cat /tmp/outside", check=False).returncode != 0  # PrivateTmp
    assert lab.run(f"{inside} touch /var/lib/p2ptrain/probe && {inside} rm /var/lib/p2ptrain/probe", check=False).returncode == 0
    assert lab.run("stat -c '%U %G %a' /run/p2ptrain/control.sock").stdout.split() == ["p2ptrain", "p2ptrain", "660"]


@pytest.fixture(scope="module")
def user_service(lab):
    """A user who lingers, with `p2ptrain service install --user` and the commands it prints."""
    lab.run(f"useradd --create-home {USER} && loginctl enable-linger {USER}")
    uid = lab.run(f"id -u {USER}").stdout.strip()
    wait_for(lambda: lab.run(f"test -S /run/user/{uid}/systemd/private", check=False).returncode, lambda code: code == 0,
             60, "the user's systemd")
    lab.run(f"mkdir -p ~/.config/p2ptrain && printf %s {shlex.quote(CONFIG)} > ~/.config/p2ptrain/config.toml", user=USER)
    installed = lab.run(f"{P2PTRAIN} service install --user", user=USER)
    for command in commands_printed(installed.stdout):
        if not command.startswith("loginctl enable-linger"):  # done above, as root
            lab.run(command, user=USER)
    return installed


def test_the_user_service_is_active_running_at_idle_priority(lab, user_service):
    facts = show(lab, "p2ptrain.service", "Type", "ActiveState", "SubState", "StatusText", "MainPID", user=USER)
    assert (facts["Type"], facts["ActiveState"], facts["SubState"], facts["StatusText"]) == ("notify", "active", "running", "idle")
    found = process_facts(lab, int(facts["MainPID"]))
    report("user service", facts)
    report("user daemon process", found)
    assert (found["user"], found["nice"], found["io"]) == (USER, 19, "idle"), found
    assert status_json(lab, user=USER)["state"] == "idle"  # the user's own socket, not the system one


def test_the_system_service_trains_and_its_worker_inherits_the_idle_priority(lab, system_service):
    lab.run(f"{P2PTRAIN} join --new-run lab --target-batch-size 64 --micro-batch 4")
    wait_for(lambda: status_json(lab), lambda status: status.get("state") == "training", 300, "training")
    pid = int(show(lab, "p2ptrain.service", "MainPID")["MainPID"])
    workers = lab.run(f"ps -o pid= --ppid {pid}").stdout.split()
    assert workers, "the daemon has no worker process"
    for worker in workers:
        report("system worker process", process_facts(lab, int(worker)))
        assert process_facts(lab, int(worker)) == {"user": "p2ptrain", "nice": 19, "io": "idle", "no_new_privileges": True}


def test_the_watchdog_restarts_a_hung_daemon_which_rejoins_its_run(lab, system_service, user_service):
    hung = {}
    for user in (None, USER):
        pid = int(show(lab, "p2ptrain.service", "MainPID", user=user)["MainPID"])
        lab.run(f"kill -STOP {pid}")
        hung[user] = pid
    for user, pid in hung.items():
        # WatchdogSec=60: SIGABRT a minute after the last ping, restart 10 s later
        facts = wait_for(lambda: show(lab, "p2ptrain.service", "NRestarts", "MainPID", "ActiveState", "SubState", user=user),
                         lambda facts: facts["NRestarts"] == "1" and facts["SubState"] == "running", 240,
                         f"the {'user' if user else 'system'} service's restart")
        report(f"{'user' if user else 'system'} service after SIGSTOP of pid {pid}", facts)
        assert int(facts["MainPID"]) != pid
    journal = lab.run("journalctl -u p2ptrain.service --no-pager", check=False).stdout
    report("system journal", [line for line in journal.splitlines() if "atchdog" in line or "Scheduled restart" in line])
    assert "Watchdog timeout" in journal, journal[-3000:]
    # the restarted system daemon goes back to the run it was in
    wait_for(lambda: status_json(lab), lambda status: status.get("state") == "training", 300, "training again")


def test_systemctl_stop_checkpoints_and_ends_before_its_timeout(lab, system_service, user_service):
    started = float(lab.run("date +%s.%N").stdout)
    lab.run("systemctl stop p2ptrain.service", timeout=300)
    report("systemctl stop took", f"{float(lab.run('date +%s.%N').stdout) - started:.1f} s (TimeoutStopSec=120)")
    facts = show(lab, "p2ptrain.service", "ActiveState", "Result", "ExecMainCode", "ExecMainStatus")
    report("system service after stop", facts)
    # Result=timeout if the daemon had outlived TimeoutStopSec and been killed
    assert (facts["ActiveState"], facts["Result"], facts["ExecMainStatus"]) == ("inactive", "success", "0"), facts
    saved = lab.run("stat -c %.9Y /var/lib/p2ptrain/checkpoints/*.pt", check=False).stdout.split()
    report("checkpoint written at", f"{saved} (stop began at {started:.3f})")
    assert saved and max(float(mtime) for mtime in saved) > started, (saved, started)
    # the worker said so: its checkpoint-saved event, reason "stop", recorded by the daemon before it exited
    events = lab.run(f"python3 -c {shlex.quote(EVENTS_SINCE)} {started}").stdout
    report("events since the stop", events.strip())
    assert '"reason": "stop"' in events, events
    assert lab.run("pgrep -u p2ptrain", check=False).stdout.strip() == ""  # nothing of the unit is left
    lab.run("systemctl --user stop p2ptrain.service", user=USER, timeout=300)
    facts = show(lab, "p2ptrain.service", "ActiveState", "Result", "ExecMainStatus", user=USER)
    report("user service after stop", facts)
    assert (facts["ActiveState"], facts["Result"], facts["ExecMainStatus"]) == ("inactive", "success", "0"), facts
