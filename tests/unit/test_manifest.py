"""The run manifest and multiaddr checks: pure functions, no hivemind processes."""

import subprocess
import sys

import pytest

from p2ptrain.multiaddr import validate_multiaddr
from p2ptrain.peers.net.dht import rank_addresses
from p2ptrain.peers.swarm.manifest import (
    Manifest,
    ManifestError,
    averaging_prefix,
    choose_manifest,
    manifest_key,
    new_manifest,
    parse_manifest,
)

PEER_ID = "QmXfDaa7kkzvbYoFhj5hbMaJXCFdHUrwDPeVkjYEM4gg6S"


def test_defaults_match_the_design():
    manifest = new_manifest("demo")
    assert manifest.mode == "sync"
    assert manifest.model == "tiny"
    assert manifest.lora is None
    assert manifest.dataset == {"kind": "stdlib"}
    assert (manifest.seq_len, manifest.target_batch_size, manifest.local_steps) == (128, 256, 50)
    # not the DiLoCo paper's 0.7 and 0.9, which a lone peer's rounds extrapolate sevenfold (peers/swarm/outer_step.py)
    assert (manifest.outer_lr, manifest.outer_momentum) == (1.0, 0.0)
    assert manifest.compression == "none"
    assert manifest.created_at > 0


def test_hash_is_stable_for_equal_manifests():
    first = new_manifest("demo", created_at=1000.0, lora={"r": 4})
    second = parse_manifest(first.model_dump(mode="json"))
    assert first.manifest_hash() == second.manifest_hash()
    assert len(first.manifest_hash()) == 16
    int(first.manifest_hash(), 16)


@pytest.mark.parametrize(
    "change",
    [
        {"run_id": "other"},
        {"mode": "diloco"},
        {"model": "gpt2"},
        {"lora": {"r": 8}},
        {"dataset": {"kind": "text", "path": "/data/a.txt"}},
        {"seq_len": 256},
        {"target_batch_size": 512},
        {"local_steps": 10},
        {"micro_batch_hint": 4},
        {"inner_lr": 2e-3},
        {"outer_lr": 0.5},
        {"outer_momentum": 0.8},
        {"compression": "fp16"},
        {"mode": "diloco", "compression": "sparse2bit-64of4096"},
        {"compression": "fp16", "compression_rungs": ["blockwise8bit"]},
        {"error_feedback_decay": 0.9},
        {"seed": 1},
        {"created_at": 1001.0},
        {"optimizer": "lamb"},
        {"warmup_epochs": 2},
        {"lr_schedule": "cosine", "total_epochs": 10},
        {"total_epochs": 10},
        {"round_end": "local_steps"},
        {"round_time_limit_s": 60.0},
    ],
)
def test_hash_changes_with_any_field(change):
    base = new_manifest("demo", created_at=1000.0)
    changed = parse_manifest({**base.model_dump(mode="json"), **change})
    assert changed.manifest_hash() != base.manifest_hash()
    assert averaging_prefix(changed) != averaging_prefix(base)


def test_every_field_is_covered_by_the_hash_test():
    covered = {"run_id", "mode", "model", "lora", "dataset", "seq_len", "target_batch_size", "local_steps"}
    covered |= {"micro_batch_hint", "inner_lr", "outer_lr", "outer_momentum", "compression", "seed", "created_at"}
    covered |= {"optimizer", "warmup_epochs", "lr_schedule", "total_epochs", "round_end", "round_time_limit_s"}
    covered |= {"compression_rungs", "error_feedback_decay"}
    covered |= {"format"}  # one valid value today; a new format is refused before hashing
    assert set(Manifest.model_fields) == covered


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lr_schedule": "cosine"}, "lr_schedule 'cosine' needs total_epochs; give total_epochs"),
        ({"lr_schedule": "linear", "warmup_epochs": 5, "total_epochs": 5}, "no epoch after 5 warm-up epochs; give total_epochs greater"),
        ({"optimizer": "sgd"}, "'optimizer' = 'sgd' is invalid; use 'adamw' or 'lamb'"),
        ({"warmup_epochs": -1}, "'warmup_epochs' = -1 is invalid"),
    ],
)
def test_bad_optimizer_settings_are_one_line_errors_with_a_fix(options, message):
    with pytest.raises(ManifestError) as error:
        new_manifest("demo", **options)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("options", "field", "fix_words"),
    [
        ({"run_id": "Has Spaces"}, "run_id", "lowercase letters"),
        ({"run_id": ""}, "run_id", "1-64 characters"),
        ({"run_id": "a" * 65}, "run_id", "1-64 characters"),
        ({"run_id": "-starts-with-dash"}, "run_id", "starting with a letter or digit"),
        ({"run_id": "ok", "mode": "async"}, "mode", "'sync' or 'diloco'"),
        ({"run_id": "ok", "target_batch_size": -1}, "target_batch_size", ">= 1"),
        ({"run_id": "ok", "target_batch_size": 0}, "target_batch_size", ">= 1"),
        ({"run_id": "ok", "outer_momentum": 1.0}, "outer_momentum", "[0, 1)"),
        ({"run_id": "ok", "inner_lr": float("nan")}, "inner_lr", "finite number"),
        ({"run_id": "ok", "compression": "zip"}, "compression", "blockwise8bit"),
        ({"run_id": "ok", "round_end": "time"}, "round_end", "'samples'"),
        ({"run_id": "ok", "round_time_limit_s": 0}, "round_time_limit_s", "seconds > 0"),
        ({"run_id": "ok", "lora": {"r": 0}}, "lora.r", "rank"),
        ({"run_id": "ok", "dataset": {"path": "x"}}, "dataset", "'kind'"),
    ],
)
def test_bad_value_is_refused_naming_field_value_and_fix(options, field, fix_words):
    with pytest.raises(ManifestError) as caught:
        parse_manifest(options)
    error = caught.value
    assert f"'{field}'" in error.message
    assert fix_words in error.fix
    assert "\n" not in str(error)


def test_new_manifest_refuses_bad_run_id():
    with pytest.raises(ManifestError, match="'run_id' = 'My Run'"):
        new_manifest("My Run")


def test_missing_run_id_is_named():
    with pytest.raises(ManifestError, match="'run_id' is missing"):
        parse_manifest({"mode": "sync"})


def test_extra_field_is_refused():
    with pytest.raises(ManifestError) as caught:
        new_manifest("demo", learning_rate=0.1)
    assert "'learning_rate' is unknown" in caught.value.message
    assert "inner_lr" in caught.value.fix


def test_extra_lora_field_is_refused():
    with pytest.raises(ManifestError, match="'lora.rank' is unknown"):
        new_manifest("demo", lora={"rank": 8})


def test_non_dict_manifest_is_refused():
    with pytest.raises(ManifestError, match="must be an object"):
        parse_manifest(["run_id", "demo"])


def test_earliest_manifest_wins_a_conflict():
    early = new_manifest("demo", created_at=100.0, seed=1)
    late = new_manifest("demo", created_at=200.0, seed=0)
    assert choose_manifest([late, early]) == early


def test_manifest_key_and_prefix_name_the_run():
    manifest = new_manifest("demo")
    assert manifest_key("demo") == "p2ptrain/demo/manifest"
    assert averaging_prefix(manifest) == f"demo-{manifest.manifest_hash()}"


def test_manifest_and_multiaddr_checks_import_without_torch_or_hivemind():
    code = (
        "import sys, p2ptrain.peers.swarm.manifest, p2ptrain.peers.net.dht, p2ptrain.peers.swarm.records;"
        "loaded = [name for name in ('torch', 'hivemind') if name in sys.modules];"
        "sys.exit(', '.join(loaded) or None)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/ip4/203.0.113.5/tcp/31337", "/ip4/203.0.113.5/tcp/31337"),
        (f"/ip4/203.0.113.5/tcp/31337/p2p/{PEER_ID}", f"/ip4/203.0.113.5/tcp/31337/p2p/{PEER_ID}"),
        (f"  /ip4/127.0.0.1/tcp/1/ipfs/{PEER_ID}/ ", f"/ip4/127.0.0.1/tcp/1/p2p/{PEER_ID}"),
        ("/ip6/2001:DB8:0:0::1/tcp/4001", "/ip6/2001:db8::1/tcp/4001"),
        (f"/ip6/::1/udp/4001/quic-v1/p2p/{PEER_ID}", f"/ip6/::1/udp/4001/quic-v1/p2p/{PEER_ID}"),
        ("/dns/Boot.Example.org/tcp/443", "/dns/boot.example.org/tcp/443"),
        (f"/dns4/boot.example.org/tcp/31337/p2p/{PEER_ID}", f"/dns4/boot.example.org/tcp/31337/p2p/{PEER_ID}"),
        ("/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/tcp/0"),
    ],
)
def test_valid_multiaddr_is_normalised(text, expected):
    assert validate_multiaddr(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("203.0.113.5:31337", "must start with '/'"),
        ("", "must start with '/'"),
        ("/ip4/203.0.113/tcp/1", "IPv4 address"),
        ("/ip4/203.0.113.5", "port"),
        ("/ip4/203.0.113.5/tcp/70000", "0-65535"),
        ("/ip4/203.0.113.5/tcp/abc", "0-65535"),
        ("/ip6/not-an-ip/tcp/1", "IPv6"),
        ("/dns/bad_host!/tcp/1", "host name"),
        ("/tcp/31337", "must start with /ip4"),
        ("/ip4/203.0.113.5/tcp/1/p2p/0OIl", "peer id"),
        ("/ip4/203.0.113.5/sctp/1", "unknown protocol"),
        ("/ip4/203.0.113.5/tcp", "needs a value"),
    ],
)
def test_invalid_multiaddr_is_refused_with_an_example(text, reason):
    with pytest.raises(ValueError) as caught:
        validate_multiaddr(text)
    message = str(caught.value)
    assert message.startswith(f"{text!r} is not a multiaddr")
    assert reason in message
    assert "expected e.g. /ip4/203.0.113.5/tcp/31337/p2p/Qm..." in message


def test_addresses_are_ranked_public_first_loopback_last():
    loopback = f"/ip4/127.0.0.1/tcp/1/p2p/{PEER_ID}"
    private = f"/ip4/192.168.1.7/tcp/1/p2p/{PEER_ID}"
    public = f"/ip4/203.0.114.9/tcp/1/p2p/{PEER_ID}"
    relayed = f"/ip4/198.51.100.1/tcp/1/p2p/{PEER_ID}/p2p-circuit/p2p/{PEER_ID}"
    assert rank_addresses([loopback, relayed, private, public, loopback]) == [public, private, relayed, loopback]
    assert rank_addresses([loopback]) == [loopback]


def test_a_manifest_from_a_newer_p2ptrain_asks_for_an_upgrade_not_about_unknown_fields():
    from p2ptrain.peers.swarm.manifest import MANIFEST_FORMAT

    newer = {"run_id": "future", "format": MANIFEST_FORMAT + 1, "field_of_the_future": 1}
    expected = rf"newer p2ptrain \(manifest format {MANIFEST_FORMAT + 1}; this one reads up to {MANIFEST_FORMAT}\)"
    with pytest.raises(ManifestError, match=expected) as error:
        parse_manifest(newer)
    assert "pip install --upgrade p2ptrain" in error.value.fix
    assert parse_manifest({"run_id": "today"}).format == MANIFEST_FORMAT
    assert parse_manifest({"run_id": "older", "format": 1}).format == 1, "older formats still parse"
    assert parse_manifest({"run_id": "older", "format": 2, "mode": "diloco"}).round_end == "local_steps", \
        "a run defined before format 3 keeps DiLoCo's fixed H"
    assert parse_manifest({"run_id": "today", "mode": "diloco"}).round_end == "samples"
    older = parse_manifest({"run_id": "older", "format": 3, "mode": "diloco"})
    assert (older.outer_lr, older.outer_momentum) == (0.7, 0.9), "a run defined before format 4 keeps the paper's outer step"
    assert older.manifest_hash() == parse_manifest(older.model_dump(mode="json")).manifest_hash()
    with pytest.raises(ManifestError, match="'format'"):
        parse_manifest({"run_id": "today", "format": 0})


def test_an_outer_step_the_study_found_unstable_gets_a_warning():
    from p2ptrain.peers.swarm.outer_step import stability_warning

    assert stability_warning("diloco", 1.0, 0.0) is None
    assert stability_warning("diloco", 0.7, 0.5) is None  # 1.4x: stable in the study
    warning = stability_warning("diloco", 0.7, 0.9)
    assert "7.0x" in warning and "--outer-lr 1 --outer-momentum 0" in warning and "\n" not in warning
    assert stability_warning("sync", 0.7, 0.9) is None  # sync mode has no outer step
