"""Comparing two SAEs: their latents matched by activation correlation (and by decoder
cosine when they share a space), and their matched spaces scored by SVCCA and RSA, every
score beside a null.

Streaming (`stream_statistics`) encodes each batch of paired activations with both SAEs
and adds the codes to `CorrelationSums`; `n_rotations` more accumulators pair A with B
reading a Haar-randomly rotated copy of B's activations (an SAE of the same sparsity that
shares no direction with A: the rotation null of the matching). The first `sample_tokens`
tokens' codes (of rank 0 under torchrun) are kept for the activation-space scores.

Scores (`compare_codes`), after Lan et al. 2024 ("Sparse autoencoders reveal universal
feature spaces across large language models") and Paulo & Belrose 2025:

- activation matching: Hungarian pairs, mutual nearest neighbours, MCC and mean max
  correlation, beside the rotation null's MCC; latents that fired on fewer than
  `min_fires` tokens are left out (their correlations set to 0), since two rare latents
  firing on the same few tokens correlate near 1 whatever they encode;
- decoder matching (shared d_model only): cosine of unit decoder rows, beside the MCC of
  a randomly rotated B;
- SVCCA and RSA of the matched pairs' (both latents frequent) decoder rows (null: unmatched random features of B)
  and of their codes over the sampled tokens (nulls: shuffled tokens, unmatched random
  features); at most `max_items` matched pairs (a seeded subset) enter these scores;
- the same decoder scores per semantic group of A's latents (a lobe, a circle, a concept
  span), each beside random B features of the group's size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.matching import FeatureMatch, match_features
from sae_atlas.geometry.similarity import (
    NullScore,
    null_test,
    permutation_p,
    random_rotation,
    random_rows,
    rsa,
    shuffled_rows,
    svcca,
)
from sae_atlas.geometry.vectors import unit_rows
from sae_atlas.saes.compare.correlation import CorrelationSums
from sae_atlas.saes.compare.pairs import PairedActs
from sae_atlas.saes.distributed import DistContext
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.sae.base import SAE

ROTATION_STREAM = 0x5CC  # keeps the rotation nulls' draws apart from other seeded arrays
MIN_GROUP_PAIRS = 3


@dataclass(frozen=True)
class CompareParams:
    """How much to stream and how to score."""

    n_tokens: int = 20_000
    batch_blocks: int = 8
    sample_tokens: int = 2048  # tokens whose codes are kept for the activation-space scores
    max_items: int = 1024  # matched pairs entering SVCCA / RSA (a seeded subset beyond)
    n_perm: int = 50  # null draws of each space score
    n_rotations: int = 1  # rotation-null accumulators streamed beside the real one
    min_fires: int = 10  # latents firing on fewer tokens correlate 0 in the matching (rare co-firing)
    seed: int = 0


@dataclass
class StreamedStats:
    """What the stream leaves: correlations and a sample of codes."""

    corr_FG: np.ndarray  # A latents x B latents, Pearson over the streamed tokens
    corr_rotated: list[np.ndarray]  # per rotation null, A vs B on rotated activations
    sample_a_MF: np.ndarray  # codes of the first sampled tokens
    sample_b_MG: np.ndarray
    n_tokens: int
    fires_a: np.ndarray  # [F] tokens each latent of A fired on
    fires_b: np.ndarray  # [G]


@dataclass
class Comparison:
    """Two SAEs compared (see the module docstring)."""

    n_tokens: int
    activation: FeatureMatch
    activation_mcc: NullScore  # MCC beside the rotation null
    rotation_pair_corr: np.ndarray  # the first rotation null's Hungarian pair correlations
    decoder: FeatureMatch | None
    decoder_mcc: NullScore | None
    spaces: dict[str, NullScore] = field(default_factory=dict)  # "<space>_<score>_<null>"
    groups: list[dict[str, Any]] = field(default_factory=list)
    n_rare: tuple[int, int] = (0, 0)  # latents of A / B left out of the matching as rare (< min_fires)

    def summary(self) -> dict[str, Any]:
        """The headline numbers, JSON-ready."""
        out: dict[str, Any] = {
            "n_tokens": self.n_tokens, "mcc": self.activation.mcc, "mean_max_a": self.activation.mean_max_a,
            "mean_max_b": self.activation.mean_max_b, "n_mutual": len(self.activation.mutual_a),
            "n_rare_a": self.n_rare[0], "n_rare_b": self.n_rare[1],
            "mcc_null": self.activation_mcc.to_dict(),
            "decoder_mcc": self.decoder.mcc if self.decoder else None,
            "decoder_mcc_null": self.decoder_mcc.to_dict() if self.decoder_mcc else None,
            "spaces": {k: v.to_dict() for k, v in self.spaces.items()},
        }
        return out


def _rotations(d: int, n: int, seed: int, device: torch.device) -> list[torch.Tensor]:
    rng = np.random.default_rng((ROTATION_STREAM, seed))
    return [torch.from_numpy(random_rotation(d, rng)).float().to(device) for _ in range(n)]


@torch.inference_mode()
def stream_statistics(sae_a: SAE, sae_b: SAE, pairs: Iterable[PairedActs], params: CompareParams,
                      ctx: DistContext | None = None) -> StreamedStats:
    """Correlation sums of the two SAEs' codes (and of the rotation nulls) over `pairs`,
    merged across ranks, and the codes of the first `params.sample_tokens` tokens."""
    F, G = sae_a.cfg.d_sae, sae_b.cfg.d_sae
    device = sae_a.W_enc.device
    sums = CorrelationSums.zeros(F, G, device)
    nulls = [CorrelationSums.zeros(F, G, device) for _ in range(params.n_rotations)]
    rotations = _rotations(sae_b.cfg.d_in, params.n_rotations, params.seed, sae_b.W_enc.device)
    sample_a: list[np.ndarray] = []
    sample_b: list[np.ndarray] = []
    kept = 0
    for pair in pairs:
        codes_a, codes_b = sae_codes(sae_a, pair.a_ND), sae_codes(sae_b, pair.b_ND)
        sums.update(codes_a, codes_b)
        x_b = pair.b_ND.float().to(sae_b.W_enc.device)
        for acc, R in zip(nulls, rotations, strict=True):
            acc.update(codes_a, sae_codes(sae_b, x_b @ R))
        if kept < params.sample_tokens:
            take = min(params.sample_tokens - kept, len(codes_a))
            sample_a.append(codes_a[:take].float().cpu().numpy())
            sample_b.append(codes_b[:take].float().cpu().numpy())
            kept += take
    for acc in (sums, *nulls):
        acc.merge(ctx)
    n = int(sums.n)
    if n < 2:
        raise InvalidInputError(f"the two SAEs have {n} tokens in common; at least 2 are needed to correlate them")
    return StreamedStats(sums.correlation(), [acc.correlation() for acc in nulls],
                         np.concatenate(sample_a), np.concatenate(sample_b), n, sums.fires_a.cpu().numpy(),
                         sums.fires_b.cpu().numpy())


def check_shared_d_model(d_a: int, d_b: int) -> None:
    """InvalidInputError unless the two SAEs' decoder rows have one width (decoder matching
    compares them by cosine)."""
    if d_a != d_b:
        raise InvalidInputError(
            f"decoder matching needs a shared d_model: A's decoder rows have d={d_a}, B's d={d_b}; "
            "compare SAEs of different widths of residual by activation correlation (decoder=False)")


def decoder_match(W_dec_a: np.ndarray, W_dec_b: np.ndarray, *, n_rotations: int = 1,
                  seed: int = 0) -> tuple[FeatureMatch, NullScore]:
    """Matching by the cosine of unit decoder rows, beside the MCC of `n_rotations`
    randomly rotated copies of B (InvalidInputError when the SAEs live in different spaces)."""
    A = unit_rows(W_dec_a, np.float64, zero_rows="refuse", what="A's decoder")
    B = unit_rows(W_dec_b, np.float64, zero_rows="refuse", what="B's decoder")
    check_shared_d_model(A.shape[1], B.shape[1])
    match = match_features(A @ B.T)
    rng = np.random.default_rng((ROTATION_STREAM, seed))
    null = np.array([match_features(A @ (B @ random_rotation(B.shape[1], rng)).T).mcc for _ in range(n_rotations)])
    return match, NullScore(match.mcc, float(null.mean()), float(null.std()), permutation_p(match.mcc, null),
                            n_rotations, "random rotation of B's decoder")


def _subset(n: int, cap: int, rng: np.random.Generator) -> np.ndarray:
    return np.sort(rng.choice(n, size=cap, replace=False)) if n > cap else np.arange(n)


def space_scores(X_PD: np.ndarray, Y_PE: np.ndarray, nulls: Mapping[str, Any], prefix: str, params: CompareParams
                 ) -> dict[str, NullScore]:
    """SVCCA and RSA of paired rows `X`, `Y` against each named null draw."""
    out = {}
    for score_name, fn in (("svcca", svcca), ("rsa", rsa)):
        for null_name, draw in nulls.items():
            out[f"{prefix}_{score_name}_{null_name}"] = null_test(fn, X_PD, Y_PE, draw, null=null_name,
                                                                  n_perm=params.n_perm, seed=params.seed)
    return out


def compare_codes(stats: StreamedStats, W_dec_a: np.ndarray, W_dec_b: np.ndarray, params: CompareParams, *,
                  decoder: bool | None = None, groups: Mapping[str, np.ndarray] | None = None) -> Comparison:
    """Match and score two SAEs from their streamed statistics and decoders. `decoder`:
    True requires decoder matching, None does it when the SAEs share d_model, False skips it.
    `groups` maps a group name to A latents."""
    act = match_features(_without_rare(stats.corr_FG, stats, params.min_fires))
    null_matches = [match_features(_without_rare(c, stats, params.min_fires)) for c in stats.corr_rotated]
    null_mcc = np.array([m.mcc for m in null_matches])
    act_null = NullScore(act.mcc, float(null_mcc.mean()) if len(null_mcc) else float("nan"),
                         float(null_mcc.std()) if len(null_mcc) else float("nan"),
                         permutation_p(act.mcc, null_mcc), len(null_mcc), "random rotation of B's activations")
    dec = dec_null = None
    if decoder or (decoder is None and W_dec_a.shape[1] == W_dec_b.shape[1]):
        dec, dec_null = decoder_match(W_dec_a, W_dec_b, n_rotations=max(1, params.n_rotations), seed=params.seed)
    rng = np.random.default_rng(params.seed)
    frequent = (stats.fires_a[act.pairs_a] >= params.min_fires) & (stats.fires_b[act.pairs_b] >= params.min_fires)
    keep = np.flatnonzero(frequent)[_subset(int(frequent.sum()), params.max_items, rng)]
    pa, pb = act.pairs_a[keep], act.pairs_b[keep]
    Wa, Wb = np.asarray(W_dec_a, np.float64), np.asarray(W_dec_b, np.float64)
    spaces = space_scores(Wa[pa], Wb[pb], {"random_features": random_rows(Wa[pa], Wb)}, "decoder", params)
    Xa, Xb = stats.sample_a_MF[:, pa], stats.sample_b_MG[:, pb]
    spaces |= space_scores(Xa, Xb, {"shuffled_tokens": shuffled_rows(Xa, Xb),
                                    "random_features": _random_columns(Xa, stats.sample_b_MG)}, "activation", params)
    rows = [_group_row(name, np.asarray(latents), act, frequent, Wa, Wb, params)
            for name, latents in (groups or {}).items()]
    return Comparison(stats.n_tokens, act, act_null,
                      null_matches[0].pair_similarity if null_matches else np.zeros(0), dec, dec_null, spaces, rows,
                      (int((stats.fires_a < params.min_fires).sum()), int((stats.fires_b < params.min_fires).sum())))


def _without_rare(corr_FG: np.ndarray, stats: StreamedStats, min_fires: int) -> np.ndarray:
    """The correlations with every latent that fired on fewer than `min_fires` tokens set to 0:
    two rare latents firing on the same few tokens correlate near 1 whatever they encode."""
    out = corr_FG.copy()
    out[stats.fires_a < min_fires, :] = 0.0
    out[:, stats.fires_b < min_fires] = 0.0
    return out


def _random_columns(X_MP: np.ndarray, pool_MG: np.ndarray) -> Any:
    """Null draws pairing `X`'s columns with as many random columns (features) of `pool`."""
    draw_rows = random_rows(X_MP.T, pool_MG.T)
    return lambda rng: tuple(m.T for m in draw_rows(rng))


def _group_row(name: str, latents: np.ndarray, act: FeatureMatch, frequent: np.ndarray, Wa: np.ndarray, Wb: np.ndarray,
               params: CompareParams) -> dict[str, Any]:
    """One semantic group's decoder SVCCA / RSA over its matched pairs, beside random B features."""
    inside = np.isin(act.pairs_a, latents) & frequent
    pa, pb = act.pairs_a[inside], act.pairs_b[inside]
    row: dict[str, Any] = {"group": name, "n_latents": len(latents), "n_pairs": len(pa),
                           "mean_pair_corr": float(act.pair_similarity[inside].mean()) if len(pa) else None}
    if len(pa) < MIN_GROUP_PAIRS:
        return row
    for key, score in space_scores(Wa[pa], Wb[pb], {"random_features": random_rows(Wa[pa], Wb)}, "decoder",
                                   params).items():
        row[key] = score.score
        row[f"{key}_null"] = score.null_mean
        row[f"{key}_p"] = score.p_value
    return row
