"""Atomic checkpoints of a worker's trainable state.

A checkpoint is one ``torch.save`` file holding a dict: the trainable
parameters, the optimizer state(s), the outer momentum (DiLoCo), the epoch, the
data position and the manifest hash. It is written to a temp file in the same
directory, fsynced and renamed over the old one, so a crash at any moment leaves
either the old or the new checkpoint, never half of one.

The worker writes one only from a state that passed its divergence guard
(``peers/training/divergence.py``), and never loads one that holds a non-finite value
anywhere (:func:`non_finite_problem`: written by an older p2ptrain while its
training diverged, or damaged): that file is kept aside (:func:`set_aside`),
not deleted, so nothing a volunteer trained is lost without a trace.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 1


def checkpoint_path(checkpoints_dir: str | os.PathLike, run_id: str) -> Path:
    """Where the checkpoint of ``run_id`` lives inside ``checkpoints_dir``."""
    safe_name = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)
    return Path(checkpoints_dir) / f"{safe_name}.pt"


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """Write ``state`` to ``path`` atomically (temp file + fsync + rename).

    Args:
        path: the checkpoint file; its directory is created if missing.
        state: a dict of tensors and plain values (what ``torch.save`` accepts).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as temp_file:
            torch.save({"format": CHECKPOINT_FORMAT, "state": state}, temp_file)
            temp_file.flush()
            os.fsync(temp_file.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    # the rename is durable only once the directory entry is on disk too
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_checkpoint(path: str | os.PathLike, manifest_hash: str | None = None) -> dict | None:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Args:
        path: the checkpoint file.
        manifest_hash: if given, a checkpoint of another manifest is refused.

    Returns:
        The saved state dict, or None when the file is missing, corrupt,
        truncated, or of another manifest (the reason is logged; never raises).
    """
    path = Path(path)
    if not path.exists():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # any unreadable file is a missing checkpoint, not a crash
        logger.warning("Ignoring unreadable checkpoint %s: %s", path, error)
        return None
    if not isinstance(saved, dict) or saved.get("format") != CHECKPOINT_FORMAT or not isinstance(saved.get("state"), dict):
        logger.warning("Ignoring checkpoint %s: not a p2ptrain checkpoint", path)
        return None
    state = saved["state"]
    if manifest_hash is not None and state.get("manifest_hash") != manifest_hash:
        logger.warning(
            "Ignoring checkpoint %s: it belongs to manifest %s, this run is %s",
            path, state.get("manifest_hash"), manifest_hash,
        )
        return None
    return state


def non_finite_problem(state, where: str = "") -> str | None:
    """Where a checkpoint's state (nested dicts, lists and tensors) holds NaN or infinity, or None.

    Every floating-point tensor is checked: the trainable parameters, and the trainer's state
    (optimizer moments, DiLoCo's global parameters and outer momentum), which a restore adopts too.
    """
    if isinstance(state, torch.Tensor):
        if state.is_floating_point() and not bool(torch.isfinite(state).all()):
            return f"{where or 'a tensor'} holds non-finite values"
        return None
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, (list, tuple)) else ()
    for key, value in items:
        problem = non_finite_problem(value, f"{where}/{key}" if where else str(key))
        if problem:
            return problem
    return None


def set_aside(path: str | os.PathLike, why: str) -> Path:
    """Rename a checkpoint that must not be loaded to ``<name>.<why>-<time>`` beside it, where
    neither a restart nor ``p2ptrain export`` (which reads ``*.pt``) picks it up; returns the new path."""
    path = Path(path)
    kept = path.with_name(f"{path.name}.{why}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(path, kept)
    logger.warning("Checkpoint %s set aside as %s (%s)", path, kept, why)
    return kept


def state_problem(expected: list[torch.Tensor] | tuple, received: list[torch.Tensor] | tuple) -> str | None:
    """Why ``received`` tensors must not replace ``expected`` ones, or None if they may.

    Checked: same number of tensors, same shapes, every value finite.
    """
    if len(expected) != len(received):
        return f"expected {len(expected)} tensors, received {len(received)}"
    for index, (mine, theirs) in enumerate(zip(expected, received)):
        if tuple(mine.shape) != tuple(theirs.shape):
            return f"tensor {index} has shape {tuple(theirs.shape)}, expected {tuple(mine.shape)}"
        if theirs.is_floating_point() and not bool(torch.isfinite(theirs).all()):
            return f"tensor {index} holds non-finite values"
    return None
