"""The engine layer of `steer_bench`; its other layers: `sae_atlas.api.commands.steer_bench` (CLI).

A steering benchmark in the style of AxBench (Wu et al. 2025): for each target, steer
with several directions at the same hook, calibrate each on the ranking prompts and count,
on the held-out confirmation prompts of every style, the (target, prompt) pairs it raises
to the requested ratio with KL on the rest within the bound.

The arms, all added at the last token (or, for prompting, with no edit at all):

- `feature_add`, `feature_clamp`: the best feature of `steering_search.rank_features`
  (its hook is the hook of every arm), added along its decoder row or clamped;
- `combination`: the search's fitted sparse combination of features (when fitted);
- `top_activating`: the naive choice, the latent of that SAE most active on the target
  token itself (mean code when a target token follows each training prompt), added;
- `diff_means`: the difference of means (`geometry.probes.diff_means_probe`) between the
  hook's activations on the target and off it: for tokens, the ranking prompts (every
  style) with a target token appended (at that token) against the same prompts (at their
  last token); for a contrast, the last tokens of texts A against texts B;
- `probe`: the direction of a logistic probe on the same two classes
  (`geometry.probes.logistic_probe`);
- `random_feature`: a seeded random live latent of the same SAE (above the density floor);
- `prompting`: the prompts prefixed with text naming the target (`prompt_prefix`).

Every direction is a unit vector swept over one geometric grid of norm fractions of the
hook's mean residual norm on the ranking prompts (`saes.intervene.strength`), so arms are
compared at matched norms; each arm's strength is the smallest reaching the ratio
specifically on `pair_share` of the ranking pairs (`steering_search.calibrate_pairs`).
Per arm, on the confirmation prompts: the curve over the grid, the ratio and KL at the
calibrated strength and at the best feature's (`matched_*`), the pair statistics
(`steering_effects.PairStats`) overall and per style, and each pair's outcome, which
`share_table` pools over targets into the share of pairs reached per arm and style with a
bootstrap interval. The probes learn from the ranking prompts only, like the features.
`top_result` repeats the arm (`feature_add` or `combination`) that the search itself
returns as its best (`SearchResult.best`): what a user of `steering_features` gets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.intervene.steering_effects import (
    BOOTSTRAP_SAMPLES,
    INTERVAL,
    PromptEffects,
    PromptSteering,
    direction_deltas,
    pair_stats,
    per_style,
    prompt_effects,
    prompt_steering,
)
from sae_atlas.saes.intervene.steering_prompts import PromptSet
from sae_atlas.saes.intervene.steering_search import (
    ResolvedTarget,
    SearchParams,
    SteeringSource,
    calibrate_pairs,
    last_token_acts,
    rank_features,
    resolve_target,
)
from sae_atlas.saes.intervene.strength import geometric_grid
from sae_atlas.saes.models import ModelHandle

ARMS = ("top_result", "feature_add", "feature_clamp", "combination", "top_activating", "diff_means", "probe",
        "random_feature", "prompting")
SAE_ARMS = ("top_result", "feature_add", "feature_clamp", "combination")


@dataclass(frozen=True)
class BenchParams:
    """How the benchmark measures (recorded with its results)."""

    search: SearchParams = SearchParams(k=1, fluency_prompts=0)
    prompt_prefix: str = "Let's talk about {target}."
    random_seed: int = 0


@dataclass
class ArmResult:
    """One arm on one target (module docstring); measured on the confirmation prompts."""

    target: str
    arm: str
    sae_id: str | None
    latent: int | None
    reached: bool  # calibrated on the ranking prompts: pair_share of them reached specifically
    norm_fraction: float | None  # calibrated (None for prompting)
    ratio: float  # at the calibrated strength, on the confirmation prompts
    kl_rest: float
    best_ratio: float  # best on the grid under the KL bound (confirmation prompts)
    matched_ratio: float  # at the best feature's calibrated norm
    matched_kl_rest: float
    curve: list[tuple[float, float, float]] = field(default_factory=list)  # (norm_fraction, ratio, kl_rest)
    latents: list[int] = field(default_factory=list)  # a combination's features
    confirmed: dict[str, Any] = field(default_factory=dict)  # PairStats at the calibrated strength
    styles: dict[str, dict[str, Any]] = field(default_factory=dict)  # the same per style
    pairs: list[tuple[str, bool]] = field(default_factory=list)  # (style, reached) per confirmation prompt


def _arm(target: str, arm: str, grid: np.ndarray, rank_pe: PromptEffects | None, held_pe: PromptEffects,
         styles: list[str], matched: int, sp: SearchParams, **where: Any) -> ArmResult:
    """An arm from its per-prompt effects over the grid on the ranking prompts (None:
    prompting, one row) and on the confirmation prompts."""
    if rank_pe is None:
        g, reached, fraction = 0, False, None
    else:
        cal = calibrate_pairs(grid, rank_pe, ratio=sp.ratio, kl_bound=sp.kl_bound, share=sp.pair_share)
        g, reached, fraction = int(np.argmin(np.abs(grid - cal.norm_fraction))), cal.reached, cal.norm_fraction
    at = held_pe.rows([g])
    eff = held_pe.aggregate()
    stats = pair_stats(at, ratio=sp.ratio, kl_bound=sp.kl_bound)
    ok = eff.kl_rest <= sp.kl_bound
    log_r, kl = at.log_p[0] - at.log_q, at.kl_rest[0]
    pairs = [(s, bool(r >= np.log(sp.ratio) and k <= sp.kl_bound)) for s, r, k in zip(styles, log_r, kl, strict=True)]
    curve = [] if rank_pe is None else [(float(f), float(r), float(k)) for f, r, k in zip(grid, eff.ratio, eff.kl_rest,
                                                                                          strict=True)]
    m = 0 if rank_pe is None else matched
    return ArmResult(target, arm, where.get("sae_id"), where.get("latent"), reached, fraction, float(eff.ratio[g]),
                     float(eff.kl_rest[g]), float(eff.ratio[ok].max()) if ok.any() else 1.0, float(eff.ratio[m]),
                     float(eff.kl_rest[m]), curve, where.get("latents", []), asdict(stats),
                     {k: asdict(v) for k, v in per_style(at, styles, ratio=sp.ratio, kl_bound=sp.kl_bound).items()},
                     pairs)


def _classes(handle: ModelHandle, hook: str, target: ResolvedTarget, rank_set: PromptSet) -> tuple[torch.Tensor,
                                                                                                         torch.Tensor]:
    """Hook activations on the target `[N, D]` and off it `[M, D]` (module docstring)."""
    if target.kind == "contrast":
        return last_token_acts(handle, hook, target.texts_a), last_token_acts(handle, hook, target.texts_b)
    on, off = [], []
    for i, prompt in enumerate(rank_set.tokens):  # causal: the prompt's last position is the same with the token added
        token = torch.tensor([target.token_ids[i % len(target.token_ids)]], dtype=prompt.dtype)
        x_TD = run_hooks(handle, torch.cat([prompt, token])[None], [hook])[hook][0].float().cpu()
        on.append(x_TD[-1])
        off.append(x_TD[-2])
    return torch.stack(on), torch.stack(off)


@torch.inference_mode()
def _prompting(handle: ModelHandle, prompts: PromptSet, prefix: str, token_ids: list[int],
               sibling_ids: list[int]) -> PromptEffects:
    """Per-prompt effects of putting `prefix` after each prompt's BOS (no edit)."""
    prefix_ids = handle.to_tokens(prefix, prepend_bos=False)[0].cpu()
    lengths = np.array([len(t) for t in prompts.tokens])
    parts, order = [], []
    for n in np.unique(lengths):
        idx = np.flatnonzero(lengths == n)
        rows = torch.stack([prompts.tokens[i] for i in idx])
        prefixed = torch.cat([rows[:, :1], prefix_ids.expand(len(rows), -1), rows[:, 1:]], 1)
        clean = handle.bridge(rows.to(handle.device))[:, -1].float()
        steered = handle.bridge(prefixed.to(handle.device))[:, -1].float()
        parts.append(prompt_effects(steered[None], clean, token_ids, sibling_ids))
        order.append(idx)
    joined = PromptEffects(*(np.concatenate([getattr(p, f) for p in parts], axis=-1) for f in PromptEffects._fields))
    return joined.prompts(np.argsort(np.concatenate(order), kind="stable"))


def bench_target(handle: ModelHandle, sources: Sequence[SteeringSource], target: Any,
                 params: BenchParams = BenchParams(), *, prompts: Sequence[str] = (),
                 category: Any = None) -> list[ArmResult]:
    """Every arm of the module docstring on one target (`prompts`: the user's own)."""
    sp = params.search
    if "{target}" not in params.prompt_prefix:
        raise InvalidInputError(f"the prompting prefix must name the target with '{{target}}', got "
                                f"{params.prompt_prefix!r}")
    found = rank_features(handle, sources, target, sp, prompts=prompts, category=category)
    if not found.features or found.prompt_sets is None:
        raise InvalidInputError(f"no candidate feature for {found.target.description}")
    best = found.features[0]
    source = next(s for s in sources if s.sae_id == best.sae_id)
    resolved, name, sibs = found.target, found.target.description, found.sibling_ids
    rank_set, confirm_set = found.prompt_sets
    grid = geometric_grid(sp.lowest, sp.highest, sp.per_doubling)
    on, off = _classes(handle, source.hook, resolved, rank_set)
    X, y = torch.cat([on, off]).numpy(), np.r_[np.ones(len(on), bool), np.zeros(len(off), bool)]
    # scikit-learn (which loads rich) is imported when a bench runs, not with the facade
    from sae_atlas.geometry.probes import diff_means_probe, logistic_probe

    W = source.sae.W_dec.detach().float().cpu()
    with torch.inference_mode():
        codes = sae_codes(source.sae, on).float().cpu()
    live = np.isfinite(source.mean_active_act_F) & (source.mean_active_act_F > 0)
    if source.density_F is not None:
        live &= np.nan_to_num(source.density_F, nan=0.0) >= sp.density_floor
    top_active = int(codes.mean(0).argmax())
    pool = np.setdiff1d(np.flatnonzero(live) if live.any() else np.arange(len(W)), [best.latent, top_active])
    random_latent = int(np.random.default_rng(params.random_seed).choice(pool))
    directions = {"feature_add": W[best.latent], "top_activating": W[top_active],
                  "diff_means": torch.as_tensor(diff_means_probe(X, y, seed=params.random_seed).direction_D).float(),
                  "probe": torch.as_tensor(logistic_probe(X, y, seed=params.random_seed).direction_D).float(),
                  "random_feature": W[random_latent]}
    where: dict[str, dict[str, Any]] = {
        "feature_add": {"sae_id": source.sae_id, "latent": best.latent},
        "top_activating": {"sae_id": source.sae_id, "latent": top_active},
        "random_feature": {"sae_id": source.sae_id, "latent": random_latent}}
    combo = found.combination
    if combo is not None and combo.sae_id == source.sae_id:
        directions["combination"] = torch.tensor(combo.weights) @ (W[combo.latents] / W[combo.latents].norm(
            dim=-1, keepdim=True))
        where["combination"] = {"sae_id": source.sae_id, "latents": combo.latents}
    unit = torch.stack([d / d.norm().clamp_min(1e-12) for d in directions.values()])
    matched = int(np.argmin(np.abs(grid - best.strength["norm_fraction"])))
    G = len(grid)
    ranking = prompt_steering(handle, rank_set, source.hook, resolved.token_ids, sibs, sp.batch)
    held = prompt_steering(handle, confirm_set, source.hook, resolved.token_ids, sibs, sp.batch)
    rank_pe = ranking.prompt_effects(direction_deltas(unit, grid, ranking.resid_norm))
    held_pe = held.prompt_effects(direction_deltas(unit, grid, ranking.resid_norm))
    arms = {arm: _arm(name, arm, grid, rank_pe.rows(slice(i * G, (i + 1) * G)),
                      held_pe.rows(slice(i * G, (i + 1) * G)), confirm_set.styles, matched, sp, **where.get(arm, {}))
            for i, arm in enumerate(directions)}
    arms["feature_clamp"] = _clamp_arm(name, source, best.latent, grid, ranking, held, confirm_set.styles, matched, sp,
                                       W)
    text = ", ".join(t.strip() for t in resolved.tokens) if resolved.kind != "contrast" else resolved.texts_a[0]
    prompted = _prompting(handle, confirm_set, params.prompt_prefix.format(target=text), resolved.token_ids, sibs)
    arms["prompting"] = _arm(name, "prompting", grid, None, prompted, confirm_set.styles, matched, sp)
    arms["top_result"] = replace(arms["combination" if found.best == "combination" and "combination" in arms
                                      else "feature_add"], arm="top_result")
    return [arms[a] for a in ARMS if a in arms]


def _clamp_arm(name: str, source: SteeringSource, latent: int, grid: np.ndarray, ranking: PromptSteering,
               held: PromptSteering, styles: list[str], matched: int, sp: SearchParams, W: torch.Tensor) -> ArmResult:
    values = grid[None, :] * ranking.resid_norm / float(W[latent].norm())
    return _arm(name, "feature_clamp", grid, ranking.clamps(source.sae, [latent], values),
                held.clamps(source.sae, [latent], values), styles, matched, sp, sae_id=source.sae_id, latent=latent)


def steer_bench(handle: ModelHandle, sources: Sequence[SteeringSource], targets: Sequence[Any],
                params: BenchParams = BenchParams(), progress: Callable[[str], None] | None = None, *,
                prompts: Sequence[str] = ()) -> list[ArmResult]:
    """`bench_target` for every target, in order."""
    if not targets:
        raise InvalidInputError("name at least one target")
    for t in targets:  # every target is checked before the first one runs
        resolve_target(handle.tokenizer, t, handle.d_vocab)
    rows: list[ArmResult] = []
    for t in targets:
        if progress:
            progress(str(t))
        rows.extend(bench_target(handle, sources, t, params, prompts=prompts))
    return rows


def share_table(rows: Sequence[dict[str, Any]], seed: int = 0) -> list[dict[str, Any]]:
    """Per arm and style (and `all`), the share of (target, prompt) pairs reached over the
    targets of `rows` (`ArmResult`s as dicts), with a bootstrap interval over pairs."""
    out = []
    tails = [100 * (1 - INTERVAL) / 2, 100 * (1 + INTERVAL) / 2]
    rng = np.random.default_rng(seed)
    for arm in dict.fromkeys(r["arm"] for r in rows):
        pairs = [tuple(p) for r in rows if r["arm"] == arm for p in r["pairs"]]
        for style in ["all", *dict.fromkeys(s for s, _ in pairs)]:
            hits = np.array([ok for s, ok in pairs if style in ("all", s)], bool)
            if not hits.size:
                continue
            low, high = np.percentile(hits[rng.integers(0, hits.size, (BOOTSTRAP_SAMPLES, hits.size))].mean(1), tails)
            out.append({"arm": arm, "style": style, "pairs": int(hits.size), "reached": int(hits.sum()),
                        "share": float(hits.mean()), "share_low": float(low), "share_high": float(high)})
    return out


def plot_bench(rows: Sequence[dict[str, Any]], path: Any, kl_bound: float) -> None:
    """One panel per target: each arm's probability ratio against its KL on the rest of the
    distribution over the strength grid (prompting as one point), written as a PNG; `rows`
    are `ArmResult`s as dicts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sae_atlas.store.atomic import save_png

    targets = list(dict.fromkeys(r["target"] for r in rows))
    fig, axes = plt.subplots(1, len(targets), figsize=(4 * len(targets), 3.6), squeeze=False)
    for ax, target in zip(axes[0], targets, strict=True):
        for r in (r for r in rows if r["target"] == target):
            if r["curve"]:
                _, ratio, kl = zip(*r["curve"], strict=True)
                ax.plot(np.maximum(kl, 1e-4), ratio, marker=".", label=r["arm"])
            else:
                ax.scatter([max(r["kl_rest"], 1e-4)], [r["ratio"]], marker="*", s=120, color="k", label=r["arm"],
                           zorder=3)
        ax.axvline(kl_bound, color="grey", ls="--", lw=0.8)
        ax.set(xscale="log", yscale="log", title=target, xlabel="KL on the rest (nats)", ylabel="p(target) ratio")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path, dpi=90)  # atomically: a killed run leaves the old plot or none
    plt.close(fig)
