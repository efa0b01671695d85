"""Steering toward a target: features ranked by their MEASURED effect, not by activation.

Features that detect a concept are often not the ones that promote it (Arad, Mueller and
Belinkov 2025, "SAEs are good for steering - if you select the right features"), so the
ranking steers and measures. A target is a set of next tokens `T`:

- `tokens`: one token or several, by text (each must be ONE token of the vocabulary) or id;
- `concept`: a concept of `saes.intervene.concepts` (built-in weekdays / months / colours,
  or a user set): `T` is the first token of `" " + value` for each of its values;
- `contrast`: two sets of texts A and B. `T` holds the tokens over-represented in A: the
  `MAX_CONTRAST_TOKENS` tokens with the largest smoothed log-odds
  `log((c_A + 1/2) / (n_A + 1/2)) - log((c_B + 1/2) / (n_B + 1/2))` (token counts `c`,
  totals `n`) among those occurring at least twice in A and with positive log-odds. The
  difference of the two sets' mean activations at each hook also proposes candidates.

Per SAE the candidates are the latents whose stored steering row (`store.steering`) lists
target tokens among its promoted ones (by their summed log-probability gain), the latents
whose decoder row through the unembedding (`saes.summary.logits` convention) gives `T` the
largest z-scored logit, and for a contrast the latents nearest the difference of means.
Each candidate is then steered (`last_token_steering`, batched) at the last token of
HELD-OUT neutral prompts (another seed than the table's; prompts equal to one of the
table's are dropped) at a matched norm (`saes.intervene.strength`), and the best are swept
over a geometric grid of strengths. Measured per row, over the prompts, with `q` the clean
and `p` the steered next-token distribution:

- `ratio = mean p(T) / mean q(T)` and `log_gain = mean log(p(T) / q(T))`;
- `kl = KL(q || p)`; `kl_rest = KL(q' || p')` with `q'`, `p'` renormalised over the tokens
  outside `T`: what the edit does to everything it was not asked to move (the fluency
  bound; the full KL grows with the very shift the edit is for).

A feature's rank is its best ratio under the KL bound; its ready edit carries the smallest
grid strength that reaches the requested ratio under the bound (`strength.calibrate`), as
a steer (add `alpha * W_dec[f]`) or a clamp (set the latent to `value`) at `at="last"`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np
import polars as pl
import torch
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from saes.encoding.texts import tokenize_texts
from saes.forward import run_hooks
from saes.intervene.concepts import load_concept
from saes.intervene.edits import ClampEdit, SteerEdit, compile_edit, resolve_positions
from saes.intervene.output_scores import last_token_steering, neutral_prompts
from saes.intervene.splice import Splice
from saes.intervene.strength import (
    MAX_KL_BOUND,
    MAX_RATIO,
    Calibration,
    StrengthScale,
    calibrate,
    check_bound,
    continuation_perplexity,
    geometric_grid,
    residual_norms,
)
from saes.models import ModelHandle
from saes.sae.base import SAE
from saes.summary.logits import logit_directions
from store.errors import InvalidInputError

MAX_TARGET_TOKENS = 64
MAX_CONTRAST_TOKENS = 16
MAX_TEXTS = 256
MAX_TEXT_CHARS = 2000
SteerMode = Literal["add", "clamp"]
STEER_MODES: tuple[SteerMode, ...] = ("add", "clamp")


class TokenTarget(BaseModel):
    """Next tokens to raise: token texts (one vocabulary token each) or ids."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["tokens"] = "tokens"
    tokens: list[str | int] = Field(min_length=1, max_length=MAX_TARGET_TOKENS)


class ContrastTarget(BaseModel):
    """Steer toward texts A and away from texts B (rule in the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["contrast"] = "contrast"
    texts_a: list[str] = Field(max_length=MAX_TEXTS)
    texts_b: list[str] = Field(max_length=MAX_TEXTS)


class ConceptTarget(BaseModel):
    """A concept's values as next tokens: a built-in name or `{values, templates, ...}`."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["concept"] = "concept"
    concept: str | dict[str, Any]


SteeringTarget = Annotated[TokenTarget | ContrastTarget | ConceptTarget, Field(discriminator="kind")]
_TARGET = TypeAdapter(SteeringTarget)


def parse_target(target: Any) -> TokenTarget | ContrastTarget | ConceptTarget:
    """A target from a model, a dict (`{"kind": "tokens" | "contrast" | "concept", ...}`), a
    token text or id, or a list of them."""
    if isinstance(target, (TokenTarget, ContrastTarget, ConceptTarget)):
        return target
    if isinstance(target, (str, int)) and not isinstance(target, bool):
        target = {"kind": "tokens", "tokens": [target]}
    elif isinstance(target, (list, tuple)):
        target = {"kind": "tokens", "tokens": list(target)}
    try:
        return _TARGET.validate_python(target)
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
        raise InvalidInputError(f"invalid steering target ({detail}); give a token, a list of tokens, "
                                "{'kind': 'contrast', 'texts_a': [...], 'texts_b': [...]} or "
                                "{'kind': 'concept', 'concept': 'weekdays'}") from exc


@dataclass
class ResolvedTarget:
    """A target as token ids `T`, with what it came from."""

    kind: str
    description: str
    token_ids: list[int]
    tokens: list[str]
    texts_a: list[str] = field(default_factory=list)
    texts_b: list[str] = field(default_factory=list)


def vocabulary_token(tokenizer: Any, token: str | int, d_vocab: int) -> int:
    """The id of one target token: an id in range, or a text that is exactly one token
    (as written in text, `" Friday"`, or as the vocabulary spells it, `"ĠFriday"`)."""
    if isinstance(token, int):
        if not 0 <= token < d_vocab:
            raise InvalidInputError(f"token id {token} is outside the vocabulary: valid 0..{d_vocab - 1}")
        return token
    if not token:
        raise InvalidInputError("a target token must be a non-empty string")
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    unknown = tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ids and token != tokenizer.unk_token
    if len(ids) == 1 and ids[0] < d_vocab and not unknown:
        return int(ids[0])
    spelled = tokenizer.convert_tokens_to_ids(token)
    if isinstance(spelled, int) and 0 <= spelled < d_vocab and spelled != tokenizer.unk_token_id:
        return spelled
    pieces = [tokenizer.decode([i]) for i in ids]
    if unknown:
        raise InvalidInputError(f"{token!r} is not in the model's vocabulary (the tokenizer reads it as unknown)")
    raise InvalidInputError(f"{token!r} is not a token of the model's vocabulary (it encodes as {len(ids)} tokens "
                            f"{pieces}); give one token, e.g. {pieces[0]!r}, or a token id")


def _check_texts(texts: Sequence[str], what: str) -> list[str]:
    texts = [t for t in texts if isinstance(t, str) and t.strip()]
    if not texts:
        raise InvalidInputError(f"{what} is empty: a contrast needs at least one non-empty text in each set")
    if any(len(t) > MAX_TEXT_CHARS for t in texts):
        raise InvalidInputError(f"{what}: a text is longer than {MAX_TEXT_CHARS} characters")
    return texts


def contrast_tokens(tokenizer: Any, texts_a: list[str], texts_b: list[str]) -> list[int]:
    """The tokens over-represented in `texts_a` (rule in the module docstring), best first."""
    def counts(texts: list[str]) -> tuple[dict[int, int], int]:
        ids = [i for t in texts for i in tokenizer(t, add_special_tokens=False)["input_ids"]]
        values, n = np.unique(ids, return_counts=True)
        return dict(zip(values.tolist(), n.tolist(), strict=True)), len(ids)

    (ca, na), (cb, nb) = counts(texts_a), counts(texts_b)
    scored = sorted(((np.log((c + 0.5) / (na + 0.5)) - np.log((cb.get(t, 0) + 0.5) / (nb + 0.5)), t)
                     for t, c in ca.items() if c >= 2), reverse=True)
    chosen = [t for s, t in scored if s > 0][:MAX_CONTRAST_TOKENS]
    if not chosen:
        raise InvalidInputError("no token occurs at least twice in texts_a and more often than in texts_b; "
                                "give texts whose words set A apart from B")
    return chosen


def resolve_target(tokenizer: Any, target: Any, d_vocab: int) -> ResolvedTarget:
    """The token set `T` of a target (module docstring)."""
    target = parse_target(target)
    if isinstance(target, TokenTarget):
        ids = list(dict.fromkeys(vocabulary_token(tokenizer, t, d_vocab) for t in target.tokens))
        desc = ", ".join(repr(tokenizer.decode([i])) for i in ids)
        return ResolvedTarget("tokens", desc, ids, [tokenizer.decode([i]) for i in ids])
    if isinstance(target, ConceptTarget):
        concept = load_concept(target.concept, categories=True)
        ids = list(dict.fromkeys(int(tokenizer(" " + v, add_special_tokens=False)["input_ids"][0])
                                 for v in concept.values))
        return ResolvedTarget("concept", f"concept {concept.name}", ids, [tokenizer.decode([i]) for i in ids])
    a, b = _check_texts(target.texts_a, "texts_a"), _check_texts(target.texts_b, "texts_b")
    ids = contrast_tokens(tokenizer, a, b)
    return ResolvedTarget("contrast", f"contrast of {len(a)} vs {len(b)} texts", ids,
                          [tokenizer.decode([i]) for i in ids], a, b)


class Effects(NamedTuple):
    """Measured effects per steered row (arrays `[F]`; module docstring)."""

    ratio: np.ndarray
    log_gain: np.ndarray
    p_steered: np.ndarray
    kl: np.ndarray
    kl_rest: np.ndarray


def target_effects(steered_FPV: torch.Tensor, clean_PV: torch.Tensor, token_ids: Sequence[int]) -> Effects:
    """The effects on `T = token_ids` of steered logits `[F, P, V]` against clean `[P, V]`."""
    ids = torch.as_tensor(list(token_ids), device=steered_FPV.device)
    logp, logq = torch.log_softmax(steered_FPV.float(), -1), torch.log_softmax(clean_PV.float(), -1)[None]
    lp_T, lq_T = logp[..., ids].logsumexp(-1), logq[..., ids].logsumexp(-1)

    def rest(logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits.float().index_fill(-1, ids, float("-inf")), -1)

    rp, rq = rest(steered_FPV), rest(clean_PV)[None]
    kl_rest = torch.nan_to_num(rq.exp() * (rq - rp), nan=0.0).sum(-1)
    kl = (logq.exp() * (logq - logp)).sum(-1)
    out = (lp_T.exp().mean(1) / lq_T.exp().mean(1), (lp_T - lq_T).mean(1), lp_T.exp().mean(1), kl.mean(1),
           kl_rest.mean(1))
    return Effects(*(t.cpu().numpy().astype(np.float64) for t in out))


def _cat(parts: list[Effects]) -> Effects:
    return Effects(*(np.concatenate(col) for col in zip(*parts, strict=True)))


class HookSteering:
    """Last-token steering at one hook on fixed prompts, measured against a target: made
    by `hook_steering`. `resid_norm` is the hook's mean residual norm on the prompts."""

    def __init__(self, steered: Callable[[torch.Tensor], torch.Tensor], clean_PV: torch.Tensor, x_last_PD: torch.Tensor,
                 resid_norm: float, token_ids: list[int], batch: int) -> None:
        self.steered, self.clean_PV, self.x_last_PD = steered, clean_PV, x_last_PD
        self.resid_norm, self.token_ids, self.batch = resid_norm, token_ids, batch
        self.p_clean = float(torch.softmax(clean_PV.float(), -1)[:, token_ids].sum(-1).mean())

    def effects(self, delta: torch.Tensor) -> Effects:
        """Effects of adding `delta_FD[f]` (or `delta_FPD[f, p]`) at the last position, in
        batches of `batch` rows."""
        parts = [target_effects(self.steered(delta[i:i + self.batch]), self.clean_PV, self.token_ids)
                 for i in range(0, len(delta), self.batch)]
        return _cat(parts)

    def directions(self, unit_ND: torch.Tensor, fractions: np.ndarray) -> Effects:
        """Effects of each unit direction at each norm fraction: rows `n * G + g`."""
        scale = torch.as_tensor(fractions, dtype=torch.float32) * self.resid_norm
        return self.effects((unit_ND.float()[:, None, :] * scale[None, :, None]).flatten(0, 1))

    def clamps(self, sae: SAE, latents: Sequence[int], values_NG: np.ndarray) -> Effects:
        """Effects of clamping each latent to each of its values (rows `n * G + g`): the
        code at the last position set to the value, the SAE's error term kept, so the
        hook's output moves by `(value - f) W_dec[latent]`."""
        with torch.inference_mode():
            f_PF = sae.encode(self.x_last_PD.to(sae.W_dec))[:, list(latents)].float().cpu()
        W_ND = sae.W_dec.detach()[list(latents)].float().cpu()
        values = torch.as_tensor(values_NG, dtype=torch.float32)
        shift_NGP = values[:, :, None] - f_PF.T[:, None, :]
        return self.effects((shift_NGP[..., None] * W_ND[:, None, None, :]).flatten(0, 1))


@contextmanager
def hook_steering(handle: ModelHandle, prompts_PT: torch.Tensor, hook: str, token_ids: list[int],
                  batch: int = 16) -> Iterator[HookSteering]:
    """A `HookSteering` at `hook` over `prompts_PT` (prefixes KV-cached once)."""
    resid_norm, x_last_PD = residual_norms(handle, hook, prompts_PT)
    with last_token_steering(handle, prompts_PT, hook) as steered:
        clean_PV = steered(torch.zeros(1, handle.d_model))[0]
        yield HookSteering(steered, clean_PV, x_last_PD, resid_norm, token_ids, batch)


def heldout_prompts(handle: ModelHandle, n: int, n_tokens: int, seed: int, avoid: Sequence[tuple[int, int, int]]) -> torch.Tensor:
    """`n` neutral prompts of `n_tokens` drawn with `seed`, none equal to a prompt of the
    draws `avoid` (`(n, n_tokens, seed)` each: the steering tables')."""
    if any(s == seed for _, _, s in avoid):
        raise InvalidInputError(f"seed {seed} drew the steering table's prompts; held-out prompts need another seed")
    seen = {tuple(row.tolist()) for a_n, a_t, a_s in avoid if a_t == n_tokens
            for row in neutral_prompts(handle, a_n, a_t, a_s)}
    drawn = neutral_prompts(handle, n + len(seen), n_tokens, seed)
    return torch.stack([row for row in drawn if tuple(row.tolist()) not in seen][:n])


@torch.inference_mode()
def last_token_acts(handle: ModelHandle, hook: str, texts: Sequence[str]) -> torch.Tensor:
    """Activations `[N, D]` at `hook` of each text's last token (BOS prepended)."""
    tokens_NT, lengths_N = tokenize_texts(handle, list(texts))
    x_NTD = run_hooks(handle, tokens_NT, [handle.check_hook(hook)])[hook].float().cpu()
    return x_NTD[torch.arange(len(x_NTD)), lengths_N - 1]


@dataclass
class SteeringSource:
    """One SAE a search ranks: its module, hook, typical active values `[F]` (the
    summaries' `mean_active_act`) and stored steering table."""

    sae_id: str
    hook: str
    sae: SAE
    mean_active_act_F: np.ndarray
    table: pl.DataFrame
    table_prompts: tuple[int, int, int]  # (n, tokens, seed) the table was measured on


@dataclass(frozen=True)
class SearchParams:
    """How `rank_features` measures (recorded with its result)."""

    k: int = 10  # features returned
    candidates: int = 24  # screened per SAE
    n_prompts: int = 16
    prompt_tokens: int = 12
    seed: int | None = None  # None: one past the largest seed of the steering tables
    mode: SteerMode = "add"
    ratio: float = 3.0  # requested probability ratio of the target
    kl_bound: float = 1.0  # nats, KL on the rest of the distribution
    lowest: float = 1 / 16  # strength grid, norm fractions
    highest: float = 2.0
    per_doubling: int = 2
    screen: float = 0.5  # norm fraction at which candidates are screened
    fluency_prompts: int = 4  # prompts continued to measure perplexity (0: skip)
    fluency_tokens: int = 12
    batch: int = 16  # steered rows (features) per forward

    def check(self) -> SearchParams:
        """Self if every parameter is within its bounds (InvalidInputError naming the first that is not)."""
        for what, value, lo, hi in (("k", self.k, 1, 100), ("candidates", self.candidates, 1, 512),
                                    ("n_prompts", self.n_prompts, 1, 256), ("prompt_tokens", self.prompt_tokens, 2, 128),
                                    ("fluency_prompts", self.fluency_prompts, 0, 64),
                                    ("fluency_tokens", self.fluency_tokens, 1, 64), ("batch", self.batch, 1, 1024),
                                    ("per_doubling", self.per_doubling, 1, 8)):
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise InvalidInputError(f"{what} must be an integer in {lo}..{hi}, got {value!r}")
        if self.mode not in STEER_MODES:
            raise InvalidInputError(f"unknown steering mode {self.mode!r}; valid: {', '.join(STEER_MODES)}")
        check_bound(self.ratio, "ratio", 1.0, MAX_RATIO)
        check_bound(self.kl_bound, "kl_bound", 0.0, MAX_KL_BOUND)
        check_bound(self.screen, "screen strength", 0.0, self.highest)
        geometric_grid(self.lowest, self.highest, self.per_doubling)
        return self


@dataclass
class RankedFeature:
    """One ranked feature: what steering it measured and its ready edit."""

    sae_id: str
    hook: str
    latent: int
    sources: list[str]  # "table", "lens", "contrast": why it was a candidate
    screen_ratio: float  # ratio at the screening strength
    best_ratio: float  # best ratio on the grid under the KL bound (the ranking key)
    reached: bool  # the requested ratio is reached under the KL bound
    ratio: float  # at the calibrated strength
    log_gain: float
    p_clean: float
    p_steered: float
    kl: float
    kl_rest: float
    strength: dict[str, float | None]  # alpha, act_multiple, norm_fraction
    edit: dict[str, Any]  # a SteerEdit or ClampEdit, ready for `Atlas.steer` / `Atlas.run`
    perplexity: float | None = None  # clean model on the edited greedy continuation


@dataclass
class SearchResult:
    """`rank_features`' answer: the ranked features and how they were measured."""

    target: ResolvedTarget
    params: SearchParams
    seed: int
    resid_norms: dict[str, float]  # per SAE, measured on the held-out prompts
    baseline_perplexity: float | None
    features: list[RankedFeature]


def _candidates(handle: ModelHandle, source: SteeringSource, target: ResolvedTarget, n: int,
                contrast_D: torch.Tensor | None) -> dict[int, list[str]]:
    """Up to `n` candidate latents of one SAE and why each is one (module docstring)."""
    ids = torch.as_tensor(target.token_ids)
    W_dec = source.sae.W_dec.detach().float().cpu()
    d_FD = logit_directions(W_dec, handle.final_norm_weight, handle.final_norm_kind)
    W_U = handle.W_U.detach().float().cpu()
    mean_F = d_FD @ W_U.mean(1)
    second_F = ((d_FD @ (W_U @ W_U.T / W_U.shape[1])) * d_FD).sum(-1)
    z_F = ((d_FD @ W_U[:, ids] - mean_F[:, None]) / (second_F - mean_F**2).clamp_min(1e-12).sqrt()[:, None]).mean(1)
    ranked: dict[str, list[int]] = {"lens": z_F.argsort(descending=True).tolist()}
    rows = (source.table.select("latent", "promoted_ids", "promoted_deltas").explode("promoted_ids", "promoted_deltas")
            .filter(pl.col("promoted_ids").is_in(target.token_ids)).group_by("latent")
            .agg(pl.col("promoted_deltas").sum().alias("gain")).sort("gain", "latent", descending=[True, False]))
    ranked["table"] = rows["latent"].to_list()
    if contrast_D is not None:
        ranked["contrast"] = (W_dec @ contrast_D / W_dec.norm(dim=-1).clamp_min(1e-12)).argsort(descending=True).tolist()
    chosen: dict[int, list[str]] = {}
    share = max(1, n // len(ranked))
    for name, order in ranked.items():
        for latent in order[:share]:
            chosen.setdefault(int(latent), []).append(name)
    for latent in ranked["lens"]:  # fill up from the lens
        if len(chosen) >= n:
            break
        chosen.setdefault(int(latent), ["lens"])
    return chosen


def _edit(mode: SteerMode, source: SteeringSource, latent: int, amount: float) -> SteerEdit | ClampEdit:
    if mode == "add":
        return SteerEdit(sae=source.sae_id, feature=latent, alpha=amount, at="last")
    return ClampEdit(sae=source.sae_id, feature=latent, value=amount, at="last")


def _scale(source: SteeringSource, latent: int, resid_norm: float) -> StrengthScale:
    mean_act = float(source.mean_active_act_F[latent])
    return StrengthScale(float(source.sae.W_dec[latent].detach().norm()), resid_norm,
                         mean_act if np.isfinite(mean_act) and mean_act > 0 else None)


def _measure(probe: HookSteering, mode: SteerMode, source: SteeringSource, latents: list[int],
             fractions: np.ndarray) -> Effects:
    """Effects of each latent at each norm fraction (rows `n * G + g`), added or clamped."""
    W_ND = source.sae.W_dec.detach()[latents].float().cpu()
    if mode == "add":
        return probe.directions(W_ND / W_ND.norm(dim=-1, keepdim=True).clamp_min(1e-12), fractions)
    values = fractions[None, :] * probe.resid_norm / W_ND.norm(dim=-1, keepdim=True).clamp_min(1e-12).numpy()
    return probe.clamps(source.sae, latents, values)


def rank_features(handle: ModelHandle, sources: Sequence[SteeringSource], target: Any,
                  params: SearchParams = SearchParams(),
                  progress: Callable[[str, int, int], None] | None = None) -> SearchResult:
    """Rank the latents of `sources` by their measured effect toward `target` (module
    docstring); `progress(stage, done, total)` is told as each SAE is screened and swept."""
    params.check()
    if not sources:
        raise InvalidInputError("no SAEs to search")
    resolved = resolve_target(handle.tokenizer, target, handle.d_vocab)
    avoid = [s.table_prompts for s in sources]
    seed = max(s for _, _, s in avoid) + 1 if params.seed is None else params.seed
    prompts = heldout_prompts(handle, params.n_prompts, params.prompt_tokens, seed, avoid)
    grid = geometric_grid(params.lowest, params.highest, params.per_doubling)
    screened: list[tuple[float, float, SteeringSource, int, list[str]]] = []
    norms: dict[str, float] = {}
    for i, source in enumerate(sources):
        if progress:
            progress("screen", i, len(sources))
        contrast_D = None
        if resolved.kind == "contrast":
            contrast_D = (last_token_acts(handle, source.hook, resolved.texts_a).mean(0)
                          - last_token_acts(handle, source.hook, resolved.texts_b).mean(0))
        cands = _candidates(handle, source, resolved, params.candidates, contrast_D)
        latents = list(cands)
        with hook_steering(handle, prompts, source.hook, resolved.token_ids, params.batch) as probe:
            norms[source.sae_id] = probe.resid_norm
            eff = _measure(probe, params.mode, source, latents, np.array([params.screen]))
        for j, latent in enumerate(latents):
            admissible = float(eff.kl_rest[j] <= params.kl_bound)
            screened.append((admissible, float(eff.ratio[j]), source, latent, cands[latent]))
    screened.sort(key=lambda row: (row[0], row[1]), reverse=True)
    top = screened[:params.k]
    ranked: list[RankedFeature] = []
    for i, source in enumerate(sources):
        mine = [row for row in top if row[2] is source]
        if progress:
            progress("sweep", i, len(sources))
        if not mine:
            continue
        latents = [row[3] for row in mine]
        with hook_steering(handle, prompts, source.hook, resolved.token_ids, params.batch) as probe:
            eff = _measure(probe, params.mode, source, latents, grid)
            p_clean = probe.p_clean
        G = len(grid)
        for j, (_, screen_ratio, _, latent, why) in enumerate(mine):
            sl = slice(j * G, (j + 1) * G)
            cal = calibrate(grid, eff.ratio[sl], eff.kl_rest[sl], ratio=params.ratio, kl_bound=params.kl_bound)
            g = int(np.argmin(np.abs(grid - cal.norm_fraction)))
            ranked.append(_ranked(params.mode, source, latent, why, screen_ratio, cal, eff, j * G + g, p_clean,
                                  norms[source.sae_id]))
    if progress:
        progress("sweep", len(sources), len(sources))
    ranked.sort(key=lambda r: (r.best_ratio, r.ratio), reverse=True)
    baseline = _fluency(handle, prompts, sources, ranked, params)
    return SearchResult(resolved, params, seed, norms, baseline, ranked)


def _ranked(mode: SteerMode, source: SteeringSource, latent: int, why: list[str], screen_ratio: float,
            cal: Calibration, eff: Effects, row: int, p_clean: float, resid_norm: float) -> RankedFeature:
    scale = _scale(source, latent, resid_norm)
    amount = scale.alpha(cal.norm_fraction, "norm_fraction")
    return RankedFeature(
        source.sae_id, source.hook, latent, why, screen_ratio, cal.best_ratio, cal.reached, cal.ratio,
        float(eff.log_gain[row]), p_clean, float(eff.p_steered[row]), float(eff.kl[row]), float(eff.kl_rest[row]),
        scale.units(amount), _edit(mode, source, latent, amount).model_dump(mode="json"))


def _fluency(handle: ModelHandle, prompts_PT: torch.Tensor, sources: Sequence[SteeringSource],
             ranked: list[RankedFeature], params: SearchParams) -> float | None:
    """Fill each ranked feature's continuation perplexity; return the unedited one."""
    if params.fluency_prompts == 0 or not ranked:
        return None
    prompts = prompts_PT[:params.fluency_prompts]
    n_prompt, n_total = prompts.shape[1], prompts.shape[1] + params.fluency_tokens
    mask = resolve_positions("last", [], n_prompt, n_total)
    by_id = {s.sae_id: s for s in sources}
    baseline = float(continuation_perplexity(handle, prompts, [Splice()], params.fluency_tokens)[0])
    for sae_id in dict.fromkeys(r.sae_id for r in ranked):
        source, rows = by_id[sae_id], [r for r in ranked if r.sae_id == sae_id]
        saes = {sae_id: (source.hook, source.sae)} if params.mode == "clamp" else {}
        splices = [Splice(dict(saes), [compile_edit(_edit(params.mode, source, r.latent,
                                                               r.edit.get("alpha", r.edit.get("value"))),
                                                         mask, sae=source.sae, hook=source.hook)]) for r in rows]
        for r, ppl in zip(rows, continuation_perplexity(handle, prompts, splices, params.fluency_tokens), strict=True):
            r.perplexity = float(ppl)
    return baseline
