"""Which SAE features carry a concept, and which few span its subspace.

Inputs, for `N` prompts that each show one of `P` concept values (weekdays, colours...):
the residual activations at the concept token `X [N, d]`, the SAE's feature activations
there `A [N, F]`, the value of each prompt, and the SAE's decoder rows `W_dec [F, d]`.

1. Concept features (`concept_features`): a feature fires on the concept when, for some
   value, it is active on at least `min_fire_rate` of that value's prompts; it is
   selective when the value explains at least `min_selectivity` of its activation
   variance (eta squared: between-value over total sum of squares).
2. Span (`greedy_span`): the variation of the concept across values is the centred matrix
   of per-value mean residuals `M [P, d]`; for ordered (cyclic) values only its part that
   turns once around the cycle (`cyclic_component`, the first Fourier mode: each value's
   own token identity is not the concept's order). Selective features are added greedily,
   each time the one whose decoder direction,
   orthogonalised against those chosen, adds the most explained variance
   `||M Q||^2 / ||M||^2`, until `target` is reached or no candidate adds `min_gain`.
3. Fit (`span_fit`): the activations projected on the span's orthonormal basis. Ordered
   (cyclic) values: a circle probe (`geometry.circle`: R^2, leave-one-out R^2, cyclic
   order, fitted period). Categories: stratified cross-validated accuracy of linear
   discriminant analysis, beside chance (1 / P).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import polars as pl

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.circle import fit_circle_probe
from sae_atlas.geometry.vectors import unit_rows

MIN_PER_CATEGORY = 3
ConceptKind = Literal["ordered", "categories"]
KINDS: tuple[str, ...] = ("ordered", "categories")
FEATURE_SCHEMA = {"latent": pl.Int64, "fire_rate": pl.Float64, "best_value": pl.Int64,
                  "mean_act": pl.Float64, "selectivity": pl.Float64, "selective": pl.Boolean}


@dataclass
class Span:
    """The greedy span: latents in the order chosen, cumulative explained variance after
    each, and the orthonormal basis `[d, k]` of their decoder directions."""

    latents: list[int]
    explained: list[float]
    basis_DK: np.ndarray

    @property
    def total(self) -> float:
        return self.explained[-1] if self.explained else 0.0


@dataclass
class ConceptSearchFit:
    """One SAE's answer: concept features, span and the span's geometry fit."""

    kind: str
    features: pl.DataFrame  # FEATURE_SCHEMA, selective first, by selectivity
    span: Span
    fit: dict[str, Any] = field(default_factory=dict)

    @property
    def score(self) -> float:
        """Held-out quality of the span's fit: leave-one-out circle R^2 (ordered, halved
        when the order is not cyclic) or cross-validated LDA accuracy (categories); -inf
        when the span is too small to fit."""
        score = self.fit.get("score")
        return float("-inf") if score is None else float(score)

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary (span, explained variance, fit)."""
        return {"kind": self.kind, "n_features": self.features.height,
                "n_selective": int(self.features["selective"].sum()), "span": self.span.latents,
                "explained": self.span.explained, "fit": self.fit, "score": self.fit.get("score")}


def _check(X_ND: np.ndarray, A_NF: np.ndarray, values_N: np.ndarray, n_values: int) -> tuple[np.ndarray, ...]:
    X = np.asarray(X_ND, dtype=np.float64)
    A = np.asarray(A_NF, dtype=np.float64)
    v = np.asarray(values_N)
    if X.ndim != 2 or A.ndim != 2 or len(X) != len(A) or v.shape != (len(X),):
        raise InvalidInputError(f"need X [N, d], A [N, F] and values [N]; got {X.shape}, {A.shape}, {v.shape}")
    if not np.issubdtype(v.dtype, np.integer) or v.min() < 0 or v.max() >= n_values:
        raise InvalidInputError(f"values must be integers in [0, {n_values})")
    if len(np.unique(v)) < 2:
        raise InvalidInputError("a concept search needs prompts of at least 2 values")
    return X, A, v.astype(np.int64)


def value_means(Y_NK: np.ndarray, values_N: np.ndarray) -> np.ndarray:
    """Mean row per present value, `[P_present, K]`, values ascending."""
    present = np.unique(values_N)
    return np.stack([Y_NK[values_N == p].mean(0) for p in present])


def cyclic_component(M_PD: np.ndarray, values_P: np.ndarray, period: int) -> np.ndarray:
    """The part of the centred per-value means that turns once around the cycle: their
    least-squares fit by `[cos 2 pi a / p, sin 2 pi a / p] B` (the first Fourier mode)."""
    M = M_PD - M_PD.mean(0)
    theta = 2 * np.pi * np.asarray(values_P, dtype=np.float64) / period
    C = np.c_[np.cos(theta), np.sin(theta)]
    B, *_ = np.linalg.lstsq(C, M, rcond=None)
    return C @ B


def concept_features(
    A_NF: np.ndarray, values_N: np.ndarray, *, min_fire_rate: float = 0.5, min_selectivity: float = 0.5,
) -> pl.DataFrame:
    """The features that fire on the concept tokens (see the module docstring), selective
    ones first, each group by selectivity (eta squared) descending."""
    A = np.asarray(A_NF, dtype=np.float64)
    v = np.asarray(values_N)
    present = np.unique(v)
    rates = np.stack([(A[v == p] > 0).mean(0) for p in present])  # [P, F]
    fires = np.flatnonzero(rates.max(0) >= min_fire_rate)
    if fires.size == 0:
        return pl.DataFrame(schema=FEATURE_SCHEMA)
    sub = A[:, fires]
    means = value_means(sub, v)
    counts = np.array([(v == p).sum() for p in present])[:, None]
    between = (counts * (means - sub.mean(0)) ** 2).sum(0)
    total = ((sub - sub.mean(0)) ** 2).sum(0)
    eta2 = np.divide(between, total, out=np.zeros_like(between), where=total > 0)
    frame = pl.DataFrame({
        "latent": fires, "fire_rate": (sub > 0).mean(0), "best_value": present[rates[:, fires].argmax(0)],
        "mean_act": sub.mean(0), "selectivity": eta2, "selective": eta2 >= min_selectivity,
    }, schema=FEATURE_SCHEMA)
    return frame.sort(["selective", "selectivity"], descending=[True, True])


def greedy_span(
    M_PD: np.ndarray, W_dec_FD: np.ndarray, candidates: np.ndarray, *, target: float = 0.9,
    min_gain: float = 0.02, max_features: int = 8,
) -> Span:
    """Greedy forward selection of decoder directions that explain the centred per-value
    means `M_PD` (see the module docstring)."""
    M = np.asarray(M_PD, dtype=np.float64)
    M = M - M.mean(0)
    total = float((M**2).sum())
    d = M.shape[1]
    chosen: list[int] = []
    explained: list[float] = []
    Q = np.zeros((d, 0))
    if total <= 0 or len(candidates) == 0:
        return Span(chosen, explained, Q)
    W = np.asarray(W_dec_FD, dtype=np.float64)[np.asarray(candidates, dtype=np.int64)]
    W = unit_rows(W, np.float64)
    residual = W.copy()  # candidate directions with the chosen span projected out
    available = np.ones(len(W), dtype=bool)
    current = 0.0
    while len(chosen) < max_features and current < target and available.any():
        norms = np.linalg.norm(residual, axis=1)
        usable = available & (norms > 1e-6)
        if not usable.any():
            break
        dirs = residual / np.maximum(norms, 1e-12)[:, None]
        gains = np.where(usable, ((M @ dirs.T) ** 2).sum(0) / total, -np.inf)
        best = int(np.argmax(gains))
        if gains[best] < min_gain:
            break
        q = dirs[best]
        Q = np.c_[Q, q]
        residual -= np.outer(residual @ q, q)
        available[best] = False
        chosen.append(int(candidates[best]))
        current = float(((M @ Q) ** 2).sum() / total)
        explained.append(current)
    return Span(chosen, explained, Q)


def span_fit(
    X_ND: np.ndarray, values_N: np.ndarray, basis_DK: np.ndarray, kind: ConceptKind, n_values: int, *, seed: int = 0,
) -> dict[str, Any]:
    """Geometry of the concept inside the span (see the module docstring); `score` is the
    held-out quality used to compare SAEs."""
    k = basis_DK.shape[1]
    Z = (np.asarray(X_ND, dtype=np.float64) - np.mean(X_ND, axis=0)) @ basis_DK
    if kind == "ordered":
        if k < 2:
            return {"dimension": k, "score": None,
                    "note": "a circle needs a span of at least 2 selective features"}
        try:
            probe = fit_circle_probe(Z, values_N, n_values, n_components=min(5, k), seed=seed)
        except InvalidInputError as exc:  # e.g. the prompts' activations barely vary inside the span
            return {"dimension": k, "score": None, "note": str(exc)}
        out = {"dimension": k, **probe.summary()}
        out["score"] = probe.r2_loo if probe.cyclic_order else probe.r2_loo / 2
        return out
    counts = np.bincount(values_N)
    fewest = int(counts[counts > 0].min())
    if k < 1 or fewest < MIN_PER_CATEGORY:  # LDA needs more training rows than classes in every fold
        return {"dimension": k, "score": None, "chance": 1 / len(np.unique(values_N)),
                "note": f"LDA needs a non-empty span and at least {MIN_PER_CATEGORY} prompts per value"}
    folds = min(5, fewest)
    # scikit-learn is imported on use: importing it loads rich (a CLI library)
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    cv = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    accuracy = cross_val_score(LinearDiscriminantAnalysis(), Z, values_N, cv=cv).mean()
    return {"dimension": k, "lda_accuracy": float(accuracy), "chance": 1 / len(np.unique(values_N)),
            "folds": folds, "score": float(accuracy)}


def search_concept(
    X_ND: np.ndarray, A_NF: np.ndarray, values_N: np.ndarray, W_dec_FD: np.ndarray, kind: ConceptKind,
    n_values: int, *, min_fire_rate: float = 0.5, min_selectivity: float = 0.5, target: float = 0.9,
    min_gain: float = 0.02, max_features: int = 8, seed: int = 0,
) -> ConceptSearchFit:
    """Concept features, greedy span and its fit for one SAE (the module docstring)."""
    if kind not in KINDS:
        raise InvalidInputError(f"unknown concept kind {kind!r}; valid: {', '.join(KINDS)}")
    X, A, v = _check(X_ND, A_NF, values_N, n_values)
    if W_dec_FD.shape != (A.shape[1], X.shape[1]):
        raise InvalidInputError(f"decoder must be [F, d] = [{A.shape[1]}, {X.shape[1]}], got {W_dec_FD.shape}")
    features = concept_features(A, v, min_fire_rate=min_fire_rate, min_selectivity=min_selectivity)
    selective = features.filter(pl.col("selective"))["latent"].to_numpy()
    means = value_means(X, v)
    if kind == "ordered":
        means = cyclic_component(means, np.unique(v), n_values)
    span = greedy_span(means, W_dec_FD, selective, target=target, min_gain=min_gain,
                       max_features=max_features)
    return ConceptSearchFit(kind, features, span, span_fit(X, v, span.basis_DK, kind, n_values, seed=seed))
