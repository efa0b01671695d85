"""A steering benchmark in the style of AxBench (Wu et al. 2025): for each target, steer
with several directions at the same hook and compare what each does to the target's
probability against what it does to the rest of the distribution.

The arms, all added at the last token of the same held-out neutral prompts (or, for
prompting, with no edit at all):

- `feature_add`, `feature_clamp`: the best feature of `steering_search.rank_features`
  (its hook is the hook of every arm), added along its decoder row or clamped;
- `top_activating`: the naive choice, the latent of that SAE most active on the target
  token itself (mean code when a target token follows each training prompt), added;
- `diff_means`: the difference of means (`geometry.probes.diff_means_probe`) between the
  hook's activations on the target and off it: for tokens, the training prompts with a
  target token appended (at that token) against the same prompts (at their last token);
  for a contrast, the last tokens of texts A against texts B;
- `probe`: the direction of a logistic probe on the same two classes
  (`geometry.probes.logistic_probe`);
- `random_feature`: a seeded random live latent of the same SAE;
- `prompting`: the prompts prefixed with text naming the target (`prompt_prefix`).

Every direction is a unit vector swept over one geometric grid of norm fractions of the
hook's mean residual norm (`saes.intervene.strength`), so arms are compared at matched
norms. Per arm: the curve over the grid, the calibrated strength (smallest reaching the
requested ratio under the KL bound), and the ratio and KL at the best feature's calibrated
norm (`matched_*`). The training prompts are the steering table's draw; the measuring
prompts are held out from them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from saes.forward import run_hooks
from saes.intervene.output_scores import neutral_prompts
from saes.intervene.steering_effects import Effects, HookSteering, hook_steering, target_effects
from saes.intervene.steering_prompts import heldout_prompts
from saes.intervene.steering_search import (
    ResolvedTarget,
    SearchParams,
    SteeringSource,
    last_token_acts,
    rank_features,
    resolve_target,
)
from saes.intervene.strength import calibrate, geometric_grid
from saes.models import ModelHandle
from store.errors import InvalidInputError

ARMS = ("feature_add", "feature_clamp", "top_activating", "diff_means", "probe", "random_feature", "prompting")


@dataclass(frozen=True)
class BenchParams:
    """How the benchmark measures (recorded with its results)."""

    search: SearchParams = SearchParams(k=1, fluency_prompts=0)
    prompt_prefix: str = "Let's talk about {target}."
    random_seed: int = 0


@dataclass
class ArmResult:
    """One arm on one target (module docstring)."""

    target: str
    arm: str
    sae_id: str | None
    latent: int | None
    reached: bool
    norm_fraction: float | None  # calibrated (None for prompting)
    ratio: float  # at the calibrated strength
    kl_rest: float
    best_ratio: float  # best on the grid under the KL bound
    matched_ratio: float  # at the best feature's calibrated norm
    matched_kl_rest: float
    curve: list[tuple[float, float, float]] = field(default_factory=list)  # (norm_fraction, ratio, kl_rest)


def _arm(target: str, arm: str, sae_id: str | None, latent: int | None, grid: np.ndarray, eff: Effects,
         matched: int, params: SearchParams) -> ArmResult:
    cal = calibrate(grid, eff.ratio, eff.kl_rest, ratio=params.ratio, kl_bound=params.kl_bound)
    curve = [(float(g), float(r), float(k)) for g, r, k in zip(grid, eff.ratio, eff.kl_rest, strict=True)]
    return ArmResult(target, arm, sae_id, latent, cal.reached, cal.norm_fraction, cal.ratio, cal.kl_rest,
                     cal.best_ratio, float(eff.ratio[matched]), float(eff.kl_rest[matched]), curve)


def _classes(handle: ModelHandle, hook: str, target: ResolvedTarget, train_PT: torch.Tensor) -> tuple[torch.Tensor,
                                                                                                        torch.Tensor]:
    """Hook activations on the target `[N, D]` and off it `[M, D]` (module docstring)."""
    if target.kind == "contrast":
        return last_token_acts(handle, hook, target.texts_a), last_token_acts(handle, hook, target.texts_b)
    ids = torch.tensor(target.token_ids)[torch.arange(len(train_PT)) % len(target.token_ids)]
    on = run_hooks(handle, torch.cat([train_PT, ids[:, None]], 1), [hook])[hook][:, -1].float().cpu()
    off = run_hooks(handle, train_PT, [hook])[hook][:, -1].float().cpu()
    return on, off


def _prompting(handle: ModelHandle, probe: HookSteering, prompts_PT: torch.Tensor, prefix: str) -> Effects:
    """Effects of putting `prefix` after each prompt's BOS (no edit; outside the probe's
    steering hooks)."""
    prefix_ids = handle.to_tokens(prefix, prepend_bos=False)[0].cpu()
    rows = torch.cat([prompts_PT[:, :1], prefix_ids.expand(len(prompts_PT), -1), prompts_PT[:, 1:]], 1)
    with torch.inference_mode():
        logits = handle.bridge(rows.to(handle.device))[:, -1].float()
    return target_effects(logits[None], probe.clean_PV, probe.token_ids)


def bench_target(handle: ModelHandle, sources: Sequence[SteeringSource], target: Any,
                 params: BenchParams = BenchParams()) -> list[ArmResult]:
    """Every arm of the module docstring on one target."""
    sp = params.search
    if "{target}" not in params.prompt_prefix:
        raise InvalidInputError(f"the prompting prefix must name the target with '{{target}}', got "
                                f"{params.prompt_prefix!r}")
    found = rank_features(handle, sources, target, sp)
    if not found.features:
        raise InvalidInputError(f"no candidate feature for {found.target.description}")
    best = found.features[0]
    source = next(s for s in sources if s.sae_id == best.sae_id)
    resolved, name = found.target, found.target.description
    grid = geometric_grid(sp.lowest, sp.highest, sp.per_doubling)
    prompts = heldout_prompts(handle, sp.n_prompts, sp.prompt_tokens, found.seed, [s.table_prompts for s in sources])
    train = neutral_prompts(handle, *source.table_prompts)
    on, off = _classes(handle, source.hook, resolved, train)
    X, y = torch.cat([on, off]).numpy(), np.r_[np.ones(len(on), bool), np.zeros(len(off), bool)]
    # scikit-learn (which loads rich) is imported when a bench runs, not with the facade
    from geometry.probes import diff_means_probe, logistic_probe

    W = source.sae.W_dec.detach().float().cpu()
    with torch.inference_mode():
        codes = source.sae.encode(on.to(W)).float().cpu()
    top_active = int(codes.mean(0).argmax())
    live = np.flatnonzero(np.isfinite(source.mean_active_act_F) & (source.mean_active_act_F > 0))
    pool = np.setdiff1d(live if live.size else np.arange(len(W)), [best.latent, top_active])
    random_latent = int(np.random.default_rng(params.random_seed).choice(pool))
    directions = {"feature_add": W[best.latent], "top_activating": W[top_active],
                  "diff_means": torch.as_tensor(diff_means_probe(X, y, seed=params.random_seed).direction_D).float(),
                  "probe": torch.as_tensor(logistic_probe(X, y, seed=params.random_seed).direction_D).float(),
                  "random_feature": W[random_latent]}
    latents = {"feature_add": best.latent, "top_activating": top_active, "random_feature": random_latent}
    unit = torch.stack([d / d.norm().clamp_min(1e-12) for d in directions.values()])
    matched = int(np.argmin(np.abs(grid - best.strength["norm_fraction"])))
    G = len(grid)
    with hook_steering(handle, prompts, source.hook, resolved.token_ids, sp.batch) as probe:
        eff = probe.directions(unit, grid)
        values = grid[None, :] * probe.resid_norm / float(W[best.latent].norm())
        clamp = probe.clamps(source.sae, [best.latent], values)
    prompted = _prompting(handle, probe, prompts, params.prompt_prefix.format(
        target=", ".join(t.strip() for t in resolved.tokens) if resolved.kind != "contrast" else resolved.texts_a[0]))
    out = []
    for i, arm in enumerate(directions):
        part = Effects(*(col[i * G:(i + 1) * G] for col in eff))
        out.append(_arm(name, arm, source.sae_id if arm in latents else None, latents.get(arm), grid, part, matched, sp))
    out.insert(1, _arm(name, "feature_clamp", source.sae_id, best.latent, grid, clamp, matched, sp))
    ratio, kl_rest = float(prompted.ratio[0]), float(prompted.kl_rest[0])
    reached = ratio >= sp.ratio and kl_rest <= sp.kl_bound
    out.append(ArmResult(name, "prompting", None, None, reached, None, ratio, kl_rest,
                         ratio if kl_rest <= sp.kl_bound else 1.0, ratio, kl_rest))
    return out


def steer_bench(handle: ModelHandle, sources: Sequence[SteeringSource], targets: Sequence[Any],
                params: BenchParams = BenchParams(),
                progress: Callable[[str], None] | None = None) -> list[ArmResult]:
    """`bench_target` for every target, in order."""
    if not targets:
        raise InvalidInputError("name at least one target")
    for t in targets:  # every target is checked before the first one runs
        resolve_target(handle.tokenizer, t, handle.d_vocab)
    rows: list[ArmResult] = []
    for t in targets:
        if progress:
            progress(str(t))
        rows.extend(bench_target(handle, sources, t, params))
    return rows


def plot_bench(rows: Sequence[dict[str, Any]], path: Any, kl_bound: float) -> None:
    """One panel per target: each arm's probability ratio against its KL on the rest of the
    distribution over the strength grid (prompting as one point), written as a PNG; `rows`
    are `ArmResult`s as dicts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from geometry.canvas import save_png

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
