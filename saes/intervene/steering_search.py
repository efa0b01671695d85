"""The engine layer of `steering_search`; its other layers:
`sae_atlas.api.commands.steering_search` (CLI).

Steering toward a target: features ranked by their MEASURED effect, not by activation.

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

Per SAE the candidates are live latents (firing densities at or above `DENSITY_FLOOR`
unless dead ones are included; then they are `direction`s): those whose stored steering row
(`store.steering`) lists target tokens among its promoted ones (by their summed
log-probability gain), those whose decoder row through the unembedding (`saes.summary.logits`
convention) gives `T` the largest z-scored logit less its siblings' (the cheap screen), and
for a contrast those nearest the difference of means. Two disjoint prompt sets are made
(`steering_prompts.split_sets`: neutral, in-context, question and the user's prompts).
Each candidate is steered (`last_token_steering`, batched) at the last token of the RANKING
prompts at a matched norm (`saes.intervene.strength`); the best `k` by specific gain
(`steering_effects`) are swept over a geometric grid of strengths there and calibrated
(`calibrate_pairs`: the smallest strength at which `pair_share` of the ranking prompts reach
the ratio specifically under the KL bound); then each ready edit is measured on the
CONFIRMATION prompts, and the features are ranked by what it does there (share of prompts
reached specifically, then mean specific gain), not by the screen. Measured per row, over
the prompts, with `q` the clean and `p` the steered next-token distribution:

- `ratio = mean p(T) / mean q(T)` and `log_gain = mean log(p(T) / q(T))`;
- `kl = KL(q || p)`; `kl_rest = KL(q' || p')` with `q'`, `p'` renormalised over the tokens
  outside `T`: what the edit does to everything it was not asked to move (the fluency
  bound; the full KL grows with the very shift the edit is for).

A ready edit is a steer (add `alpha * W_dec[f]`) or a clamp (set the latent to `value`) at
`at="last"`. With `combine`, a sparse combination of features of the best feature's SAE is
fitted (`steering_combination`), calibrated and confirmed the same way; `best` says which
of the two is better on the confirmation prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np
import polars as pl
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.encoding.texts import tokenize_texts
from sae_atlas.saes.encoding.tokens import piece_text
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.intervene.concepts import load_concept
from sae_atlas.saes.intervene.edits import (
    ClampEdit,
    SteerEdit,
    compile_edit,
    edit_dict,
    resolve_positions,
)
from sae_atlas.saes.intervene.splice import Splice
from sae_atlas.saes.intervene.steering_combination import FitParams, fit_combination
from sae_atlas.saes.intervene.steering_effects import (
    PairStats,
    PromptEffects,
    PromptSteering,
    clamp_deltas,
    pair_stats,
    per_style,
    prompt_steering,
)
from sae_atlas.saes.intervene.steering_prompts import (
    PROMPT_STYLES,
    PromptSet,
    PromptStyle,
    SetSpec,
    split_sets,
    target_class,
)
from sae_atlas.saes.intervene.strength import (
    MAX_KL_BOUND,
    MAX_RATIO,
    Calibration,
    StrengthScale,
    calibrate,
    check_bound,
    continuation_perplexity,
    geometric_grid,
)
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.summary.logits import logit_directions

MAX_TARGET_TOKENS = 64
MAX_CONTRAST_TOKENS = 16
MAX_TEXTS = 256
MAX_TEXT_CHARS = 2000
SteerMode = Literal["add", "clamp"]
STEER_MODES: tuple[SteerMode, ...] = ("add", "clamp")
DENSITY_FLOOR = 1e-4
"""Latents firing on fewer tokens than this share are dead or near-dead: directions, not features."""


@dataclass(frozen=True)
class TokenTarget:
    """Next tokens to raise: token texts (one vocabulary token each) or ids."""

    tokens: list[str | int]
    kind: Literal["tokens"] = "tokens"


@dataclass(frozen=True)
class ContrastTarget:
    """Steer toward texts A and away from texts B (rule in the module docstring)."""

    texts_a: list[str]
    texts_b: list[str]
    kind: Literal["contrast"] = "contrast"


@dataclass(frozen=True)
class ConceptTarget:
    """A concept's values as next tokens: a built-in name or `{values, templates, ...}`."""

    concept: str | dict[str, Any]
    kind: Literal["concept"] = "concept"


SteeringTarget = TokenTarget | ContrastTarget | ConceptTarget
TARGET_KINDS: dict[str, type[SteeringTarget]] = {"tokens": TokenTarget, "contrast": ContrastTarget,
                                                 "concept": ConceptTarget}


def parse_target(target: Any) -> SteeringTarget:
    """A target from a target, a dict (`{"kind": "tokens" | "contrast" | "concept", ...}`), a
    token text or id, or a list of them (`api.operations.steering` validates JSON targets
    with their bounds; this is the core's plain reading)."""
    if isinstance(target, (TokenTarget, ContrastTarget, ConceptTarget)):
        return target
    if isinstance(target, (str, int)) and not isinstance(target, bool):
        return TokenTarget([target])
    if isinstance(target, (list, tuple)) and target:
        return TokenTarget(list(target))
    kind = target.get("kind") if isinstance(target, dict) else None
    try:
        return TARGET_KINDS[kind](**{k: v for k, v in target.items() if k != "kind"})  # type: ignore[index, union-attr]
    except (KeyError, TypeError) as exc:
        raise InvalidInputError(f"invalid steering target {target!r}; give a token, a list of tokens, "
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
    pieces = [piece_text(tokenizer, i) for i in ids]
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
        texts = [piece_text(tokenizer, i) for i in ids]
        return ResolvedTarget("tokens", ", ".join(map(repr, texts)), ids, texts)
    if isinstance(target, ConceptTarget):
        concept = load_concept(target.concept, categories=True)
        ids = list(dict.fromkeys(int(tokenizer(" " + v, add_special_tokens=False)["input_ids"][0])
                                 for v in concept.values))
        return ResolvedTarget("concept", f"concept {concept.name}", ids, [piece_text(tokenizer, i) for i in ids])
    a, b = _check_texts(target.texts_a, "texts_a"), _check_texts(target.texts_b, "texts_b")
    ids = contrast_tokens(tokenizer, a, b)
    return ResolvedTarget("contrast", f"contrast of {len(a)} vs {len(b)} texts", ids,
                          [piece_text(tokenizer, i) for i in ids], a, b)


@torch.inference_mode()
def last_token_acts(handle: ModelHandle, hook: str, texts: Sequence[str]) -> torch.Tensor:
    """Activations `[N, D]` at `hook` of each text's last token (BOS prepended)."""
    tokens_NT, lengths_N = tokenize_texts(handle, list(texts))
    x_NTD = run_hooks(handle, tokens_NT, [handle.check_hook(hook)])[hook].float().cpu()
    return x_NTD[torch.arange(len(x_NTD)), lengths_N - 1]


@dataclass
class SteeringSource:
    """One SAE a search ranks: its module, hook, typical active values `[F]` (the
    summaries' `mean_active_act`), firing densities `[F]` (None: unknown) and stored
    steering table."""

    sae_id: str
    hook: str
    sae: SAE
    mean_active_act_F: np.ndarray
    table: pl.DataFrame
    table_prompts: tuple[int, int, int]  # (n, tokens, seed) the table was measured on
    density_F: np.ndarray | None = None


@dataclass(frozen=True)
class SearchParams:
    """How `rank_features` measures (recorded with its result)."""

    k: int = 10  # features returned
    candidates: int = 24  # screened per SAE
    n_prompts: int = 16  # neutral ranking prompts
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
    confirm_prompts: int = 16  # neutral confirmation prompts (another seed)
    styles: tuple[PromptStyle, ...] = PROMPT_STYLES  # prompt styles ranked and confirmed on
    density_floor: float = DENSITY_FLOOR  # latents firing less often are directions, left out unless included
    include_dead: bool = False
    pair_share: float = 0.75  # share of ranking pairs the calibrated strength must reach
    combine: int = 3  # features in the fitted combination (0: none; add mode only)
    combine_pool: int = 16  # candidates per SAE the combination is fitted over

    def check(self) -> SearchParams:
        """Self if every parameter is within its bounds (InvalidInputError naming the first that is not)."""
        for what, value, lo, hi in (("k", self.k, 1, 100), ("candidates", self.candidates, 1, 512),
                                    ("n_prompts", self.n_prompts, 1, 256), ("prompt_tokens", self.prompt_tokens, 2, 128),
                                    ("fluency_prompts", self.fluency_prompts, 0, 64),
                                    ("fluency_tokens", self.fluency_tokens, 1, 64), ("batch", self.batch, 1, 1024),
                                    ("per_doubling", self.per_doubling, 1, 8),
                                    ("confirm_prompts", self.confirm_prompts, 0, 256), ("combine", self.combine, 0, 16),
                                    ("combine_pool", self.combine_pool, 1, 512)):
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise InvalidInputError(f"{what} must be an integer in {lo}..{hi}, got {value!r}")
        if self.mode not in STEER_MODES:
            raise InvalidInputError(f"unknown steering mode {self.mode!r}; valid: {', '.join(STEER_MODES)}")
        bad = [s for s in self.styles if s not in PROMPT_STYLES]
        if not self.styles or bad:
            raise InvalidInputError(f"unknown prompt style(s) {bad or 'none given'}; valid: {', '.join(PROMPT_STYLES)}")
        check_bound(self.ratio, "ratio", 1.0, MAX_RATIO)
        check_bound(self.kl_bound, "kl_bound", 0.0, MAX_KL_BOUND)
        check_bound(self.screen, "screen strength", 0.0, self.highest)
        check_bound(self.pair_share, "pair_share", 0.0, 1.0)
        if not 0 <= self.density_floor < 1:
            raise InvalidInputError(f"density_floor must be in [0, 1), got {self.density_floor!r}")
        geometric_grid(self.lowest, self.highest, self.per_doubling)
        return self


@dataclass
class RankedFeature:
    """One ranked feature: what steering it measured and its ready edit. `ratio` .. `kl_rest`
    are measured on the ranking prompts at the calibrated strength; `confirmed` on the
    held-out confirmation prompts at the same edit (the ranking key), also per style."""

    sae_id: str
    hook: str
    latent: int
    sources: list[str]  # "table", "lens", "contrast": why it was a candidate
    screen_ratio: float  # ratio at the screening strength
    best_ratio: float  # best ratio on the grid under the KL bound
    reached: bool  # the requested ratio is reached under the KL bound on pair_share of the ranking pairs
    ratio: float  # at the calibrated strength
    log_gain: float
    p_clean: float
    p_steered: float
    kl: float
    kl_rest: float
    strength: dict[str, float | None]  # alpha, act_multiple, norm_fraction
    edit: dict[str, Any]  # a SteerEdit or ClampEdit, ready for `Atlas.steer` / `Atlas.run`
    perplexity: float | None = None  # clean model on the edited greedy continuation
    kind: Literal["feature", "direction"] = "feature"  # direction: fires below the density floor
    density: float | None = None
    sibling_ratio: float | None = None  # the target's siblings' ratio (None without siblings)
    target_rank: float = 0.0  # median rank of the target among the tokens the edit promotes
    confirmed: PairStats | None = None
    confirmed_styles: dict[str, PairStats] = field(default_factory=dict)


@dataclass
class RankedCombination:
    """A fitted sparse combination of features of one SAE (`steering_combination`):
    per feature its weight as a norm fraction at the calibrated strength and the alpha of
    its steer edit; measured like a feature."""

    sae_id: str
    hook: str
    latents: list[int]
    weights: list[float]  # each unit decoder row's share of the edit, as a norm fraction
    densities: list[float | None]
    reached: bool
    ratio: float
    kl_rest: float
    best_ratio: float
    norm_fraction: float  # of the whole edit
    edits: list[dict[str, Any]]  # SteerEdits, one per feature, ready for `Atlas.steer`
    sibling_ratio: float | None
    target_rank: float
    confirmed: PairStats
    confirmed_styles: dict[str, PairStats]


@dataclass
class SearchResult:
    """`rank_features`' answer: the ranked features and how they were measured."""

    target: ResolvedTarget
    params: SearchParams
    seed: int
    resid_norms: dict[str, float]  # per SAE, measured on the ranking prompts
    baseline_perplexity: float | None
    features: list[RankedFeature]
    confirm_seed: int = 0
    category: str | None = None  # the target's class, whose templates gave in-context prompts
    siblings: list[str] = field(default_factory=list)
    prompt_counts: dict[str, dict[str, int]] = field(default_factory=dict)  # rank / confirm -> style -> n
    combination: RankedCombination | None = None
    best: Literal["feature", "combination"] = "feature"  # better on the confirmation prompts
    left_out_dead: int = 0  # candidates left out below the density floor
    sibling_ids: list[int] = field(default_factory=list)
    prompt_sets: tuple[PromptSet, PromptSet] | None = None  # ranking, confirmation


def _live(source: SteeringSource, params: SearchParams) -> np.ndarray:
    """Latents at or above the density floor (all when densities are unknown or dead ones are included)."""
    if source.density_F is None or params.include_dead:
        return np.ones(len(source.mean_active_act_F), bool)
    return np.nan_to_num(source.density_F, nan=0.0) >= params.density_floor


def _candidates(handle: ModelHandle, source: SteeringSource, target: ResolvedTarget, n: int,
                contrast_D: torch.Tensor | None, live_F: np.ndarray, sibling_ids: Sequence[int]) -> dict[int, list[str]]:
    """Up to `n` live candidate latents of one SAE and why each is one (module docstring);
    with siblings the lens ranks by the target's z-scored logit less the siblings' mean
    (when positive)."""
    W_dec = source.sae.W_dec.detach().float().cpu()
    d_FD = logit_directions(W_dec, handle.final_norm_weight, handle.final_norm_kind)
    W_U = handle.W_U.detach().float().cpu()
    mean_F = d_FD @ W_U.mean(1)
    std_F = (((d_FD @ (W_U @ W_U.T / W_U.shape[1])) * d_FD).sum(-1) - mean_F**2).clamp_min(1e-12).sqrt()

    def z(token_ids: Sequence[int]) -> torch.Tensor:
        return ((d_FD @ W_U[:, list(token_ids)] - mean_F[:, None]) / std_F[:, None]).mean(1)

    z_F = z(target.token_ids)
    if sibling_ids:
        z_F = z_F - z(sibling_ids).clamp_min(0)
    live = set(np.flatnonzero(live_F).tolist())
    ranked: dict[str, list[int]] = {"lens": z_F.argsort(descending=True).tolist()}
    rows = (source.table.select("latent", "promoted_ids", "promoted_deltas").explode("promoted_ids", "promoted_deltas")
            .filter(pl.col("promoted_ids").is_in(target.token_ids)).group_by("latent")
            .agg(pl.col("promoted_deltas").sum().alias("gain")).sort("gain", "latent", descending=[True, False]))
    ranked["table"] = rows["latent"].to_list()
    if contrast_D is not None:
        ranked["contrast"] = (W_dec @ contrast_D / W_dec.norm(dim=-1).clamp_min(1e-12)).argsort(descending=True).tolist()
    ranked = {name: [int(i) for i in order if int(i) in live] for name, order in ranked.items()}
    chosen: dict[int, list[str]] = {}
    share = max(1, n // len(ranked))
    for name, order in ranked.items():
        for latent in order[:share]:
            chosen.setdefault(latent, []).append(name)
    for latent in ranked["lens"]:  # fill up from the lens
        if len(chosen) >= n:
            break
        chosen.setdefault(latent, ["lens"])
    return chosen


def _edit(mode: SteerMode, source: SteeringSource, latent: int, amount: float) -> SteerEdit | ClampEdit:
    if mode == "add":
        return SteerEdit(sae=source.sae_id, feature=int(latent), alpha=float(amount), at="last")
    return ClampEdit(sae=source.sae_id, feature=int(latent), value=float(amount), at="last")


def _scale(source: SteeringSource, latent: int, resid_norm: float) -> StrengthScale:
    mean_act = float(source.mean_active_act_F[latent])
    return StrengthScale(float(source.sae.W_dec[latent].detach().norm()), resid_norm,
                         mean_act if np.isfinite(mean_act) and mean_act > 0 else None)


def _unit(source: SteeringSource, latents: Sequence[int]) -> torch.Tensor:
    W_ND = source.sae.W_dec.detach()[list(latents)].float().cpu()
    return W_ND / W_ND.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def _measure(probe: PromptSteering, mode: SteerMode, source: SteeringSource, latents: list[int],
             fractions: np.ndarray) -> PromptEffects:
    """Per-prompt effects of each latent at each norm fraction (rows `n * G + g`), added or clamped."""
    if mode == "add":
        return probe.directions(_unit(source, latents), fractions)
    W_norm = source.sae.W_dec.detach()[latents].float().cpu().norm(dim=-1, keepdim=True).clamp_min(1e-12).numpy()
    return probe.clamps(source.sae, latents, fractions[None, :] * probe.resid_norm / W_norm)


def _measure_edits(probe: PromptSteering, mode: SteerMode, source: SteeringSource, latents: list[int],
                   amounts: list[float]) -> PromptEffects:
    """Per-prompt effects of each latent's ready edit (alpha or clamp value), one row each."""
    if mode == "add":
        W_ND = source.sae.W_dec.detach()[latents].float().cpu()
        return probe.prompt_effects(W_ND * torch.tensor(amounts, dtype=torch.float32)[:, None])
    return probe.prompt_effects(torch.cat([clamp_deltas(source.sae, probe.x_last_PD, [latent], np.array([[value]]))
                                           for latent, value in zip(latents, amounts, strict=True)]))


def calibrate_pairs(fractions: np.ndarray, pe_G: PromptEffects, *, ratio: float, kl_bound: float,
                    share: float) -> Calibration:
    """The smallest grid strength at which at least `share` of the prompts reach the ratio
    specifically under the KL bound (`steering_effects`); when none does, the one reaching
    the most, or (none reaching any) `strength.calibrate` on the set's ratio."""
    eff = pe_G.aggregate()
    g, ok = pe_G.gain(), pe_G.kl_rest <= kl_bound
    reached_G = ((g >= np.log(ratio)) & ok).mean(1)
    base = calibrate(fractions, eff.ratio, eff.kl_rest, ratio=ratio, kl_bound=kl_bound)
    if reached_G.max() <= 0:
        return Calibration(base.norm_fraction, base.ratio, base.kl_rest, False, base.best_ratio)
    hits = np.flatnonzero(reached_G >= share)
    i = int(hits[0]) if hits.size else int(np.argmax(reached_G))
    return Calibration(float(fractions[i]), float(eff.ratio[i]), float(eff.kl_rest[i]), bool(hits.size),
                       base.best_ratio)


def _key(stats: PairStats | None) -> tuple[float, float]:
    return (-1.0, -np.inf) if stats is None else (stats.share_specific, stats.score)


class _Screened(NamedTuple):
    admissible: bool
    score: float
    ratio: float
    source: SteeringSource
    latent: int
    why: list[str]


def _confirm_seed(seed: int, avoid: Sequence[tuple[int, int, int]]) -> int:
    taken = {s for _, _, s in avoid} | {seed}
    return next(s for s in range(seed + 1, seed + 2 + len(taken)) if s not in taken)


def rank_features(handle: ModelHandle, sources: Sequence[SteeringSource], target: Any,
                  params: SearchParams = SearchParams(),
                  progress: Callable[[str, int, int], None] | None = None, *,
                  prompts: Sequence[str] = (), category: Any = None) -> SearchResult:
    """Rank the latents of `sources` by their measured effect toward `target` (module
    docstring): screened and calibrated on the ranking prompts, ranked on the confirmation
    prompts (`steering_prompts.split_sets`; `prompts` are the user's own, `category` names
    the target's class when it is not a built-in one); `progress(stage, done, total)` is
    told as each SAE is screened, swept and confirmed."""
    params.check()
    if not sources:
        raise InvalidInputError("no SAEs to search")
    resolved = resolve_target(handle.tokenizer, target, handle.d_vocab)
    cls = target_class(handle.tokenizer, resolved.token_ids, handle.d_vocab, resolved.kind, category)
    avoid = [s.table_prompts for s in sources]
    seed = max(s for _, _, s in avoid) + 1 if params.seed is None else params.seed
    spec = SetSpec(params.n_prompts, params.confirm_prompts, params.prompt_tokens, seed, _confirm_seed(seed, avoid),
                   tuple(avoid), params.styles)
    rank_set, confirm_set = split_sets(handle, spec, cls, prompts)
    grid = geometric_grid(params.lowest, params.highest, params.per_doubling)
    screened: list[_Screened] = []
    norms: dict[str, float] = {}
    probes: dict[str, PromptSteering] = {}
    left_out = 0
    siblings = cls.sibling_ids
    for i, source in enumerate(sources):
        if progress:
            progress("screen", i, len(sources))
        contrast_D = None
        if resolved.kind == "contrast":
            contrast_D = (last_token_acts(handle, source.hook, resolved.texts_a).mean(0)
                          - last_token_acts(handle, source.hook, resolved.texts_b).mean(0))
        live = _live(source, params)
        left_out += int((~live).sum())
        cands = _candidates(handle, source, resolved, params.candidates, contrast_D, live, siblings)
        latents = list(cands)
        probe = probes[source.sae_id] = prompt_steering(handle, rank_set, source.hook, resolved.token_ids, siblings,
                                                        params.batch)
        norms[source.sae_id] = probe.resid_norm
        pe = _measure(probe, params.mode, source, latents, np.array([params.screen]))
        eff = pe.aggregate()
        score = np.where(pe.kl_rest <= params.kl_bound, pe.gain(), np.minimum(pe.gain(), 0.0)).mean(1)
        screened += [_Screened(bool(eff.kl_rest[j] <= params.kl_bound), float(score[j]), float(eff.ratio[j]), source,
                               latent, cands[latent]) for j, latent in enumerate(latents)]
    screened.sort(key=lambda row: (row.admissible, row.score), reverse=True)
    top = screened[:params.k]
    ranked: list[RankedFeature] = []
    for i, source in enumerate(sources):
        mine = [row for row in top if row.source is source]
        if progress:
            progress("sweep", i, len(sources))
        if mine:
            ranked += _sweep_and_confirm(handle, source, mine, probes[source.sae_id], confirm_set, resolved, siblings,
                                         grid, params)
    if progress:
        progress("sweep", len(sources), len(sources))
    ranked.sort(key=lambda r: (_key(r.confirmed), r.best_ratio), reverse=True)
    combination = None
    if params.combine and params.mode == "add" and ranked:
        source = next(s for s in sources if s.sae_id == ranked[0].sae_id)
        pool = [row.latent for row in screened if row.source is source][:params.combine_pool]
        if len(pool) >= params.combine:
            if progress:
                progress("combine", 0, 1)
            combination = _combination(handle, source, pool, rank_set, probes[source.sae_id], confirm_set, resolved,
                                       siblings, grid, params)
    best: Literal["feature", "combination"] = "feature"
    if combination is not None and (not ranked or _key(combination.confirmed) > _key(ranked[0].confirmed)):
        best = "combination"
    neutral = torch.stack([rank_set.tokens[i] for i in rank_set.of_style("neutral")]) \
        if rank_set.of_style("neutral") else None
    baseline = _fluency(handle, neutral, sources, ranked, params)
    counts = {name: {s: len(ps.of_style(s)) for s in dict.fromkeys(ps.styles)}
              for name, ps in (("rank", rank_set), ("confirm", confirm_set))}
    return SearchResult(resolved, params, seed, norms, baseline, ranked, spec.confirm_seed,
                        cls.category.name if cls.category else None,
                        [piece_text(handle.tokenizer, t) for t in siblings], counts, combination, best, left_out,
                        list(siblings), (rank_set, confirm_set))


def _density(source: SteeringSource, latent: int) -> float | None:
    if source.density_F is None or not np.isfinite(source.density_F[latent]):
        return None
    return float(source.density_F[latent])


def _sweep_and_confirm(handle: ModelHandle, source: SteeringSource, mine: list[_Screened], probe: PromptSteering,
                       confirm_set: PromptSet, resolved: ResolvedTarget, siblings: list[int], grid: np.ndarray,
                       params: SearchParams) -> list[RankedFeature]:
    """Calibrate each screened latent on the ranking prompts, then measure its edit on the
    confirmation prompts."""
    latents = [row.latent for row in mine]
    pe = _measure(probe, params.mode, source, latents, grid)
    G = len(grid)
    out: list[RankedFeature] = []
    for j, row in enumerate(mine):
        rows = pe.rows(slice(j * G, (j + 1) * G))
        cal = calibrate_pairs(grid, rows, ratio=params.ratio, kl_bound=params.kl_bound, share=params.pair_share)
        g = int(np.argmin(np.abs(grid - cal.norm_fraction)))
        out.append(_ranked(params.mode, source, row, cal, rows.rows([g]), probe.p_clean, probe.resid_norm, params))
    amounts = [r.edit.get("alpha", r.edit.get("value")) for r in out]
    held = _measure_edits(prompt_steering(handle, confirm_set, source.hook, resolved.token_ids, siblings, params.batch),
                          params.mode, source, latents, amounts)
    for j, r in enumerate(out):
        r.confirmed = pair_stats(held.rows([j]), ratio=params.ratio, kl_bound=params.kl_bound)
        r.confirmed_styles = per_style(held.rows([j]), confirm_set.styles, ratio=params.ratio,
                                       kl_bound=params.kl_bound)
    return out


def _ranked(mode: SteerMode, source: SteeringSource, row: _Screened, cal: Calibration, at: PromptEffects,
            p_clean: float, resid_norm: float, params: SearchParams) -> RankedFeature:
    scale = _scale(source, row.latent, resid_norm)
    amount = scale.alpha(cal.norm_fraction, "norm_fraction")
    eff = at.aggregate()
    stats = pair_stats(at, ratio=params.ratio, kl_bound=params.kl_bound)
    density = _density(source, row.latent)
    kind: Literal["feature", "direction"] = "direction" if density is not None and density < params.density_floor \
        else "feature"
    return RankedFeature(
        source.sae_id, source.hook, row.latent, row.why, row.ratio, cal.best_ratio, cal.reached, cal.ratio,
        float(eff.log_gain[0]), p_clean, float(eff.p_steered[0]), float(eff.kl[0]), float(eff.kl_rest[0]),
        scale.units(amount), edit_dict(_edit(mode, source, row.latent, amount)), kind=kind,
        density=density, sibling_ratio=stats.sibling_ratio, target_rank=stats.target_rank)


def _combination(handle: ModelHandle, source: SteeringSource, pool: list[int], rank_set: PromptSet,
                 probe: PromptSteering, confirm_set: PromptSet, resolved: ResolvedTarget, siblings: list[int],
                 grid: np.ndarray, params: SearchParams) -> RankedCombination:
    """Fit a sparse combination over `pool` on the ranking prompts, calibrate its overall
    strength there like a feature's, and confirm it on the held-out prompts."""
    resid_norm = probe.resid_norm
    fitted = fit_combination(handle, rank_set, source.hook, _unit(source, pool), pool, resid_norm,
                             resolved.token_ids, siblings, params.ratio, FitParams(n_features=params.combine))
    w = torch.tensor(fitted.weights, dtype=torch.float32)
    direction = w @ _unit(source, fitted.latents)
    size = float(direction.norm().clamp_min(1e-12))
    pe = probe.directions((direction / size)[None], grid)
    cal = calibrate_pairs(grid, pe, ratio=params.ratio, kl_bound=params.kl_bound, share=params.pair_share)
    g = int(np.argmin(np.abs(grid - cal.norm_fraction)))
    at = pe.rows([g])
    weights = (w / size * cal.norm_fraction).tolist()  # norm fractions of each unit row at the calibrated strength
    norms_N = source.sae.W_dec.detach()[fitted.latents].float().norm(dim=-1).cpu().numpy()
    alphas = [wf * resid_norm / float(n) for wf, n in zip(weights, norms_N, strict=True)]
    edits = [edit_dict(SteerEdit(sae=source.sae_id, feature=int(latent), alpha=float(a), at="last"))
             for latent, a in zip(fitted.latents, alphas, strict=True)]
    delta_D = sum(a * source.sae.W_dec.detach()[latent].float().cpu() for latent, a in zip(fitted.latents, alphas,
                                                                                            strict=True))
    held = prompt_steering(handle, confirm_set, source.hook, resolved.token_ids, siblings,
                           params.batch).prompt_effects(torch.as_tensor(delta_D)[None])
    stats = pair_stats(at, ratio=params.ratio, kl_bound=params.kl_bound)
    return RankedCombination(
        source.sae_id, source.hook, fitted.latents, weights, [_density(source, latent) for latent in fitted.latents],
        cal.reached, cal.ratio, cal.kl_rest, cal.best_ratio, cal.norm_fraction, edits, stats.sibling_ratio,
        stats.target_rank, pair_stats(held, ratio=params.ratio, kl_bound=params.kl_bound),
        per_style(held, confirm_set.styles, ratio=params.ratio, kl_bound=params.kl_bound))


def _fluency(handle: ModelHandle, prompts_PT: torch.Tensor | None, sources: Sequence[SteeringSource],
             ranked: list[RankedFeature], params: SearchParams) -> float | None:
    """Fill each ranked feature's continuation perplexity (on the neutral ranking
    prompts); return the unedited one."""
    if params.fluency_prompts == 0 or not ranked or prompts_PT is None:
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
