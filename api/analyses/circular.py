"""Circular (multi-dimensional) features: the orchestration that composes `saes` and `geometry`.

- `discover_for_sae`: encode a hook's cached activations with an SAE into a sparse CSR
  matrix, run `geometry.circular_discovery`, and store the ranked table under
  `analyses/circular/<run>.*`.
- `run_circle_analysis`: collect activations at a cyclic concept's token (weekdays, months
  or a user set) at several layers and fit a circle probe per layer.
- `run_intervention`: at one layer, move the concept token along the fitted circle (centred
  frame) toward target values and measure the answer's logit difference and accuracy
  against baselines: whole-vector patch from the target prompt, a random subspace of the
  same dimension, and mean ablation of the circle plane.
- `concept_spectra`: Fourier power of SAE features (or residual dimensions) against the
  concept index, grouped by dominant period.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.geometry.circle import (
    TWO_PI,
    CircleProbe,
    fit_circle_probe,
    random_subspace,
    replace_on_circle,
    subspace_replace,
)
from sae_atlas.geometry.circular_discovery import (
    ANALYSIS_KIND,
    DiscoveryParams,
    DiscoveryResult,
    discover_circular,
)
from sae_atlas.geometry.figures_circular import (
    circle_probe_figure,
    cluster_projection_figure,
    intervention_figure,
)
from sae_atlas.geometry.spectra import Spectra, cluster_by_period, fourier_power
from sae_atlas.saes.atlas_saes import hook_of, load_atlas_sae
from sae_atlas.saes.encoding.cached import sae_activation_matrix
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.intervene.answers import answer_metrics, patched_logits
from sae_atlas.saes.intervene.concepts import (
    OrderedConcept,
    TokenizedPrompts,
    collect_concept_activations,
    tokenize_prompts,
    value_token_ids,
)
from sae_atlas.saes.intervene.edits import CirclePlane
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE
from sae_atlas.store import analysis_runs
from sae_atlas.store.activations import ActivationReader, Split
from sae_atlas.store.analysis_runs import MAIN, read_analysis, write_analysis
from sae_atlas.store.atomic import save_png


def run_paths(root: str | Path, run: str) -> tuple[Path, Path]:
    """`(parquet, json)` paths of a run under `analyses/circular/`."""
    return analysis_runs.run_paths(root, ANALYSIS_KIND, run)


def write_circular_run(
    root: str | Path, run: str, result: DiscoveryResult, extra: dict[str, Any] | None = None
) -> tuple[Path, Path]:
    """Store a run with `store.analysis_runs.write_analysis` (table, then the JSON with
    parameters, summary, checksums and `extra`); returns `(parquet, json)`."""
    js = write_analysis(root, ANALYSIS_KIND, run, parameters=result.params.to_dict(), summary=result.summary,
                        tables={MAIN: result.table}, extra=extra)
    return run_paths(root, run)[0], js


# --------------------------------------------------------------------------- discovery


def discover_for_sae(
    atlas: str | Path,
    sae_id: str,
    params: DiscoveryParams | None = None,
    *,
    run: str | None = None,
    split: Split = "heldout",
    max_tokens: int | None = 200_000,
    vocab: list[str] | None = None,
    figures: int = 3,
) -> tuple[DiscoveryResult, Path]:
    """Discover and rank multi-dimensional feature clusters of one SAE of the atlas; write
    `analyses/circular/<run>.parquet/.json` (run defaults to `<sae_id>-<method>`) and PNGs
    of the top `figures` clusters' 2-D projections. Returns the result and the json path."""
    sae = load_atlas_sae(atlas, sae_id)
    hook = hook_of(sae, sae_id)
    reader = ActivationReader(atlas, hook)
    acts, token_ids = sae_activation_matrix(sae, reader, split=split, max_tokens=max_tokens)
    params = params or DiscoveryParams()
    result = discover_circular(sae.W_dec.detach().float().numpy(), acts, token_ids, params, vocab=vocab)
    run = run or f"{sae_id}-{params.method}"
    pq, js = run_paths(atlas, run)
    pngs = []
    for row in result.table.head(figures).iter_rows(named=True):
        path = pq.with_name(f"{run}.cluster-{row['cluster_id']}.png")
        save_png(cluster_projection_figure(row, vocab=vocab), path)
        pngs.append(path.name)
    write_circular_run(
        atlas, run, result,
        extra={"type": "discovery", "sae_id": sae_id, "hook": hook, "split": split,
               "max_tokens": max_tokens, "figures": pngs},
    )
    return result, js


# --------------------------------------------------------------------------- concepts


@dataclass
class CircleAnalysis:
    """Per-layer circle probes of one concept on one model."""

    concept: OrderedConcept
    hooks: dict[int, str]  # layer -> hook
    batch: TokenizedPrompts
    acts: dict[int, np.ndarray]  # layer -> [N, d] at the concept token
    probes: dict[int, CircleProbe]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def values(self) -> np.ndarray:
        return self.batch.values.numpy()

    @property
    def best_layer(self) -> int:
        """Among layers in cyclic order (all layers if none), the one with the largest margin
        of leave-one-out R^2 over the permutation null."""
        cyc = [ly for ly, p in self.probes.items() if p.cyclic_order] or list(self.probes)
        return max(cyc, key=lambda ly: self.probes[ly].r2_loo - self.probes[ly].r2_null)

    def table(self) -> pl.DataFrame:
        """One row per layer: R^2 (in-sample, leave-one-out, permutation null), the
        unsupervised cyclic order and fitted period."""
        rows = []
        for ly in sorted(self.probes):
            p = self.probes[ly]
            rows.append({"layer": ly, "hook": self.hooks[ly], "r2": p.r2, "r2_loo": p.r2_loo,
                         "r2_null": p.r2_null, "cyclic_order": p.cyclic_order,
                         "adjacent_fraction": p.adjacent_fraction, "fitted_period": p.fitted_period,
                         "period_fit": p.period_fit, "mean_plane_variance": p.mean_plane_variance,
                         "order": p.order,
                         "explained_variance_ratio": p.explained_variance_ratio_K.tolist()})
        return pl.DataFrame(rows)


def run_circle_analysis(
    handle: ModelHandle,
    concept: OrderedConcept,
    layers: list[int],
    *,
    hook_kind: str = "hook_resid_post",
    n_components: int = 5,
    batch_size: int = 64,
    prepend_bos: bool = True,
) -> CircleAnalysis:
    """Collect activations at the concept token at `layers` (one pass per batch) and fit a
    circle probe on the top `n_components` PCs at each layer."""
    if not layers:
        raise InvalidInputError("name at least one layer")
    hooks = {ly: handle.check_hook(f"blocks.{ly}.{hook_kind}") for ly in layers}
    batch = tokenize_prompts(handle.tokenizer, concept.prompts(), bos_token_id=handle.bos_token_id,
                             prepend_bos=prepend_bos)
    got = collect_concept_activations(handle, batch, list(hooks.values()), batch_size=batch_size)
    acts = {ly: got[h].numpy().astype(np.float64) for ly, h in hooks.items()}
    values = batch.values.numpy()
    probes = {ly: fit_circle_probe(a, values, concept.period, n_components=n_components) for ly, a in acts.items()}
    params = {"layers": list(layers), "hook_kind": hook_kind, "n_components": n_components,
              "prepend_bos": prepend_bos, "n_prompts": len(batch)}
    return CircleAnalysis(concept, hooks, batch, acts, probes, params)


@dataclass
class InterventionResult:
    """Answer changes per method and target shift at one layer."""

    layer: int
    table: pl.DataFrame  # method, shift, mean_logit_diff, delta_logit_diff, accuracy[, decode_error]
    clean: dict[str, float]
    params: dict[str, Any]

    def by_method(self) -> dict[str, dict[str, float]]:
        """Mean over shifts of each method's numbers."""
        agg = self.table.group_by("method").agg(pl.exclude("shift", "method").mean())
        return {r.pop("method"): r for r in agg.iter_rows(named=True)}


METHODS = ("circle", "patch_layer", "random_subspace", "mean_ablation")


def _target_rows(batch: TokenizedPrompts, targets: np.ndarray) -> np.ndarray:
    """Index of the prompt with the same template and offset but the target value."""
    key = {(p.template, p.offset, p.value): i for i, p in enumerate(batch.prompts)}
    return np.array([key[(p.template, p.offset, int(t))] for p, t in zip(batch.prompts, targets, strict=True)])


def replacements(
    analysis: CircleAnalysis, layer: int, targets: np.ndarray, method: str, *, seed: int = 0
) -> np.ndarray:
    """Replacement activations `[N, d]` at the concept token for one method:

    - circle: the fitted-circle point of the target angle, `x - U U^T (x - m) + U c*`;
    - patch_layer: the whole activation of the prompt with the target value;
    - random_subspace: a seeded random plane's coordinates swapped in from that prompt;
    - mean_ablation: the circle-plane component set to the mean (`c* = 0`).
    """
    probe, X = analysis.probes[layer], analysis.acts[layer]
    if method == "circle":
        return replace_on_circle(probe, X, TWO_PI * targets / analysis.concept.period)
    donor = X[_target_rows(analysis.batch, targets)]
    if method == "patch_layer":
        return donor
    if method == "random_subspace":
        R = random_subspace(X.shape[1], probe.plane_D2.shape[1], seed)
        return subspace_replace(X, R, probe.mean_D, (donor - probe.mean_D) @ R)
    if method == "mean_ablation":
        return subspace_replace(X, probe.plane_D2, probe.mean_D, np.zeros((len(X), probe.plane_D2.shape[1])))
    raise InvalidInputError(f"unknown intervention method {method!r}; valid: {', '.join(METHODS)}")


def _circ_error(a: np.ndarray, b: np.ndarray, period: int) -> float:
    d = np.mod(a - b, period)
    return float(np.minimum(d, period - d).mean())


def run_intervention(
    handle: ModelHandle,
    analysis: CircleAnalysis,
    layer: int,
    *,
    shifts: list[int] | None = None,
    methods: tuple[str, ...] = METHODS,
    decode_layers: list[int] | None = None,
    seed: int = 0,
    batch_size: int = 64,
) -> InterventionResult:
    """Move each prompt's concept value by `shift` steps (target `(a + shift) mod p`) at
    `layer` with each method and measure the answer (needs prompts with offsets) and, at
    `decode_layers` (probed layers at or after `layer`), the probe's decoded value error
    against the target (mean circular distance in value units)."""
    if layer not in analysis.probes:
        raise InvalidInputError(f"layer {layer} was not probed; probed: {sorted(analysis.probes)}")
    p = analysis.concept.period
    shifts = shifts or list(range(1, p))
    decode_layers = decode_layers or []
    bad = [ly for ly in decode_layers if ly not in analysis.probes or ly < layer]
    if bad:
        raise InvalidInputError(f"decode layers {bad} must be probed layers >= {layer}")
    batch, values = analysis.batch, analysis.values
    has_answers = all(pr.answer is not None for pr in batch.prompts)
    capture = tuple(analysis.hooks[ly] for ly in decode_layers)
    if has_answers:
        cand = value_token_ids(handle.tokenizer, analysis.concept)
        offsets = np.array([pr.offset for pr in batch.prompts])
        old = torch.tensor([cand[pr.answer] for pr in batch.prompts])
        clean_logits, _ = patched_logits(handle, batch, batch_size=batch_size)
    rows = []
    for shift in shifts:
        targets = (values + shift) % p
        for method in methods:
            X_new = replacements(analysis, layer, targets, method, seed=seed + shift)
            logits, caps = patched_logits(handle, batch, analysis.hooks[layer], torch.tensor(X_new, dtype=torch.float32),
                                          capture=capture, batch_size=batch_size)
            row: dict[str, Any] = {"method": method, "shift": shift}
            if has_answers:
                new = torch.tensor([cand[(t + o) % p] for t, o in zip(targets, offsets, strict=True)])
                m, c = answer_metrics(logits, old, new, cand), answer_metrics(clean_logits, old, new, cand)
                row.update(mean_logit_diff=m.mean_logit_diff, delta_logit_diff=m.mean_logit_diff - c.mean_logit_diff,
                           accuracy=m.accuracy)
            for ly in decode_layers:
                dec = analysis.probes[ly].decode_value(caps[analysis.hooks[ly]].numpy())
                row[f"decode_error_L{ly}"] = _circ_error(dec, targets, p)
            rows.append(row)
    clean: dict[str, float] = {}
    if has_answers:
        ca = answer_metrics(clean_logits, old, old, cand)
        clean = {"accuracy": ca.accuracy}
    for ly in decode_layers:
        clean[f"decode_error_L{ly}"] = _circ_error(analysis.probes[ly].decode_value(analysis.acts[ly]), values, p)
    params = {"layer": layer, "shifts": shifts, "methods": list(methods), "decode_layers": decode_layers, "seed": seed}
    return InterventionResult(layer, pl.DataFrame(rows), clean, params)


def write_concept_run(
    atlas: str | Path, run: str, analysis: CircleAnalysis, intervention: InterventionResult | None = None,
    *, model: str = "", extra: dict[str, Any] | None = None,
) -> Path:
    """Store a concept run: PNG figures, then `store.analysis_runs.write_analysis` (the
    per-layer probe table and the JSON with parameters, summaries and checksums)."""
    pq, _ = run_paths(atlas, run)
    best = analysis.best_layer
    figs = {"probe": pq.with_name(f"{run}.probe.png")}
    save_png(circle_probe_figure(analysis.table(), analysis.probes[best], analysis.acts[best],
                                 analysis.values, analysis.concept.values, best), figs["probe"])
    meta: dict[str, Any] = {
        "type": "concept", "model": model, "concept": analysis.concept.to_dict(),
        "best_layer": best, "best": analysis.probes[best].summary(),
    }
    if intervention is not None:
        cols = [c for c in intervention.table.columns if c == "delta_logit_diff" or c.startswith("decode_error")]
        if cols:
            figs["intervention"] = pq.with_name(f"{run}.intervention.png")
            save_png(intervention_figure(intervention.table, layer=intervention.layer, metric=cols[0]),
                     figs["intervention"])
        meta["intervention"] = {"parameters": intervention.params, "clean": intervention.clean,
                                "by_method": intervention.by_method(),
                                "rows": intervention.table.to_dicts()}
    meta["figures"] = {k: v.name for k, v in figs.items()}
    meta.update(extra or {})
    return write_analysis(atlas, ANALYSIS_KIND, run, parameters=analysis.params,
                          tables={MAIN: analysis.table(), PLANES: planes_table(analysis)}, extra=meta)


PLANES = "planes"


def planes_table(analysis: CircleAnalysis) -> pl.DataFrame:
    """One row per probed layer with the fitted circle as arrays (mean, plane basis
    flattened `[d, 2]`, map `A` flattened `[2, 2]`, centre `c0`): what `rotate` edits read."""
    rows = [{"layer": ly, "hook": analysis.hooks[ly], "period": p.period, "mean": p.mean_D.tolist(),
             "basis": p.plane_D2.reshape(-1).tolist(), "circle_A": p.circle_A_22.reshape(-1).tolist(),
             "circle_c0": p.circle_c0_2.tolist()} for ly, p in sorted(analysis.probes.items())]
    return pl.DataFrame(rows)


def read_circle_plane(atlas: str | Path, run: str, layer: int | None = None) -> CirclePlane:
    """The fitted circle of a stored concept run at `layer` (default: its best layer)."""
    stored = read_analysis(atlas, ANALYSIS_KIND, run)
    if stored.meta.get("type") != "concept":
        raise InvalidInputError(f"circular run {run!r} is not a concept run (`analyze circular concept`)")
    if PLANES not in stored.tables:
        raise InvalidInputError(f"concept run {run!r} stores no circle planes; re-run "
                                f"`sae-atlas analyze circular concept --atlas {atlas} --run {run}`")
    layer = int(stored.meta["best_layer"]) if layer is None else layer
    rows = stored.tables[PLANES].filter(pl.col("layer") == layer).to_dicts()
    if not rows:
        raise NotFoundError(f"concept run {run!r} did not probe layer {layer}; probed: "
                            f"{stored.tables[PLANES]['layer'].to_list()}")
    r = rows[0]
    return CirclePlane(r["hook"], int(r["period"]), np.array(r["mean"]), np.array(r["basis"]).reshape(-1, 2),
                       np.array(r["circle_A"]).reshape(2, 2), np.array(r["circle_c0"]))


# --------------------------------------------------------------------------- spectra


def spectra_summary(spectra: Spectra, groups: dict[float, np.ndarray], top: int = 10) -> dict[str, Any]:
    """JSON-ready summary: per dominant period, the feature count and the `top` features
    with the most non-constant power."""
    out = {}
    for period, feats in groups.items():
        order = feats[np.argsort(-spectra.total_power_F[feats], kind="stable")][:top]
        out[f"{period:g}"] = {"n_features": int(len(feats)), "top_features": order.tolist()}
    return {"period": spectra.period, "by_period": out}


def concept_spectra(
    analysis: CircleAnalysis, layer: int, sae: SAE | None = None, *, min_share: float = 0.5
) -> tuple[Spectra, dict[float, np.ndarray]]:
    """Fourier power against the concept index of SAE features at `layer` (residual
    dimensions when `sae` is None), and the features grouped by dominant period."""
    X = analysis.acts[layer]
    if sae is not None:
        with torch.inference_mode():
            X = sae_codes(sae, torch.as_tensor(X)).float().cpu().numpy()
    spectra = fourier_power(X, analysis.values, analysis.concept.period)
    return spectra, cluster_by_period(spectra, min_share=min_share)
