"""Atomic training checkpoints in `<sae_dir>/checkpoints/` and finding the latest valid one.

A checkpoint is one `torch.save` file `step-XXXXXXXX.pt` holding the SAE and optimizer
and scheduler state, RNG states, step, tokens seen, dead-latent counters, the input scale
and the metrics so far. It is written through `store.atomic.atomic_path`, so a crash
leaves either the previous file set or the new one (and at worst a temporary file, which
`remove_checkpoints` deletes with the rest); a file that fails to load (e.g. a
foreign truncated file) is skipped with the next older one used instead.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import torch

from sae_atlas.store.atomic import atomic_path

_NAME = re.compile(r"^step-(\d{8,})\.pt$")
_TEMPORARY = re.compile(r"^\.step-\d{8,}\.pt\..*\.tmp$")  # a checkpoint write killed before its rename
KEEP = 2  # newest checkpoints kept; older ones are removed after a successful write


def checkpoint_dir(sae_dir: Path) -> Path:
    return Path(sae_dir) / "checkpoints"


def _checkpoints(sae_dir: Path) -> list[tuple[int, Path]]:
    folder = checkpoint_dir(sae_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def rng_state() -> dict[str, Any]:
    """Every RNG the training loop could draw from."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(sae_dir: Path, step: int, state: dict[str, Any]) -> Path:
    """Write `state` as the checkpoint of `step` atomically; prune all but the newest KEEP."""
    path = checkpoint_dir(sae_dir) / f"step-{step:08d}.pt"
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    for _, old in _checkpoints(sae_dir)[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


def load_latest_checkpoint(sae_dir: Path, map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
    """The newest checkpoint that loads, or None when there is none."""
    for _, path in reversed(_checkpoints(sae_dir)):
        try:
            return torch.load(path, map_location=map_location, weights_only=False)
        except Exception:  # noqa: BLE001 - an unreadable checkpoint is skipped, older ones tried
            continue
    return None


def remove_checkpoints(sae_dir: Path) -> None:
    """Delete the run's checkpoints and the temporary files of killed checkpoint writes
    (after the final SAE is saved), then the emptied folder."""
    folder = checkpoint_dir(sae_dir)
    if not folder.is_dir():
        return
    for path in list(folder.iterdir()):
        if _NAME.match(path.name) or _TEMPORARY.match(path.name):
            path.unlink(missing_ok=True)
    if not any(folder.iterdir()):
        folder.rmdir()
