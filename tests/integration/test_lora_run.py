"""LoRA fine-tuning of a local pretrained Llama in a DiLoCo run, through the CLI, with a restart.

The model is a small LlamaConfig model and a BPE tokenizer saved with
``save_pretrained`` in a temporary directory: no network, as a volunteer with a
downloaded model would have it.
"""

from __future__ import annotations

import json

import pytest

from daemons import cli
from local_models import save_small_corpus, save_small_llama

pytestmark = [pytest.mark.swarm]


def status_json(home) -> dict:
    return json.loads(cli(home, "status", "--json").stdout)


def events(home) -> list[dict]:
    return json.loads(cli(home, "events", "--json", "--limit", "500").stdout)["events"]


@pytest.mark.timeout(600)
def test_two_daemons_fine_tune_lora_adapters_and_a_restarted_one_rejoins(daemons, tmp_path):
    model_dir = tmp_path / "small-llama"
    save_small_llama(model_dir)
    corpus = tmp_path / "corpus.txt"
    save_small_corpus(corpus)
    a = daemons.start("la")
    b = daemons.start("lb")
    created = cli(a.home, "join", "--new-run", "lora-run", "--mode", "diloco", "--model", str(model_dir),
                  "--lora-r", "8", "--local-steps", "10", "--micro-batch", "4", "--seq-len", "64",
                  "--target-batch-size", "80", "--dataset", str(corpus))
    assert created.returncode == 0, created.stderr
    address = a.wait_until(lambda s: (s.get("local") or {}).get("addresses"), 180, what="A to create the run")["local"]["addresses"][0]
    joined = cli(b.home, "join", "lora-run", "--peers", address)
    assert joined.returncode == 0, joined.stderr

    for daemon in (a, b):
        daemon.wait_until(lambda s: s["state"] == "training" and (s.get("run") or {}).get("epoch", 0) >= 2
                          and s["run"].get("num_peers") == 2, 300, what="LoRA DiLoCo epoch 2 with both peers")
    for daemon in (a, b):
        local = status_json(daemon.home)["local"]
        assert local["parameters"] > 0 and local["trainable_parameters"] > 0
        assert local["trainable_parameters"] / local["parameters"] < 0.2, local
        assert local["precision"] == "fp32" and local["quantization"] == "none"

    assert a.terminate(timeout=120) == 0
    restarted = daemons.start("la")
    restarted.wait_until(lambda s: s["state"] == "training" and (s.get("run") or {}).get("id") == "lora-run", 180,
                         what="the restarted daemon to rejoin lora-run by itself")
    history = events(restarted.home)
    kinds = [event["kind"] for event in history]
    assert "checkpoint-loaded" in kinds, f"the restarted daemon did not resume from its checkpoint: {kinds}"
    loaded_at = kinds.index("checkpoint-loaded")
    saved = [event for event in history[:loaded_at] if event["kind"] == "checkpoint-saved"]
    assert saved and saved[-1]["data"]["reason"] == "stop", saved[-1:]
    resumed_epoch = history[loaded_at]["data"]["epoch"]
    assert resumed_epoch == saved[-1]["data"]["epoch"] >= 2
    # A alone runs ahead until B arrives, so "epoch 3" means: past where A stopped, and at least 3
    goal = max(3, resumed_epoch + 1)
    for daemon in (restarted, b):
        daemon.wait_until(lambda s: s["state"] == "training" and s["run"]["epoch"] >= goal and s["run"].get("num_peers") == 2,
                          300, what=f"the pair to reach epoch {goal}")

    # the adapters the swarm trained, as Hugging Face peft adapters of the local model
    assert cli(b.home, "pause").returncode == 0  # writes a checkpoint
    exported = cli(b.home, "export", str(tmp_path / "adapters"), timeout=180)
    assert exported.returncode == 0, exported.stderr
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), tmp_path / "adapters")
    adapters = [p for name, p in adapted.named_parameters() if "lora_B" in name]
    assert adapters and any(bool(p.abs().sum() > 0) for p in adapters)  # LoRA's B starts at zero: it was trained
