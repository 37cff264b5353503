"""The top of the dashboard: the daemon's state and why, the run, this peer, uptime."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import var
from textual.widget import Widget
from textual.widgets import Label

from p2ptrain.control_types import Status
from p2ptrain.tui.formatting import format_duration
from p2ptrain.tui.widgets import show_text

# Shown until the first poll of the daemon answered or failed.
CONNECTING = "connecting…"
STATES = ("idle", "joining", "training", "paused", "finishing", "leaving", "error")

PAUSE_REASONS = {
    "user": "paused by you",
    "user-active": "you are using this computer",
    "battery": "running on battery",
    "gpu-busy": "another program is using the GPU",
    "temperature": "the GPU is too hot",
    "schedule": "outside the training schedule",
    "traffic-budget": "this month's network traffic budget is spent",
    "oom-backoff": "backing off after running out of GPU memory",
    "diverged": "training diverged again and again (see Health)",
}


def short_peer_id(peer_id: str | None) -> str:
    """The tail of a libp2p peer id, which is the part that differs between peers."""
    if not peer_id:
        return "—"
    return peer_id if len(peer_id) <= 12 else f"…{peer_id[-10:]}"


def describe_reason(status: Status, now: float) -> str:
    """One line on why the daemon is not training (or what it is doing)."""
    state = status.state
    if state == "paused":
        reason = status.pause_reason or "user"
        words = PAUSE_REASONS.get(reason, reason)
        until = status.paused_until
        if until:
            words += f" · resumes in {format_duration(until - now)}"
        return f"Paused: {words} · press p to resume"
    if state == "error":
        problems = [entry for entry in status.health if entry.level == "error"]
        if problems:
            first = problems[0]
            return f"Error: {first.message} · fix: {first.fix}"
        return "Error: see the event log"
    if state == "idle":
        return "Not in a run · press j to join one"
    if state == "finishing":
        return "Finishing the current epoch, then pausing"
    warnings = [entry for entry in status.health if entry.level == "warning"]
    if not warnings:
        return ""
    fix = f" · fix: {warnings[0].fix}" if warnings[0].fix else ""
    return f"Warning: {warnings[0].message}{fix}"


class StatusHeader(Widget):
    """The daemon's state, pause reason, run name, peer id and uptime."""

    status: var[Status | None] = var(None)
    now: var[float] = var(0.0)
    connection: var[str] = var(CONNECTING)

    def compose(self) -> ComposeResult:
        with Horizontal(id="header-line"):
            yield Label("p2ptrain", id="title")
            yield Label("", id="state")
            yield Label("", id="details")
        yield Label("", id="reason")

    def _refresh_labels(self) -> None:
        state_label = self.query_one("#state", Label)
        details = self.query_one("#details", Label)
        reason = self.query_one("#reason", Label)
        status = self.status
        if status is None:
            connecting = self.connection == CONNECTING
            self._show_state_class("connecting" if connecting else "disconnected")
            show_text(state_label, " CONNECTING " if connecting else " DISCONNECTED ")
            show_text(details, "")
            show_text(reason, self.connection)
            reason.display = True
            return
        state = status.state
        self._show_state_class(state)
        show_text(state_label, f" {state.upper()} ")
        run, local = status.run, status.local
        parts = []
        if run:
            parts.append(f"run [b]{run.id}[/b] ({run.mode}, {run.model})")
        if local and local.peer_id:
            nickname = f" {local.nickname}" if local.nickname else ""
            # how peers reach this one, when it is not plainly direct (a health warning says what to do)
            reach = local.reachability
            reach = f" ({reach})" if reach in ("relayed", "unreachable") else ""
            parts.append(f"peer {short_peer_id(local.peer_id)}{nickname}{reach}")
        traffic = local.traffic if local else None
        if traffic:
            rate = sum(traffic.bytes_per_s.values())
            parts.append(f"net {rate / 1000:.1f} KB/s (~{traffic.month_gb:.0f} GB/month)")
        if status.since:
            parts.append(f"{state} for {format_duration(self.now - status.since)}")
        if status.started_at:
            parts.append(f"up {format_duration(self.now - status.started_at)}")
        show_text(details, " · ".join(parts))
        reason_text = describe_reason(status, self.now)
        show_text(reason, reason_text)
        reason.display = bool(reason_text)

    def _show_state_class(self, state: str) -> None:
        """The CSS class of ``state`` (``-paused``...) and no other state's: a class change restyles the
        header, so nothing is changed when the state is the same (the clock calls this every second)."""
        for name in (*STATES, "connecting", "disconnected"):
            self.set_class(name == state, f"-{name}")

    def on_mount(self) -> None:
        self._refresh_labels()

    def watch_status(self) -> None:
        if self.is_mounted:
            self._refresh_labels()

    def watch_now(self) -> None:
        if self.is_mounted:
            self._refresh_labels()

    def watch_connection(self) -> None:
        if self.is_mounted:
            self._refresh_labels()
