"""The typed-result layer of `interventions`; its other layers:
`sae_atlas.api.http.routers.interventions` (HTTP), `sae_atlas.api.operations.interventions`
(parameter), `sae_atlas.api.services.interventions` (service).

Results of interventions (`Atlas.run`, `Atlas.steer`, `Atlas.attribute`), with HTML for
notebooks: the baseline and edited text side by side, and an attribution heatmap over the
prompt's tokens (red: the token's features push the target up, blue: down)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl
import torch
from typing_extensions import NotRequired, TypedDict

from sae_atlas.api.results.html import escape, format_value, rows_table, signed_tokens
from sae_atlas.api.results.search import TokenActivation
from sae_atlas.api.results.wire import JsonResult, Number, PythonOnly
from sae_atlas.saes.encoding.tokens import piece_text
from sae_atlas.saes.intervene.attribution import Attribution
from sae_atlas.saes.intervene.edits import edit_dict
from sae_atlas.saes.intervene.generate import Generation, distribution_shift
from sae_atlas.saes.intervene.splice import SpliceRun


def _edit_dicts(specs: list[Any]) -> list[dict[str, Any]]:
    return [edit_dict(s) for s in specs]


class TokenProb(TypedDict):
    """A next token: its probability with the edits and without."""

    token: str
    token_id: int
    p_edited: float
    p_clean: float


@dataclass
class RunView(JsonResult):
    """One spliced (and edited) forward pass: next-token predictions, edited vs clean, and
    the top features per token of each spliced SAE. `logits_TV` and `codes` keep the
    full tensors for Python use (not sent)."""

    text: str
    tokens: list[str]
    token_ids: list[int]
    edits: list[dict[str, Any]]
    next_tokens: list[TokenProb]  # top tokens at the last position: token, p_edited, p_clean
    kl: Number  # KL(clean || edited) at the last position
    features: dict[str, list[list[TokenActivation]]]  # sae_id -> per token -> [{latent, act, label}]
    logits_TV: PythonOnly[torch.Tensor | None] = field(repr=False, default=None)
    codes: PythonOnly[dict[str, torch.Tensor]] = field(repr=False, default_factory=dict)

    @classmethod
    def build(cls, tokenizer: Any, text: str, tokens: list[str], ids: list[int], out: SpliceRun, clean: SpliceRun,
              specs: list[Any], *, k: int = 10) -> RunView:
        rising, _, kl = distribution_shift(tokenizer, clean.logits_TV[-1], out.logits_TV[-1], k)
        p = torch.softmax(out.logits_TV[-1].double(), -1)
        q = torch.softmax(clean.logits_TV[-1].double(), -1)
        top = p.topk(k).indices.tolist()
        nxt = [{"token": piece_text(tokenizer, i), "token_id": i, "p_edited": float(p[i]), "p_clean": float(q[i])}
               for i in top]
        feats = {}
        for sid, f_TF in out.codes.items():
            vals, idx = f_TF.topk(min(5, f_TF.shape[1]), dim=1)
            feats[sid] = [[{"latent": int(i), "act": float(a)} for a, i in zip(v, ix, strict=True) if a > 0]
                          for v, ix in zip(vals.tolist(), idx.tolist(), strict=True)]
        return cls(text, tokens, ids, _edit_dicts(specs), nxt, kl, feats, out.logits_TV, out.codes)

    def _repr_html_(self) -> str:
        return (f"<b>run</b> with {len(self.edits)} edit(s), KL(clean || edited) {format_value(self.kl)} "
                "at the last token" + rows_table(self.next_tokens, ["token", "p_clean", "p_edited"]))


class Shift(TypedDict):
    """A token whose next-token probability the edits raise or lower."""

    token: str
    token_id: int
    p_baseline: float
    p_edited: float


@dataclass
class SteerView(JsonResult):
    """Baseline vs edited continuation (same seed) and the next-token shift."""

    prompt: str
    baseline_text: str
    edited_text: str
    baseline_ids: list[int]
    edited_ids: list[int]
    rising: list[Shift]
    falling: list[Shift]
    kl: Number
    edits: list[dict[str, Any]]
    temperature: float
    seed: int

    @classmethod
    def build(cls, gen: Generation, specs: list[Any], *, temperature: float, seed: int) -> SteerView:
        return cls(gen.prompt, gen.baseline_text, gen.edited_text, gen.baseline_ids, gen.edited_ids,
                   [asdict(r) for r in gen.rising], [asdict(r) for r in gen.falling], gen.kl,
                   _edit_dicts(specs), temperature, seed)

    def __str__(self) -> str:
        return (f"prompt:   {self.prompt}\nbaseline: {self.baseline_text}\nedited:   {self.edited_text}\n"
                f"KL(baseline || edited) = {self.kl:.4g}; rising: "
                + ", ".join(f"{r['token']!r} {r['p_baseline']:.3g}->{r['p_edited']:.3g}" for r in self.rising[:5]))

    def _repr_html_(self) -> str:
        cell = "vertical-align:top;padding:4px 8px;max-width:28em"
        return (f"<div><i>{escape(self.prompt)}</i></div><table><tr><th>baseline</th><th>edited</th></tr>"
                f"<tr><td style='{cell}'>{escape(self.baseline_text)}</td>"
                f"<td style='{cell}'>{escape(self.edited_text)}</td></tr></table>"
                f"KL(baseline || edited) {format_value(self.kl)}<table><tr><td style='{cell}'><b>rising</b>"
                + rows_table(self.rising, ["token", "p_baseline", "p_edited"])
                + f"</td><td style='{cell}'><b>falling</b>"
                + rows_table(self.falling, ["token", "p_baseline", "p_edited"]) + "</td></tr></table>")


class AttributedFeature(TypedDict):
    """A feature's attribution to the target (and, when verified, its true ablation effect)."""

    sae_id: str
    feature: int
    attribution: Number
    max_act: Number
    top_position: int
    ablation_effect: NotRequired[Number]


@dataclass
class AttributionView(JsonResult):
    """Feature attributions of one target on one prompt, the per-token heatmap, the
    completeness check per SAE and the agreement with true ablation effects."""

    text: str
    tokens: list[str]
    target: dict[str, Any]
    total: Number
    features: list[AttributedFeature]
    token_attr: dict[str, list[Number]]
    token_error: dict[str, list[Number]]
    parts: list[dict[str, Any]]
    complete: bool
    tolerance: dict[str, float]
    verification: list[AttributedFeature]
    agreement: dict[str, Number]
    mode: str

    @classmethod
    def build(cls, text: str, tokens: list[str], a: Attribution) -> AttributionView:
        return cls(text, tokens, a.target, a.total, a.features.to_dicts(), a.token_attr, a.token_error, a.parts,
                   a.complete, a.tolerance, a.verification, a.agreement, a.mode)

    @property
    def frame(self) -> pl.DataFrame:
        """The top features: sae_id, feature, attribution, max_act, top_position."""
        return pl.DataFrame(self.features)

    def _repr_html_(self) -> str:
        rows = "".join(f"<div><b>{escape(sid)}</b> {signed_tokens(self.tokens, vals)}</div>"
                       for sid, vals in self.token_attr.items())
        check = "complete" if self.complete else "INCOMPLETE"
        return (f"<div>{self.mode} attribution of {escape(self.target)} = {format_value(self.total)} ({check} "
                f"within {self.tolerance['atol']} + {self.tolerance['rtol']}|total|)</div>{rows}"
                + rows_table(self.features[:10], ["sae_id", "feature", "attribution", "max_act", "top_position"])
                + "<div>attribution vs ablation effect "
                + ", ".join(f"{k} {format_value(v)}" for k, v in self.agreement.items()) + "</div>"
                + rows_table(self.verification, ["sae_id", "feature", "attribution", "ablation_effect"]))
