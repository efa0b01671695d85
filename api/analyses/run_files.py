"""What every analysis run shares: its figures beside its tables (`analyses/<kind>/<run>.<name>.png`)
and the tokenizer's plain `text -> ids` encoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sae_atlas.store.analysis_runs import run_paths
from sae_atlas.store.atomic import save_png


def encoder_of(tokenizer: Any) -> Any:
    """`text -> ids` without special tokens, for an HF tokenizer."""
    return lambda text: tokenizer.encode(text, add_special_tokens=False)


def run_figure(fig: Any, atlas: str | Path, kind: str, run: str, suffix: str) -> str:
    """Save `fig` as `analyses/<kind>/<run>.<suffix>.png`; its file name."""
    pq, _ = run_paths(atlas, kind, run)
    return save_png(fig, pq.with_name(f"{run}.{suffix}.png")).name
