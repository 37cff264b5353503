"""hivemind averagers that defend this peer's rounds and downloads.

``RobustAverager`` is a ``DecentralizedAverager`` that

- runs its rounds with ``robust_allreduce.RobustAllReduceRunner`` (robust
  reducers, checked results, banned peers left out);
- forms no group with a banned peer: hivemind builds its ``Matchmaking`` in
  the averager's process, and this averager swaps it, before its first round,
  for a ``BanAwareMatchmaking`` that refuses banned followers and skips banned
  leaders (a banned peer that still ends up in a group, as another leader's
  follower, has its pieces and results left out);
- downloads state from the peers that share it, highest priority first as
  hivemind does, but skips banned peers and checks each download with
  ``state_check``: a refused state names its peer, and the next peer is tried;
  the peer whose state was taken is ``last_state_source`` (who serves joiners);
- spreads the downloads over the peers that can serve them: the priority a peer
  declares is hivemind's (its epoch) less a fraction under 1 that grows with the
  downloads it served in the last ``RECENT_SERVES_S`` seconds, so a newer epoch
  still wins and, at the same epoch, the peer that served fewer lately does
  (one donor took every joiner in hivemind's swarms: hivemind #169);
- serves at most ``MAX_SERVES_AT_ONCE`` downloads at once: a further downloader
  gets an empty answer (busy) and tries the next donor. Priorities are read from
  the DHT once per download, so a burst of joiners all pick the same donor, the
  one that reached the newest epoch first, and share its uplink; the busy answer
  sends them on. For its first ``NEWEST_EPOCH_WAIT_S`` a downloader takes no older
  epoch than a busy donor's (an older state would be downloaded again at once):
  after a pass over the donors in which one was busy, it waits ``BUSY_RETRY_S``,
  reads the priorities again (the rest of the swarm reaches that epoch seconds
  later) and asks again, for up to ``BUSY_WAIT_S``. Past ``NEWEST_EPOCH_WAIT_S`` it
  asks the older epochs' donors too, so a peer that declares a far epoch and answers
  nothing delays joiners by that much, not forever;
- gives up on a group member that stopped sending in a round after a deadline
  set by this peer's own recent rounds: ``STALL_FACTOR`` times the longest of
  its last ``ROUNDS_TIMED`` rounds in which every member sent (at least
  ``MIN_STALL_S``, at most the deadline configured, else the round's timeout),
  once ``ROUNDS_BEFORE_ADAPTING`` were timed. hivemind's deadlines are fixed:
  DiLoCo's averager had none per member, so a volunteer whose machine froze or
  whose line dropped after its group formed held the group until the round's
  timeout (120 s on the internet), then the round failed for all; sync mode's
  was a fixed 30 s. Now the member is left out (hivemind's
  ``sender_timeout``: the others average without it) once it is that far
  behind. In a swarm of a thousand someone leaves mid-round every round: a
  fixed deadline makes every round wait for the slowest;
- reports each round's named peers to its ``trust.Trust`` through a queue
  (its rounds run in the averager's own process) and takes ban-list updates
  from it through hivemind's control pipe;
- holds the task of each round and download while it runs (``_held``), which
  hivemind's loop holds only until its next command: the garbage collector
  destroyed them mid-wait;
- stores its own declaration as a donor straight to the key's holders
  (``local_reads.store_record``): hivemind searched every node of the 20
  nearest to the key before each declaration (every epoch and every serve: the
  priority changes), each answer carrying every donor's declaration. A download
  still reads the declarations by hivemind's search: read from one holder, a
  declaration stored before that holder joined (the first donor's, alone in the
  swarm) stayed missing until the donor declared again, and a burst of joiners
  took an older epoch's state (the state-burst lab, 2 of 2 runs).

The averagers p2ptrain uses derive from it: DiLoCo's ``PseudoGradientAverager``,
sync mode's ``CheckedTrainingStateAverager`` (through ``sync.CheckedStateMixin``)
and this module's ``GradientAverager``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import multiprocessing
import random
import time
from typing import AsyncIterator, Iterable

import hivemind.optim.grad_averager
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.allreduce import AveragingMode
from hivemind.averaging.group_info import GroupInfo
from hivemind.averaging.matchmaking import Matchmaking
from hivemind.compression import deserialize_torch_tensor
from hivemind.p2p import P2PContext, PeerID
from hivemind.proto import averaging_pb2
from hivemind.utils import MPFuture, get_logger
from hivemind.utils.asyncio import aiter_with_timeout, as_aiter, azip
from hivemind.utils.streaming import combine_from_streaming
from hivemind.utils.timed_storage import ValueWithExpiration, get_dht_time

from p2ptrain.peers.net.local_reads import store_record
from p2ptrain.peers.robust import state_check
from p2ptrain.peers.robust.allreduce import ReplayMemory, RobustAllReduceRunner, RoundJudge
from p2ptrain.peers.robust.reduce import BAD_STATE, RobustOptions
from p2ptrain.peers.robust.trust import Trust

logger = get_logger(__name__)

_PEER_ID_CHARS = 64  # a libp2p peer id in base58 is 46-52 characters
RECENT_SERVES_S = 300.0  # downloads served within this many seconds make this peer a later choice for the next
_SERVES_KEPT = 32  # the serve times remembered (more within RECENT_SERVES_S count as this many)
MAX_SERVES_AT_ONCE = 2  # downloads of this peer's state served at once; another downloader is told to try elsewhere
BUSY_RETRY_S = 1.0  # after a pass in which a donor was busy, the downloader asks again this much later...
BUSY_WAIT_S = 60.0  # ...for up to this long since its download began (and within its own timeout)
NEWEST_EPOCH_WAIT_S = 10.0  # for this long, no donor of an older epoch than a busy donor's is asked
BUSY = "busy"  # what a donor's empty answer to a download means (``_download_state``)
ROUNDS_TIMED = 8  # the last rounds (every member sent) whose durations set the stall deadline...
ROUNDS_BEFORE_ADAPTING = 3  # ...once this many were timed
STALL_FACTOR = 3.0  # a member that sent nothing for this many times the longest of them is left out...
MIN_STALL_S = 10.0  # ...but never sooner than this
AVERAGING_NAMES = {"_diloco": "pseudo-gradient", "_grad_averager": "gradient", "_state_averager": "state"}


class RobustAverager(DecentralizedAverager):
    """A ``DecentralizedAverager`` with robust rounds, bans and checked downloads (see the module doc).

    Args:
        trust: this peer's ``Trust``: its bans apply from the start, and it collects
            this averager's reports (a fresh one when None).
        robust: how this averager's reducers judge pieces (``RobustOptions``).
        (the rest as ``DecentralizedAverager``)
    """

    def __init__(self, *args, trust: Trust | None = None, robust: RobustOptions | None = None, **kwargs):
        self.trust = trust if trust is not None else Trust()
        self.robust_options = robust or RobustOptions()
        # set before hivemind forks the averager's process, which keeps its own copies; a SimpleQueue
        # writes at once, so a report is there before the result it goes with (the host drains it each step)
        self._round_reports = multiprocessing.SimpleQueue()
        self._state_source = multiprocessing.Array("c", _PEER_ID_CHARS)  # base58 of the peer whose state was taken last
        self._state_downloads = multiprocessing.Value("i", 0)  # states taken so far
        self._serve_times = multiprocessing.Array("d", _SERVES_KEPT)  # when this peer served its state (time.time())
        self._serving = multiprocessing.Value("i", 0)  # downloads of this peer's state in progress
        self._most_serving = multiprocessing.Value("i", 0)  # the most it served at once so far
        self._busy_refusals = multiprocessing.Value("i", 0)  # downloaders told it was busy so far
        self._banned = {PeerID.from_base58(peer_id) for peer_id in self.trust.banned}
        self._judge: RoundJudge | None = None
        self._tasks_held: set[asyncio.Task] = set()  # in the averager's process: see _held
        self._round_seconds: collections.deque[float] = collections.deque(maxlen=ROUNDS_TIMED)  # ditto
        self._stall_deadline = multiprocessing.Value("d", 0.0)  # the last round's (0: the configured one)
        super().__init__(*args, **kwargs)
        self.trust.attach(self)
        # the averager's process handles its pipe in order: this comes before any round
        self._outer_pipe.send(("_use_ban_aware_matchmaking", [], {}))

    @property
    def averaging_name(self) -> str:
        """What this averager averages, in words (``pseudo-gradient``, ``gradient``, ``state``)."""
        return next((name for suffix, name in AVERAGING_NAMES.items() if self.prefix.endswith(suffix)), self.prefix)

    # --- in the host process --------------------------------------------
    def pop_round_reports(self) -> list[dict]:
        """The reports of the rounds (and downloads) finished since the last call."""
        reports = []
        while not self._round_reports.empty():
            reports.append(self._round_reports.get())
        return reports

    @property
    def state_sharing_priority(self) -> float:
        """The priority this peer declares as a source of state: hivemind's (the epoch, set through the
        setter) less ``n / (n + 1)`` for the ``n`` downloads it served in the last ``RECENT_SERVES_S``
        seconds (see the module doc)."""
        served = self.recent_serves
        return DecentralizedAverager.state_sharing_priority.fget(self) - served / (served + 1)

    @state_sharing_priority.setter
    def state_sharing_priority(self, value: float):
        DecentralizedAverager.state_sharing_priority.fset(self, value)

    @property
    def recent_serves(self) -> int:
        """The downloads of this peer's state served in the last ``RECENT_SERVES_S`` seconds."""
        since = time.time() - RECENT_SERVES_S
        return sum(1 for served in self._serve_times[:] if served > since)

    @property
    def serving_now(self) -> int:
        """Downloads of this peer's state in progress."""
        return self._serving.value

    @property
    def most_serving_at_once(self) -> int:
        """The most downloads of this peer's state it served at once so far (at most ``MAX_SERVES_AT_ONCE``)."""
        return self._most_serving.value

    @property
    def busy_refusals(self) -> int:
        """How many downloaders this peer sent elsewhere so far, busy serving ``MAX_SERVES_AT_ONCE`` others."""
        return self._busy_refusals.value

    @property
    def stall_deadline(self) -> float | None:
        """Seconds the last round waited for a member that sent nothing before leaving it out, when set from
        this peer's recent rounds (None before: the configured deadline)."""
        return self._stall_deadline.value or None

    @property
    def state_downloads(self) -> int:
        """How many states this averager downloaded and took so far."""
        return self._state_downloads.value

    @property
    def last_state_source(self) -> str | None:
        """The peer id (base58) whose state this averager's last download took, or None before any."""
        return self._state_source.value.decode() or None

    def set_banned(self, peer_ids: Iterable[str]) -> None:
        """Make the averager's process refuse and leave out exactly ``peer_ids`` (base58) from now on."""
        self._outer_pipe.send(("_set_banned", [[PeerID.from_base58(peer_id).to_bytes() for peer_id in peer_ids]], {}))

    # --- in the averager's process --------------------------------------
    async def _set_banned(self, peer_ids: list[bytes]) -> None:
        self._banned.clear()
        self._banned.update(PeerID(peer_id) for peer_id in peer_ids)

    async def _use_ban_aware_matchmaking(self) -> None:
        self._matchmaking = BanAwareMatchmaking(self._p2p, self.schema_hash, self.dht, client_mode=self.client_mode,
                                                banned=self._banned, **self.matchmaking_kwargs)

    def _round_judge(self) -> RoundJudge:
        if self._judge is None:
            self._judge = RoundJudge(self.robust_options, self._banned, ReplayMemory(self.total_size), self._round_reports.put)
        return self._judge

    async def _run_allreduce_inplace_(self, tensors, group_info: GroupInfo, group_id: bytes | None = None, **kwargs):
        """hivemind's round, run by a ``RobustAllReduceRunner``."""
        group_id = group_info.group_id if group_id is None else group_id
        kwargs.update(self._stall_deadlines(kwargs.get("sender_timeout")))
        started = time.monotonic()
        runner = RobustAllReduceRunner(
            judge=self._round_judge(), p2p=self._p2p, servicer_type=type(self), prefix=self.prefix, tensors=tensors,
            group_id=group_id, ordered_peer_ids=group_info.peer_ids, **kwargs,
        )
        assert group_id in self._running_groups, f"Group id {group_id} was not registered in _register_allreduce_group"
        self._running_groups[group_id].set_result(runner)
        if runner.modes[group_info.peer_ids.index(self.peer_id)] != AveragingMode.AUX:
            async for tensor, update in azip(as_aiter(*tensors), runner):
                tensor.add_(update, alpha=self._averaging_alpha)
                self.last_updated = get_dht_time()
                # hivemind also sets ``_state_updated`` here, which re-declares this peer as a state source
                # in the DHT after every tensor of every round (4 stores a second at a sync peer in the
                # lab) though the declared priority did not change: its setter re-declares when it does
        else:
            async for _ in runner:
                raise ValueError("aux peers should not receive averaged tensors")
        if not runner.banned_senders:  # a round that waited for a stalled member would lengthen the next deadline
            self._round_seconds.append(time.monotonic() - started)
        else:
            deadline = kwargs.get("sender_timeout")
            logger.info(f"Averaged without {len(runner.banned_senders)} group member(s) that sent nothing for "
                        f"{'the round' if deadline is None else f'{deadline:.1f} s'}: "
                        f"{', '.join(str(peer) for peer in runner.banned_senders)}")

    def _stall_deadlines(self, configured: float | None) -> dict:
        """The next round's ``sender_timeout`` and ``reducer_timeout`` (hivemind's ratio, 2) from this peer's
        recent rounds (see the module doc); none before ``ROUNDS_BEFORE_ADAPTING`` rounds were timed.
        ``configured``: the averager's own ``sender_timeout``, the most it waits."""
        if len(self._round_seconds) < ROUNDS_BEFORE_ADAPTING:
            return {}
        sender = max(MIN_STALL_S, STALL_FACTOR * max(self._round_seconds))
        ceiling = configured if configured is not None else self._allreduce_timeout
        if ceiling is not None:
            sender = min(sender, ceiling)
        self._stall_deadline.value = sender
        return {"sender_timeout": sender, "reducer_timeout": 2 * sender}

    async def rpc_download_state(self, request: averaging_pb2.DownloadRequest,
                                 context: P2PContext) -> AsyncIterator[averaging_pb2.DownloadData]:
        """hivemind's: this peer's state to a peer that downloads it, or an empty answer while this peer
        serves ``MAX_SERVES_AT_ONCE`` others (the downloader tries the next donor); once served, its lower
        priority is declared at once (see the module doc)."""
        with self._serving.get_lock():
            busy = self._serving.value >= MAX_SERVES_AT_ONCE
            if not busy:
                self._serving.value += 1
                self._most_serving.value = max(self._most_serving.value, self._serving.value)
        if busy:
            with self._busy_refusals.get_lock():
                self._busy_refusals.value += 1
            logger.info(f"Sent a state download from {context.remote_id} elsewhere: serving {MAX_SERVES_AT_ONCE} already")
            return
        served = False
        try:
            async for message in super().rpc_download_state(request, context):
                served = True
                yield message
        finally:
            with self._serving.get_lock():
                self._serving.value -= 1
        if served:
            times = self._serve_times
            times[min(range(len(times)), key=times.__getitem__)] = time.time()
            self._state_updated.set()  # hivemind's declaration loop re-declares on it

    @contextlib.contextmanager
    def _held(self):
        """Hold the running task (a pipe command's) until the block ends.

        hivemind's loop keeps the task of a pipe command only until the next command arrives, and the
        event loop keeps tasks weakly. A task that waits on an ``MPFuture`` (which hivemind holds weakly
        too) is then held by nothing once the host sent another command, and the garbage collector
        destroys it ("Task was destroyed but it is pending!"):

        - a state download waiting for this peer's own state from the host: the host got None or
          waited its timeout (120 s on the internet), and hivemind's optimizer moved the peer to the
          swarm's epoch with its old parameters (18 of a 16-peer lab's 36 joins and returns);
        - a round scheduled ahead, its group found, waiting for its trigger: this peer's round failed,
          and the rest of its group waited for its part until their all-reduce timeout (120 s on the
          internet) and failed too, reason ``exchange``.
        """
        running = asyncio.current_task()
        self._tasks_held.add(running)
        try:
            yield
        finally:
            self._tasks_held.discard(running)

    async def _step(self, **kwargs):
        """hivemind's round, its task held (``_held``)."""
        with self._held():
            return await super()._step(**kwargs)

    async def _load_state_from_peers(self, future: MPFuture, timeout: float | None = None):
        """hivemind's download, over the peers that are not banned, each download checked (``state_check``);
        its task held (``_held``)."""
        with self._held():
            await self._download_checked_state(future, timeout)

    async def _download_checked_state(self, future: MPFuture, timeout: float | None) -> None:
        """Passes over the donors, newest epoch first (see the module doc), until one's state is taken, no
        donor was busy, or ``BUSY_WAIT_S`` (or ``timeout``, the caller's for the whole download) passed."""
        began = time.monotonic()
        give_up = began + min(BUSY_WAIT_S, timeout if timeout is not None else BUSY_WAIT_S)
        if timeout is not None:
            timeout = self.next_chunk_timeout if self.next_chunk_timeout is not None else self.request_timeout
        try:
            far_refused = []  # (peer, why, ratio, tensors) refused by checks 3-4 only: a second peer may confirm one
            refused = set()  # peers whose state was refused, not asked again in a later pass
            while True:
                newest_only = time.monotonic() - began < NEWEST_EPOCH_WAIT_S
                taken, busy = await self._download_pass(timeout, far_refused, refused, newest_only)
                if taken is not None:
                    future.set_result(taken)
                    return
                if not busy or time.monotonic() + BUSY_RETRY_S > give_up:
                    return
                await asyncio.sleep(BUSY_RETRY_S)
        finally:
            if not future.done():
                future.set_result(None)

    def _download_key(self) -> str:
        """hivemind's key of the donors' declarations."""
        return f"{self._matchmaking.group_key_manager.prefix}.all_averagers"

    async def _declare_for_download_periodically(self):
        """hivemind 1.1.12's, each declaration stored straight to the key's holders (``local_reads.store_record``):
        at once when the priority changes (each epoch, each download served), else every ``declare_state_period``;
        a declaration of None when sharing was switched off."""
        sharing_was_allowed = self.allow_state_sharing
        while True:
            expiration_time = get_dht_time() + self.declare_state_period
            if self.allow_state_sharing or sharing_was_allowed:
                asyncio.create_task(asyncio.wait_for(
                    store_record(self.dht, self._download_key(), self.peer_id.to_bytes(),
                                 self.state_sharing_priority if self.allow_state_sharing else None,
                                 expiration_time, return_future=True),
                    timeout=expiration_time - get_dht_time()))
                sharing_was_allowed = self.allow_state_sharing
            self._state_updated.clear()
            try:
                await asyncio.wait_for(self._state_updated.wait(), timeout=max(0.0, expiration_time - get_dht_time()))
            except asyncio.TimeoutError:
                pass

    def _state_donors(self) -> list[tuple[PeerID, int]]:
        """The peers that declare their state (but this one and the banned), highest priority first, each
        with the epoch its priority declares (``state_sharing_priority``: the epoch less a fraction)."""
        priorities, _ = self.dht.get(self._download_key(), latest=True) or ({}, None)
        priorities = {
            PeerID(peer_id): (float(info.value), random.random())  # randomness breaks ties
            for peer_id, info in priorities.items()
            if isinstance(info, ValueWithExpiration) and isinstance(info.value, (float, int))
        }
        return [(peer, math.ceil(priorities[peer][0])) for peer in sorted(priorities, key=priorities.get, reverse=True)
                if peer != self.peer_id and peer not in self._banned]

    async def _download_pass(self, timeout: float | None, far_refused: list, refused: set[PeerID],
                             newest_only: bool) -> tuple[tuple | None, bool]:
        """One pass over the donors but those in ``refused`` (which it adds to): ``(metadata, tensors)`` taken,
        or None; and whether a donor was busy. ``newest_only``: no donor of an older epoch than a busy one's
        is asked."""
        own, busy_epoch = None, None
        for peer, epoch in self._state_donors():
            if newest_only and busy_epoch is not None and epoch < busy_epoch:
                break
            if peer in refused:
                continue
            downloaded = await self._download_state(peer, timeout)
            if downloaded is BUSY:
                busy_epoch = epoch if busy_epoch is None else busy_epoch
                continue
            if downloaded is None:
                continue
            parameter_count = self.robust_options.parameter_count or 0
            if own is None:
                own_metadata, own, _ = await self._get_current_state_from_host_process()
                own_epoch = _epoch(self.serializer.loads(own_metadata)) or 0
            metadata, tensors = downloaded
            problem = state_check.broken_state(own, tensors, parameter_count)
            if problem is not None:
                self._refused_state(peer, problem, float("inf"))
                refused.add(peer)
                continue
            far = state_check.far_state(own, tensors, parameter_count, (_epoch(metadata) or 0) - own_epoch)
            if far is None or any(state_check.same_state(other, tensors, parameter_count) for *_, other in far_refused):
                # a far state is somebody's fault only once this peer knows the swarm's one
                for other_peer, why, ratio, other in far_refused:
                    if not state_check.same_state(other, tensors, parameter_count):
                        self._refused_state(other_peer, f"{why}, and it differs from the state another peer served", ratio)
                self._state_source.value = peer.to_base58().encode()[:_PEER_ID_CHARS]
                with self._state_downloads.get_lock():
                    self._state_downloads.value += 1
                return downloaded, busy_epoch is not None
            logger.info(f"Not taking the state of {peer} unless another peer serves the same: {far[0]}")
            far_refused.append((peer, *far, tensors))
            refused.add(peer)
        return None, busy_epoch is not None

    async def _download_state(self, peer: PeerID, timeout: float | None):
        """``(metadata, tensors)`` as ``peer`` shares them, :data:`BUSY` when it answered nothing (it serves
        others, or shares no state), or None when the download failed (hivemind's download from one peer)."""
        started = time.monotonic()
        logger.info(f"Downloading parameters from peer {peer}")
        metadata, answered = None, False
        try:
            stub = self.get_stub(self._p2p, peer, namespace=self.prefix)
            stream = await stub.rpc_download_state(averaging_pb2.DownloadRequest())
            current_tensor_parts, tensors = [], []
            async for message in aiter_with_timeout(stream, timeout=timeout):
                answered = True
                if message.metadata:
                    metadata = self.serializer.loads(message.metadata)
                if message.tensor_part.dtype and current_tensor_parts:
                    # a part with a dtype starts the next tensor
                    tensors.append(deserialize_torch_tensor(combine_from_streaming(current_tensor_parts)))
                    current_tensor_parts = []
                current_tensor_parts.append(message.tensor_part)
            if current_tensor_parts:
                tensors.append(deserialize_torch_tensor(combine_from_streaming(current_tensor_parts)))
        except Exception as error:
            logger.warning(f"Failed to download state from {peer}: {error!r}")
            return None
        if not answered:
            logger.info(f"Peer {peer} is busy serving its state to others")
            return BUSY
        if not metadata:
            logger.debug(f"Peer {peer} did not send its state")
            return None
        logger.info(f"Finished downloading state in {time.monotonic() - started:.3f}s from {peer}")
        return metadata, tensors

    def _refused_state(self, peer: PeerID, problem: str, ratio: float) -> None:
        logger.warning(f"Refused the state downloaded from {peer}: {problem}")
        self._round_reports.put({"time": time.time(), "group": None, "senders": 0,
                                 "suspects": [{"peer_id": peer.to_base58(), "reason": BAD_STATE, "ratio": ratio, "role": "state",
                                               "detail": problem}]})


def _epoch(metadata) -> int | None:
    """The epoch a shared state's metadata claims (both modes put it there), or None."""
    epoch = metadata.get("epoch") if isinstance(metadata, dict) else None
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None


class BanAwareMatchmaking(Matchmaking):
    """hivemind's ``Matchmaking`` that never groups with a peer in ``banned`` (a set it shares
    with the averager, updated in place). The rest as ``Matchmaking``."""

    def __init__(self, *args, banned: set[PeerID], **kwargs):
        self.banned = banned
        super().__init__(*args, **kwargs)

    async def _request_join_group(self, leader: PeerID) -> GroupInfo | None:
        if leader in self.banned:
            return None
        return await super()._request_join_group(leader)

    def _check_reasons_to_reject(self, request: averaging_pb2.JoinRequest, context: P2PContext) -> averaging_pb2.MessageFromLeader | None:
        if context.remote_id in self.banned:
            return averaging_pb2.MessageFromLeader(code=averaging_pb2.PROTOCOL_VIOLATION)
        return super()._check_reasons_to_reject(request, context)


class GradientAverager(RobustAverager, hivemind.optim.grad_averager.GradientAverager):
    """hivemind's ``GradientAverager`` (sync mode's gradients) with robust rounds and bans.

    Named as hivemind's class: hivemind names an averager's RPC handlers after its
    class, and peers running another p2ptrain version must still find them.
    """
