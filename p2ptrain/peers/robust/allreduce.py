"""hivemind's all-reduce with robust reducers and checked results (runs in an averager's process).

``RobustAllReduceRunner`` is hivemind's ``AllReduceRunner`` with two parts swapped:

- its reducer (``RobustPartReducer``) keeps every sender's piece of the current
  part and combines them with ``robust_reduce.robust_aggregate`` instead of
  adding them into a weighted sum; it leaves out banned senders and senders that
  replay an earlier piece (``ReplayMemory``);
- its tensor container (``CheckedPartContainer``) holds each part that another
  reducer returns until this peer's own reducer has seen every piece it will
  get this round (so it knows the senders' weights and whom it named), then
  checks it: one from a banned peer, or from a peer this reducer named as a
  sender in this round, is not used; one past ``robust_reduce.bad_result``'s
  bounds (NaN/infinity, a value above the bound of the largest weight counted
  in the group, or farther from our own piece than ``far_from_own`` times its
  norm when this peer's weight counts) is refused and names its reducer. Our
  own piece is kept for a part not used, as hivemind does for a reducer that
  failed. A reducer can return
  anything for its part (BTARD verifies reducers with commitments and random
  checks; hivemind has nothing of the kind), so these checks are what limits
  a misbehaving reducer.

When the round ends, the runner hands the senders and reducers it named to
``RoundJudge.report`` (one record per round; ``trust.Trust`` counts them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from typing import Callable, Sequence

import torch
from hivemind.averaging.allreduce import AllReduceRunner
from hivemind.averaging.partition import AllreduceException, BannedException, TensorPartContainer, TensorPartReducer
from hivemind.p2p import PeerID

from p2ptrain.peers.robust.reduce import REPLAYED, RobustOptions, Suspect, bad_result, robust_aggregate, worse_suspect

logger = logging.getLogger(__name__)

# replays are judged on samples of the flattened tensors: at most this many per full vector
REPLAY_SAMPLES = 4096
MIN_REPLAY_STRIDE = 257  # a prime, so samples do not line up with tensor rows
MIN_REPLAY_EVIDENCE = 16  # a piece is a replay when at least this many of its nonzero samples repeat exactly


class ReplayMemory:
    """What each sender sent at every ``stride``-th element of the flattened tensors, in
    the latest round where this peer reduced that element; an honest update never
    repeats bit for bit, a replayed one does.

    Args:
        total_size: elements in all averaged tensors together.
    """

    def __init__(self, total_size: int):
        self.stride = max(MIN_REPLAY_STRIDE, total_size // REPLAY_SAMPLES)
        self.samples: dict[PeerID, dict[int, float]] = {}

    def positions(self, offset: int, size: int) -> range:
        """Indices, inside a piece starting at flat element ``offset``, of the sampled elements."""
        first = -offset % self.stride
        return range(first, size, self.stride)

    def sample(self, piece: torch.Tensor, offset: int) -> dict[int, float]:
        """The sampled elements of ``piece`` (flat, starting at ``offset``), by flat index."""
        inside = self.positions(offset, piece.numel())
        values = piece.reshape(-1)[inside.start :: inside.step].tolist() if len(inside) else []
        return {offset + position: value for position, value in zip(inside, values)}

    def is_replay(self, sender: PeerID, sampled: dict[int, float]) -> bool:
        """True when ``sampled`` repeats what ``sender`` sent before, exactly, on enough nonzero elements."""
        earlier = self.samples.get(sender)
        if not earlier:
            return False
        compared = [(value, earlier[index]) for index, value in sampled.items() if index in earlier and (value or earlier[index])]
        return len(compared) >= MIN_REPLAY_EVIDENCE and all(now == before for now, before in compared)

    def remember(self, sender: PeerID, sampled: dict[int, float]) -> None:
        self.samples.setdefault(sender, {}).update(sampled)


@dataclasses.dataclass
class RoundJudge:
    """What an averager's reducers need across rounds (in the averager's process).

    Args:
        options: the averager's ``RobustOptions``.
        banned: peers whose pieces and results are not used (updated by the host).
        replays: the averager's ``ReplayMemory``.
        report: called once per finished round with ``{"time", "group",
            "senders", "suspects": [{"peer_id", "reason", "ratio", "role"}]}``.
    """

    options: RobustOptions
    banned: set[PeerID]
    replays: ReplayMemory
    report: Callable[[dict], None]


class RobustPartReducer(TensorPartReducer):
    """hivemind's ``TensorPartReducer`` that combines the pieces of each part robustly.

    Args:
        part_shapes: shapes of this peer's parts, in order.
        sender_ids: the group's senders, in hivemind's sender order.
        own: this peer's index among the senders (None if it does not send).
        part_offsets: flat element index of each part's first element.
        judge: the averager's ``RoundJudge``.
        on_finished: called once this reducer has combined its last part (at once when it
            has none) or the round ended.
        own_rms: the root mean square of this peer's whole piece (``robust_aggregate``).
    """

    def __init__(self, part_shapes: Sequence[torch.Size], sender_ids: Sequence[PeerID], own: int | None,
                 part_offsets: Sequence[int], judge: RoundJudge, on_finished: Callable[[], None], own_rms: float = 0.0):
        self.sender_ids, self.own, self.part_offsets, self.judge = list(sender_ids), own, list(part_offsets), judge
        self.own_rms = own_rms
        self.on_finished = on_finished
        self.pieces: dict[int, tuple[torch.Tensor, float]] = {}
        self.suspects: dict[int, Suspect] = {}
        self.ratios: dict[int, float] = {}  # the largest distance / clip radius of each sender, over the parts
        self.weights: dict[int, float] = {}  # the weight each sender claimed (the log says, beside the suspects)
        self.named_parts: list[str] = []  # where a sender was named: part, elements, each piece's norm (the log says)
        self.largest_weight = 0.0  # the largest weight counted in any part (robust_reduce.bad_result)
        self.replay_samples: dict[int, dict[int, float]] = {}  # to remember once the round succeeded
        self.combine_seconds = 0.0  # what the robust combination costs this round (the log says)
        super().__init__(part_shapes, len(sender_ids))

    def reset_accumulators(self):
        """Get ready for the next part (hivemind's, without its sum buffer)."""
        if self.current_part_index >= self.num_parts - 1:
            self.finalize()
            return
        self.current_part_index += 1
        self.current_part_accumulated_from = 0
        self.current_part_future = asyncio.Future()
        self.num_current_senders = sum(self.current_part_index < failed_after for failed_after in self.sender_failed_after)
        self.pieces = {}

    async def accumulate_part(self, sender_index: int, part_index: int, tensor_part: torch.Tensor, weight: float = 1.0) -> torch.Tensor:
        """Keep a sender's piece of the part, wait for the others, return the combined part
        (hivemind's protocol: parts are reduced in order)."""
        assert 0 <= sender_index < self.num_senders, "invalid sender index"
        assert 0 <= part_index < self.num_parts, "invalid part index"
        self.num_parts_received[sender_index] += 1
        while part_index > self.current_part_index:
            await asyncio.wait({self.current_part_future, asyncio.create_task(self.finished.wait())},
                               return_when=asyncio.FIRST_COMPLETED)
            if self.finished.is_set():
                raise AllreduceException(f"attempted to aggregate part in a finalized {self.__class__.__name__}")
        if self.sender_failed_after[sender_index] != float("inf"):
            raise BannedException(f"sender {sender_index} was banned in background")
        assert part_index == self.current_part_index
        current_part_future = self.current_part_future
        if part_index < self.sender_failed_after[sender_index]:
            self.pieces[sender_index] = (tensor_part, weight)
            self.current_part_accumulated_from += 1
            self.check_current_part_finished()
        return await current_part_future

    def check_current_part_finished(self):
        assert self.current_part_accumulated_from <= self.num_current_senders
        if self.current_part_accumulated_from == self.num_current_senders:
            self.current_part_future.set_result(self._combine())
            self.reset_accumulators()

    def _combine(self) -> torch.Tensor:
        if not self.pieces:
            return torch.zeros(self.part_shapes[self.current_part_index])
        started = time.perf_counter()
        weights = {sender: weight for sender, (_, weight) in self.pieces.items()}
        offset = self.part_offsets[self.current_part_index]
        for sender, (piece, _) in self.pieces.items():
            peer = self.sender_ids[sender]
            if peer in self.judge.banned:
                weights[sender] = 0.0
            elif self.judge.options.detect_replays and weights[sender] > 0:
                sampled = self.judge.replays.sample(piece, offset)
                if self.judge.replays.is_replay(peer, sampled):
                    self.suspects[sender] = worse_suspect(self.suspects.get(sender), Suspect(REPLAYED, 1.0))
                    weights[sender] = 0.0
                self.replay_samples.setdefault(sender, {}).update(sampled)
        aggregate = robust_aggregate({sender: piece for sender, (piece, _) in self.pieces.items()}, weights,
                                     own=self.own, options=self.judge.options, own_rms=self.own_rms)
        for sender, suspect in aggregate.suspects.items():
            if self.sender_ids[sender] not in self.judge.banned:
                self.suspects[sender] = worse_suspect(self.suspects.get(sender), suspect)
        self.weights.update({sender: weight for sender, (_, weight) in self.pieces.items()})
        if aggregate.suspects and len(self.named_parts) < 3:
            norms = ", ".join(f"{sender}: {float(piece.float().norm()):.3g}" for sender, (piece, _) in sorted(self.pieces.items()))
            self.named_parts.append(f"part {self.current_part_index} ({self.part_shapes[self.current_part_index].numel()} "
                                    f"values; norms by sender {norms})")
        for sender, ratio in aggregate.ratios.items():
            self.ratios[sender] = max(ratio, self.ratios.get(sender, 0.0))
        self.largest_weight = max(self.largest_weight, aggregate.largest_weight)
        self.combine_seconds += time.perf_counter() - started
        return aggregate.result

    def finalize(self):
        finished = self.finished.is_set()
        super().finalize()
        if not finished:
            self.on_finished()

    def named(self, peer: PeerID) -> bool:
        """True when this reducer named ``peer`` as a sender in this round (so far)."""
        return any(self.sender_ids[sender] == peer for sender in self.suspects)

    def remember_replays(self) -> None:
        """Keep this round's samples for the next rounds' replay checks (once the round succeeded)."""
        for sender, sampled in self.replay_samples.items():
            self.judge.replays.remember(self.sender_ids[sender], sampled)


class CheckedPartContainer(TensorPartContainer):
    """hivemind's ``TensorPartContainer`` that holds the parts other reducers return until
    ``release``, then uses each as ``check`` says.

    Args:
        check: ``check(peer_index, local_part, delta) -> bool`` for a part that the peer
            at ``peer_index`` reduced: whether to use it (a part not used keeps our own
            piece, and counts as lost, as hivemind counts a failed reducer's).
        own_index: this peer's index in the group (its own reducer's parts are not held).
        (the rest as ``TensorPartContainer``)
    """

    def __init__(self, *args, check: Callable[[int, torch.Tensor, torch.Tensor], bool], own_index: int, **kwargs):
        self.check, self.own_index = check, own_index
        self.held: list[tuple[int, int, torch.Tensor]] = []
        self.released = False
        super().__init__(*args, **kwargs)

    def register_processed_part(self, peer_index: int, part_index: int, part: torch.Tensor):
        if peer_index == self.own_index:
            super().register_processed_part(peer_index, part_index, part)
        elif not self.released:
            self.held.append((peer_index, part_index, part))
        elif not self.finished.is_set():  # a part that comes after the round ended is not read
            own_piece = self._input_parts_by_peer[peer_index][part_index][0]
            if not self.check(peer_index, own_piece, part):
                part = torch.zeros_like(part)
                self.failed_size += part.numel()
            super().register_processed_part(peer_index, part_index, part)

    def release(self) -> None:
        """Check and use the parts held so far, and from now on each part as it comes."""
        self.released = True
        held, self.held = self.held, []
        if self.finished.is_set():
            return  # the round is over: nothing will read them
        for peer_index, part_index, part in held:
            self.register_processed_part(peer_index, part_index, part)

    def register_failed_reducer(self, peer_index: int):
        """A reducer that failed: its parts held so far are not used either (our own pieces are)."""
        self.held = [(index, part_index, part) for index, part_index, part in self.held if index != peer_index]
        super().register_failed_reducer(peer_index)


class RobustAllReduceRunner(AllReduceRunner):
    """hivemind's ``AllReduceRunner`` with a ``RobustPartReducer`` and a ``CheckedPartContainer``.

    Args:
        judge: the averager's ``RoundJudge``.
        (the rest as ``AllReduceRunner``; ``compression``, ``part_size_bytes`` and
        ``tensor_infos`` go to the container, as there)
    """

    def __init__(self, *, judge: RoundJudge, tensors: Sequence[torch.Tensor], peer_fractions: Sequence[float], **kwargs):
        super().__init__(tensors=tensors, peer_fractions=peer_fractions, **kwargs)
        self.judge = judge
        self.reducer_suspects: dict[PeerID, Suspect] = {}
        own_index = self.ordered_peer_ids.index(self.peer_id)
        container_options = {key: kwargs[key] for key in ("compression", "part_size_bytes", "tensor_infos") if key in kwargs}
        # hivemind built a plain container and reducer: replace both before anything uses them
        self.tensor_part_container.finalize()
        self.tensor_part_reducer.finished.set()
        self.tensor_part_container = CheckedPartContainer(tensors, peer_fractions, return_deltas=True, check=self._check_result,
                                                          own_index=own_index, **container_options)
        self.parts_for_local_averaging = self.tensor_part_container.get_raw_input_parts(own_index)
        first_element = sum(part.numel() for parts in self.tensor_part_container._input_parts_by_peer[:own_index] for part, _ in parts)
        offsets, position = [], first_element
        for part in self.parts_for_local_averaging:
            offsets.append(position)
            position += part.numel()
        own_sender = self.sender_peer_ids.index(self.peer_id) if self.peer_id in self.sender_peer_ids else None
        total = sum(tensor.numel() for tensor in tensors) if judge.options.floor_from_whole else 0
        self.own_rms = math.sqrt(sum(float(tensor.detach().float().pow(2).sum()) for tensor in tensors) / total) if total else 0.0
        self.tensor_part_reducer = RobustPartReducer(tuple(part.shape for part in self.parts_for_local_averaging),
                                                     self.sender_peer_ids, own_sender, offsets, judge,
                                                     on_finished=self.tensor_part_container.release, own_rms=self.own_rms)
        self._reported = False

    def _check_result(self, peer_index: int, local_part: torch.Tensor, delta: torch.Tensor) -> bool:
        """Whether to use a part reduced by the peer at ``peer_index`` (see the module doc);
        called once this peer's own reducer is finished."""
        peer = self.ordered_peer_ids[peer_index]
        if peer in self.judge.banned or self.tensor_part_reducer.named(peer):
            return False
        problem = bad_result(local_part, local_part + delta, self.tensor_part_reducer.largest_weight or None, self.judge.options,
                             own_weight=self.weight, own_rms=self.own_rms)
        if problem is not None:
            self.reducer_suspects[peer] = worse_suspect(self.reducer_suspects.get(peer), problem)
        return problem is None

    def finalize(self, *, cancel: bool = False, exception: BaseException | None = None):
        super().finalize(cancel=cancel, exception=exception)
        if self._reported:
            return
        self._reported = True
        succeeded = not cancel and exception is None
        if succeeded:
            self.tensor_part_reducer.remember_replays()
        suspects = [{"peer_id": self.sender_peer_ids[sender].to_base58(), "reason": suspect.reason, "ratio": suspect.ratio, "role": "sender"}
                    for sender, suspect in self.tensor_part_reducer.suspects.items()]
        suspects += [{"peer_id": peer.to_base58(), "reason": suspect.reason, "ratio": suspect.ratio, "role": "reducer"}
                     for peer, suspect in self.reducer_suspects.items()]
        reducer = self.tensor_part_reducer
        ratios = {self.sender_peer_ids[sender].to_base58()[-6:]: round(ratio, 2) for sender, ratio in reducer.ratios.items()}
        weights = {f"{sender} {self.sender_peer_ids[sender].to_base58()[-6:]}": weight for sender, weight in sorted(reducer.weights.items())}
        # a round that names someone is worth a line in a default log: an honest peer named is a bug to explain
        logger.log(logging.WARNING if suspects else logging.INFO,
                   "Robust round of %d (%s, %.3f s combining): largest distance / clip radius by sender %s, weights by sender %s "
                   "(we are %s), named %s%s", self.group_size, "done" if succeeded else "failed", reducer.combine_seconds, ratios,
                   weights, reducer.own, suspects or "nobody", f" in {'; '.join(reducer.named_parts)}" if reducer.named_parts else "")
        self.judge.report({"time": time.time(), "group": self.group_id.hex()[:12], "senders": len(self.sender_peer_ids),
                           "suspects": suspects, "ratios": ratios})
