"""What a last-token steering edit does to a target, per prompt and over a prompt set.

With `q` the clean and `p` the steered next-token distribution of one prompt, a target
set `T` and its siblings `S` (other words of its class; may be empty):

- `log_p = log p(T)`, `log_q = log q(T)`; a prompt's ratio is `p(T) / q(T)`, a set's ratio
  `mean p(T) / mean q(T)`;
- `kl = KL(q || p)`; `kl_rest = KL(q' || p')` with `q'`, `p'` renormalised over the tokens
  outside `T` (what the edit does to everything it was not asked to move);
- `sib_log_p`, `sib_log_q`: the same for `S`;
- `target_rank`: how many tokens the edit promotes more than the target's most promoted
  token, by the change `log p - log q` (0: the target is what the edit raises most).

A prompt's specific gain is `g = log(p(T)/q(T)) - max(0, log(p(S)/q(S)))`: raising the
whole class counts for nothing. A (target, prompt) pair is reached when its ratio is at
least the requested one with `kl_rest` within the bound, and reached specifically when `g`
is at least the log of the requested ratio under the bound.

`prompt_steering` measures a ragged `PromptSet`: its prompts are grouped by length and each
group's prefixes are KV-cached once (`output_scores.last_token_steering`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.intervene.output_scores import last_token_steering
from sae_atlas.saes.intervene.steering_prompts import PromptSet
from sae_atlas.saes.intervene.strength import residual_norms
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE

BOOTSTRAP_SAMPLES = 1000
INTERVAL = 0.95


class Effects(NamedTuple):
    """Effects per steered row, over the prompts (arrays `[F]`; module docstring)."""

    ratio: np.ndarray
    log_gain: np.ndarray
    p_steered: np.ndarray
    kl: np.ndarray
    kl_rest: np.ndarray


class PromptEffects(NamedTuple):
    """Effects per steered row and prompt (arrays `[F, P]`, clean ones `[P]`)."""

    log_p: np.ndarray
    log_q: np.ndarray
    kl: np.ndarray
    kl_rest: np.ndarray
    sib_log_p: np.ndarray  # nan without siblings
    sib_log_q: np.ndarray
    target_rank: np.ndarray

    def aggregate(self) -> Effects:
        """The set's effects per row."""
        p, q = np.exp(self.log_p), np.exp(self.log_q)
        return Effects(p.mean(1) / q.mean(), (self.log_p - self.log_q).mean(1), p.mean(1), self.kl.mean(1),
                       self.kl_rest.mean(1))

    def rows(self, index: slice | np.ndarray | list[int]) -> PromptEffects:
        """Only the rows `index`."""
        return PromptEffects(self.log_p[index], self.log_q, self.kl[index], self.kl_rest[index],
                             self.sib_log_p[index], self.sib_log_q, self.target_rank[index])

    def prompts(self, index: list[int] | np.ndarray) -> PromptEffects:
        """Only the prompts `index`."""
        return PromptEffects(self.log_p[:, index], self.log_q[index], self.kl[:, index], self.kl_rest[:, index],
                             self.sib_log_p[:, index], self.sib_log_q[index], self.target_rank[:, index])

    def gain(self) -> np.ndarray:
        """The specific gain `g` per row and prompt (module docstring)."""
        sib = np.nan_to_num(self.sib_log_p - self.sib_log_q[None], nan=0.0)
        return self.log_p - self.log_q[None] - np.maximum(sib, 0.0)


def _cat(parts: Sequence[PromptEffects], axis: int) -> PromptEffects:
    if axis == 0:
        first = parts[0]
        return PromptEffects(*(np.concatenate([getattr(p, f) for p in parts]) if f not in ("log_q", "sib_log_q")
                               else getattr(first, f) for f in PromptEffects._fields))
    return PromptEffects(*(np.concatenate([getattr(p, f) for p in parts], axis=-1) for f in PromptEffects._fields))


def prompt_effects(steered_FPV: torch.Tensor, clean_PV: torch.Tensor, token_ids: Sequence[int],
                   sibling_ids: Sequence[int] = ()) -> PromptEffects:
    """Per row and prompt, the effects of steered logits `[F, P, V]` against clean `[P, V]`."""
    ids = torch.as_tensor(list(token_ids), device=steered_FPV.device)
    logp, logq = torch.log_softmax(steered_FPV.float(), -1), torch.log_softmax(clean_PV.float(), -1)[None]
    lp_T, lq_T = logp[..., ids].logsumexp(-1), logq[..., ids].logsumexp(-1)

    def rest(logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits.float().index_fill(-1, ids, float("-inf")), -1)

    rp, rq = rest(steered_FPV), rest(clean_PV)[None]
    kl_rest = torch.nan_to_num(rq.exp() * (rq - rp), nan=0.0).sum(-1)
    kl = (logq.exp() * (logq - logp)).sum(-1)
    delta = logp - logq
    rank = (delta > delta[..., ids].amax(-1, keepdim=True)).sum(-1)
    if sibling_ids:
        sib = torch.as_tensor(list(sibling_ids), device=steered_FPV.device)
        sp, sq = logp[..., sib].logsumexp(-1), logq[0, :, sib].logsumexp(-1)
    else:
        sp, sq = torch.full_like(lp_T, float("nan")), torch.full_like(lq_T[0], float("nan"))
    out = (lp_T, lq_T[0], kl, kl_rest, sp, sq, rank)
    return PromptEffects(*(t.cpu().numpy().astype(np.float64) for t in out))


def target_effects(steered_FPV: torch.Tensor, clean_PV: torch.Tensor, token_ids: Sequence[int]) -> Effects:
    """The effects on `T = token_ids` of steered logits `[F, P, V]` against clean `[P, V]`."""
    return prompt_effects(steered_FPV, clean_PV, token_ids).aggregate()


class HookSteering:
    """Last-token steering at one hook on prompts of one length, measured against a target:
    made by `hook_steering`. `resid_norm` is the hook's mean residual norm on the prompts."""

    def __init__(self, steered: Callable[[torch.Tensor], torch.Tensor], clean_PV: torch.Tensor, x_last_PD: torch.Tensor,
                 resid_norm: float, token_ids: list[int], batch: int, sibling_ids: Sequence[int] = ()) -> None:
        self.steered, self.clean_PV, self.x_last_PD = steered, clean_PV, x_last_PD
        self.resid_norm, self.token_ids, self.batch = resid_norm, token_ids, batch
        self.sibling_ids = list(sibling_ids)
        self.p_clean = float(torch.softmax(clean_PV.float(), -1)[:, token_ids].sum(-1).mean())

    def prompt_effects(self, delta: torch.Tensor) -> PromptEffects:
        """Per-prompt effects of adding `delta_FD[f]` (or `delta_FPD[f, p]`) at the last
        position, in batches of `batch` rows."""
        return _cat([prompt_effects(self.steered(delta[i:i + self.batch]), self.clean_PV, self.token_ids,
                                    self.sibling_ids) for i in range(0, len(delta), self.batch)], 0)

    def effects(self, delta: torch.Tensor) -> Effects:
        """`prompt_effects` over the prompts."""
        return self.prompt_effects(delta).aggregate()

    def directions(self, unit_ND: torch.Tensor, fractions: np.ndarray) -> Effects:
        """Effects of each unit direction at each norm fraction: rows `n * G + g`."""
        return self.effects(direction_deltas(unit_ND, fractions, self.resid_norm))

    def clamps(self, sae: SAE, latents: Sequence[int], values_NG: np.ndarray) -> Effects:
        """Effects of clamping each latent to each of its values (rows `n * G + g`): the
        code at the last position set to the value, the SAE's error term kept, so the
        hook's output moves by `(value - f) W_dec[latent]`."""
        return self.effects(clamp_deltas(sae, self.x_last_PD, latents, values_NG))


def direction_deltas(unit_ND: torch.Tensor, fractions: np.ndarray, resid_norm: float) -> torch.Tensor:
    """Each unit direction at each norm fraction of `resid_norm`: `[N * G, D]`."""
    scale = torch.as_tensor(fractions, dtype=torch.float32) * resid_norm
    return (unit_ND.float()[:, None, :] * scale[None, :, None]).flatten(0, 1)


def clamp_deltas(sae: SAE, x_last_PD: torch.Tensor, latents: Sequence[int], values_NG: np.ndarray) -> torch.Tensor:
    """The per-prompt shifts `[N * G, P, D]` that clamp each latent to each of its values."""
    with torch.inference_mode():
        f_PF = sae_codes(sae, x_last_PD)[:, list(latents)].float().cpu()
    W_ND = sae.W_dec.detach()[list(latents)].float().cpu()
    values = torch.as_tensor(values_NG, dtype=torch.float32)
    shift_NGP = values[:, :, None] - f_PF.T[:, None, :]
    return (shift_NGP[..., None] * W_ND[:, None, None, :]).flatten(0, 1)


@contextmanager
def hook_steering(handle: ModelHandle, prompts_PT: torch.Tensor, hook: str, token_ids: list[int],
                  batch: int = 16, sibling_ids: Sequence[int] = ()) -> Iterator[HookSteering]:
    """A `HookSteering` at `hook` over `prompts_PT` (prefixes KV-cached once)."""
    resid_norm, x_last_PD = residual_norms(handle, hook, prompts_PT)
    with last_token_steering(handle, prompts_PT, hook) as steered:
        clean_PV = steered(torch.zeros(1, handle.d_model))[0]
        yield HookSteering(steered, clean_PV, x_last_PD, resid_norm, token_ids, batch, sibling_ids)


class PromptSteering:
    """Last-token steering at one hook over a ragged `PromptSet`, measured against a
    target: its prompts are grouped by length and each call steers every group in turn
    (their KV caches cannot be open at once); per-prompt answers come back in the set's
    order. `resid_norm` is the mean residual norm over all positions after BOS."""

    def __init__(self, handle: ModelHandle, prompts: PromptSet, hook: str, token_ids: list[int],
                 sibling_ids: Sequence[int] = (), batch: int = 16) -> None:
        self.handle, self.hook, self.token_ids, self.batch = handle, hook, token_ids, batch
        self.sibling_ids = list(sibling_ids)
        lengths = np.array([len(t) for t in prompts.tokens])
        self.groups = [(idx, torch.stack([prompts.tokens[i] for i in idx]))
                       for idx in (np.flatnonzero(lengths == n) for n in np.unique(lengths))]
        self.order = np.argsort(np.concatenate([idx for idx, _ in self.groups]), kind="stable")
        norms, lasts, p_clean = [], [], 0.0
        for idx, rows in self.groups:
            with hook_steering(handle, rows, hook, token_ids, batch, sibling_ids) as probe:
                norms.append(probe.resid_norm)
                lasts.append(probe.x_last_PD)
                p_clean += probe.p_clean * len(idx)
        weights = np.array([len(idx) * max(rows.shape[1] - 1, 1) for idx, rows in self.groups], float)
        self.resid_norm = float(np.average(norms, weights=weights))
        self.x_last_PD = torch.cat(lasts)[torch.as_tensor(self.order)]
        self.p_clean = p_clean / len(prompts)

    def prompt_effects(self, delta: torch.Tensor) -> PromptEffects:
        """Per-prompt effects of `delta_FD` (or per-prompt `delta_FPD`), in the set's order."""
        parts = []
        for idx, rows in self.groups:
            with hook_steering(self.handle, rows, self.hook, self.token_ids, self.batch, self.sibling_ids) as probe:
                parts.append(probe.prompt_effects(delta if delta.ndim == 2 else delta[:, torch.as_tensor(idx)]))
        return _cat(parts, 1).prompts(self.order)

    def directions(self, unit_ND: torch.Tensor, fractions: np.ndarray) -> PromptEffects:
        """Per-prompt effects of each unit direction at each norm fraction (rows `n * G + g`)."""
        return self.prompt_effects(direction_deltas(unit_ND, fractions, self.resid_norm))

    def clamps(self, sae: SAE, latents: Sequence[int], values_NG: np.ndarray) -> PromptEffects:
        """Per-prompt effects of clamping each latent to each of its values (rows `n * G + g`)."""
        return self.prompt_effects(clamp_deltas(sae, self.x_last_PD, latents, values_NG))


def prompt_steering(handle: ModelHandle, prompts: PromptSet, hook: str, token_ids: list[int],
                    sibling_ids: Sequence[int] = (), batch: int = 16) -> PromptSteering:
    """A `PromptSteering` at `hook` over `prompts`."""
    return PromptSteering(handle, prompts, hook, token_ids, sibling_ids, batch)


@dataclass
class PairStats:
    """One edit at one strength on a prompt set (module docstring): the set's ratio with a
    bootstrap interval over prompts, the share of (target, prompt) pairs reached (plainly
    and specifically) with an interval, and the side effects."""

    n_prompts: int
    ratio: float
    ratio_low: float
    ratio_high: float
    median_ratio: float
    share_reached: float
    share_low: float
    share_high: float
    share_specific: float
    lowered: float  # share of prompts where the target's probability fell
    kl_rest: float
    sibling_ratio: float | None
    target_rank: float  # median over prompts
    score: float  # mean specific gain, pairs over the KL bound counted at most 0 (ranking tie-break)


def pair_stats(pe: PromptEffects, *, ratio: float, kl_bound: float, seed: int = 0) -> PairStats:
    """`PairStats` of the one row of `pe`."""
    log_r, kl, g = pe.log_p[0] - pe.log_q, pe.kl_rest[0], pe.gain()[0]
    ok = kl <= kl_bound
    reached, specific = (log_r >= np.log(ratio)) & ok, (g >= np.log(ratio)) & ok
    p, q = np.exp(pe.log_p[0]), np.exp(pe.log_q)
    idx = np.random.default_rng(seed).integers(0, len(q), (BOOTSTRAP_SAMPLES, len(q)))
    tails = [100 * (1 - INTERVAL) / 2, 100 * (1 + INTERVAL) / 2]
    r_lo, r_hi = np.percentile(p[idx].mean(1) / q[idx].mean(1), tails)
    s_lo, s_hi = np.percentile(reached[idx].mean(1), tails)
    sib = None
    if not np.isnan(pe.sib_log_q).any():
        sib = float(np.exp(pe.sib_log_p[0]).mean() / np.exp(pe.sib_log_q).mean())
    return PairStats(len(q), float(p.mean() / q.mean()), float(r_lo), float(r_hi), float(np.exp(np.median(log_r))),
                     float(reached.mean()), float(s_lo), float(s_hi), float(specific.mean()), float((log_r < 0).mean()),
                     float(kl.mean()), sib, float(np.median(pe.target_rank[0])),
                     float(np.where(ok, g, np.minimum(g, 0.0)).mean()))


def per_style(pe: PromptEffects, styles: Sequence[str], *, ratio: float, kl_bound: float) -> dict[str, PairStats]:
    """`pair_stats` of each style's prompts."""
    out = {}
    for style in dict.fromkeys(styles):
        idx = [i for i, s in enumerate(styles) if s == style]
        out[style] = pair_stats(pe.prompts(idx), ratio=ratio, kl_bound=kl_bound)
    return out
