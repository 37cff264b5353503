"""``p2ptrain export``: checkpoints written like the worker writes them, exported and loaded back with transformers/peft."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from p2ptrain.paths import resolve_paths
from p2ptrain.peers.model.checkpoint import checkpoint_path, save_checkpoint
from p2ptrain.peers.model.export import ExportError, export_checkpoint
from p2ptrain.peers.swarm.manifest import new_manifest
from p2ptrain.peers.model.models import build_model


def save_small_llama(directory) -> None:
    """A small Llama and a byte-level BPE tokenizer, saved with save_pretrained (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(["def main():\n    return 0\n"], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>", unk_token="<unk>")
    tokenizer.save_pretrained(directory)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=64, eos_token_id=1)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)


def write_checkpoint(path, manifest, loaded, global_parameters=None, epoch=3) -> None:
    """A checkpoint with the fields the worker writes (see Worker.save_checkpoint)."""
    trainer = {"epoch": epoch}
    if global_parameters is not None:
        trainer.update(global_parameters=global_parameters, outer_momentum=[torch.zeros_like(t) for t in global_parameters])
    save_checkpoint(path, {
        "trainable": loaded.trainable_state(), "trainer": trainer, "epoch": epoch, "data_position": 0,
        "manifest_hash": manifest.manifest_hash(), "contributed_samples": 0, "manifest": manifest.model_dump(mode="json"),
    })


def run_export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "p2ptrain.cli", "export", *args], capture_output=True, text=True, timeout=120)


def test_lora_diloco_checkpoint_exports_the_global_adapters_loadable_with_peft(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = tmp_path / "base"
    save_small_llama(model_dir)
    manifest = new_manifest("lora-export", mode="diloco", model=str(model_dir), lora={"r": 4, "alpha": 8, "dropout": 0.0})
    loaded = build_model(manifest.model, manifest.lora.model_dump(), seed=manifest.seed)
    generator = torch.Generator().manual_seed(5)
    global_parameters = [torch.randn(p.shape, generator=generator) for p in loaded.trainable()]
    with torch.no_grad():  # this peer's own unfinished inner steps: must not be exported
        for parameter in loaded.trainable():
            parameter.add_(100.0)
    checkpoint = tmp_path / "lora-export.pt"
    write_checkpoint(checkpoint, manifest, loaded, global_parameters, epoch=7)

    info = export_checkpoint(checkpoint, tmp_path / "out")
    assert (info["format"], info["epoch"], info["base_model"]) == ("peft-lora-adapters", 7, str(model_dir))
    assert (tmp_path / "out" / "adapter_config.json").is_file()
    assert not (tmp_path / "out" / "model.safetensors").exists()  # adapters only, not the base weights

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    peft_model = PeftModel.from_pretrained(base, tmp_path / "out")
    adapters = {name: p for name, p in peft_model.named_parameters() if "lora_" in name}
    assert len(adapters) == len(global_parameters)
    for (name, exported), expected in zip(adapters.items(), global_parameters):
        assert torch.equal(exported.detach(), expected), name
    assert len(AutoTokenizer.from_pretrained(tmp_path / "out")) == len(AutoTokenizer.from_pretrained(model_dir))


def checkpointed_tiny_run(home, run_id: str, train):
    """A sync run of the tiny preset whose weights ``train`` changed in place, checkpointed in ``home``;
    returns the model."""
    manifest = new_manifest(run_id, mode="sync")
    loaded = build_model("tiny", seed=manifest.seed)
    with torch.no_grad():
        for parameter in loaded.trainable():
            train(parameter)
    write_checkpoint(checkpoint_path(resolve_paths(home).checkpoints_dir, manifest.run_id), manifest, loaded)
    return loaded


def test_full_tiny_checkpoint_exports_through_the_cli_a_model_transformers_loads(tmp_path):
    from transformers import AutoModelForCausalLM

    home = tmp_path / "home"
    loaded = checkpointed_tiny_run(home, "tiny-export", lambda parameter: parameter.mul_(0.5))

    result = run_export(str(tmp_path / "out"), "--home", str(home))
    assert result.returncode == 0, result.stderr
    assert "exported transformers-model of run 'tiny-export' at epoch 3" in result.stdout
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    expected = loaded.trainable_state()
    parameters = dict(exported.named_parameters())
    assert all(torch.equal(parameters[name].detach(), tensor) for name, tensor in expected.items())
    assert "UTF-8 bytes" in json.loads((tmp_path / "out" / "p2ptrain-export.json").read_text())["tokenizer"]


def test_an_exported_tiny_model_starts_a_new_run_with_the_byte_tokenizer(tmp_path):
    """The export of a tiny run is a `--model DIR` for the next run: Hugging Face reads its
    tokenizer as bytes, and p2ptrain builds it with the byte tokenizer and the trained weights."""
    from transformers import AutoTokenizer

    from p2ptrain.peers.model.tokenizers import ByteTokenizer

    home = tmp_path / "home"
    loaded = checkpointed_tiny_run(home, "tiny-pretrain", lambda parameter: parameter.add_(0.25))
    assert run_export(str(tmp_path / "out"), "--home", str(home)).returncode == 0

    text = "déf f(x):\n\treturn x  # ✓"
    hf_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert hf_tokenizer.encode(text, add_special_tokens=False) == list(text.encode("utf-8"))
    assert (hf_tokenizer.bos_token_id, hf_tokenizer.eos_token_id, hf_tokenizer.pad_token_id) == (256, 257, 258)
    assert hf_tokenizer.decode(list(text.encode("utf-8"))) == text

    again = build_model(str(tmp_path / "out"), seed=7)
    assert isinstance(again.tokenizer, ByteTokenizer)
    assert again.parameters == loaded.parameters
    assert all(torch.equal(again.trainable_state()[name], tensor) for name, tensor in loaded.trainable_state().items())


def test_without_a_checkpoint_export_says_so_in_one_line(tmp_path):
    result = run_export(str(tmp_path / "out"), "--home", str(tmp_path / "home"))
    assert result.returncode == 1
    assert "no checkpoint yet" in result.stderr and "p2ptrain pause" in result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


def test_a_truncated_checkpoint_is_a_one_line_error(tmp_path):
    manifest = new_manifest("cut", mode="sync")
    checkpoint = tmp_path / "cut.pt"
    write_checkpoint(checkpoint, manifest, build_model("tiny", seed=0))
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    with pytest.raises(ExportError, match="unreadable .corrupt or truncated.; let the daemon write a new one"):
        export_checkpoint(checkpoint, tmp_path / "out")


def test_export_refuses_a_directory_that_is_not_empty(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not an empty directory"):
        export_checkpoint(tmp_path / "missing.pt", tmp_path / "out")
