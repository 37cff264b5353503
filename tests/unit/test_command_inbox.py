"""The worker's command inbox over a real pipe: commands kept in order, told on arrival, the pipe's end seen."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from p2ptrain.peers.worker.command_inbox import CommandInbox
from p2ptrain.worker_pipe import Finish, Leave, Pause, Resume, encode

pytestmark = pytest.mark.timeout(30)


class Opened:
    """An inbox on one end of a real pipe; the daemon's end is ``daemon``. Records what its callbacks saw."""

    def __init__(self, kept=None):
        self.daemon, worker_end = multiprocessing.Pipe()
        self.arrived, self.unknown = [], []
        self.arrival_threads = set()
        self.inbox = CommandInbox(worker_end, self._arrived, self.unknown.append, kept=kept)
        self.inbox.start()

    def _arrived(self, command) -> None:
        self.arrived.append(command)
        self.arrival_threads.add(threading.current_thread().name)

    def taken_within(self, count: int, seconds: float = 5.0) -> list:
        taken, deadline = [], time.monotonic() + seconds
        while len(taken) < count and time.monotonic() < deadline:
            self.inbox.wait(0.1)
            taken += self.inbox.take()
        return taken


def test_commands_are_kept_in_order_after_those_received_before_and_told_on_arrival():
    opened = Opened(kept=[Resume()])
    opened.daemon.send(encode(Pause()))
    opened.daemon.send(encode(Finish()))
    taken = opened.taken_within(3)
    assert [type(command) for command in taken] == [Resume, Pause, Finish]
    assert [type(command) for command in opened.arrived] == [Pause, Finish]  # the kept one arrived before the inbox
    assert opened.arrival_threads == {"command-reader"}, "the arrival is told on the reader thread, not the loop's"
    assert opened.inbox.take() == []


def test_the_arrival_is_told_while_the_loop_is_busy():
    """The point of the inbox: a leave reaches the worker while its loop waits in a step."""
    opened = Opened()
    opened.daemon.send(encode(Leave()))
    deadline = time.monotonic() + 5
    while not opened.arrived and time.monotonic() < deadline:
        time.sleep(0.05)  # the "step": nobody calls take() or wait()
    assert [type(command) for command in opened.arrived] == [Leave]


def test_wait_ends_when_a_command_comes():
    opened = Opened()
    threading.Timer(0.3, opened.daemon.send, args=(encode(Pause()),)).start()
    started = time.monotonic()
    opened.inbox.wait(20)
    assert time.monotonic() - started < 10, "wait() slept past the command's arrival"
    assert [type(command) for command in opened.inbox.take()] == [Pause]


def test_an_unknown_command_is_answered_and_not_kept():
    opened = Opened()
    opened.daemon.send({"kind": "self-destruct"})
    opened.daemon.send(encode(Pause()))
    taken = opened.taken_within(1)
    assert [type(command) for command in taken] == [Pause]
    assert len(opened.unknown) == 1 and "self-destruct" in opened.unknown[0]


def test_a_message_that_does_not_unpickle_is_answered_and_the_reader_reads_on():
    opened = Opened()
    opened.daemon.send_bytes(b"not a pickle at all")
    opened.daemon.send(encode(Leave()))
    taken = opened.taken_within(1)
    assert [type(command) for command in taken] == [Leave]
    assert len(opened.unknown) == 1 and opened.unknown[0].startswith("<unreadable: ")


def test_a_failing_arrival_still_keeps_the_command():
    daemon, worker_end = multiprocessing.Pipe()

    def broken(command):
        raise RuntimeError("the trainer is shutting down")

    inbox = CommandInbox(worker_end, broken, lambda text: None)
    inbox.start()
    daemon.send(encode(Pause()))
    inbox.wait(5)
    assert [type(command) for command in inbox.take()] == [Pause]


def test_the_daemons_end_closing_is_seen():
    opened = Opened()
    opened.daemon.send(encode(Pause()))
    opened.daemon.close()
    deadline = time.monotonic() + 5
    while not opened.inbox.closed and time.monotonic() < deadline:
        opened.inbox.wait(0.1)
    assert opened.inbox.closed
    assert [type(command) for command in opened.inbox.take()] == [Pause], "what came before the close is kept"
