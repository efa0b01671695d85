"""The analysis-run layer of `probes`; its other layers: `sae_atlas.geometry.probes` (maths).

Linear probes on cached activations (`analyses/probe/`): a position ridge probe or a
concept classifier per hook, and k-sparse probes on the neurons of an SAE's hook vs its latents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from sae_atlas.api.analyses.run_files import run_figure
from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.figures import probe_figure
from sae_atlas.geometry.probes import compare_sparse_probes, probe_layers
from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.store.activations import ActivationReader
from sae_atlas.store.analysis_runs import write_analysis


def _hook_acts(atlas: str | Path, hook: str, max_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(acts [N, d], token_ids [N], positions [N])` from the start of a hook's cache (BOS excluded)."""
    rows = list(ActivationReader(atlas, hook).rows("all", max_tokens=max_tokens))
    if not rows:
        raise InvalidInputError(f"hook {hook!r} has no cached tokens")
    return tuple(torch.cat([getattr(r, name) for r in rows]).numpy() for name in ("acts", "token_ids", "positions"))


def run_probe(
    atlas: str | Path,
    hooks: list[str],
    *,
    target: str = "position",
    token_ids: np.ndarray | None = None,
    sae_id: str | None = None,
    max_tokens: int = 20_000,
    ks: tuple[int, ...] = (1, 2, 4, 8, 16),
    seed: int = 0,
    run: str | None = None,
) -> dict[str, Any]:
    """Probes on cached activations of each hook. `target="position"` fits a ridge probe of
    the token position; otherwise `target` names a concept whose `token_ids` are the
    positive class (logistic per layer, plus k-sparse probes on the neurons of the SAE's
    hook vs its latents when `sae_id` is given)."""
    if not hooks:
        raise InvalidInputError("name at least one cached hook to probe")
    layers, labels = {}, None
    for hook in hooks:
        X, toks, pos = _hook_acts(atlas, hook, max_tokens)
        layers[hook] = X
        if target == "position":
            labels = pos.astype(np.float64)
        else:
            if token_ids is None:
                raise InvalidInputError(f"target {target!r} needs the concept's token ids")
            labels = np.isin(toks, token_ids)
    n = min(len(X) for X in layers.values())
    layers = {h: X[:n] for h, X in layers.items()}
    labels = labels[:n]
    kind = "ridge" if target == "position" else "logistic"
    per_layer = probe_layers(layers, labels, kind, seed=seed)
    tables, figures = {"main": per_layer}, []
    run = run or f"{target}-{kind}"
    if sae_id is not None and kind == "logistic":
        sae = load_atlas_sae(atlas, sae_id)
        hook = sae.cfg.hook_name
        X = layers[hook] if hook in layers else _hook_acts(atlas, hook, n)[0][:n]
        with torch.inference_mode():
            latents = sae_codes(sae, torch.as_tensor(X)).float().cpu().numpy()
        tables["sparse"] = compare_sparse_probes({"neurons": X, "latents": latents}, labels, ks, seed=seed)
        figures.append(run_figure(probe_figure(tables["sparse"], f"k-sparse probes: {target}"), atlas, "probe", run, "sparse"))
    figures.append(run_figure(probe_figure(per_layer, f"{kind} probe: {target}"), atlas, "probe", run, "layers"))
    params = {"hooks": hooks, "target": target, "kind": kind, "sae_id": sae_id, "max_tokens": max_tokens,
              "n_rows": n, "positives": int(np.sum(labels)) if kind == "logistic" else None, "ks": list(ks),
              "seed": seed}
    js = write_analysis(atlas, "probe", run, parameters=params, tables=tables, extra={"figures": figures},
                        summary={"best_layer": per_layer.sort("test_score", descending=True)["layer"][0]})
    return {"tables": tables, "params": params, "json_path": js, "figures": figures}
