"""Every peer in the run: who, on what hardware, how fast, and whether it can average with us."""

from __future__ import annotations

from rich.cells import cell_len
from textual.reactive import var
from textual.widgets import DataTable

from p2ptrain.control_types import PeerRow
from p2ptrain.tui.formatting import format_age, format_number
from p2ptrain.tui.widgets.status_header import short_peer_id

# What a volunteer scans first comes first: an 80-column terminal shows those without scrolling.
COLUMNS = ("Peer", "Samples/s", "Epoch", "Loss", "Link", "Last seen", "Device", "Precision", "Batch")


def peer_name(peer: PeerRow) -> str:
    """Nickname (or short id), starred for this machine, flagged when incompatible or banned."""
    name = peer.nickname or short_peer_id(peer.peer_id)
    if peer.is_local:
        name = f"★ {name}"
    if peer.compatible is False:
        name = f"{name} ⚠ incompatible"
    if peer.banned:
        name = f"{name} ⛔ banned"
    return name


def precision_text(peer: PeerRow) -> str:
    """``bf16``, or ``bf16/nf4`` when the base model is quantized."""
    precision = peer.precision or "?"
    quantization = peer.quantization
    return f"{precision}/{quantization}" if quantization and quantization != "none" else precision


class PeersTable(DataTable):
    """The run's peers, this machine first."""

    BORDER_TITLE = "Peers"

    peers: var[tuple[PeerRow, ...]] = var(())
    now: var[float] = var(0.0)

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)

    def on_mount(self) -> None:
        self._refresh_rows()

    def _last_seen(self, peer: PeerRow) -> str:
        return "now" if peer.is_local else format_age(peer.last_seen, self.now)

    def _cells(self, peer: PeerRow) -> tuple[str, ...]:
        """A peer's row, in the order of ``COLUMNS``."""
        return (
            peer_name(peer),
            format_number(peer.samples_per_second, 1),
            "—" if peer.epoch is None else str(peer.epoch),
            format_number(peer.loss, 3),
            peer.reachability or "?",
            self._last_seen(peer),
            peer.device or "?",
            precision_text(peer),
            str(peer.micro_batch or "—"),
        )

    def _refresh_rows(self) -> None:
        """Rebuild the rows when the peers change, keeping the row the user has selected.

        The columns are as wide as their widest cell, set here rather than measured by the table: Textual's
        DataTable measures added rows only when it is next idle, and a header it drew before that keeps the old
        widths (narrower than the rows beneath it) until something else changes.
        """
        selected_row = self.cursor_row
        ordered = sorted(self.peers, key=lambda peer: (not peer.is_local, peer.nickname or ""))
        rows = [self._cells(peer) for peer in ordered]
        self.clear(columns=True)
        for index, label in enumerate(COLUMNS):
            self.add_column(label, width=max([cell_len(label)] + [cell_len(row[index]) for row in rows]), key=label)
        for peer, cells in zip(ordered, rows):
            self.add_row(*cells, key=peer.peer_id)
        if ordered:
            self.move_cursor(row=min(selected_row, len(ordered) - 1))
        self.border_subtitle = f"{len(ordered)} peers" if ordered else "no peers"

    def _refresh_ages(self) -> None:
        """Only the "Last seen" cells, and only those whose text changed: the clock ticks every second
        (all rows again when an age outgrows its column)."""
        width = self.columns["Last seen"].width
        for peer in self.peers:
            age = self._last_seen(peer)
            key = peer.peer_id
            if cell_len(age) > width:
                self._refresh_rows()
                return
            if key in self.rows and self.get_cell(key, "Last seen") != age:
                self.update_cell(key, "Last seen", age)

    def watch_peers(self) -> None:
        if self.is_mounted:
            self._refresh_rows()

    def watch_now(self) -> None:
        if self.is_mounted and self.peers:
            self._refresh_ages()
