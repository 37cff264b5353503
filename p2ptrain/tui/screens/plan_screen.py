"""The daemon's hardware plan for this machine's workers, and why it chose each value."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Static

from p2ptrain.control_types import WorkerStatus


def plan_text(workers: list[WorkerStatus]) -> str:
    """A block per worker: device, what it trains with, its memory, then the plan's rationale."""
    blocks = []
    for worker in workers:
        plan = worker.plan
        if not plan:
            continue
        quantization = "" if plan.quantization == "none" else f", {plan.quantization}"
        checkpointing = ", gradient checkpointing" if plan.gradient_checkpointing else ""
        cap = f", allocator capped at {plan.memory_cap_gib} GiB" if plan.memory_cap_gib else ""
        lines = [f"[b]{escape(str(worker.device))}[/b] {escape(plan.device_name or '')}",
                 f"{plan.precision}{quantization}{checkpointing}, micro-batch {plan.micro_batch} x {plan.grad_accum}",
                 f"~{plan.memory_estimate_gib} of {plan.memory_allowed_gib} GiB allowed{cap}"]
        lines += [f"  • {escape(line)}" for line in plan.rationale]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) or "No plan yet: the daemon plans each worker once it knows the run's manifest."


class PlanScreen(ModalScreen[None]):
    """The plan of each worker (``status.local.workers[].plan``); escape, i or q closes it."""

    AUTO_FOCUS = "#plan-dialog"
    BINDINGS = [("escape", "close", "Close"), ("i", "close", "Close"), ("q", "close", "Close")]

    def __init__(self, workers: list[WorkerStatus]):
        """``workers``: ``status.local.workers``, each with its ``plan``."""
        super().__init__()
        self.plans = workers

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog", id="plan-dialog"):
            yield Static(plan_text(self.plans))

    def action_close(self) -> None:
        self.dismiss(None)
