"""The maths layer of `absorption`; its other layers: `sae_atlas.saes.eval.absorption` (eval).

Feature absorption and feature splitting on arrays (Chanin et al. 2024, "A is for
Absorption"), scored as SAEBench's `absorption` eval scores them.

One binary concept (a first letter) per call of `letter_absorption`: a logistic probe on
the activations gives the concept's true direction and the words it recognises (probe true
positives on the held-out rows); k-sparse probes on the SAE codes, latents ranked by an L1
probe, give an F1 curve over k, and the latents of the last k whose F1 rose by more than
`f1_jump` over the previous best are the concept's (split) main latents. On every probe
true positive, the absorption fraction is the share of the probe projection that latents
other than the main ones carry (at most `max_absorbing` of them, each with decoder cosine
>= `fraction_cos` to the probe, together >= `projection_share` of the projection); full
absorption is a word where no main latent fires and one latent aligned with the probe
(cosine >= `full_cos`) carries >= `projection_share` of it. `absorption_scores` averages
over the letters whose probe F1 exceeds `min_probe_f1`, or refuses when fewer than
`min_letters` do.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.metrics import f1_score

from sae_atlas.geometry.probes import ProbeResult, l1_ranked_units, logistic_probe, train_test_split

ACTIVE_EPS = 1e-8  # a main latent with |activation| below this did not fire
MEAN_METRICS = ("mean_absorption_fraction_score", "mean_full_absorption_score", "mean_num_split_features",
                "std_dev_absorption_fraction_score", "std_dev_full_absorption_score", "std_dev_num_split_features")


@dataclass(frozen=True)
class AbsorptionThresholds:
    """SAEBench's thresholds (`FeatureAbsorptionCalculator`, `add_feature_splits_to_metrics_df`
    and the eval config's `min_GT_probe_f1` / `min_feats_for_eval`)."""

    fraction_cos: float = 0.1
    full_cos: float = 0.025
    projection_share: float = 0.4
    max_absorbing: int = 3
    f1_jump: float = 0.03
    min_probe_f1: float = 0.6
    min_letters: int = 20


@dataclass
class LetterAbsorption:
    """One concept's result: its probe's held-out F1, its main (split) latents and, per probe
    true positive (`true_positives`: their rows), the absorption fraction and whether it is
    fully absorbed."""

    letter: str
    probe_f1: float
    split_latents: list[int]
    true_positives: np.ndarray
    fractions: np.ndarray
    full: np.ndarray

    def detail(self) -> dict[str, Any]:
        """SAEBench's `AbsorptionResultDetail` of this letter."""
        n = len(self.fractions)
        return {"first_letter": self.letter, "mean_absorption_fraction": float(self.fractions.sum() / n),
                "full_absorption_rate": float(self.full.sum() / n), "num_full_absorption": int(self.full.sum()),
                "num_probe_true_positives": n, "num_split_features": len(self.split_latents)}


def probe_f1(probe: ProbeResult, X_ND: np.ndarray, y_N: np.ndarray, rows: np.ndarray) -> float:
    """F1 of `probe` (positive where `X @ direction + bias > 0`) on `rows`."""
    scores = np.asarray(X_ND, dtype=np.float64)[rows] @ probe.direction_D + probe.bias
    return float(f1_score(np.asarray(y_N, dtype=bool)[rows], scores > 0, zero_division=0.0))


def split_latents(f1_by_k: Sequence[float], latents_by_k: Sequence[Sequence[int]], f1_jump: float = 0.03) -> list[int]:
    """The latents of the last k (from k = 1 up) whose F1 exceeded the best so far by more
    than `f1_jump`; the walk stops at the first k that does not."""
    best, chosen = -np.inf, []
    for f1, latents in zip(f1_by_k, latents_by_k, strict=True):
        if f1 <= best + f1_jump:
            break
        best, chosen = f1, [int(i) for i in latents]
    return chosen


def ksparse_f1_curve(codes_NF: np.ndarray, y_N: np.ndarray, max_k: int, *, l1_decay: float = 0.01,
                     test_frac: float = 0.2, seed: int = 0) -> tuple[list[float], list[list[int]]]:
    """Held-out F1 of the k-sparse probes k = 1..max_k on the codes (latents: the top k of an
    L1 probe fitted on the training rows; balanced logistic probe on them) and their latents."""
    train, test = train_test_split(len(y_N), test_frac, seed)
    codes = np.asarray(codes_NF)
    order = l1_ranked_units(codes[train], np.asarray(y_N)[train], l1_decay=l1_decay)
    f1s, latents = [], []
    for k in range(1, min(max_k, len(order)) + 1):
        chosen = codes[:, order[:k]]
        probe = logistic_probe(chosen, y_N, test_frac=test_frac, seed=seed, class_weight="balanced")
        f1s.append(probe_f1(probe, chosen, y_N, test))
        latents.append(order[:k].tolist())
    return f1s, latents


def _projections(codes_NF: np.ndarray, acts_ND: np.ndarray, probe_D: np.ndarray,
                 decoder_FD: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decoder cosines to the probe `[F]`, each latent's probe projection (activation x cosine)
    `[N, F]` and the activations' projection on the unit probe `[N]`."""
    unit = np.asarray(probe_D, dtype=np.float64) / np.linalg.norm(probe_D)
    decoder = np.asarray(decoder_FD, dtype=np.float64)
    cos_F = decoder @ unit / np.maximum(np.linalg.norm(decoder, axis=1), 1e-12)
    return cos_F, np.asarray(codes_NF, dtype=np.float64) * cos_F, np.asarray(acts_ND, dtype=np.float64) @ unit


def absorption_fractions(codes_NF: np.ndarray, acts_ND: np.ndarray, probe_D: np.ndarray, decoder_FD: np.ndarray,
                         main_latents: Sequence[int], thresholds: AbsorptionThresholds = AbsorptionThresholds()
                         ) -> np.ndarray:
    """Per row, the share of the probe projection absorbed by other latents (0 when the
    main latents carry it all, when the absorbers carry less than `projection_share` of it
    or when the row does not project positively on the probe)."""
    cos_F, proj_NF, total_N = _projections(codes_NF, acts_ND, probe_D, decoder_FD)
    main = np.zeros(len(cos_F), dtype=bool)
    main[list(main_latents)] = True
    main_N = proj_NF[:, main].sum(1)
    candidates_NF = np.where(~main & (cos_F >= thresholds.fraction_cos) & (proj_NF > 0), proj_NF, 0.0)
    top = min(thresholds.max_absorbing, candidates_NF.shape[1])
    absorbers_N = -np.sort(-candidates_NF, axis=1)[:, :top].sum(1)
    fractions = np.zeros(len(total_N))
    for i, (total, main_proj, absorbed) in enumerate(zip(total_N, main_N, absorbers_N, strict=True)):
        if total <= 0 or main_proj >= total or absorbed / total < thresholds.projection_share:
            continue
        if main_proj <= 0:
            fractions[i] = 1.0
        else:
            absorbed = min(absorbed, total - main_proj)
            fractions[i] = np.clip(absorbed / (absorbed + main_proj), 0.0, 1.0)
    return fractions


def full_absorptions(codes_NF: np.ndarray, acts_ND: np.ndarray, probe_D: np.ndarray, decoder_FD: np.ndarray,
                     main_latents: Sequence[int], thresholds: AbsorptionThresholds = AbsorptionThresholds()
                     ) -> np.ndarray:
    """Per row, whether it is fully absorbed: no main latent fires, the row projects
    positively on the probe, and the latent with the largest probe projection has decoder
    cosine >= `full_cos` and carries >= `projection_share` of the projection."""
    cos_F, proj_NF, total_N = _projections(codes_NF, acts_ND, probe_D, decoder_FD)
    silent_N = (np.abs(np.asarray(codes_NF)[:, list(main_latents)]) < ACTIVE_EPS).all(1)
    top_N = proj_NF.argmax(1)
    top_proj_N = proj_NF[np.arange(len(top_N)), top_N]
    with np.errstate(divide="ignore", invalid="ignore"):
        share_N = np.where(total_N > 0, top_proj_N / total_N, 0.0)
    return silent_N & (cos_F[top_N] >= thresholds.full_cos) & (total_N > 0) & (share_N >= thresholds.projection_share)


def letter_absorption(letter: str, acts_ND: np.ndarray, codes_NF: np.ndarray, decoder_FD: np.ndarray, y_N: np.ndarray,
                      *, max_k: int = 10, l1_decay: float = 0.01, test_frac: float = 0.2, seed: int = 0,
                      thresholds: AbsorptionThresholds = AbsorptionThresholds()) -> LetterAbsorption:
    """Probe, split latents and per-true-positive absorption of one concept (`y`) from the
    activations, the SAE codes of the same rows and the decoder rows; every fit uses the
    training rows of one seeded split, every score its held-out rows."""
    y = np.asarray(y_N, dtype=bool)
    _, test = train_test_split(len(y), test_frac, seed)
    probe = logistic_probe(acts_ND, y, test_frac=test_frac, seed=seed, class_weight="balanced")
    f1s, latents = ksparse_f1_curve(codes_NF, y, max_k, l1_decay=l1_decay, test_frac=test_frac, seed=seed)
    main = split_latents(f1s, latents, thresholds.f1_jump)
    scores = np.asarray(acts_ND, dtype=np.float64)[test] @ probe.direction_D + probe.bias
    positives = test[y[test] & (scores > 0)]
    codes, acts = np.asarray(codes_NF)[positives], np.asarray(acts_ND)[positives]
    return LetterAbsorption(letter, probe_f1(probe, acts_ND, y, test), main, positives,
                            absorption_fractions(codes, acts, probe.direction_D, decoder_FD, main, thresholds),
                            full_absorptions(codes, acts, probe.direction_D, decoder_FD, main, thresholds))


@dataclass
class AbsorptionScores:
    """SAEBench's mean metrics and per-letter details, or (`refusal` set) no scores: too few
    letters have a probe good enough to score."""

    metrics: dict[str, float | None]
    details: list[dict[str, Any]]
    refusal: str | None = None


def absorption_scores(letters: Sequence[LetterAbsorption],
                      thresholds: AbsorptionThresholds = AbsorptionThresholds()) -> AbsorptionScores:
    """Means and sample standard deviations over the letters whose probe F1 exceeds
    `min_probe_f1` (and that have probe true positives); every metric None, with the reason,
    when fewer than `min_letters` such letters exist."""
    scored = [r for r in letters if r.probe_f1 > thresholds.min_probe_f1 and len(r.fractions)]
    if len(scored) < thresholds.min_letters:
        return AbsorptionScores(dict.fromkeys(MEAN_METRICS), [],
                                f"not scored: {len(scored)} first letters have a probe F1 above "
                                f"{thresholds.min_probe_f1} (of {len(letters)} probed); absorption needs at least "
                                f"{thresholds.min_letters}")
    details = [r.detail() for r in scored]
    columns = {name: [row[name] for row in details]
               for name in ("mean_absorption_fraction", "full_absorption_rate", "num_split_features")}
    metrics = {"mean_absorption_fraction_score": statistics.mean(columns["mean_absorption_fraction"]),
               "mean_full_absorption_score": statistics.mean(columns["full_absorption_rate"]),
               "mean_num_split_features": statistics.mean(columns["num_split_features"]),
               "std_dev_absorption_fraction_score": statistics.stdev(columns["mean_absorption_fraction"]),
               "std_dev_full_absorption_score": statistics.stdev(columns["full_absorption_rate"]),
               "std_dev_num_split_features": statistics.stdev(columns["num_split_features"])}
    return AbsorptionScores({name: float(value) for name, value in metrics.items()}, details)
