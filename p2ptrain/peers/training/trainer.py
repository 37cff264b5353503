"""What the training worker needs of a trainer: the interface ``SyncTrainer`` and ``DiLoCoTrainer`` share.

The worker's loop (``peers/worker/training_worker.py``) drives a trainer without
knowing the mode: it asks ``wants_batch``, puts one batch's gradients in
``.grad`` of ``parameters`` and calls ``step``, or calls ``tick`` while the
trainer works in the background; ``is_behind`` and ``load_state_from_peers``
catch up with the swarm; ``account`` says what became of every sample. ``tests/unit/test_trainer_protocol.py`` checks that
both trainers have every member with the same arguments.

Both trainers are built from a ``SwarmSettings`` and an ``LrSchedule``
(``settings.py``), plus what only their mode has.

Importable without torch or hivemind (the types are for type checkers only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch
    from hivemind.optim.progress_tracker import ProgressTracker

    from p2ptrain.peers.training.sample_account import SampleAccount
    from p2ptrain.peers.training.sync import StepOutcome
    from p2ptrain.peers.robust.trust import Trust


class Trainer(Protocol):
    """One peer's optimizer over the trainable parameters, averaging with the swarm.

    Attributes:
        parameters: the trainable parameters; the worker checks their
            gradients before ``step`` and the trainer averages only these.
        tracker: hivemind's progress tracker of the run (``global_epoch``,
            ``global_progress``): where the swarm stands.
        account: this peer's samples: trained, contributed, unused by reason
            (the trainer counts what it steps on; the worker adds batches it skips).
        trust: the peers its averagers named and banned (``peers/robust/trust.py``):
            the worker reports them after each step and lifts bans on ``Unban``.
    """

    parameters: Sequence[torch.nn.Parameter]
    tracker: ProgressTracker
    account: SampleAccount
    trust: Trust

    @property
    def local_epoch(self) -> int:
        """This peer's epoch: global steps (sync) or outer steps (DiLoCo) it has taken or downloaded."""

    @property
    def state_source(self) -> str | None:
        """The peer id (base58) whose state the last download from the swarm took, or None before any."""

    def wants_batch(self) -> bool:
        """Whether the next batch is welcome now (False while DiLoCo waits for its round)."""

    def is_behind(self) -> bool:
        """Whether the swarm is too far ahead to catch up by training: download its state first."""

    @property
    def pending_samples(self) -> int:
        """Samples trained whose local progress (DiLoCo) or gradients (sync) the trainer holds, not yet
        contributed: after a restore, what the restored state holds."""

    @property
    def waiting(self) -> str | None:
        """Why the pending samples wait, in one line, when it is more than the current round
        (rounds that found no other peer); None otherwise. ``status`` shows it."""

    def scale_lr(self, scale: float) -> bool:
        """Take this peer's own steps at ``scale`` times the manifest's learning rate (the divergence
        guard lowers it after a rollback); False when the mode has no rate of a peer's own."""

    def step(self, samples: int) -> StepOutcome:
        """Take one local batch of ``samples`` samples whose gradients are in ``.grad``."""

    def tick(self) -> StepOutcome:
        """Collect what background rounds finished, while no batch is taken."""

    def skip_batch(self) -> None:
        """Drop the gradients of a batch that must not be contributed (non-finite, or interrupted)."""

    def pause(self) -> None:
        """Training pauses: let a round pre-scheduled with the swarm go on without this peer."""

    def abandon_rounds(self, without_group: bool) -> None:
        """Stop waiting for the averaging rounds in flight (called from another thread when the
        worker must stop while ``step`` or ``tick`` may wait for one): the waiting call returns as
        after a failed round, and the worker checkpoints before its stop deadline. ``without_group``:
        only the rounds whose group has not formed (a pause or leave; a formed group's members wait
        for this peer's part), else every one (a stop signal, before the stop deadline)."""

    def load_state_from_peers(self) -> bool:
        """Download the swarm's newest state; True if the local epoch moved."""

    def state_dict(self) -> dict:
        """The trainer's state for a checkpoint."""

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``'s output (from a checkpoint)."""

    def shutdown(self) -> None:
        """Stop the averagers and background threads."""
