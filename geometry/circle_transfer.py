"""The maths layer of `circle_transfer`; its other layers: `sae_atlas.api.services.circle_transfer`
(service).

Does a circle found in one representation exist in another? The circle probe of Engels
et al. 2024 ("Not All Language Model Features Are Linear", section 4) fitted again in B.

Inputs: the activations at the concept token of the same concept prompts on side A and on
side B (`X [N, d]`, another layer, SAE or model; B may use another basis or width), the
concept value of each prompt and, per side, optionally its SAE codes and decoder rows.
Rows per side and space:

- `residual`: the circle probe (`geometry.circle.fit_circle_probe`) on the activations:
  R^2, leave-one-out R^2, the cyclic order read without supervision and the fitted period;
  null: the value labels relabelled by random permutations (p-value of the in-sample R^2).
- `span`: with SAE codes, the concept search's greedy span of selective features and its
  circle fit (`geometry.concept_search`); null: the same fit in spans of as many seeded
  random directions (p-value of the leave-one-out R^2).
- On B only, when both sides share `d`: `a_probe`, A's fitted probe read unchanged on B
  (R^2 of its `(cos, sin)` output; null: relabelled values), and `a_span`, the circle
  fitted inside A's span basis. They stay high only when B keeps A's coordinates (a
  fine-tuned model); the refitted rows find the circle in whatever basis B uses.

`order_matches_a`: the values sorted by angle in B form the same cycle as in A, up to a
rotation and a reflection (Monday..Sunday read either way round).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.circle import (
    CircleProbe,
    circular_order,
    fit_circle_probe,
    fit_period,
    random_subspace,
    value_angle,
)
from sae_atlas.geometry.concept_search import search_concept, span_fit

SIDES = ("A", "B")
SCHEMA = {"side": pl.String, "space": pl.String, "dimension": pl.Int64, "r2": pl.Float64, "r2_loo": pl.Float64,
          "null": pl.String, "null_mean": pl.Float64, "p_value": pl.Float64, "cyclic_order": pl.Boolean,
          "fitted_period": pl.Float64, "period_fit": pl.Float64, "order": pl.List(pl.String),
          "order_matches_a": pl.Boolean, "latents": pl.List(pl.Int64), "note": pl.String}


@dataclass
class SideActivations:
    """One side at the concept token: activations `[N, d]`, optionally SAE codes `[N, F]`
    and decoder rows `[F, d]`."""

    X_ND: np.ndarray
    codes_NF: np.ndarray | None = None
    W_dec_FD: np.ndarray | None = None


@dataclass
class CircleTransfer:
    """One row per (side, space) (`SCHEMA`), a JSON-ready summary, and each probe's output
    `[N, 2]` (approximately `(cos, sin)` of the value's angle) by `<side>_<space>` for the
    figure."""

    table: pl.DataFrame
    summary: dict[str, Any]
    outputs: dict[str, np.ndarray]


def same_cycle(a: list[int], b: list[int]) -> bool:
    """Whether `b` is `a` read around the circle from another start, in either direction."""
    if len(a) != len(b) or sorted(a) != sorted(b) or not a:
        return False
    for seq in (list(b), list(reversed(b))):
        start = seq.index(a[0])
        if seq[start:] + seq[:start] == list(a):
            return True
    return False


def _p_value(null: np.ndarray, score: float) -> float:
    return float((1 + (null >= score).sum()) / (1 + len(null))) if len(null) else float("nan")


def _row(side: str, space: str, names: list[str], **fields: Any) -> dict[str, Any]:
    row = {key: None for key in SCHEMA} | {"side": side, "space": space} | fields
    if row["order"] is not None:
        row["order"] = [names[v] for v in row["order"]]
    return row


def _probe_row(side: str, probe: CircleProbe, names: list[str]) -> dict[str, Any]:
    return _row(side, "residual", names, dimension=len(probe.components_KD), r2=probe.r2, r2_loo=probe.r2_loo,
                null="relabelled values", null_mean=probe.r2_null, p_value=probe.r2_p_value,
                cyclic_order=probe.cyclic_order, fitted_period=probe.fitted_period, period_fit=probe.period_fit,
                order=probe.order)


def _span_row(side: str, space: str, X_ND: np.ndarray, values_N: np.ndarray, period: int, basis_DK: np.ndarray,
              latents: list[int], names: list[str], *, n_random: int, seed: int) -> dict[str, Any]:
    """The circle fit inside a span basis, beside spans of as many random directions."""
    fit = span_fit(X_ND, values_N, basis_DK, "ordered", period, seed=seed)
    if fit.get("score") is None:
        return _row(side, space, names, dimension=basis_DK.shape[1], latents=latents, note=fit.get("note"))
    k = basis_DK.shape[1]
    null = [span_fit(X_ND, values_N, random_subspace(X_ND.shape[1], k, seed + 1 + i), "ordered", period,
                     seed=seed).get("r2_loo") for i in range(n_random)]
    null_R = np.array([np.nan if v is None else v for v in null], dtype=np.float64)
    null_R = null_R[~np.isnan(null_R)]
    return _row(side, space, names, dimension=k, r2=fit["r2"], r2_loo=fit["r2_loo"], null="random directions",
                null_mean=float(null_R.mean()) if len(null_R) else None, p_value=_p_value(null_R, fit["r2_loo"]),
                cyclic_order=fit["cyclic_order"], fitted_period=fit["fitted_period"], period_fit=fit["period_fit"],
                order=fit["order"], latents=latents)


def _target_r2(P_N2: np.ndarray, values_N: np.ndarray, period: int) -> float:
    theta = value_angle(values_N, period)
    T = np.c_[np.cos(theta), np.sin(theta)]
    return float(1 - ((T - P_N2) ** 2).sum() / ((T - T.mean(0)) ** 2).sum())


def _read_probe_row(probe: CircleProbe, X_ND: np.ndarray, values_N: np.ndarray, names: list[str], *, n_null: int,
                    seed: int) -> dict[str, Any]:
    """A's probe read unchanged on B: R^2 of its output against the true angles, beside the
    same R^2 against relabelled values; the order of the per-value mean outputs' angles."""
    period = probe.period
    P = probe.predict(X_ND)
    r2 = _target_r2(P, values_N, period)
    rng = np.random.default_rng(seed)
    null = np.array([_target_r2(P, rng.permutation(period)[values_N], period) for _ in range(n_null)])
    angles = np.full(period, np.nan)
    for v in np.unique(values_N):
        m = P[values_N == v].mean(0)
        angles[v] = np.mod(np.arctan2(m[1], m[0]), 2 * np.pi)
    order, cyclic, _ = circular_order(angles)
    fitted, resultant = fit_period(angles)
    return _row("B", "a_probe", names, dimension=len(probe.components_KD), r2=r2, null="relabelled values",
                null_mean=float(null.mean()) if n_null else None, p_value=_p_value(null, r2), cyclic_order=cyclic,
                fitted_period=fitted, period_fit=resultant, order=order)


def circle_transfer(
    a: SideActivations, b: SideActivations, values_N: np.ndarray, names: list[str], *, n_components: int = 5,
    n_null: int = 200, n_random: int = 50, alpha: float = 0.05, seed: int = 0, **search: Any,
) -> CircleTransfer:
    """Fit the concept's circle on both sides (see the module docstring); `names` are the
    concept's values in order (period = their number); `search` goes to `search_concept`."""
    period = len(names)
    values = np.asarray(values_N)
    for side, s in zip(SIDES, (a, b), strict=True):
        if np.asarray(s.X_ND).shape[0] != len(values):
            raise InvalidInputError(f"side {side}: {np.asarray(s.X_ND).shape[0]} rows for {len(values)} prompts")
        if (s.codes_NF is None) != (s.W_dec_FD is None):
            raise InvalidInputError(f"side {side}: give SAE codes and decoder rows together")
    probes, spans, rows, outputs = {}, {}, [], {}
    for side, s in zip(SIDES, (a, b), strict=True):
        X = np.asarray(s.X_ND, dtype=np.float64)
        probes[side] = fit_circle_probe(X, values, period, n_components=n_components, n_null=n_null, seed=seed)
        rows.append(_probe_row(side, probes[side], names))
        outputs[f"{side}_residual"] = probes[side].predict(X)
        if s.codes_NF is not None:
            fit = search_concept(X, s.codes_NF, values, s.W_dec_FD, "ordered", period, seed=seed, **search)
            spans[side] = fit.span
            rows.append(_span_row(side, "span", X, values, period, fit.span.basis_DK, fit.span.latents, names,
                                  n_random=n_random, seed=seed))
    X_B = np.asarray(b.X_ND, dtype=np.float64)
    if np.asarray(a.X_ND).shape[1] == X_B.shape[1]:
        rows.append(_read_probe_row(probes["A"], X_B, values, names, n_null=n_null, seed=seed))
        outputs["B_a_probe"] = probes["A"].predict(X_B)
        if "A" in spans:
            rows.append(_span_row("B", "a_span", X_B, values, period, spans["A"].basis_DK, spans["A"].latents,
                                  names, n_random=n_random, seed=seed))
    table = pl.DataFrame(rows, schema=SCHEMA)
    a_order = [names.index(v) for v in table.row(0, named=True)["order"]]
    matches = [None if o is None else same_cycle(a_order, [names.index(v) for v in o]) for o in table["order"]]
    table = table.with_columns(pl.Series("order_matches_a", matches, dtype=pl.Boolean))
    return CircleTransfer(table, _summary(table, alpha, period), outputs)


def _summary(table: pl.DataFrame, alpha: float, period: int) -> dict[str, Any]:
    """Per side and space: R^2, p-value, period and order match; `found_in_b`: some space of
    B (refitted, or A's probe or span read there) beats its null at `alpha` in A's cyclic
    order."""
    fits = {f"{r['side']}_{r['space']}": {k: r[k] for k in ("r2", "r2_loo", "null_mean", "p_value", "cyclic_order",
                                                            "fitted_period", "order", "order_matches_a")}
            for r in table.iter_rows(named=True)}
    found = any(r["p_value"] is not None and r["p_value"] <= alpha and bool(r["order_matches_a"])
                for r in table.filter(pl.col("side") == "B").iter_rows(named=True))
    return {"period": period, "alpha": alpha, "found_in_b": found, "fits": fits}
