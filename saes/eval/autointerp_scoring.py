"""Autointerp samples and scores: what an explainer sees, what a scorer judges, and the metrics.

Per latent (after delphi, Paulo et al. 2024, "Automatically Interpreting Millions of
Features in LLMs"): the explainer sees the latent's highest top examples; the scorers judge
held-out activating windows drawn across its activation quantiles (the summary's bands,
the remaining top examples as the highest stratum) mixed with non-activating windows.
`detection` asks whether a window contains the feature (activating windows are positive).
`fuzzing` shows every window with tokens highlighted: activating windows at the tokens
where the latent fires (positive), non-activating ones at the positions of a random
activating window (negative). Scores follow delphi's `compute_confusion` /
`compute_classification_metrics` / `compute_auc`: balanced accuracy is the mean of the
true-positive and true-negative rates, F1 comes from precision `tp / (tp + fp)` and recall
`tp / positives` (0 when undefined), and AUC is the ROC AUC of the probabilities (None when
they are missing or all equal).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import polars as pl
from sklearn.metrics import roc_auc_score

ScorerName = Literal["detection", "fuzzing"]
SCORERS: tuple[ScorerName, ...] = ("detection", "fuzzing")


@dataclass(frozen=True)
class Window:
    """A token window and the latent's activation on each token (zeros: it never fires)."""

    tokens: tuple[str, ...]
    acts: tuple[float, ...]

    @property
    def firing(self) -> tuple[int, ...]:
        """Positions where the latent fires."""
        return tuple(i for i, act in enumerate(self.acts) if act > 0)


@dataclass(frozen=True)
class Sample:
    """One window a scorer judges: its tokens, the highlighted positions (fuzzing only) and
    whether it is a positive (`activating` as delphi names it)."""

    tokens: tuple[str, ...]
    highlighted: tuple[int, ...]
    activating: bool


@dataclass(frozen=True)
class Judgement:
    """A scorer's verdict on one sample: the prediction (None: the back-end's answer could not
    be read) and, when the back-end gives one, the probability that the sample is positive."""

    prediction: bool | None
    probability: float | None = None


@dataclass(frozen=True)
class LatentExamples:
    """The windows of one latent: shown to the explainer, held-out activating, non-activating."""

    latent: int
    explain: list[Window]
    activating: list[Window]
    non_activating: list[Window]


def _windows(rows: pl.DataFrame, *, silent: bool = False) -> list[Window]:
    """Windows of example rows with tokens (the latent's acts, or zeros when `silent`)."""
    return [Window(tuple(tokens), tuple(0.0 for _ in tokens) if silent else tuple(float(a) for a in acts))
            for tokens, acts in rows.select("tokens", "acts").iter_rows() if tokens and acts is not None]


def _by_quantile(rows: pl.DataFrame, n: int, rng: np.random.Generator) -> pl.DataFrame:
    """`n` rows spread over the activation strata (bands; top examples above them): the
    strata taken in turn, each in seeded order."""
    strata = rows.with_columns(pl.when(pl.col("kind") == "top").then(pl.lit(1 << 14))
                               .otherwise(pl.col("band").cast(pl.Int32)).alias("_stratum"))
    order = [rng.permutation(np.flatnonzero((strata["_stratum"] == s).to_numpy()))
             for s in sorted(strata["_stratum"].unique().to_list())]
    picked = [idx[i] for i in range(max((len(idx) for idx in order), default=0)) for idx in order if i < len(idx)]
    return rows[picked[:n]]


def latent_examples(latent: int, own: pl.DataFrame, pool: pl.DataFrame, *, n_explain: int, n_activating: int,
                    n_non_activating: int, seed: int) -> LatentExamples:
    """Sample one latent's windows from its stored examples `own` and, as non-activating
    windows, from the stored examples `pool` of other latents (a seeded draw; the latent's
    own rows and windows overlapping its examples are left out)."""
    rng = np.random.default_rng([seed, latent])
    own = own.filter(pl.col("tokens").is_not_null() & pl.col("acts").is_not_null())
    top = own.filter(pl.col("kind") == "top").sort("rank")
    held_out = pl.concat([top.slice(n_explain), own.filter(pl.col("kind") == "band")])
    reach = int(own["tokens"].list.len().max() or 0)
    overlaps = pl.lit(False)
    for block, pos in own.select("block", "pos").unique().iter_rows():
        overlaps = overlaps | ((pl.col("block") == block) & ((pl.col("pos") - pos).abs() < reach))
    drawn = rng.choice(pool.height, size=min(pool.height, 16 * n_non_activating + own.height), replace=False)
    negatives = pool[drawn.tolist()].filter((pl.col("latent") != latent) & pl.col("tokens").is_not_null() & ~overlaps)
    return LatentExamples(latent, _windows(top.head(n_explain)), _windows(_by_quantile(held_out, n_activating, rng)),
                          _windows(negatives.head(n_non_activating), silent=True))


def scorer_samples(scorer: ScorerName, examples: LatentExamples, seed: int) -> list[Sample]:
    """The shuffled samples `scorer` judges for one latent (see the module docstring)."""
    rng = np.random.default_rng([seed, examples.latent, SCORERS.index(scorer)])
    fuzzing = scorer == "fuzzing"
    samples = [Sample(w.tokens, w.firing if fuzzing else (), True) for w in examples.activating]
    spans = [w.firing for w in examples.activating] or [()]
    for window in examples.non_activating:
        marked = spans[int(rng.integers(len(spans)))] if fuzzing else ()
        samples.append(Sample(window.tokens, tuple(i for i in marked if i < len(window.tokens)), False))
    return [samples[i] for i in rng.permutation(len(samples))]


def classification_scores(samples: Sequence[Sample], judgements: Sequence[Judgement]) -> dict[str, float | None]:
    """delphi's metrics of one scorer's judgements: balanced_accuracy, f1, precision,
    recall, auc (None unless the probabilities vary) and failed (unread judgements, left out)."""
    read = [(s, j) for s, j in zip(samples, judgements, strict=True) if j.prediction is not None]
    truth = np.array([s.activating for s, _ in read], dtype=bool)
    predicted = np.array([j.prediction for _, j in read], dtype=bool)
    positives, negatives = int(truth.sum()), int((~truth).sum())
    tp, tn, fp = int((predicted & truth).sum()), int((~predicted & ~truth).sum()), int((predicted & ~truth).sum())
    tpr = tp / positives if positives else 0.0
    tnr = tn / negatives if negatives else 0.0
    precision = tp / (tp + fp) if tp + fp else 0.0
    f1 = 2 * precision * tpr / (precision + tpr) if precision + tpr else 0.0
    probabilities = [j.probability for _, j in read]
    auc = None
    if all(p is not None for p in probabilities) and len(set(probabilities)) > 1 and 0 < positives < len(truth):
        auc = float(roc_auc_score(truth, np.array(probabilities, dtype=float)))
    return {"balanced_accuracy": (tpr + tnr) / 2, "f1": f1, "precision": precision, "recall": tpr, "auc": auc,
            "failed": len(samples) - len(read)}
