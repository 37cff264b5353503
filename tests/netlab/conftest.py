"""Fixtures of the network lab: a lab torn down whatever happens, skipped in one line where none can be built."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from lab import Lab, lab_unavailable, remove_stale_labs  # noqa: E402


@pytest.fixture(scope="session")
def lab_machine():
    """Skip (with the reason) where no lab can be built; clean up labs a killed run left behind."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    remove_stale_labs()


@pytest.fixture
def lab(lab_machine, request):
    """An empty lab (an internet bridge) for one test; hosts are added by the test."""
    built = Lab(tag=f"t{abs(hash(request.node.nodeid)) % 10_000}")
    try:
        yield built
    finally:
        built.teardown()
