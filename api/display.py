"""Result objects of the Atlas facade: plain data with `to_dict()` (the HTTP payload),
compact HTML for Jupyter (`_repr_html_`) and matplotlib `.plot()` where a picture helps.

Example tokens are highlighted with a background whose opacity is the token's activation
relative to the example's maximum, like Neuronpedia's activation text.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from api.commands.common import to_jsonable
from store.errors import InvalidInputError


def _esc(value: Any) -> str:
    return html.escape(str(value))


def highlight_tokens(tokens: list[str], acts: list[float], scale: float | None = None) -> str:
    """HTML spans of `tokens` with an orange background proportional to `acts / scale`."""
    top = scale if scale else max([a for a in acts if a is not None] + [1e-9])
    spans = []
    for tok, act in zip(tokens, acts, strict=False):
        alpha = 0.0 if not act or top <= 0 else min(1.0, max(0.0, act / top))
        title = f"{act:.3g}" if act is not None else ""
        spans.append(f'<span title="{title}" style="background:rgba(255,140,0,{alpha:.2f});'
                     f'padding:0 1px;border-radius:2px">{_esc(tok)}</span>')
    return "".join(spans)


def _frame_html(rows: list[dict[str, Any]] | None, columns: list[str]) -> str:
    if not rows:
        return "<i>none</i>"
    head = "".join(f"<th>{_esc(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in columns) + "</tr>" for r in rows
    )
    return f'<table style="font-size:90%"><tr>{head}</tr>{body}</table>'


def _fmt(value: Any) -> str:
    if value is None:
        return "&ndash;"
    return f"{value:.4g}" if isinstance(value, float) else _esc(value)


@dataclass
class Feature:
    """One SAE latent: stats, histogram, top examples, logit effects, neighbours, map."""

    sae_id: str
    index: int
    hook: str
    stats: dict[str, Any]
    histogram: dict[str, list[float]]
    examples: list[dict[str, Any]]
    top_logits: list[dict[str, Any]]
    bottom_logits: list[dict[str, Any]]
    neighbours: list[dict[str, Any]] | None = None
    cross_layer: list[dict[str, Any]] | None = None
    map_position: dict[str, Any] | None = None
    damaged_saes: dict[str, str] | None = None  # SAEs left out of cross_layer: id -> problem
    geometry: list[dict[str, Any]] = field(default_factory=list)  # circles, concept spans, lobes it is in
    label: str | None = None  # offline label from its statistics (null before `sae-atlas search labels --rebuild`)
    explanations: list[str] | None = None  # imported explanations

    def to_dict(self) -> dict[str, Any]:
        """The feature as JSON-ready data."""
        return to_jsonable(self)

    def _repr_html_(self) -> str:
        s = self.stats
        head = (f"<b>{_esc(self.sae_id)} / feature {self.index}</b> "
                f"<span style='color:#666'>({_esc(self.hook)})</span><br>"
                f"density {_fmt(s['density'])} &middot; mean active {_fmt(s['mean_active_act'])} "
                f"&middot; max {_fmt(s['max_act'])}")
        scale = s["max_act"] or None
        examples = "".join(
            f"<div style='font-family:monospace;margin:2px 0'>{highlight_tokens(e['tokens'], e['acts'], scale)}"
            f" <span style='color:#888'>{e['act']:.3g}</span></div>"
            for e in self.examples
        )
        logits = " ".join(f"<code>{_esc(t['token'])}</code> {t['value']:+.3g}" for t in self.top_logits[:8])
        neighbours = _frame_html(self.neighbours, ["latent", "cosine"])
        return (f"<div style='border:1px solid #ddd;padding:6px;max-width:720px'>{head}"
                f"<div><b>top examples</b>{examples or ' <i>none</i>'}</div>"
                f"<div><b>promotes</b> {logits or '<i>no logit effects</i>'}</div>"
                f"<div><b>neighbours</b>{neighbours}</div></div>")

    def plot(self, ax: Any = None) -> Any:
        """Bar chart of the activation histogram (log-spaced bins); returns the axes."""
        import matplotlib.pyplot as plt

        ax = ax or plt.subplots(figsize=(5, 2.5))[1]
        edges, counts = self.histogram["edges"], self.histogram["counts"]
        lo = [max(e, edges[1] / 2) for e in edges[:-1]]
        ax.bar(lo, counts, width=[b - a for a, b in zip(lo, edges[1:], strict=False)], align="edge")
        ax.set_xscale("log")
        ax.set_xlabel("activation")
        ax.set_ylabel("tokens")
        ax.set_title(f"{self.sae_id} / {self.index}")
        return ax


@dataclass
class TextSearch:
    """Which features fire on each token of a text, per SAE (top features per token)."""

    text: str
    token_ids: list[int]
    tokens: list[str]
    features: dict[str, list[list[dict[str, Any]]]]  # sae_id -> per token -> [{latent, act}]

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return to_jsonable(self)

    def frame(self) -> pl.DataFrame:
        """Long table: sae_id, pos, token, rank, latent, act."""
        rows = [
            {"sae_id": sid, "pos": pos, "token": self.tokens[pos], "rank": rank, "latent": f["latent"], "act": f["act"]}
            for sid, per_token in self.features.items()
            for pos, feats in enumerate(per_token)
            for rank, f in enumerate(feats)
        ]
        schema = {"sae_id": pl.String, "pos": pl.Int64, "token": pl.String, "rank": pl.Int64,
                  "latent": pl.Int64, "act": pl.Float64}
        return pl.DataFrame(rows, schema=schema)

    def _repr_html_(self) -> str:
        parts = []
        for sid, per_token in self.features.items():
            top = [f[0]["act"] if f else 0.0 for f in per_token]
            cells = "".join(
                f"<td style='vertical-align:top;padding:2px 4px'>{highlight_tokens([tok], [a], max(top) or None)}"
                f"<br><small>{'<br>'.join(str(f['latent']) for f in feats[:3])}</small></td>"
                for tok, a, feats in zip(self.tokens, top, per_token, strict=False)
            )
            parts.append(f"<div><b>{_esc(sid)}</b><table><tr>{cells}</tr></table></div>")
        return "".join(parts)


@dataclass
class TokenFeatures:
    """Features tied to one token: examples centred on it, and logit effects promoting it."""

    token: str | None
    token_id: int
    centred: pl.DataFrame
    promoting: pl.DataFrame

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data."""
        return {"token": self.token, "token_id": self.token_id,
                "centred": self.centred.to_dicts(), "promoting": self.promoting.to_dicts()}

    def _repr_html_(self) -> str:
        return (f"<b>token {_esc(self.token)} (id {self.token_id})</b>"
                f"<div>centred on it{_frame_html(self.centred.to_dicts(), self.centred.columns)}</div>"
                f"<div>promoting it{_frame_html(self.promoting.to_dicts(), self.promoting.columns)}</div>")


@dataclass
class AnalysisResult:
    """A stored geometry result: parameters/summary, table, and figures (PNG paths)."""

    kind: str
    run: str
    meta: dict[str, Any]
    table: pl.DataFrame | None
    figures: list[Path] = field(default_factory=list)

    def to_dict(self, max_rows: int = 1000) -> dict[str, Any]:
        """The result as JSON-ready data (table rows capped at `max_rows`)."""
        rows = self.table.head(max_rows).to_dicts() if self.table is not None else None
        return {"kind": self.kind, "run": self.run, "meta": to_jsonable(self.meta),
                "columns": self.table.columns if self.table is not None else None,
                "rows": to_jsonable(rows), "n_rows": self.table.height if self.table is not None else 0,
                "figures": [p.name for p in self.figures]}

    def _repr_html_(self) -> str:
        images = "".join(
            f"<img style='max-width:360px' src='data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}'>"
            for p in self.figures[:4]
        )
        table = self.table.head(10)._repr_html_() if self.table is not None else ""
        return f"<b>{_esc(self.kind)} / {_esc(self.run)}</b>{table}{images}"

    def plot(self) -> Any:
        """Show the stored figures side by side; returns the matplotlib figure."""
        import matplotlib.image as mpimg
        import matplotlib.pyplot as plt

        if not self.figures:
            raise InvalidInputError(f"analysis {self.kind}/{self.run} stored no figures")
        fig, axes = plt.subplots(1, len(self.figures), figsize=(4 * len(self.figures), 4), squeeze=False)
        for ax, path in zip(axes[0], self.figures, strict=False):
            ax.imshow(mpimg.imread(path))
            ax.set_axis_off()
            ax.set_title(path.name, fontsize=8)
        return fig
