"""How much of an all-reduce came back averaged, so a round that lost a peer's share is not reported as a full one.

hivemind's all-reduce splits the averaged vector into parts, each reduced by
one peer of the group. When a reducer drops out, the parts it held come back
as this peer's own values ("Averaging: received 66.0% results" in hivemind's
log), as do parts whose result this peer refused (``robust_allreduce``); when
a sender drops out, the parts this peer reduces are averaged over fewer peers
("Reducer: received 66.7% of input tensors"). Either way
``averager.step`` still returns the whole group, and the round looked like
"averaged with 3 peers".

``CountsLostParts`` is mixed into our averagers (before hivemind's class): it
measures both shares after each all-reduce, in the averager's process, and
keeps the smaller in shared memory, where the training worker reads it with
``received_share()``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
from typing import Sequence


def received_share(results_failed: float, results_total: float, inputs_received: Sequence[int],
                   parts: int) -> float:
    """The share of one all-reduce that was really averaged, in [0, 1].

    Args:
        results_failed, results_total: values of this peer's vector that came back
            unaveraged, and all of them (hivemind's ``TensorPartContainer``).
        inputs_received: parts this peer received from each sender, for the parts it reduces.
        parts: how many parts this peer reduces (0 for a client, which reduces none).
    """
    share = 1.0 - results_failed / results_total if results_total else 1.0
    if parts and inputs_received:
        share = min(share, sum(inputs_received) / (parts * len(inputs_received)))
    return max(0.0, min(1.0, share))


def found_no_group(error: BaseException) -> bool:
    """True when a failed ``averager.step`` never formed a group (hivemind's message for it) or this
    peer let go of it (cancelled: a pause, leave or stop; ``Trainer.abandon_rounds``), False when a
    group formed and its data exchange failed."""
    return isinstance(error, (asyncio.CancelledError, concurrent.futures.CancelledError)) or "could not find a group" in str(error)


class CountsLostParts:
    """Mixin for a hivemind ``DecentralizedAverager`` subclass: ``received_share()`` of its last all-reduce.

    ``rounds()`` counts the all-reduces it finished, so a caller can tell that a
    new one happened since it last looked.
    """

    def __init__(self, *args, **kwargs):
        # created before hivemind forks the averager process (in super().__init__ with start=True)
        self._last_received_share = multiprocessing.Value("d", 1.0, lock=False)
        self._finished_allreduces = multiprocessing.Value("i", 0, lock=False)
        super().__init__(*args, **kwargs)

    async def _run_allreduce_inplace_(self, tensors, group_info, group_id=None, **kwargs):
        group_id = group_info.group_id if group_id is None else group_id
        try:
            await super()._run_allreduce_inplace_(tensors, group_info, group_id=group_id, **kwargs)
        finally:
            # runs in the averager process; the runner is registered under the group id until the round is over
            runner_future = self._running_groups.get(group_id)
            if runner_future is not None and runner_future.done() and not runner_future.cancelled():
                runner = runner_future.result()
                container, reducer = runner.tensor_part_container, runner.tensor_part_reducer
                self._last_received_share.value = received_share(
                    container.failed_size, container.total_size, reducer.num_parts_received, reducer.num_parts
                )
                self._finished_allreduces.value += 1

    def received_share(self) -> float:
        """The share of the last all-reduce that was averaged (1.0 when nothing was lost)."""
        return self._last_received_share.value

    def rounds(self) -> int:
        """All-reduces this averager has finished (whole or not)."""
        return self._finished_allreduces.value
