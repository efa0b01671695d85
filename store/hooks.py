"""TransformerLens hook names: the block a hook belongs to, and the hook an SAE's cfg.json names."""

from __future__ import annotations

import re
from typing import Any

BLOCK_HOOK = re.compile(r"^blocks\.(\d+)\.(.+)$")  # groups: block number, the hook within the block


def hook_layer(hook: str) -> int:
    """Block number of a hook name (`blocks.9.hook_resid_post` -> 9); -1 for hooks before the
    first block (`hook_embed`) and for an empty name."""
    match = BLOCK_HOOK.match(hook or "")
    return int(match.group(1)) if match else -1


def cfg_hook_name(cfg: dict[str, Any]) -> str:
    """The hook an SAELens cfg.json names (`metadata.hook_name`, else top-level `hook_name`;
    "" when neither is set)."""
    return str((cfg.get("metadata") or {}).get("hook_name") or cfg.get("hook_name") or "")
