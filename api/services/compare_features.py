"""The feature cards of a stored comparison's two sides, read-only: side A from this atlas,
side B from the atlas the comparison recorded (this one, or another opened read-only and
kept for the life of this atlas's context), each by the feature-page service."""

from __future__ import annotations

from pathlib import Path

from api.context import AtlasContext
from api.results.compare import Side
from api.results.feature import Feature
from api.sae_view import open_sae
from api.services import features
from api.services.compare import KIND
from geometry import results
from store.errors import NotFoundError
from store.layout import AtlasLayout, check_id


def side_atlas(ctx: AtlasContext, run: str, side: Side) -> tuple[AtlasContext, str]:
    """The opened atlas and SAE id of one side of comparison `run` (NotFoundError naming the
    recorded path when side B's atlas is gone)."""
    parameters = results.verify_run(ctx.root, KIND, check_id(run, "run name")).get("parameters", {})
    sae_id = str(parameters.get(f"sae_{side}", ""))
    if side == "a":
        return ctx, sae_id
    where = Path(str(parameters.get("atlas_b", "")))
    if where.resolve() == ctx.root.resolve():
        return ctx, sae_id
    if not AtlasLayout(where).atlas_json.exists():
        raise NotFoundError(f"B's atlas {where} (recorded by comparison {run!r}) is gone: no atlas.json there")
    return ctx.cache.get(("compared-atlas", str(where.resolve())), lambda: AtlasContext(where)), sae_id


def side_feature(ctx: AtlasContext, run: str, side: Side, latent: int, *, examples: int = 10,
                 neighbours: int = 8) -> Feature:
    """The feature page of `latent` of side `side` of comparison `run`, read from that side's atlas."""
    where, sae_id = side_atlas(ctx, run, side)
    return features.feature_page(open_sae(where, sae_id), latent, examples=examples, neighbours=neighbours)
