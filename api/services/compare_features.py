"""The feature cards of a stored comparison's two sides, read-only: side A from this atlas,
side B from the atlas the comparison recorded (this one, or another opened read-only and
kept for the life of this atlas's context), each by the feature-page service."""

from __future__ import annotations

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.results.compare import Side
from sae_atlas.api.results.feature import Feature
from sae_atlas.api.sae_view import open_sae
from sae_atlas.api.services import features
from sae_atlas.api.services.compare import KIND, side_context
from sae_atlas.store import analysis_runs
from sae_atlas.store.layout import check_id


def side_feature(ctx: AtlasContext, run: str, side: Side, latent: int, *, examples: int = 10,
                 neighbours: int = 8) -> Feature:
    """The feature page of `latent` of side `side` of comparison `run`, read from that side's
    atlas (NotFoundError naming the recorded path when side B's atlas is gone)."""
    parameters = analysis_runs.verify_run(ctx.root, KIND, check_id(run, "run name")).get("parameters", {})
    where, sae_id = side_context(ctx, run, parameters, side)
    return features.feature_page(open_sae(where, sae_id), latent, examples=examples, neighbours=neighbours)
