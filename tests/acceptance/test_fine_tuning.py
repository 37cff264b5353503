"""The README's "Starting a fine-tuning run", as written, with a local model and local files.

The README's run on local files (``--model ./my-model --dataset ./notes.jsonl
--text-field body``) runs verbatim in a directory that holds them: a small
Llama saved with ``save_pretrained`` and a JSONL file whose text is in
``body``. It takes ``--lora-r`` from the README's LoRA example (whose hub
model and dataset need the network). Then ``p2ptrain export ./adapters``
writes the adapters, once ``p2ptrain pause`` has checkpointed (as export's
own message says: a checkpoint is otherwise written every 10 minutes). The starter is a volunteer account with the default
configuration (``volunteers.py``).

Cost: about 1-2 minutes.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

from local_models import save_small_llama
from readme import code_blocks, option_value, shell_commands
from volunteers import Volunteer

pytestmark = [pytest.mark.swarm]


def save_notes(path: Path) -> None:
    """A JSONL file of notes whose text is in ``body`` (paragraphs of Python's own documentation strings)."""
    source = (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text()
    paragraphs = [paragraph.strip() for paragraph in source.split("\n\n") if len(paragraph.strip()) > 80]
    path.write_text("".join(json.dumps({"title": f"note {index}", "body": text}) + "\n" for index, text in enumerate(paragraphs)))


@pytest.mark.timeout(480)
def test_a_lora_run_on_a_local_model_and_local_notes_then_export_the_adapters(tmp_path):
    hub_lora, local_files, export = shell_commands(code_blocks("Starting a fine-tuning run")[0])
    assert export == ["p2ptrain", "export", "./adapters"]
    starter = Volunteer.create(tmp_path / "starter")
    work = tmp_path / "work"
    save_small_llama(work / option_value(local_files, "--model"))
    save_notes(work / option_value(local_files, "--dataset"))
    assert option_value(local_files, "--text-field") == "body"
    try:
        assert starter.run(["p2ptrain", "service", "install", "--user"]).returncode == 0
        starter.start_service()
        created = starter.run([*local_files, "--lora-r", option_value(hub_lora, "--lora-r")], cwd=work)
        assert created.returncode == 0, created.stdout + created.stderr
        status = starter.wait_until(lambda s: s["state"] == "training" and (s.get("local") or {}).get("samples_per_second"),
                                    300, what="training on the notes")
        local = status["local"]
        assert 0 < local["trainable_parameters"] < local["parameters"] / 5, local  # LoRA adapters only
        paused = starter.run(["p2ptrain", "pause"])
        assert paused.returncode == 0, paused.stderr
        # the pause answers at once; the worker then checkpoints and exits (the first checkpoint of this run:
        # an export started before it finds none)
        starter.wait_until(lambda s: s["local"]["workers"][0]["state"] == "paused", 60, what="the worker to checkpoint and stop")
        exported = starter.run(export, cwd=work, timeout=240)
        assert exported.returncode == 0, exported.stdout + exported.stderr
    finally:
        starter.stop()

    info = json.loads((work / "adapters/p2ptrain-export.json").read_text())
    manifest = info["manifest"]
    assert info["format"] == "peft-lora-adapters" and manifest["lora"]["r"] == int(option_value(hub_lora, "--lora-r"))
    assert (manifest["mode"], manifest["optimizer"], manifest["warmup_epochs"], manifest["target_batch_size"]) == (
        "sync", "lamb", 5, 4096)
    assert manifest["model"] == str(work / "my-model")
    assert manifest["dataset"] == {"kind": "files", "paths": [str(work / "notes.jsonl")], "text_field": "body"}

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    # the adapters load onto the local model, and are the ones the run trains (a sync run applies its
    # first update at the end of its first epoch of 4096 samples: none yet, so B is still its zero start)
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(work / "my-model"), work / "adapters")
    adapters = sum(parameter.numel() for name, parameter in adapted.named_parameters() if "lora_" in name)
    assert adapters == local["trainable_parameters"]
