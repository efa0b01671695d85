"""The maths layer of `emergence`; its other layers: `sae_atlas.api.commands.emergence` (CLI),
`sae_atlas.api.services.emergence` (service).

Where a concept's features emerge over a series of dictionaries (checkpoints, layers or
sizes), read from SAE codes at the concept token.

Per concept and member, the rows are the concept's prompts (positives) and control prompts
(the same templates with other words in the value's place), split once into seeded
training and held-out rows (`geometry.probes.train_test_split`):

- `auroc`: best single-latent selectivity, the held-out AUROC (`geometry.contrast.auroc`)
  of the latent whose training AUROC is highest (its id is `latent`);
- `k1_accuracy`: held-out accuracy of the k = 1 sparse probe (Gurnee et al. 2023, "Finding
  Neurons in a Haystack": the unit with the largest class-mean gap, then a logistic probe;
  `geometry.probes.ksparse_probe`);
- `probe_accuracy`: held-out accuracy of the logistic probe on every latent, beside
  `baseline`, the majority-class share of the held-out rows;
- `value_selectivity` (with the prompts' values): which value rather than whether the
  concept, the largest share of a latent's variance over the concept prompts that their
  value explains (eta squared, `geometry.concept_search.concept_features`, among latents
  active on at least half of some value's prompts; in-sample), and its latent.

Onsets (`onsets`): over the members in the order given, the first that reaches `threshold`
on the chosen metric, the members below it after that (`gaps`), those where it is reached
again after a gap (`reappears`) and the member from which it stays reached (`stable_from`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.concept_search import concept_features
from sae_atlas.geometry.contrast import auroc
from sae_atlas.geometry.emergence_options import METRICS, Metric

SCORE_SCHEMA = {"auroc": pl.Float64, "train_auroc": pl.Float64, "latent": pl.Int64, "k1_accuracy": pl.Float64,
                "probe_accuracy": pl.Float64, "baseline": pl.Float64, "value_selectivity": pl.Float64,
                "value_latent": pl.Int64, "n_concept": pl.Int64, "n_control": pl.Int64}
ONSET_SCHEMA = {"concept": pl.String, "first": pl.String, "first_index": pl.Int64, "stable_from": pl.String,
                "gaps": pl.List(pl.String), "reappears": pl.List(pl.String), "best": pl.String,
                "best_score": pl.Float64}


def member_scores(concept_NF: np.ndarray, control_MF: np.ndarray, values_N: np.ndarray | None = None, *,
                  test_frac: float = 0.25, seed: int = 0) -> dict[str, Any]:
    """Selectivity and probe scores of one member's codes (see the module docstring); the
    value selectivity is None without `values_N` (the concept prompts' values)."""
    # geometry.probes imports scikit-learn, which loads rich (a CLI library): imported on use
    from sae_atlas.geometry.probes import ksparse_probe, logistic_probe, train_test_split

    pos, neg = np.asarray(concept_NF, dtype=np.float64), np.asarray(control_MF, dtype=np.float64)
    if pos.ndim != 2 or neg.ndim != 2 or pos.shape[1] != neg.shape[1]:
        raise InvalidInputError(f"need codes [N, F] and [M, F] of one width, got {pos.shape} and {neg.shape}")
    X = np.concatenate([pos, neg])
    y = np.r_[np.ones(len(pos), dtype=bool), np.zeros(len(neg), dtype=bool)]
    train, test = train_test_split(len(X), test_frac, seed)
    if y[train].all() or not y[train].any() or y[test].all() or not y[test].any():
        raise InvalidInputError("the split left one class out of the training or held-out rows; add prompts")
    train_auc = auroc(X[train][y[train]], X[train][~y[train]])
    gap = X[train][y[train]].mean(0) - X[train][~y[train]].mean(0)
    best = int(np.lexsort((-gap, -train_auc))[0])  # highest training AUROC, then largest mean gap
    held = float(auroc(X[test][y[test]][:, [best]], X[test][~y[test]][:, [best]])[0])
    k1 = ksparse_probe(X, y, 1, test_frac=test_frac, seed=seed)
    full = logistic_probe(X, y, test_frac=test_frac, seed=seed)
    eta2, value_latent = None, None
    if values_N is not None:
        firing = concept_features(pos, np.asarray(values_N))
        if firing.height:
            eta2, value_latent = float(firing["selectivity"].max()), int(firing.sort("selectivity")["latent"][-1])
    return {"auroc": held, "train_auroc": float(train_auc[best]), "latent": best, "k1_accuracy": k1.test_score,
            "probe_accuracy": full.test_score, "baseline": full.baseline, "value_selectivity": eta2,
            "value_latent": value_latent, "n_concept": len(pos), "n_control": len(neg)}


def onsets(passed: list[bool], members: list[str]) -> dict[str, Any]:
    """First member reaching the threshold, the gaps after it, where it re-appears and the
    member from which it stays reached (None when never reached)."""
    if len(passed) != len(members):
        raise InvalidInputError(f"{len(passed)} scores for {len(members)} members")
    hits = [i for i, ok in enumerate(passed) if ok]
    if not hits:
        return {"first": None, "first_index": None, "stable_from": None, "gaps": [], "reappears": []}
    first = hits[0]
    gaps = [members[i] for i in range(first, len(members)) if not passed[i]]
    reappears = [members[i] for i in range(first + 1, len(members)) if passed[i] and not passed[i - 1]]
    stable = None
    if passed[-1]:
        stable = len(members) - 1
        while stable > 0 and passed[stable - 1]:
            stable -= 1
    return {"first": members[first], "first_index": first, "stable_from": None if stable is None else members[stable],
            "gaps": gaps, "reappears": reappears}


def emergence_tables(scores: pl.DataFrame, members: list[str], *, metric: Metric = "auroc",
                     threshold: float = 0.9) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`scores` (columns concept, member and `SCORE_SCHEMA`, one row per pair) with a
    `reached` column, and one onset row per concept (`ONSET_SCHEMA`) in first-seen order."""
    if metric not in METRICS:
        raise InvalidInputError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
    scored = scores.with_columns((pl.col(metric) >= threshold).fill_null(False).alias("reached"))
    rows = []
    for concept in scored["concept"].unique(maintain_order=True).to_list():
        part = scored.filter(pl.col("concept") == concept)
        by_member = {r["member"]: r for r in part.iter_rows(named=True)}
        if set(by_member) != set(members):
            raise InvalidInputError(f"concept {concept!r} is not scored on every member")
        passed = [bool(by_member[m]["reached"]) for m in members]
        values = np.array([np.nan if by_member[m][metric] is None else by_member[m][metric] for m in members])
        best = None if np.isnan(values).all() else int(np.nanargmax(values))
        rows.append({"concept": concept, **onsets(passed, members), "best": None if best is None else members[best],
                     "best_score": None if best is None else float(values[best])})
    return scored, pl.DataFrame(rows, schema=ONSET_SCHEMA)
