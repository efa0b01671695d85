"""A 2-D feature map: `MapPoint`, one feature's place on it (`Atlas.map` rows), and
`MapColumns`, the same map as columns with its kNN-overlap scores (`GET /saes/{id}/map`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, with_config

from sae_atlas.api.results.feature import MapPosition
from sae_atlas.api.results.rows import Rows
from sae_atlas.api.results.wire import Number
from sae_atlas.store.maps import Basis


@with_config(ConfigDict(extra="allow"))
class MapPoint(MapPosition):
    """A feature on its SAE's map in one basis, with its offline label (group columns such
    as `cluster` when present)."""

    label: Annotated[str | None, Field(description="the feature's offline label (null where none is stored)")]


class MapScore(BaseModel):
    """How faithful one map basis is: the mean share of each feature's k nearest neighbours
    in that basis kept among its k nearest on the map, the chance level, and the mean share
    of the other basis' neighbours the map keeps (null: not measured)."""

    knn_overlap_mean: Number
    chance: Number
    other_basis_overlap_mean: Number


class MapColumns(BaseModel):
    """A 2-D map in one basis as columns of equal length (group columns such as `cluster`
    when present), with the kNN-overlap scores of every basis built for the SAE."""

    model_config = ConfigDict(extra="allow")

    basis: Basis = Field(description="decoder: UMAP of the decoder rows; cooccurrence: of the co-occurrence graph")
    scores: dict[Basis, MapScore] = Field(description="per built basis, how well its map keeps neighbourhoods")
    latent: list[int]
    x: list[Number]
    y: list[Number]
    knn_overlap: list[Number]
    label: list[str | None] = Field(description="each feature's offline label (null where none is stored)")


def map_columns(basis: Basis, scores: dict[str, dict[str, float | None]], points: Rows[MapPoint]) -> dict[str, Any]:
    """The map as `MapColumns` sends it: basis, scores, then one list per column."""
    return {"basis": basis, "scores": scores} | points.frame.to_dict(as_series=False)
