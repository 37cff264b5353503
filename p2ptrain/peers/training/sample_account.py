"""What became of the samples a peer trained: used by the run, still pending, or not used and why.

A volunteer's question is "how much of my work did the run use?". Every sample
a peer trains is counted once in ``trained``; it ends in exactly one place:

- ``contributed``: it entered an adopted average or optimizer step (sync: the
  gradients it was in were averaged or stepped on; DiLoCo: the pseudo-gradient
  it was in entered an outer step that the swarm adopted, or this peer's own
  outer step while it trained alone);
- ``unused[reason]``: it never will, because the peer was ``late`` (more rounds
  behind the swarm than a delta may be carried), the ``failed_round`` it was in
  cannot be finished (the worker restarted while the round ran), or it was
  ``rejected`` (a non-finite loss, gradient, pseudo-gradient or average);
- pending: neither yet (the current round or epoch); ``pending`` is the rest.

Stdlib only. The reasons are the fields of the worker pipe's ``UnusedSamples``;
``totals`` are the fields of its ``Step`` and ``Epoch`` reports.
"""

from __future__ import annotations

import dataclasses

from p2ptrain.worker_pipe import UnusedSamples

UNUSED_REASONS = tuple(field.name for field in dataclasses.fields(UnusedSamples))


@dataclasses.dataclass
class SampleAccount:
    """Running totals of one peer's samples in one run (see the module doc)."""

    trained: int = 0
    contributed: int = 0
    unused: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(UNUSED_REASONS, 0))

    def add_trained(self, samples: int) -> None:
        self.trained += samples

    def add_contributed(self, samples: int) -> None:
        self.contributed += samples

    def add_unused(self, reason: str, samples: int) -> None:
        """Count ``samples`` as never to be used, for ``reason`` (one of ``UNUSED_REASONS``)."""
        if reason not in UNUSED_REASONS:
            raise ValueError(f"unknown reason {reason!r} for unused samples: use one of {', '.join(UNUSED_REASONS)}")
        self.unused[reason] += samples

    @property
    def pending(self) -> int:
        """Samples trained whose fate is not decided yet (the current round or epoch)."""
        return self.trained - self.contributed - sum(self.unused.values())

    def totals(self) -> dict:
        """``trained_samples``, ``contributed_samples`` and ``unused_samples``: the fields of the
        worker's ``Step`` and ``Epoch`` reports and the names of ``status.local``."""
        return {"trained_samples": self.trained, "contributed_samples": self.contributed, "unused_samples": UnusedSamples(**self.unused)}

    def as_dict(self) -> dict:
        """``totals`` as plain values, for a checkpoint."""
        return {"trained_samples": self.trained, "contributed_samples": self.contributed, "unused_samples": dict(self.unused)}

    def load_dict(self, data: dict) -> None:
        """Take the totals ``as_dict`` wrote (a checkpoint's); one of an older p2ptrain has only
        ``contributed_samples``, which counted every trained sample then."""
        self.contributed = int(data.get("contributed_samples", 0))
        self.trained = int(data.get("trained_samples", self.contributed))
        self.unused = dict.fromkeys(UNUSED_REASONS, 0)
        self.unused.update({reason: int(count) for reason, count in (data.get("unused_samples") or {}).items() if reason in self.unused})
