"""Result objects of the meaning searches (contrast, concept search, label search): plain
data with `to_dict()` (the HTTP payload) and compact HTML for Jupyter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from api.commands.common import to_jsonable


@dataclass
class ContrastResult:
    """Features that separate text set A from set B, best first (see `Atlas.contrast`).

    `table` columns: rank, sae_id, hook, latent, mean_a, mean_b, diff, auroc, effect_size,
    p_value, q_value (Benjamini-Hochberg over every tested feature of every SAE),
    significant, group (the rank of the first row of its near-duplicate group)."""

    n_a: int
    n_b: int
    pool: str
    n_permutations: int
    alpha: float
    duplicate_threshold: float
    n_tested: dict[str, int]  # per SAE: features active on some text (the ones tested)
    n_significant: int  # over all SAEs, q <= alpha
    table: pl.DataFrame

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data (table as rows)."""
        out = {k: to_jsonable(getattr(self, k)) for k in (
            "n_a", "n_b", "pool", "n_permutations", "alpha", "duplicate_threshold", "n_tested", "n_significant")}
        out["features"] = self.table.to_dicts()
        return out

    def _repr_html_(self) -> str:
        return (f"<b>contrast</b> A: {self.n_a} texts, B: {self.n_b} texts; {self.n_significant} features "
                f"with q &le; {self.alpha}{self.table._repr_html_()}")


@dataclass
class ConceptResult:
    """Concept search over one or more SAEs (see `Atlas.concept_search`): per SAE the
    features that fire on the concept tokens, the smallest feature group spanning the
    concept's variation and the geometry fit of that span; `best` names the best SAE."""

    concept: dict[str, Any]
    kind: str
    per_sae: dict[str, dict[str, Any]]
    best: str
    features: pl.DataFrame = field(default_factory=pl.DataFrame)

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return {"concept": to_jsonable(self.concept), "kind": self.kind, "best": self.best,
                "per_sae": to_jsonable(self.per_sae), "features": self.features.to_dicts()}

    def _repr_html_(self) -> str:
        best = self.per_sae[self.best]
        return (f"<b>concept {self.concept.get('name')}</b> ({self.kind}); best SAE {self.best}: "
                f"span {best['span']} fit {to_jsonable(best['fit'])}{self.features.head(20)._repr_html_()}")
