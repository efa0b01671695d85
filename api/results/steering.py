"""The typed-result layer of `steering`; its other layers: `sae_atlas.api.http.routers.steering`
(HTTP), `sae_atlas.api.operations.steering` (parameter), `sae_atlas.api.services.steering`
(service), `sae_atlas.store.steering` (persistence).

Result of `Atlas.steering_features`: features ranked by their measured effect toward a
target, each with a calibrated strength and a ready edit (`saes.intervene.steering_search`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from typing_extensions import TypedDict

from sae_atlas.api.results.html import escape, rows_table
from sae_atlas.api.results.wire import JsonResult, Number
from sae_atlas.saes.intervene.steering_search import SearchResult


class Strength(TypedDict):
    """One strength in every unit: raw `alpha` (or clamp value), multiples of the latent's
    typical active value, fraction of the hook's mean residual norm."""

    alpha: float
    act_multiple: Number
    norm_fraction: float


class Confirmed(TypedDict):
    """One edit measured on a prompt set (`saes.intervene.steering_effects.PairStats`): the
    set's ratio with a 95% bootstrap interval over prompts, the share of (target, prompt)
    pairs reaching the requested ratio under the KL bound (with its interval), and reaching
    it specifically (not by raising the target's siblings with it)."""

    n_prompts: int
    ratio: Number
    ratio_low: Number
    ratio_high: Number
    median_ratio: Number
    share_reached: Number
    share_low: Number
    share_high: Number
    share_specific: Number
    lowered: Number  # share of prompts where the target's probability fell
    kl_rest: Number
    sibling_ratio: Number  # null without siblings
    target_rank: Number  # median rank of the target among the tokens the edit promotes (0: first)
    score: Number  # mean specific log gain (ranking tie-break)


class SteeringFeature(TypedDict):
    """One ranked feature: calibrated on the ranking prompts, confirmed on held-out ones."""

    rank: int
    sae_id: str
    hook: str
    latent: int
    label: str | None
    sources: list[str]  # why it was a candidate: "table", "lens", "contrast"
    best_ratio: Number  # best ratio of the target's probability under the KL bound (ranking key)
    reached: bool  # the requested ratio is reached under the KL bound
    ratio: Number  # mean p(T) steered / clean, at the calibrated strength
    log_gain: Number
    p_clean: Number
    p_steered: Number
    kl: Number  # KL(clean || steered), nats
    kl_rest: Number  # the same over the tokens outside the target, renormalised (the fluency bound)
    perplexity: Number  # the clean model's perplexity of the edited greedy continuation
    strength: Strength
    edit: dict[str, Any]  # SteerEdit / ClampEdit, ready for `Atlas.steer` and `Atlas.run`
    kind: str  # "feature", or "direction" for a latent firing below the density floor
    density: Number  # share of tokens it fires on (null: unknown)
    sibling_ratio: Number  # the ratio of the target's siblings on the ranking prompts (null: none)
    target_rank: Number  # median rank of the target among the tokens the edit promotes
    confirmed: Confirmed  # on the held-out confirmation prompts (the ranking key)
    confirmed_styles: dict[str, Confirmed]  # the same per prompt style


class SteeringCombination(TypedDict):
    """A fitted sparse combination of features of one SAE, in the SAE basis: each feature's
    weight (norm fraction at the calibrated strength) and steer edit; measured like a feature."""

    sae_id: str
    hook: str
    latents: list[int]
    labels: list[str | None]
    weights: list[float]
    densities: list[Number]
    reached: bool
    ratio: Number
    kl_rest: Number
    best_ratio: Number
    norm_fraction: float
    edits: list[dict[str, Any]]  # SteerEdits, ready for `Atlas.steer` together
    sibling_ratio: Number
    target_rank: Number
    confirmed: Confirmed
    confirmed_styles: dict[str, Confirmed]


@dataclass
class SteeringSearch(JsonResult):
    """Features ranked by measured effect toward a target, best first."""

    target: str  # what the target is
    target_kind: str  # tokens, concept or contrast
    tokens: list[str]  # the target tokens T
    token_ids: list[int]
    mode: str  # "add" (steer) or "clamp"
    ratio_requested: float
    kl_bound: float
    n_prompts: int
    seed: int  # of the held-out prompts
    resid_norms: dict[str, float]  # per SAE: the hook's mean residual norm on those prompts
    baseline_perplexity: Number  # of the unedited greedy continuation
    features: list[SteeringFeature]
    confirm_seed: int = 0  # of the held-out neutral confirmation prompts
    styles: list[str] = field(default_factory=list)  # prompt styles asked for
    prompt_counts: dict[str, dict[str, int]] = field(default_factory=dict)  # rank / confirm -> style -> prompts
    category: str | None = None  # the target's class (in-context and question prompts, siblings)
    siblings: list[str] = field(default_factory=list)
    density_floor: float = 0.0  # latents firing less often are left out (or, included, called directions)
    include_dead: bool = False
    left_out_dead: int = 0
    combination: SteeringCombination | None = None
    best: str = "feature"  # "feature" or "combination": which is better on the confirmation prompts

    @classmethod
    def build(cls, result: SearchResult, labels: dict[tuple[str, int], str | None]) -> SteeringSearch:
        rows: list[SteeringFeature] = []
        for rank, f in enumerate(result.features, 1):
            d = asdict(f)
            d.pop("screen_ratio")
            rows.append({"rank": rank, **d, "label": labels.get((f.sae_id, f.latent))})  # type: ignore[typeddict-item]
        t, p, c = result.target, result.params, result.combination
        combo: SteeringCombination | None = None
        if c is not None:
            combo = {**asdict(c), "labels": [labels.get((c.sae_id, i)) for i in c.latents]}  # type: ignore[typeddict-item]
        return cls(t.description, t.kind, t.tokens, t.token_ids, p.mode, p.ratio, p.kl_bound, p.n_prompts,
                   result.seed, result.resid_norms, result.baseline_perplexity, rows, result.confirm_seed,
                   list(p.styles), result.prompt_counts, result.category, result.siblings, p.density_floor,
                   p.include_dead, result.left_out_dead, combo, result.best)

    @property
    def best_edit(self) -> dict[str, Any]:
        """The ready edit of the top-ranked feature."""
        return self.features[0]["edit"]

    @property
    def best_edits(self) -> list[dict[str, Any]]:
        """The ready edits of the best result on the confirmation prompts: the top feature's
        one, or the fitted combination's."""
        if self.best == "combination" and self.combination is not None:
            return self.combination["edits"]
        return [self.best_edit]

    def __str__(self) -> str:
        return "\n".join(f"{r['rank']:>2} {r['sae_id']}/{r['latent']} x{r['ratio']:.3g} kl_rest {r['kl_rest']:.3g} "
                         f"{r['edit']}" for r in self.features)

    def _repr_html_(self) -> str:
        shown = [{**r, "alpha": r["strength"]["alpha"], "norm_fraction": r["strength"]["norm_fraction"]}
                 for r in self.features]
        return (f"<b>steering toward {escape(self.target)}</b> ({self.mode}, ratio {self.ratio_requested:g} "
                f"requested, KL bound {self.kl_bound:g})"
                + rows_table(shown, ["rank", "sae_id", "latent", "label", "ratio", "kl_rest", "alpha",
                                     "norm_fraction", "reached"]))


class BenchArm(TypedDict):
    """One arm of the steering benchmark on one target (`saes.intervene.steer_bench`)."""

    target: str
    arm: str  # top_result (the search's best: feature_add or combination), feature_add, feature_clamp, combination,
    # top_activating, diff_means, probe, random_feature, prompting
    sae_id: str | None
    latent: int | None
    reached: bool  # the requested ratio under the KL bound
    norm_fraction: Number  # calibrated strength (None for prompting)
    ratio: Number
    kl_rest: Number
    best_ratio: Number  # best ratio on the grid under the KL bound
    matched_ratio: Number  # at the best feature's calibrated norm
    matched_kl_rest: Number
    curve: list[tuple[float, float, float]]  # (norm_fraction, ratio, kl_rest) over the grid
    latents: list[int]  # a combination's features
    confirmed: Confirmed  # on the held-out confirmation prompts at the calibrated strength
    styles: dict[str, Confirmed]  # the same per prompt style
    pairs: list[tuple[str, bool]]  # (style, reached) per confirmation prompt


class BenchShare(TypedDict):
    """The share of (target, prompt) pairs one arm raises to the requested ratio under the
    KL bound, over all targets, in one prompt style (or `all`), with a 95% bootstrap interval."""

    arm: str
    style: str
    pairs: int
    reached: int
    share: float
    share_low: float
    share_high: float


@dataclass
class SteerBench(JsonResult):
    """The steering benchmark: every arm on every target, with how it was measured, and the
    share of pairs each arm reaches per style."""

    ratio_requested: float
    kl_bound: float
    n_prompts: int
    prompt_prefix: str
    arms: list[BenchArm]
    shares: list[BenchShare] = field(default_factory=list)
    styles: list[str] = field(default_factory=list)

    def plot(self, path: str | Path) -> Path:
        """Each target's ratio-vs-KL curves per arm, as a PNG at `path` (needs matplotlib)."""
        from sae_atlas.saes.intervene.steer_bench import (
            plot_bench,  # the bench pulls in scikit-learn
        )

        plot_bench(self.arms, path, self.kl_bound)
        return Path(path)

    def __str__(self) -> str:
        return "\n".join(f"{s['arm']:<15} {s['style']:<11} {s['reached']}/{s['pairs']} pairs reached "
                         f"({s['share']:.2f}, {s['share_low']:.2f}-{s['share_high']:.2f})" for s in self.shares)
