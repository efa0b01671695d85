"""Result objects of interventions (`Atlas.run`, `Atlas.steer`, `Atlas.attribute`):
JSON-ready `to_dict()` (the HTTP payload) and HTML for notebooks: the baseline and edited
text side by side, and an attribution heatmap over the prompt's tokens (red: the token's
features push the target up, blue: down)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl
import torch

from api.display import _esc, _fmt, _frame_html
from saes.intervene.attribution import Attribution
from saes.intervene.generate import Generation, distribution_shift
from saes.intervene.splice import SpliceRun


def _edit_dicts(specs: list[Any]) -> list[dict[str, Any]]:
    return [s.model_dump(mode="json") for s in specs]


def signed_tokens(tokens: list[str], values: list[float]) -> str:
    """HTML spans of `tokens`, red for positive and blue for negative values (opacity
    relative to the largest magnitude), the value in the tooltip."""
    top = max([abs(v) for v in values] + [1e-12])
    spans = []
    for tok, v in zip(tokens, values, strict=False):
        a = min(1.0, abs(v) / top)
        rgb = "220,50,47" if v >= 0 else "38,139,210"
        spans.append(f'<span title="{v:.4g}" style="background:rgba({rgb},{a:.2f});padding:0 1px;'
                     f'border-radius:2px">{_esc(tok)}</span>')
    return "".join(spans)


@dataclass
class RunView:
    """One spliced (and edited) forward pass: next-token predictions, edited vs clean, and
    the top features per token of each spliced SAE. `logits_TV` and `codes` keep the
    full tensors for Python use."""

    text: str
    tokens: list[str]
    token_ids: list[int]
    edits: list[dict[str, Any]]
    next_tokens: list[dict[str, Any]]  # top tokens at the last position: token, p_edited, p_clean
    kl: float  # KL(clean || edited) at the last position
    features: dict[str, list[list[dict[str, Any]]]]  # sae_id -> per token -> [{latent, act}]
    logits_TV: torch.Tensor = field(repr=False, default=None)
    codes: dict[str, torch.Tensor] = field(repr=False, default_factory=dict)

    @classmethod
    def build(cls, tokenizer: Any, text: str, tokens: list[str], ids: list[int], out: SpliceRun, clean: SpliceRun,
              specs: list[Any], *, k: int = 10) -> RunView:
        rising, _, kl = distribution_shift(tokenizer, clean.logits_TV[-1], out.logits_TV[-1], k)
        p = torch.softmax(out.logits_TV[-1].double(), -1)
        q = torch.softmax(clean.logits_TV[-1].double(), -1)
        top = p.topk(k).indices.tolist()
        nxt = [{"token": tokenizer.decode([i]), "token_id": i, "p_edited": float(p[i]), "p_clean": float(q[i])}
               for i in top]
        feats = {}
        for sid, f_TF in out.codes.items():
            vals, idx = f_TF.topk(min(5, f_TF.shape[1]), dim=1)
            feats[sid] = [[{"latent": int(i), "act": float(a)} for a, i in zip(v, ix, strict=True) if a > 0]
                          for v, ix in zip(vals.tolist(), idx.tolist(), strict=True)]
        return cls(text, tokens, ids, _edit_dicts(specs), nxt, kl, feats, out.logits_TV, out.codes)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("logits_TV", "codes")}

    def _repr_html_(self) -> str:
        return (f"<b>run</b> with {len(self.edits)} edit(s), KL(clean || edited) {_fmt(self.kl)} at the last token"
                + _frame_html(self.next_tokens, ["token", "p_clean", "p_edited"]))


@dataclass
class SteerView:
    """Baseline vs edited continuation (same seed) and the next-token shift."""

    prompt: str
    baseline_text: str
    edited_text: str
    baseline_ids: list[int]
    edited_ids: list[int]
    rising: list[dict[str, Any]]
    falling: list[dict[str, Any]]
    kl: float
    edits: list[dict[str, Any]]
    temperature: float
    seed: int

    @classmethod
    def build(cls, gen: Generation, specs: list[Any], *, temperature: float, seed: int) -> SteerView:
        return cls(gen.prompt, gen.baseline_text, gen.edited_text, gen.baseline_ids, gen.edited_ids,
                   [asdict(r) for r in gen.rising], [asdict(r) for r in gen.falling], gen.kl,
                   _edit_dicts(specs), temperature, seed)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return (f"prompt:   {self.prompt}\nbaseline: {self.baseline_text}\nedited:   {self.edited_text}\n"
                f"KL(baseline || edited) = {self.kl:.4g}; rising: "
                + ", ".join(f"{r['token']!r} {r['p_baseline']:.3g}->{r['p_edited']:.3g}" for r in self.rising[:5]))

    def _repr_html_(self) -> str:
        cell = "vertical-align:top;padding:4px 8px;max-width:28em"
        return (f"<div><i>{_esc(self.prompt)}</i></div><table><tr><th>baseline</th><th>edited</th></tr>"
                f"<tr><td style='{cell}'>{_esc(self.baseline_text)}</td>"
                f"<td style='{cell}'>{_esc(self.edited_text)}</td></tr></table>"
                f"KL(baseline || edited) {_fmt(self.kl)}<table><tr><td style='{cell}'><b>rising</b>"
                + _frame_html(self.rising, ["token", "p_baseline", "p_edited"])
                + f"</td><td style='{cell}'><b>falling</b>"
                + _frame_html(self.falling, ["token", "p_baseline", "p_edited"]) + "</td></tr></table>")


@dataclass
class AttributionView:
    """Feature attributions of one target on one prompt, the per-token heatmap, the
    completeness check per SAE and the agreement with true ablation effects."""

    text: str
    tokens: list[str]
    target: dict[str, Any]
    total: float
    features: list[dict[str, Any]]
    token_attr: dict[str, list[float]]
    token_error: dict[str, list[float]]
    parts: list[dict[str, Any]]
    complete: bool
    tolerance: dict[str, float]
    verification: list[dict[str, Any]]
    agreement: dict[str, float]
    mode: str

    @classmethod
    def build(cls, text: str, tokens: list[str], a: Attribution) -> AttributionView:
        return cls(text, tokens, a.target, a.total, a.features.to_dicts(), a.token_attr, a.token_error, a.parts,
                   a.complete, a.tolerance, a.verification, a.agreement, a.mode)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def frame(self) -> pl.DataFrame:
        """The top features: sae_id, feature, attribution, max_act, top_position."""
        return pl.DataFrame(self.features)

    def _repr_html_(self) -> str:
        rows = "".join(f"<div><b>{_esc(sid)}</b> {signed_tokens(self.tokens, vals)}</div>"
                       for sid, vals in self.token_attr.items())
        check = "complete" if self.complete else "INCOMPLETE"
        return (f"<div>{self.mode} attribution of {_esc(self.target)} = {_fmt(self.total)} ({check} within "
                f"{self.tolerance['atol']} + {self.tolerance['rtol']}|total|)</div>{rows}"
                + _frame_html(self.features[:10], ["sae_id", "feature", "attribution", "max_act", "top_position"])
                + "<div>attribution vs ablation effect "
                + ", ".join(f"{k} {_fmt(v)}" for k, v in self.agreement.items()) + "</div>"
                + _frame_html(self.verification, ["sae_id", "feature", "attribution", "ablation_effect"]))
