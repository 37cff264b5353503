"""Traffic accounting: kinds of DHT keys, a process's socket bytes, the month's total, and the budget policy."""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import datetime

import pytest

from p2ptrain.daemon.policies import PolicyEngine, PolicySettings
from p2ptrain.daemon.traffic_month import MonthlyTraffic, monthly_estimate_gb
from p2ptrain.peers.net.traffic import SocketTotals, TrafficMeter, TrafficReporter, kind_of_key, kind_of_message, socket_bytes


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("run-8b78d2247af2f8e0_progress", "progress"),
        ("run_metrics", "metrics"),
        ("run-8b78d2247af2f8e0_grad_averager.0b", "matchmaking"),
        ("run-8b78d2247af2f8e0_diloco.0b01", "matchmaking"),
        ("run-8b78d2247af2f8e0_state_averager.all_averagers", "matchmaking"),
        ("p2ptrain/run/manifest", "dht"),
        (b"\x00raw", "dht"),
    ],
)
def test_a_dht_request_takes_the_kind_of_its_key(key, kind):
    assert kind_of_key(key) == kind


def test_streamed_messages_are_averaging_or_matchmaking_by_type():
    from hivemind.proto import averaging_pb2

    assert kind_of_message(averaging_pb2.AveragingData) == "averaging"
    assert kind_of_message(averaging_pb2.DownloadData) == "averaging"
    assert kind_of_message(averaging_pb2.JoinRequest) == "matchmaking"
    assert kind_of_message(averaging_pb2.MessageFromLeader) == "matchmaking"


def test_the_meter_adds_up_by_kind():
    meter = TrafficMeter()
    meter.add("progress", sent=1000, received=500)
    meter.add("averaging", sent=4000)
    assert meter.totals()["progress"] == (1000, 500) and meter.totals()["averaging"] == (4000, 0)


class KernelCounts:
    """Stands in for ``SocketTotals`` (p2pd's sockets through ``ss``): the kernel's running totals, set by the test."""

    def __init__(self):
        self.sent = self.received = 0

    def sample(self):
        return self.sent, self.received


def test_other_over_a_span_is_the_kernels_bytes_less_the_kinds_even_when_the_kernel_lags():
    """A round's megabytes are counted by hivemind before they cross TCP: the last minute's ``other`` dips below
    zero and is cut at zero, so a mean of those minutes reads high; the totals keep the dip and cancel it."""
    meter, kernel = TrafficMeter(), KernelCounts()
    reporter = TrafficReporter(meter, dht=None, report=None, window_s=0.01)
    reporter.sockets = kernel
    reporter.sample()
    windows, lagging = [], True
    for _ in range(6):
        if lagging:  # hivemind handed p2pd 1 MB of a round; the kernel has sent none of it yet, but 3 kB of upkeep
            meter.add("averaging", sent=1_000_000)
            kernel.sent += 3_000
        else:  # the kernel sent the megabyte and 3 kB of upkeep
            kernel.sent += 1_003_000
        lagging = not lagging
        time.sleep(0.02)
        fields = reporter.sample()
        windows.append(fields["bytes_per_s"]["other"] * 0.02)
        assert fields["bytes_per_s"]["other"] >= 0
    assert fields["totals"]["averaging"] == 3_000_000
    assert fields["totals"]["other"] == kernel.sent - 3_000_000 == 18_000  # six times 3 kB of upkeep
    assert sum(windows) > 2 * 12_000  # the minutes cut at zero: each catching-up window read as a megabyte of other


def _non_loopback_address() -> str | None:
    import psutil

    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    return None


@pytest.mark.timeout(30)
def test_socket_totals_count_what_this_process_sends_through_tcp():
    address = _non_loopback_address()
    if address is None:
        pytest.skip("no network interface besides loopback (loopback sockets are not counted)")
    listener = socket.create_server((address, 0))
    received = bytearray()

    def drain():
        connection, _ = listener.accept()
        while chunk := connection.recv(65536):
            received.extend(chunk)
        connection.close()

    thread = threading.Thread(target=drain)
    thread.start()
    client = socket.create_connection(listener.getsockname())
    totals = SocketTotals(os.getpid())
    client.sendall(b"x" * 300_000)  # returns once the kernel holds the bytes, maybe before it sent them
    deadline = time.monotonic() + 10
    while len(received) < 300_000 and time.monotonic() < deadline:  # sent: the other end has them all
        time.sleep(0.01)
    sent, _ = totals.sample()
    totals.close()
    client.close()
    thread.join(10)
    listener.close()
    if socket_bytes(os.getpid()) is None:
        pytest.skip("`ss` (iproute2) is not installed")
    # both ends are this process: the client's 300 kB sent, and nothing sent back
    assert 300_000 <= sent < 320_000


@pytest.mark.timeout(30)
def test_a_new_connection_between_the_same_two_addresses_is_counted_from_its_first_byte():
    """libp2p dials from its listening port: a volunteer who leaves and joins again through the same NAT mapping
    comes back on the same two addresses, with the kernel's counters from zero."""
    address = _non_loopback_address()
    if address is None or socket_bytes(os.getpid()) is None:
        pytest.skip("no network interface besides loopback, or no `ss`")
    listener = socket.create_server((address, 0))
    totals, port = SocketTotals(os.getpid()), None
    for size in (300_000, 200_000):
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        client.bind((address, port or 0))
        port = client.getsockname()[1]
        client.connect(listener.getsockname())
        server, _ = listener.accept()
        client.sendall(b"x" * size)
        received = 0
        while received < size:
            received += len(server.recv(65536))
        sent, _ = totals.sample()
        server.close()  # the server closes first: the client's port is free to bind again at once
        client.close()
    totals.close()
    listener.close()
    assert 500_000 <= sent < 520_000, sent


@pytest.mark.timeout(30)
def test_a_connection_that_closes_after_its_last_reading_is_counted_to_its_last_byte():
    """A volunteer who leaves ends its connections right after a round: those bytes were sent, and counted."""
    address = _non_loopback_address()
    if address is None or socket_bytes(os.getpid()) is None:
        pytest.skip("no network interface besides loopback, or no `ss`")
    listener = socket.create_server((address, 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    totals = SocketTotals(os.getpid())
    try:
        totals.sample()  # the connection is known, with nothing sent yet
        client.sendall(b"x" * 400_000)
        received = 0
        while received < 400_000:
            received += len(server.recv(65536))
        client.close()
        server.close()
        deadline = time.monotonic() + 10
        while (sent := totals.sample()[0]) < 400_000 and time.monotonic() < deadline:
            time.sleep(0.1)  # the kernel's last word on a socket comes through a second `ss`
    finally:
        totals.close()
        listener.close()
    assert 400_000 <= sent < 420_000, sent
    assert totals._ends is None or totals._ends.poll() is not None, "the watching `ss` ended with close()"


def test_the_month_counts_new_bytes_of_each_worker_and_starts_over_next_month():
    saved = {}
    moment = [datetime(2026, 11, 30, 23, 0)]
    month = MonthlyTraffic(lambda: dict(saved), saved.update, wallclock=lambda: moment[0])
    month.add_report("cpu", since=1.0, sent_bytes=2e9, received_bytes=1e9)
    month.add_report("cpu", since=1.0, sent_bytes=3e9, received_bytes=1e9)
    assert month.used_gb() == pytest.approx(4.0)
    month.add_report("cpu", since=2.0, sent_bytes=0.5e9, received_bytes=0)  # the worker restarted
    assert month.used_gb() == pytest.approx(4.5)
    again = MonthlyTraffic(lambda: dict(saved), saved.update, wallclock=lambda: moment[0])  # a restarted daemon
    assert again.used_gb() == pytest.approx(4.5)
    moment[0] = datetime(2026, 12, 1, 0, 1)
    assert again.used_gb() == 0.0


def test_a_rate_is_extrapolated_to_the_whole_month():
    assert monthly_estimate_gb(10_000, datetime(2026, 11, 5)) == pytest.approx(25.92)  # 10 KB/s, 30 days
    assert monthly_estimate_gb(10_000, datetime(2026, 12, 5)) == pytest.approx(26.784)


class NoSensors:
    gpu_index = None

    def on_battery(self):
        return None

    def user_idle_s(self):
        return None

    def gpu_temperature_c(self):
        return None

    def other_gpu_processes(self):
        return None


def test_a_spent_traffic_budget_pauses_training_until_it_is_raised():
    used = [4.0]
    clock = [0.0]
    settings = PolicySettings(max_monthly_traffic_gb=5, min_pause_s=0, resume_after_s=0)
    engine = PolicyEngine(settings, NoSensors(), clock=lambda: clock[0], monthly_traffic_gb=lambda: used[0])
    assert engine.evaluate() is None
    used[0] = 5.2
    assert engine.evaluate() == "traffic-budget"
    assert "5.20 of 5 GB" in engine.detail and "policy.max_monthly_traffic_gb" in engine.detail
    engine.settings = PolicySettings(max_monthly_traffic_gb=10, min_pause_s=0, resume_after_s=0)
    clock[0] = 1.0
    assert engine.evaluate() is None


def test_no_budget_means_no_traffic_pause():
    engine = PolicyEngine(PolicySettings(), NoSensors(), monthly_traffic_gb=lambda: 1e6)
    assert engine.evaluate() is None
