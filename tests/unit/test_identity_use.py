"""When a returning worker skips hivemind's check that no other peer uses its identity (daemon/identity_use.py)."""

from __future__ import annotations

from p2ptrain.daemon.identity_use import IdentityUse

KEY = "/state/identity.key"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_worker_that_returns_within_minutes_skips_the_check_and_later_ones_do_not():
    clock = Clock()
    use = IdentityUse(recheck_after_s=600, clock=clock)
    assert use.needs_check(KEY)  # nothing known: a fresh daemon always checks
    use.joined(KEY)
    assert use.needs_check(KEY)  # still held by a running worker: a second one must not start beside it
    clock.now += 3600
    use.ended(KEY)
    clock.now += 599
    assert not use.needs_check(KEY)
    clock.now += 1
    assert use.needs_check(KEY)


def test_a_worker_that_never_joined_proves_nothing_about_its_identity():
    clock = Clock()
    use = IdentityUse(clock=clock)
    use.ended(KEY)  # it failed before its DHT was up (or hivemind's check refused the identity)
    assert use.needs_check(KEY)
    use.joined("/state/identity-gpu1.key")
    use.ended("/state/identity-gpu1.key")
    assert use.needs_check(KEY) and not use.needs_check("/state/identity-gpu1.key")
