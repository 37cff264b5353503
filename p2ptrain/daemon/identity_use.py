"""When this daemon's own workers last held each peer identity in the swarm.

hivemind checks at start that no other peer of the swarm uses the identity a
DHT starts with: it starts a second, anonymous p2pd and tries to reach the
identity's peer id (``check_if_identity_free``). That is what stops a copied
state directory (a cloned disk image) from running a second peer under the
same id, but it costs seconds on a loaded machine (7 of a returning peer's
~30 s in the 16-peer lab). A worker that returns shortly after this daemon's
previous worker left the swarm under that identity skips it: the window in
which a copy elsewhere could have started unchecked is those few minutes, and
that copy was checked itself when it started.
"""

from __future__ import annotations

import time
from typing import Callable

RECHECK_AFTER_S = 600.0


class IdentityUse:
    """Which identity keys this daemon's workers hold now, and when they last let go of the others.

    Args:
        recheck_after_s: how long after a worker left the swarm the next one under the same identity
            still skips hivemind's check.
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, recheck_after_s: float = RECHECK_AFTER_S, clock: Callable[[], float] = time.monotonic):
        self.recheck_after_s, self.clock = recheck_after_s, clock
        self._released_at: dict[str, float | None] = {}  # None: a worker holds it now

    def joined(self, identity_key: str) -> None:
        """A worker under ``identity_key`` is in the swarm (its DHT passed hivemind's check or made the key)."""
        self._released_at[identity_key] = None

    def ended(self, identity_key: str) -> None:
        """The worker under ``identity_key`` has ended (its DHT, with it); nothing if it never joined."""
        if identity_key in self._released_at:
            self._released_at[identity_key] = self.clock()

    def needs_check(self, identity_key: str) -> bool:
        """Whether a worker starting under ``identity_key`` now should run hivemind's check: unless this daemon's
        own worker left the swarm under it less than ``recheck_after_s`` ago. One that still runs (ending while
        a new one starts) keeps the check: the new one must not start beside it."""
        released_at = self._released_at.get(identity_key, -1.0)
        if released_at is None or released_at < 0:
            return True
        return self.clock() - released_at >= self.recheck_after_s
