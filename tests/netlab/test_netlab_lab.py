"""The lab itself: NAT, the firewalls, isolation from the host, shaping, and its teardown."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from lab import PREFIX, Lab, remove_stale_labs

pytestmark = pytest.mark.timeout(120)

PORT = 4242
# Accepts connections; tells each client the address it came from, then how many bytes it sent.
SERVER = f"""
import socket
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", {PORT}))
server.listen()
print("ready", flush=True)
while True:
    connection, (address, _) = server.accept()
    connection.sendall(address.encode() + b"\\n")
    received = 0
    while chunk := connection.recv(65536):
        received += len(chunk)
    connection.sendall(str(received).encode())
    connection.close()
"""
# Connects, prints what the server says about it, sends N bytes, prints the count the server got.
CLIENT = """
import socket, sys
connection = socket.create_connection((sys.argv[1], {port}), timeout=3)
print(connection.recv(100).decode().strip())
connection.sendall(b"x" * int(sys.argv[2]))
connection.shutdown(socket.SHUT_WR)
print(connection.recv(100).decode())
""".format(port=PORT)


def serve(host) -> subprocess.Popen:
    server = subprocess.Popen(host.command([sys.executable, "-c", SERVER]), stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    return server


def dial(host, address: str, size: int = 0) -> subprocess.CompletedProcess:
    return host.run([sys.executable, "-c", CLIENT, address, str(size)])


@pytest.fixture
def homes(lab: Lab):
    public, h1, h2 = lab.add_public("pub"), lab.add_home("h1"), lab.add_home("h2")
    servers = [serve(host) for host in (public, h1, h2)]
    try:
        yield public, h1, h2
    finally:
        for server in servers:
            server.kill()
            server.wait()


def test_a_home_reaches_the_public_host_from_its_router_address(homes):
    public, h1, _ = homes
    dialled = dial(h1, public.address, 1000)
    assert dialled.returncode == 0, dialled.stderr
    seen_as, received = dialled.stdout.split()
    assert seen_as == h1.router.public_address != h1.address
    assert received == "1000"


def test_nobody_dials_into_a_home(homes):
    public, h1, h2 = homes
    for caller, target in ((public, h1.router.public_address), (h2, h1.router.public_address), (public, h1.address)):
        dialled = dial(caller, target)
        assert dialled.returncode != 0, f"{caller.name} reached {target}: {dialled.stdout}"


def test_a_firewalled_global_host_dials_out_but_nobody_dials_in(lab: Lab):
    public, firewalled = lab.add_public("pub"), lab.add_firewalled("fw")
    servers = [serve(public), serve(firewalled)]
    try:
        assert dial(firewalled, public.address).returncode == 0
        assert dial(public, firewalled.address).returncode != 0
    finally:
        for server in servers:
            server.kill()
            server.wait()


def test_the_lab_has_no_route_to_the_host_or_beyond(lab: Lab):
    public, home = lab.add_public("pub"), lab.add_home("h1")
    for host in (public, home, home.router):
        namespace = host.namespace
        routes = subprocess.run(["ip", "-n", namespace, "route", "get", "8.8.8.8"], capture_output=True, text=True)
        if host is home:  # its default route leads to its router, which has none
            assert routes.returncode == 0
        else:
            assert routes.returncode != 0, routes.stdout
    assert dial(home, "8.8.8.8").returncode != 0


def test_a_shaped_uplink_is_slow_and_counted_at_the_router(homes, lab: Lab):
    public, h1, _ = homes
    lab.shape("h1", upload_mbit=8)
    before = h1.router.uplink_bytes()
    started = time.monotonic()
    dialled = dial(h1, public.address, 2_000_000)
    elapsed = time.monotonic() - started
    assert dialled.returncode == 0 and dialled.stdout.split()[1] == "2000000"
    # 16 Mbit at 8 Mbit/s: at least ~2 s (a lower bound, whatever the machine's load)
    assert elapsed > 1.5
    sent = h1.router.uplink_bytes()["sent"] - before["sent"]
    # the payload, TCP/IP headers and retransmissions of what the shaper's queue dropped
    assert 2_000_000 < sent < 3_200_000


def test_teardown_ends_processes_and_deletes_namespaces(lab_machine):
    lab = Lab(tag="gone")
    host = lab.add_home("h1")
    sleeper = subprocess.Popen(host.command(["sleep", "600"]))
    # `ip netns exec` enters the namespace, then runs sleep in its own pid: wait for that, or a loaded
    # machine tears down first and the sleeper enters a namespace nobody lists (CI's run of 73d2f3c)
    deadline = time.monotonic() + 30
    while str(sleeper.pid) not in subprocess.run(["ip", "netns", "pids", host.namespace], capture_output=True,
                                                 text=True).stdout.split():
        assert time.monotonic() < deadline, "the sleeper never entered its namespace"
        time.sleep(0.05)
    lab.teardown()
    assert sleeper.wait(10) is not None
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "-gone-" not in listed


def test_labs_of_dead_test_runs_are_removed(lab_machine):
    dead_pid = 4_000_000  # above any pid_max: no such process
    name = f"{PREFIX}{dead_pid}-x-pub"
    subprocess.run(["ip", "netns", "add", name], check=True)
    removed = remove_stale_labs()
    assert name in removed
    assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
