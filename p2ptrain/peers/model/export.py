"""``p2ptrain export PATH``: a run's trained weights in the standard Hugging Face format.

Reads the newest checkpoint in the daemon's checkpoint directory (that of the
run it is in, or was in last), rebuilds the run's model from the manifest the
checkpoint carries, loads the trained state and writes:

- under LoRA: the adapters with peft's ``save_pretrained``
  (``adapter_config.json`` + ``adapter_model.safetensors``, loadable with
  ``PeftModel.from_pretrained(base, PATH)``), plus the base model's tokenizer;
- otherwise: the whole model with ``save_pretrained`` (loadable with
  ``AutoModelForCausalLM.from_pretrained(PATH)``) and its tokenizer (for the
  tiny preset its UTF-8 byte tokenizer as a Hugging Face one), so PATH can
  start a new run: ``p2ptrain join --new-run NAME --model PATH``;
- ``p2ptrain-export.json``: run id, epoch, manifest.

The weights are the swarm's: DiLoCo's averaged global parameters, not this
peer's unfinished inner steps. ``p2ptrain export`` imports this module
(its ``add_arguments`` and ``run``) only for that command; torch and
transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXPORT_INFO = "p2ptrain-export.json"


class ExportError(Exception):
    """Nothing to export, or the export cannot be written; the message says how to fix it."""


def newest_checkpoint(checkpoints_dir: Path, run_id: str | None = None) -> Path:
    """The checkpoint of ``run_id``, or the most recently written one.

    Raises ExportError when there is none yet.
    """
    from p2ptrain.peers.model.checkpoint import checkpoint_path

    if run_id is not None:
        path = checkpoint_path(checkpoints_dir, run_id)
        if not path.is_file():
            raise ExportError(f"no checkpoint of run {run_id!r} in {checkpoints_dir}; "
                              f"join it and let the daemon checkpoint (p2ptrain pause does) first")
        return path
    candidates = sorted(checkpoints_dir.glob("*.pt"), key=lambda path: path.stat().st_mtime) if checkpoints_dir.is_dir() else []
    if not candidates:
        raise ExportError(f"no checkpoint yet in {checkpoints_dir}; join a run and let the daemon checkpoint "
                          f"(p2ptrain pause or leave writes one) first")
    return candidates[-1]


def trained_state(state: dict, names: list[str], mode: str) -> dict:
    """The trainable tensors to export, by name: DiLoCo's global parameters, else the model's."""
    if mode == "diloco":
        global_parameters = state["trainer"]["global_parameters"]
        if len(global_parameters) != len(names):
            raise ExportError(f"the checkpoint holds {len(global_parameters)} global tensors for {len(names)} "
                              f"trainable ones; it does not match its manifest, export another checkpoint")
        return dict(zip(names, global_parameters))
    return state["trainable"]


def export_checkpoint(checkpoint: Path, output: Path) -> dict:
    """Write the checkpoint's model or adapters into ``output`` (created; must be empty if it exists).

    Returns the export info (``run_id``, ``epoch``, ``format``, ``manifest``).
    Raises ExportError with a one-line fix.
    """
    from p2ptrain.peers.model.checkpoint import load_checkpoint
    from p2ptrain.peers.swarm.manifest import ManifestError, parse_manifest
    from p2ptrain.peers.model.models import build_model
    from p2ptrain.peers.model.tokenizers import ByteTokenizer, ModelUnavailable

    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ExportError(f"{output} exists and is not an empty directory; give a new directory")
    state = load_checkpoint(checkpoint)
    if state is None:
        raise ExportError(f"checkpoint {checkpoint} is unreadable (corrupt or truncated); "
                          f"let the daemon write a new one (p2ptrain pause) and export again")
    if "manifest" not in state:
        raise ExportError(f"checkpoint {checkpoint} was written by an older p2ptrain without its manifest; "
                          f"let the daemon write a new one (p2ptrain pause) and export again")
    try:
        manifest = parse_manifest(state["manifest"])
        loaded = build_model(manifest.model, manifest.lora.model_dump() if manifest.lora else None, seed=manifest.seed)
        loaded.load_trainable_state(trained_state(state, list(loaded.trainable_state()), manifest.mode))
    except ManifestError as error:
        raise ExportError(f"the checkpoint's manifest is invalid: {error}") from error
    except ModelUnavailable as error:
        raise ExportError(f"{error}; export on a machine that has the run's model") from error
    except (KeyError, ValueError) as error:
        raise ExportError(f"checkpoint {checkpoint} does not fit its model ({error})") from error

    output.mkdir(parents=True, exist_ok=True)
    loaded.model.save_pretrained(output)
    hf_tokenizer = getattr(loaded.tokenizer, "hf_tokenizer", None)
    if hf_tokenizer is not None:
        hf_tokenizer.save_pretrained(output)
    elif isinstance(loaded.tokenizer, ByteTokenizer):
        loaded.tokenizer.save_pretrained(output)
    info = {
        "run_id": manifest.run_id,
        "epoch": int(state.get("epoch", 0)),
        "format": "peft-lora-adapters" if manifest.lora else "transformers-model",
        "base_model": manifest.model if manifest.lora else None,
        "tokenizer": "saved" if hf_tokenizer is not None else (
            "saved; UTF-8 bytes: ids 0-255 are bytes, 256 bos, 257 eos, 258 pad"
            if isinstance(loaded.tokenizer, ByteTokenizer) else "none"),
        "manifest": manifest.model_dump(mode="json"),
    }
    (output / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return info


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `p2ptrain export` (the CLI adds its global options, `--home` among them)."""
    parser.add_argument("path", help="a new directory to write into")
    parser.add_argument("--run", help="export this run's checkpoint (default: the newest checkpoint)")


def run(args: argparse.Namespace) -> int:
    """`p2ptrain export PATH [--run RUN]`: exit 0, or 1 with a one-line error."""
    from p2ptrain.paths import resolve_paths

    try:
        checkpoint = newest_checkpoint(resolve_paths(args.home).checkpoints_dir, args.run)
        info = export_checkpoint(checkpoint, Path(args.path).expanduser().resolve())
    except ExportError as error:
        print(f"p2ptrain export: {error}", file=sys.stderr)
        return 1
    print(f"exported {info['format']} of run {info['run_id']!r} at epoch {info['epoch']} to {args.path}")
    return 0

