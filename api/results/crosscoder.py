"""The typed-result layer of `crosscoder`; its other layers: `sae_atlas.api.operations.crosscoder`
(parameter), `sae_atlas.api.services.crosscoder` (service), `sae_atlas.saes.compare.crosscoder`
(engine).

Reads of a stored crosscoder: `CrosscoderRow` (one crosscoder in the listing),
`CrosscoderLatents` (a filtered, sorted page of its latents beside the relative-norm
histogram of all of them) and `CrosscoderLatentCard` (one latent: both decoder norms and the
atlas features nearest to its decoder rows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import polars as pl
from pydantic import Field
from typing_extensions import TypedDict

from sae_atlas.api.results.html import escape
from sae_atlas.api.results.wire import JsonResult, Number
from sae_atlas.saes.compare.crosscoder import LatentClass


class CrosscoderRow(TypedDict):
    """A stored crosscoder: what each side reads, its size and how many latents each class holds."""

    crosscoder: str
    model_a: str
    hook_a: str
    model_b: str
    hook_b: str
    d_sae: int
    k: int
    n_tokens: int
    a_only: Annotated[int, Field(description="latents with relative norm < 0.1")]
    shared: int
    b_only: Annotated[int, Field(description="latents with relative norm > 0.9")]


class CrosscoderLatentRow(TypedDict):
    """One latent of a crosscoder: each side's decoder norm and the relative norm."""

    latent: int
    norm_a: Number
    norm_b: Number
    relative_norm: Annotated[Number, Field(description="||D_B|| / (||D_A|| + ||D_B||) (Lindsey et al. 2024)")]
    latent_class: LatentClass
    scaling: Annotated[dict[str, Number], Field(
        description="the table's further per-latent columns, e.g. Latent Scaling's beta_* and nu_* (Minder et al. "
                    "2025); empty when it has none")]


class RelativeNormHistogram(TypedDict):
    """Counts of latents by relative norm, split by class (the bins align with the class bounds)."""

    edges: Annotated[list[float], Field(description="bin edges over [0, 1]")]
    a_only: list[int]
    shared: list[int]
    b_only: list[int]
    a_only_below: float
    b_only_above: float


@dataclass
class CrosscoderLatents(JsonResult):
    """A page of a crosscoder's latents (those of `latent_class`, or all), sorted by `sort`,
    beside the relative-norm histogram of every latent."""

    crosscoder: CrosscoderRow
    latent_class: LatentClass | None
    sort: str
    descending: bool
    total: Annotated[int, Field(description="latents passing the filter")]
    offset: int
    rows: list[CrosscoderLatentRow]
    histogram: RelativeNormHistogram

    def _repr_html_(self) -> str:
        which = self.latent_class or "all"
        rows = pl.DataFrame([{k: v for k, v in r.items() if k != "scaling"} | r["scaling"] for r in self.rows])
        return (f"<b>crosscoder {escape(self.crosscoder['crosscoder'])}</b>: {self.total} {which} latents"
                + rows._repr_html_())


class NearFeature(TypedDict):
    """An atlas feature whose decoder direction is near one side of a crosscoder latent."""

    sae_id: str
    latent: int
    cosine: Annotated[float, Field(description="cosine of the two decoder rows")]
    label: str | None


@dataclass
class CrosscoderLatentCard(JsonResult):
    """One crosscoder latent: both decoder norms, the relative norm and class, any Latent
    Scaling values, and per side the nearest features among this atlas's SAEs at that side's
    hook (None, with the reason in `notes`, where none can be compared)."""

    crosscoder: CrosscoderRow
    latent: int
    norm_a: Number
    norm_b: Number
    relative_norm: Number
    latent_class: LatentClass
    scaling: dict[str, Number]
    nearest_a: list[NearFeature] | None
    nearest_b: list[NearFeature] | None
    notes: Annotated[list[str], Field(description="why a side has no nearest features")]

    def _repr_html_(self) -> str:
        rows = [("norm_a", self.norm_a), ("norm_b", self.norm_b), ("relative_norm", self.relative_norm),
                ("class", self.latent_class), *self.scaling.items()]
        near = [pl.DataFrame(n)._repr_html_() for n in (self.nearest_a, self.nearest_b) if n]
        return (f"<b>crosscoder {escape(self.crosscoder['crosscoder'])} / latent {self.latent}</b>"
                + pl.DataFrame({"": [r[0] for r in rows], "value": [str(r[1]) for r in rows]})._repr_html_()
                + "".join(near) + "".join(f"<p>{escape(n)}</p>" for n in self.notes))

