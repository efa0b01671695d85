"""The typed-result layer of `search`; its other layers: `sae_atlas.api.commands.search` (CLI),
`sae_atlas.api.http.routers.search` (HTTP), `sae_atlas.api.operations.search` (parameter),
`sae_atlas.api.services.search` (service), `sae_atlas.store.search` (persistence).

Search results: `TextSearch` (which features fire on each token of a text) and
`TokenFeatures` (features tied to one token), with their row types."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import polars as pl
from pydantic import Field
from typing_extensions import NotRequired, TypedDict

from sae_atlas.api.results.html import escape, highlight_tokens, rows_table
from sae_atlas.api.results.rows import Rows
from sae_atlas.api.results.wire import JsonResult, Number


class TokenActivation(TypedDict):
    """A feature active on a token."""

    latent: int
    act: Number
    label: NotRequired[Annotated[str | None, Field(description="the latent's offline label")]]


@dataclass
class TextSearch(JsonResult):
    """Which features fire on each token of a text, per SAE (top features per token). The
    model's special tokens (BOS first) are left out unless the search asked for them."""

    text: str
    token_ids: list[int]
    tokens: list[str | None]
    positions: Annotated[list[int], Field(description="each token's position in the model's input (BOS is 0)")]
    special: Annotated[list[bool], Field(description="each token is BOS or another special token of the model "
                                                     "(all false unless include_special)")]
    features: dict[str, list[list[TokenActivation]]]  # sae_id -> per token -> [{latent, act, label}]

    @property
    def frame(self) -> pl.DataFrame:
        """Long table: sae_id, pos (in the model's input), token, rank, latent, act, label."""
        rows = [
            {"sae_id": sid, "pos": pos, "token": tok, "rank": rank, "latent": f["latent"], "act": f["act"],
             "label": f.get("label")}
            for sid, per_token in self.features.items()
            for pos, tok, feats in zip(self.positions, self.tokens, per_token, strict=True)
            for rank, f in enumerate(feats)
        ]
        schema = {"sae_id": pl.String, "pos": pl.Int64, "token": pl.String, "rank": pl.Int64,
                  "latent": pl.Int64, "act": pl.Float64, "label": pl.String}
        return pl.DataFrame(rows, schema=schema)

    def _repr_html_(self) -> str:
        parts = []
        for sid, per_token in self.features.items():
            top = [f[0]["act"] if f else 0.0 for f in per_token]
            scale = max((a for a, special in zip(top, self.special, strict=True) if not special), default=0.0)
            cells = "".join(
                f"<td style='vertical-align:top;padding:2px 4px'>{highlight_tokens([tok], [a], scale or None)}"
                f"<br><small>{'<br>'.join(str(f['latent']) for f in feats[:3])}</small></td>"
                for tok, a, feats in zip(self.tokens, top, per_token, strict=False)
            )
            parts.append(f"<div><b>{escape(sid)}</b><table><tr>{cells}</tr></table></div>")
        return "".join(parts)


class CentredLatent(TypedDict):
    """A latent whose top examples centre on the token."""

    latent: int
    n_examples: int
    max_act: Number
    sae_id: str
    label: Annotated[str | None, Field(description="the latent's offline label")]


class PromotingLatent(TypedDict):
    """A latent whose logit effects promote the token."""

    latent: int
    logit: Number
    sae_id: str
    label: Annotated[str | None, Field(description="the latent's offline label")]


@dataclass
class TokenFeatures(JsonResult):
    """Features tied to one token: examples centred on it, and logit effects promoting it
    (`token` is None when asked by id)."""

    token: str | None
    token_id: int
    centred: Rows[CentredLatent]
    promoting: Rows[PromotingLatent]

    def _repr_html_(self) -> str:
        return (f"<b>token {escape(self.token)} (id {self.token_id})</b>"
                f"<div>centred on it{rows_table(self.centred.to_dicts(), self.centred.columns)}</div>"
                f"<div>promoting it{rows_table(self.promoting.to_dicts(), self.promoting.columns)}</div>")
