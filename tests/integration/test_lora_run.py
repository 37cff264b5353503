"""LoRA fine-tuning of a local pretrained Llama in a DiLoCo run, through the CLI, with a restart.

The model is a small LlamaConfig model and a BPE tokenizer saved with
``save_pretrained`` in a temporary directory: no network, as a volunteer with a
downloaded model would have it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemons import cli

pytestmark = [pytest.mark.swarm]


def save_small_llama(directory: Path, hidden_size: int = 128, intermediate_size: int = 344, layers: int = 2, heads: int = 4) -> None:
    """A small pretrained-looking Llama (~0.3 M parameters by default) with its own byte-level BPE tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(["def main():\n    return 0\n", "import os\nprint(os.getcwd())\n", "class A:\n    pass\n"], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>", unk_token="<unk>")
    tokenizer.save_pretrained(directory)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=256, eos_token_id=1)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)


def save_small_corpus(path: Path) -> None:
    """About 400 KB of Python source: tokenizing it with a BPE tokenizer takes seconds, not the minutes the stdlib takes."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "\n".join((stdlib / name).read_text() for name in ("argparse.py", "ast.py", "dataclasses.py", "enum.py"))
    path.write_text(text[:400_000])


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
