"""Depth metrics per prompt family: do prompts of one family (say, logic with one semantic
carrier) move through the layers as another family's do?

A family file is JSON `{"families": {"name": ["prompt", ...], ...}}` (at least two families
of at least two prompts). Each prompt runs alone (no padding) with every requested layer
captured; BOS is left out. Per prompt, over its tokens: the trajectory means (convergence
index, curvature, path length) and, per layer, the mean local intrinsic dimension of its
tokens within the pooled cloud of every family's tokens. Families are compared pairwise on
each per-prompt metric with the two-sided rank-sum permutation test of the contrast
analysis, prompts being the units that are permuted.
"""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.contrast import permutation_p_values
from sae_atlas.geometry.intrinsic_dimension import local_dimension
from sae_atlas.geometry.trajectories import TrajectorySpace, trajectory_geometry
from sae_atlas.saes.depth.capture import check_layers
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.models import ModelHandle

FAMILY_FILE_SHAPE = '{"families": {"name": ["prompt", ...], ...}}'


def read_families(path: str | Path) -> dict[str, list[str]]:
    """The families of a family file (InvalidInputError naming the file and the expected
    shape when it has none, or fewer than two, or a family with fewer than two prompts)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"cannot read family file {path}: {exc}") from exc
    families = data.get("families") if isinstance(data, dict) else None
    if not isinstance(families, dict) or not families:
        raise InvalidInputError(f"family file {path} has no families; expected {FAMILY_FILE_SHAPE}")
    bad = [name for name, prompts in families.items()
           if not isinstance(prompts, list) or len(prompts) < 2 or not all(isinstance(p, str) and p for p in prompts)]
    if bad or len(families) < 2:
        raise InvalidInputError(f"family file {path} needs at least 2 families of at least 2 non-empty prompts each; "
                                f"{f'these are not: {bad}' if bad else f'got only {list(families)}'}")
    return {str(name): list(prompts) for name, prompts in families.items()}


def prompt_states(handle: ModelHandle, prompt: str, layers: list[int]) -> np.ndarray:
    """States `[T, L, D]` of one prompt's tokens (BOS left out) after each of `layers`."""
    tokens = handle.to_tokens(prompt, prepend_bos=True)
    hooks = [f"blocks.{layer}.hook_resid_post" for layer in layers]
    acts = run_hooks(handle, tokens, hooks)
    start = 1 if handle.bos_token_id is not None and int(tokens[0, 0]) == handle.bos_token_id else 0
    return np.stack([acts[h][0, start:].float().cpu().numpy() for h in hooks], axis=1)


def family_depth(
    handle: ModelHandle, families: dict[str, list[str]], layers: list[int], *, k: int = 10,
    space: TrajectorySpace = "raw", n_permutations: int = 2000, seed: int = 0,
) -> dict[str, pl.DataFrame]:
    """Tables `prompts` (per-prompt metrics), `families` (their means per family) and
    `tests` (every family pair x metric: the two means and the permutation p-value)."""
    layers = check_layers(handle, layers)
    rows, clouds, owners = [], [], []
    for family, prompts in families.items():
        for i, prompt in enumerate(prompts):
            H = prompt_states(handle, prompt, layers)
            if len(H) < 1:
                raise InvalidInputError(f"prompt {i} of family {family!r} has no tokens besides BOS")
            t = trajectory_geometry(H, space=space)
            rows.append({"family": family, "prompt": i, "n_tokens": len(H),
                         "convergence_index": float(t.convergence_index.mean()),
                         "curvature": float(np.nanmean(t.curvature)) if np.isfinite(t.curvature).any() else None,
                         "path_length": float(t.step_length.sum(axis=1).mean())})
            clouds.append(H)
            owners.extend([len(rows) - 1] * len(H))
    cloud, owner = np.concatenate(clouds), np.asarray(owners)
    if len(cloud) <= k:
        raise InvalidInputError(f"local dimension with k={k} needs more than {k} tokens; the families have "
                                f"{len(cloud)}: add prompts or lower --k")
    for j, layer in enumerate(layers):
        lid = local_dimension(cloud[:, j], k=k)
        means = np.bincount(owner, lid, minlength=len(rows)) / np.bincount(owner, minlength=len(rows))
        for row, value in zip(rows, means, strict=True):
            row[f"lid_{layer}"] = float(value)
    prompts = pl.DataFrame(rows)
    metrics = [c for c in prompts.columns if c not in ("family", "prompt", "n_tokens")]
    tests: list[dict[str, Any]] = []
    for a, b in combinations(families, 2):
        A = prompts.filter(pl.col("family") == a).select(metrics).to_numpy().astype(np.float64)
        B = prompts.filter(pl.col("family") == b).select(metrics).to_numpy().astype(np.float64)
        A, B = np.nan_to_num(A, nan=0.0), np.nan_to_num(B, nan=0.0)
        p = permutation_p_values(A, B, n_permutations, seed)
        tests.extend({"family_a": a, "family_b": b, "metric": m, "mean_a": float(A[:, i].mean()),
                      "mean_b": float(B[:, i].mean()), "p_value": float(p[i])} for i, m in enumerate(metrics))
    summary = prompts.group_by("family", maintain_order=True).agg(pl.len().alias("n_prompts"),
                                                                  *(pl.col(m).mean() for m in metrics))
    return {"prompts": prompts, "families": summary, "tests": pl.DataFrame(tests)}
