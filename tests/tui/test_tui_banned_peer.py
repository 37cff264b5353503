"""The peers table flags a peer this machine banned (``banned`` in the daemon's peer rows)."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult

from p2ptrain.control_types import PeerRow
from p2ptrain.tui.widgets.peers_table import PeersTable

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


class PeersOnly(App):
    def compose(self) -> ComposeResult:
        yield PeersTable()


async def test_a_banned_peer_is_flagged_in_the_peers_table():
    app = PeersOnly()
    async with app.run_test(size=(120, 20)) as pilot:
        table = app.query_one(PeersTable)
        table.peers = (
            PeerRow(peer_id="12D3KooWHonest", nickname="honest-owl", banned=False),
            PeerRow(peer_id="12D3KooWRogue", nickname="rogue-rat", banned=True),
        )
        await pilot.pause()
        names = [table.get_row_at(index)[0] for index in range(table.row_count)]
        assert names == ["honest-owl", "rogue-rat ⛔ banned"]
