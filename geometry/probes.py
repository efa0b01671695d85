"""The maths layer of `probes`; its other layers: `sae_atlas.api.analyses.probes` (analysis-run).

Linear probes over activations: difference of means, logistic regression, k-sparse
probes (Gurnee et al. 2023, "Finding Neurons in a Haystack": rank units by the class
mean difference, fit a logistic probe on the top k) to compare neurons with SAE latents,
SAEBench's sparse-probing accuracies built from them, and ridge regression for ordered
quantities (years, positions), one per layer.

Every probe is scored on a seeded held-out split, beside the majority-class (or
mean-prediction) baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np
import polars as pl
from scipy import sparse
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import r2_score

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.splits import split_rows

ProbeKind = Literal["diff_means", "logistic", "ridge"]
KINDS: tuple[ProbeKind, ...] = get_args(ProbeKind)
ClassWeight = Literal["balanced"] | None


@dataclass
class ProbeResult:
    """One fitted probe: its direction (in the input's coordinates), scores, units used."""

    kind: str
    direction_D: np.ndarray
    bias: float
    train_score: float  # accuracy (classifiers) or R^2 (ridge)
    test_score: float
    baseline: float  # majority-class accuracy or R^2 of the mean (0)
    features: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # units used


def train_test_split(n: int, test_frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded `(train, test)` index split of `n` rows for a probe (`geometry.splits`; a probe
    needs >= 4 rows)."""
    if not 0 < test_frac < 1 or n < 4:
        raise InvalidInputError(f"need >= 4 rows and test_frac in (0, 1), got n={n}, test_frac={test_frac}")
    return split_rows(n, test_frac, np.random.default_rng(seed))


def _check(X: np.ndarray, y: np.ndarray, binary: bool) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    if X.ndim != 2 or len(X) != len(y):
        raise InvalidInputError(f"X must be [N, d] with one target per row, got X {X.shape}, y {y.shape}")
    if binary:
        y = y.astype(bool)
        if y.all() or not y.any():
            raise InvalidInputError("a classification probe needs both classes among the labels")
    return X, y


def _accuracy(scores: np.ndarray, y: np.ndarray) -> float:
    return float(((scores > 0) == y).mean())


def diff_means_probe(X_ND: np.ndarray, y_N: np.ndarray, *, test_frac: float = 0.25, seed: int = 0) -> ProbeResult:
    """Direction = mean(positive) - mean(negative); threshold at the midpoint of the class means."""
    X, y = _check(X_ND, y_N, True)
    tr, te = train_test_split(len(X), test_frac, seed)
    mu1, mu0 = X[tr][y[tr]].mean(0), X[tr][~y[tr]].mean(0)
    w = mu1 - mu0
    b = -float(w @ (mu1 + mu0) / 2)
    return ProbeResult("diff_means", w, b, _accuracy(X[tr] @ w + b, y[tr]), _accuracy(X[te] @ w + b, y[te]),
                       float(max(y[te].mean(), 1 - y[te].mean())), np.arange(X.shape[1]))


def logistic_probe(
    X_ND: np.ndarray, y_N: np.ndarray, *, C: float = 1.0, test_frac: float = 0.25, seed: int = 0,
    features: np.ndarray | None = None, class_weight: ClassWeight = None,
) -> ProbeResult:
    """L2-regularised logistic regression (on `features` columns only when given;
    `class_weight="balanced"` weighs each class by the inverse of its frequency)."""
    X, y = _check(X_ND, y_N, True)
    cols = np.arange(X.shape[1]) if features is None else np.asarray(features, dtype=np.int64)
    tr, te = train_test_split(len(X), test_frac, seed)
    mu, sd = X[tr][:, cols].mean(0), X[tr][:, cols].std(0) + 1e-8
    Z = (X[:, cols] - mu) / sd
    model = LogisticRegression(C=C, max_iter=2000, random_state=seed, class_weight=class_weight).fit(Z[tr], y[tr])
    w_std = model.coef_.ravel()
    w = np.zeros(X.shape[1])
    w[cols] = w_std / sd
    b = float(model.intercept_[0] - (w_std * mu / sd).sum())
    return ProbeResult("logistic", w, b, float(model.score(Z[tr], y[tr])), float(model.score(Z[te], y[te])),
                       float(max(y[te].mean(), 1 - y[te].mean())), cols)


def ksparse_probe(
    X_ND: np.ndarray, y_N: np.ndarray, k: int, *, C: float = 1.0, test_frac: float = 0.25, seed: int = 0
) -> ProbeResult:
    """Logistic probe on the k units with the largest |mean difference| between the classes
    (ranked on the training rows only)."""
    X, y = _check(X_ND, y_N, True)
    if not 1 <= k <= X.shape[1]:
        raise InvalidInputError(f"k must be in 1..{X.shape[1]}, got {k}")
    tr, _ = train_test_split(len(X), test_frac, seed)
    gap = np.abs(X[tr][y[tr]].mean(0) - X[tr][~y[tr]].mean(0))
    top = np.argsort(-gap, kind="stable")[:k]
    result = logistic_probe(X, y, C=C, test_frac=test_frac, seed=seed, features=top)
    result.kind = f"ksparse_{k}"
    return result


def l1_ranked_units(X_ND: np.ndarray, y_N: np.ndarray, *, l1_decay: float = 0.01,
                    class_weight: ClassWeight = "balanced") -> np.ndarray:
    """Every unit, most positive weight first, of an L1-regularised logistic probe on the raw
    `X` (all rows; pass training rows only): SAEBench's latent choice for k-sparse probes,
    the top k of this order. `l1_decay` is the L1 strength per row (mean loss + decay * |w|_1).
    The fit reads `X` as a sparse matrix (SAE codes are mostly zeros)."""
    y = np.asarray(y_N).astype(bool)
    if X_ND.ndim != 2 or len(X_ND) != len(y) or y.all() or not y.any():
        raise InvalidInputError(f"need X [N, d] with one label per row and both classes, got X {X_ND.shape}")
    X = sparse.csr_matrix(X_ND, dtype=np.float64)
    model = LogisticRegression(l1_ratio=1.0, solver="liblinear", C=1.0 / (l1_decay * X.shape[0]),
                               class_weight=class_weight, max_iter=2000, random_state=0).fit(X, y)
    return np.argsort(-model.coef_.ravel(), kind="stable")


def sparse_probing_accuracies(
    bases: dict[str, np.ndarray], y_N: np.ndarray, ks: tuple[int, ...] = (1, 2, 5), *,
    test_frac: float = 0.25, seed: int = 0,
) -> dict[str, float]:
    """SAEBench's sparse-probing scores of binary labels on several bases of the same rows
    (e.g. `{"llm": residuals, "sae": latents}`): `<basis>_test_accuracy` of the logistic probe
    on every unit and `<basis>_top_<k>_test_accuracy` of the k-sparse probe (held-out split;
    k larger than a basis' width is skipped)."""
    scores = {}
    for name, X in bases.items():
        scores[f"{name}_test_accuracy"] = logistic_probe(X, y_N, test_frac=test_frac, seed=seed).test_score
        for k in ks:
            if k <= np.asarray(X).shape[1]:
                scores[f"{name}_top_{k}_test_accuracy"] = ksparse_probe(X, y_N, k, test_frac=test_frac,
                                                                        seed=seed).test_score
    return scores


def ridge_probe(
    X_ND: np.ndarray, values_N: np.ndarray, *, alpha: float = 1.0, test_frac: float = 0.25, seed: int = 0
) -> ProbeResult:
    """Ridge regression of an ordered quantity; scores are held-out R^2 (baseline 0)."""
    X, v = _check(X_ND, values_N, False)
    v = v.astype(np.float64)
    tr, te = train_test_split(len(X), test_frac, seed)
    model = Ridge(alpha=alpha).fit(X[tr], v[tr])
    return ProbeResult("ridge", model.coef_.ravel().copy(), float(model.intercept_),
                       float(r2_score(v[tr], model.predict(X[tr]))), float(r2_score(v[te], model.predict(X[te]))),
                       0.0, np.arange(X.shape[1]))


def compare_sparse_probes(
    bases: dict[str, np.ndarray], y_N: np.ndarray, ks: tuple[int, ...] = (1, 2, 4, 8, 16), *,
    test_frac: float = 0.25, seed: int = 0,
) -> pl.DataFrame:
    """k-sparse probes on several bases of the same tokens (e.g. `{"neurons": resid,
    "latents": sae_acts}`): one row per (basis, k) with held-out accuracy and units used."""
    rows = []
    for name, X in bases.items():
        for k in ks:
            if k > np.asarray(X).shape[1]:
                continue
            r = ksparse_probe(X, y_N, k, test_frac=test_frac, seed=seed)
            rows.append({"basis": name, "k": k, "train_accuracy": r.train_score, "test_accuracy": r.test_score,
                         "baseline": r.baseline, "features": r.features.tolist()})
    return pl.DataFrame(rows, schema={"basis": pl.String, "k": pl.Int64, "train_accuracy": pl.Float64,
                                      "test_accuracy": pl.Float64, "baseline": pl.Float64,
                                      "features": pl.List(pl.Int64)})


def probe_layers(
    layers: dict[str, np.ndarray], target_N: np.ndarray, kind: ProbeKind = "logistic", *,
    test_frac: float = 0.25, seed: int = 0, **options: float,
) -> pl.DataFrame:
    """One probe of `kind` per layer (`{hook: X [N, d]}`, same rows and target for all):
    columns layer, kind, train_score, test_score, baseline."""
    fns = {"diff_means": diff_means_probe, "logistic": logistic_probe, "ridge": ridge_probe}
    if kind not in fns:
        raise InvalidInputError(f"unknown probe kind {kind!r}; valid: {', '.join(KINDS)}")
    rows = []
    for layer, X in layers.items():
        r = fns[kind](X, target_N, test_frac=test_frac, seed=seed, **options)
        rows.append({"layer": layer, "kind": kind, "train_score": r.train_score, "test_score": r.test_score,
                     "baseline": r.baseline})
    return pl.DataFrame(rows, schema={"layer": pl.String, "kind": pl.String, "train_score": pl.Float64,
                                      "test_score": pl.Float64, "baseline": pl.Float64})
