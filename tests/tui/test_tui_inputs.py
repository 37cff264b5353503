"""What the dialogs accept and the one-line hints for what they do not (durations: tests/unit/test_durations.py)."""

from __future__ import annotations

import pytest

from p2ptrain.tui.formatting import format_age, format_duration
from p2ptrain.tui.screens.join_dialog import join_params


def test_durations_and_ages_read_at_a_glance():
    assert format_duration(7505) == "2h 05m"
    assert format_duration(93_600) == "1d 02h"
    assert format_duration(None) == "—"
    assert format_age(100.0, 112.0) == "12s ago"
    assert format_age(None, 112.0) == "never"


def test_join_needs_a_run_name_and_a_bootstrap_address():
    with pytest.raises(ValueError, match="give the run a name"):
        join_params("  ", "/ip4/1.2.3.4/tcp/1/p2p/X", False, "sync", "tiny")
    with pytest.raises(ValueError, match="paste a bootstrap address"):
        join_params("tiny-demo", "", False, "sync", "tiny")
    assert join_params("tiny-demo", "/ip4/a, /ip4/b", False, "sync", "tiny") == {
        "run": "tiny-demo",
        "initial_peers": ["/ip4/a", "/ip4/b"],
    }


def test_a_new_run_needs_no_bootstrap_address_but_a_model():
    assert join_params("mine", "", True, "diloco", " tiny ")["manifest"] == {"mode": "diloco", "model": "tiny"}
    with pytest.raises(ValueError, match="name the model"):
        join_params("mine", "", True, "sync", "")
