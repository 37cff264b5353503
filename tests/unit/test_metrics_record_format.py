"""A peer's metrics record holds only the fields its run's peers know (``records.record_for_format``)."""

from __future__ import annotations

import pydantic
import pytest

from p2ptrain.peers.swarm.manifest import MANIFEST_FORMAT
from p2ptrain.peers.swarm.records import FIELDS_SINCE_FORMAT_5, MAX_BANS, LocalMetrics, record_for_format


# The record as a peer of manifest format 4 validates it: the same fields less the newer ones, nothing else allowed.
LocalMetricsOfFormat4 = pydantic.create_model(
    "LocalMetricsOfFormat4",
    __config__=pydantic.ConfigDict(extra="forbid"),
    **{name: (field.annotation, field) for name, field in LocalMetrics.model_fields.items() if name not in FIELDS_SINCE_FORMAT_5},
)


def test_a_record_for_an_older_run_passes_an_older_peers_schema_and_a_newer_one_carries_group_and_bans():
    metrics = LocalMetrics(peer_id="QmPeer", last_group=3, bans=["QmRogue"])
    older = record_for_format(metrics, 4)
    assert LocalMetricsOfFormat4.model_validate(older, strict=True).peer_id == "QmPeer"
    newer = record_for_format(metrics, MANIFEST_FORMAT)
    with pytest.raises(pydantic.ValidationError):  # why the gate is needed: an older peer refuses the new fields
        LocalMetricsOfFormat4.model_validate(newer, strict=True)
    parsed = LocalMetrics.model_validate(newer, strict=True)
    assert (parsed.last_group, parsed.bans) == (3, ["QmRogue"])


def test_a_record_cannot_claim_endless_bans():
    with pytest.raises(pydantic.ValidationError):
        LocalMetrics.model_validate({"peer_id": "QmPeer", "bans": [f"Qm{index}" for index in range(MAX_BANS + 1)]}, strict=True)
