"""The typed-result layer of `compare`; its other layers: `sae_atlas.api.commands.compare` (CLI),
`sae_atlas.api.http.routers.compare` (HTTP), `sae_atlas.api.operations.compare` (parameter),
`sae_atlas.api.services.compare` (service).

`CompareResult`: a stored comparison of two SAEs, and `CompareRunRow`, a row of the
listing of stored comparisons."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import polars as pl
from pydantic import Field
from typing_extensions import TypedDict

from sae_atlas.api.results.html import escape
from sae_atlas.api.results.rows import Rows
from sae_atlas.api.results.sae import Status
from sae_atlas.api.results.wire import JsonResult, Number, wire_payload

Side = Literal["a", "b"]
"""One side of a comparison or crosscoder."""
MAX_PAIRS = 500
"""Matched pairs sent by `CompareResult.to_dict()` (and so over HTTP), best first."""


class CompareRunRow(TypedDict):
    """A stored comparison: which SAEs, on how many tokens, its headline scores and its status."""

    run: str
    sae_a: str
    atlas_b: str
    sae_b: str
    n_tokens: int
    mcc: Number
    mcc_null: Annotated[Number, Field(description="mean MCC of the rotation null")]
    decoder_mcc: Annotated[Number, Field(description="MCC of decoder cosines (null: no shared d_model)")]
    status: Annotated[Status, Field(
        description="'damaged': a file of the run is missing, truncated or corrupt (its scores are left empty); "
                    "'unregistered': its files verify but analyses/compare/runs.json does not list it. Neither is "
                    "served (500 naming the file and the repair)")]
    problem: Annotated[str | None, Field(
        description="for a damaged run: the file, what is wrong, the repair; for an unregistered one: the command "
                    "that registers it again")]


class MatchedPair(TypedDict):
    """One Hungarian pair: A's latent, its B partner, their activation correlation, both labels."""

    a_latent: int
    b_latent: int
    corr: Number
    mutual: Annotated[bool, Field(description="each is the other's most correlated latent")]
    decoder_cos: Annotated[Number, Field(description="cosine of their decoder rows (null: no shared d_model)")]
    a_label: Annotated[str | None, Field(description="A's latent's offline label")]
    b_label: Annotated[str | None, Field(description="B's latent's offline label (null once B's atlas is gone)")]


class SpaceScoreRow(TypedDict):
    """SVCCA or RSA of the matched features' decoder rows or codes, beside a null."""

    space: Annotated[str, Field(description="'decoder' or 'activation'")]
    score_name: Annotated[str, Field(description="'svcca' or 'rsa'")]
    null: Annotated[str, Field(description="'random_features' or 'shuffled_tokens'")]
    score: Number
    null_mean: Number
    null_std: Number
    p_value: Annotated[Number, Field(description="(1 + #{null >= score}) / (1 + n_null)")]
    n_null: int


class CorrelationHistogram(TypedDict):
    """Counts of the Hungarian pairs' correlations beside the rotation null's, on shared bins."""

    edges: list[float]
    pairs: Annotated[list[int], Field(description="every matched pair of the run (not only those sent)")]
    null: Annotated[list[int], Field(description="pairs matched after a random rotation of B's codes")]


@dataclass
class CompareResult(JsonResult):
    """A stored comparison: its parameters and summary (MCC beside its rotation null, decoder
    MCC, space scores), the matched pairs (best first), the space scores and the per-group
    scores (one row per semantic group of A's latents; columns vary with the scores) and the
    histogram of every pair's correlation beside the rotation null's."""

    run: str
    parameters: dict[str, Any]
    summary: dict[str, Any]
    pairs: Annotated[Rows[MatchedPair], Field(
        description=f"the first {MAX_PAIRS} matched pairs by correlation")]
    spaces: list[SpaceScoreRow]
    groups: Annotated[list[dict[str, Any]], Field(
        description="per group of A's latents: its size, matched pairs and decoder scores beside their null")]
    correlations: CorrelationHistogram
    notes: Annotated[list[str], Field(
        description="why a p-value cannot go below 0.05 (too few null draws) and how to rerun")] = field(
        default_factory=list)

    def to_dict(self, max_rows: int = MAX_PAIRS) -> dict[str, Any]:
        """The result as JSON-ready data (pairs capped at `max_rows`; every space and group score)."""
        return wire_payload(self, context={"max_rows": max_rows})

    def _repr_html_(self) -> str:
        s = self.summary
        head = (f"<b>compare / {escape(self.run)}</b>: MCC {s.get('mcc', float('nan')):.3f} "
                f"(rotation null {s.get('mcc_null', {}).get('null_mean', float('nan')):.3f}) on "
                f"{s.get('n_tokens')} tokens")
        return head + pl.DataFrame(self.spaces)._repr_html_() + self.pairs.frame.head(10)._repr_html_()
