"""Vector representations of token-set concepts (Park et al. 2024, "The Geometry of
Categorical and Hierarchical Concepts in Large Language Models").

For the causal-basis vectors `g(y)` of a concept's tokens W: `gbar = mean g(y)`,
`Sigma = LedoitWolf(g(y))`, `gt = pinv(Sigma) gbar / ||.||` and `l_W = (gbar . gt) gt`
(the "lda" estimator: the direction along which the concept's tokens project most
consistently, scaled so that they project to ~1). The "mean" estimator is `l_W = gbar`.
The check: held-out tokens of the concept project to ~1 (`g . l / ||l||^2`), random
vocabulary tokens to ~0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.splits import split_rows

Estimator = Literal["lda", "mean"]
ESTIMATORS: tuple[Estimator, ...] = get_args(Estimator)


def concept_vector(g_ND: np.ndarray, *, estimator: Estimator = "lda") -> np.ndarray:
    """The concept vector `l_W [d]` of the basis vectors `g_ND` of a concept's tokens."""
    if estimator not in ESTIMATORS:
        raise InvalidInputError(f"unknown estimator {estimator!r}; valid: {', '.join(ESTIMATORS)}")
    g = np.asarray(g_ND, dtype=np.float64)
    if g.ndim != 2 or g.shape[0] < 2:
        raise InvalidInputError(f"a concept needs at least 2 token vectors [N, d], got shape {g.shape}")
    gbar = g.mean(axis=0)
    if estimator == "mean":
        return gbar
    # imported here: sklearn loads rich, which importing the facade must not
    from sklearn.covariance import LedoitWolf

    sigma = LedoitWolf().fit(g).covariance_
    try:  # Ledoit-Wolf shrinkage makes Sigma positive definite: solve == pinv, and faster
        direction = np.linalg.solve(sigma, gbar)
    except np.linalg.LinAlgError:
        direction = np.linalg.pinv(sigma, hermitian=True) @ gbar
    norm = np.linalg.norm(direction)
    if norm == 0.0:
        return np.zeros_like(gbar)
    direction /= norm
    return float(gbar @ direction) * direction


def projections(g_ND: np.ndarray, l_D: np.ndarray) -> np.ndarray:
    """Projections `g . l / ||l||^2` of vectors onto a concept vector (1 = on the concept)."""
    denom = float(l_D @ l_D)
    if denom == 0.0:
        return np.zeros(len(g_ND))
    return np.asarray(g_ND, dtype=np.float64) @ l_D / denom


@dataclass
class ConceptFit:
    """One concept's vector, fitted on a training subset of its tokens, with its checks."""

    name: str
    vector_D: np.ndarray
    n_tokens: int
    n_train: int
    heldout_projection: float  # mean projection of held-out concept tokens (~1)
    random_projection: float  # mean projection of random non-concept tokens (~0)


def fit_concepts(
    g_VD: np.ndarray,
    concepts: dict[str, np.ndarray],
    *,
    estimator: Estimator = "lda",
    heldout_frac: float = 0.2,
    n_random: int = 1000,
    seed: int = 0,
) -> dict[str, ConceptFit]:
    """Fit every concept's vector on a seeded split of its tokens and run the projection
    checks on the held-out part and on `n_random` random tokens outside the concept.

    `concepts` maps a name to token ids (rows of `g_VD`); each needs at least 3 tokens
    when `heldout_frac > 0` (2 to fit, 1 to check).
    """
    if not 0 <= heldout_frac < 1:
        raise InvalidInputError(f"heldout_frac must be in [0, 1), got {heldout_frac}")
    g = np.asarray(g_VD, dtype=np.float64)
    rng = np.random.default_rng(seed)
    fits = {}
    for name, ids in concepts.items():
        ids = np.unique(np.asarray(ids, dtype=np.int64))
        if len(ids) < (3 if heldout_frac > 0 else 2) or ids.min() < 0 or ids.max() >= len(g):
            raise InvalidInputError(
                f"concept {name!r}: needs >= 3 distinct token ids in [0, {len(g)}), got {len(ids)}"
            )
        train, held = (ids[part] for part in split_rows(len(ids), heldout_frac, rng))
        vector = concept_vector(g[train], estimator=estimator)
        outside = np.setdiff1d(rng.choice(len(g), size=min(n_random, len(g)), replace=False), ids)
        fits[name] = ConceptFit(
            name=name,
            vector_D=vector,
            n_tokens=len(ids),
            n_train=len(train),
            heldout_projection=float(projections(g[held], vector).mean()) if len(held) else float("nan"),
            random_projection=float(projections(g[outside], vector).mean()) if len(outside) else float("nan"),
        )
    return fits
