"""Repeated events are one row with a count and a time span: in the log, the database and the pushes."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

from p2ptrain.daemon.event_bursts import EventBursts
from p2ptrain.daemon.event_log import EventLog
from p2ptrain.daemon.server import Broadcaster
from p2ptrain.storage import queries
from p2ptrain.storage.database import Database

NON_FINITE = "skipped a batch with non-finite gradients; nothing was contributed"


def test_a_flood_of_700_events_in_84_seconds_is_one_row_written_every_few_seconds():
    bursts = EventBursts(gap_s=30, update_interval_s=5)
    opened, written = [], []
    for index in range(700):
        now = 1000.0 + index * 0.12
        burst = bursts.add("non-finite", NON_FINITE, {"batch": index}, now)
        if burst is not None:
            opened.append(burst)
        written += [(now, due.count) for due in bursts.due(now)]
    assert len(opened) == 1 and opened[0].ts == 1000.0
    assert 15 <= len(written) <= 17  # one update every 5 s of the 84 s
    assert all(later - earlier >= 5 for (earlier, _), (later, _) in zip(written, written[1:]))
    [final] = bursts.due(1000.0 + 84 + 31)  # 30 s without a repeat: the row closes with every occurrence
    assert (final.count, final.closed, final.data) == (700, True, {"batch": 699})
    assert final.row().to_dict() == {"ts": 1000.0, "kind": "non-finite", "message": NON_FINITE, "data": {"batch": 699},
                                     "count": 700, "last_ts": final.last_ts}
    assert bursts.due(2000.0) == []
    # after the gap, the same event opens a new row
    assert bursts.add("non-finite", NON_FINITE, None, 2000.0) is not None


def test_events_of_another_kind_or_message_are_rows_of_their_own():
    bursts = EventBursts()
    assert bursts.add("non-finite", NON_FINITE, None, 0.0) is not None
    assert bursts.add("averaged", "averaged with 2 peers", None, 0.1) is not None
    assert bursts.add("averaged", "averaged with 3 peers", None, 0.2) is not None
    assert bursts.add("averaged", "averaged with 2 peers", None, 0.3) is None


def test_the_event_log_writes_one_row_one_push_and_two_log_lines_for_a_flood(tmp_path, caplog):
    async def scenario() -> list[dict]:
        database = Database.open(tmp_path / "p2ptrain.db", flush_interval_s=0)
        broadcaster = Broadcaster(lambda: {})
        ours, theirs = socket.socketpair()
        # (reader, writer) of each end, both kept: a writer closes its socket when collected
        daemon_end = await asyncio.open_unix_connection(sock=ours)
        streaming = asyncio.create_task(broadcaster.stream(daemon_end[1]))
        subscriber_end = await asyncio.open_unix_connection(sock=theirs)
        reader = subscriber_end[0]
        await reader.readline()  # the snapshot
        events = EventLog(database, broadcaster)
        with caplog.at_level(logging.INFO, logger="p2ptrain.daemon.event_log"):
            for _ in range(700):
                events.record_repeating("non-finite", NON_FINITE)
            events.record("paused", "paused (user)")
            events.flush(final=True)
        pushed = [json.loads(await reader.readline()) for _ in range(3)]
        streaming.cancel()
        rows = queries.events_since(database)
        database.close()
        assert queries.events_since(tmp_path / "p2ptrain.db") == rows  # as stored
        return pushed, rows

    pushed, rows = asyncio.run(scenario())
    assert [(row["kind"], row["count"]) for row in rows] == [("non-finite", 700), ("paused", 1)]
    assert rows[0]["last_ts"] >= rows[0]["ts"]
    assert [(push["data"]["kind"], push["data"]["count"]) for push in pushed] == [("non-finite", 1), ("paused", 1), ("non-finite", 700)]
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0] == f"non-finite: {NON_FINITE}" and lines[-1].startswith(f"non-finite: {NON_FINITE} (x700 in ")
    assert len(lines) == 3


def test_a_row_of_repeats_is_updated_after_it_was_written(tmp_path):
    with Database.open(tmp_path / "p2ptrain.db", flush_interval_s=3600) as database:
        database.record_event("averaged", "averaged with 2 peers", {"epoch": 1}, ts=100.0)
        database.update_event(100.0, "averaged", 2, 110.0, "averaged with 2 peers", {"epoch": 2})  # still buffered
        database.flush()
        database.update_event(100.0, "averaged", 3, 120.0, "averaged with 2 peers", {"epoch": 3})  # stored
        [waiting] = queries.events_since(database)
        assert (waiting["count"], waiting["last_ts"], waiting["data"]) == (3, 120.0, {"epoch": 3})
        database.flush()
    [stored] = queries.events_since(tmp_path / "p2ptrain.db")
    assert (stored["count"], stored["last_ts"], stored["data"]) == (3, 120.0, {"epoch": 3})
