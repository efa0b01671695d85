"""Meaning searches for the Atlas facade: contrast two sets of texts and search for a
concept's features. The model runs through `saes` (`saes.text_features`,
`saes.intervene.concepts`), the statistics are `geometry` functions; this module only
composes them over the atlas's SAEs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import polars as pl

from api.display_meaning import ContrastResult
from geometry.contrast import benjamini_hochberg, contrast_stats, duplicate_groups, ranked
from saes.text_features import Pool, pooled_feature_acts

__all__ = ["Pool", "check_texts", "contrast"]
from store.errors import InvalidInputError

MAX_TEXTS = 1000


def check_texts(texts: Sequence[str], what: str, max_chars: int) -> list[str]:
    """`texts` as a list if it is 2..MAX_TEXTS non-empty strings of at most `max_chars`."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise InvalidInputError(f"{what} must be a list of strings")
    texts = list(texts)
    if not 2 <= len(texts) <= MAX_TEXTS:
        raise InvalidInputError(f"{what} must hold 2..{MAX_TEXTS} texts, got {len(texts)}")
    for t in texts:
        if not isinstance(t, str) or not t.strip():
            raise InvalidInputError(f"{what}: every text must be a non-empty string")
        if len(t) > max_chars:
            raise InvalidInputError(f"{what}: a text has {len(t)} characters; the maximum is {max_chars}")
    return texts


def contrast(
    handle: Any,
    saes: dict[str, Any],
    hooks: dict[str, str],
    texts_a: list[str],
    texts_b: list[str],
    *,
    k: int,
    pool: Pool,
    n_permutations: int,
    alpha: float,
    duplicate_threshold: float,
    seed: int,
    run_locked: Callable[[Callable[[], Any]], Any],
) -> ContrastResult:
    """Rank the features of `saes` by how well they separate `texts_a` from `texts_b`
    (`geometry.contrast`), q-values over every tested feature of every SAE, the top `k`
    grouped into near-duplicates by decoder cosine."""
    if not 0 < alpha < 1:
        raise InvalidInputError(f"alpha must be in (0, 1), got {alpha}")
    acts = run_locked(lambda: pooled_feature_acts(handle, saes, hooks, [*texts_a, *texts_b], pool=pool))
    n_a = len(texts_a)
    frames, n_tested = [], {}
    for sid, acts_NF in acts.items():
        stats = contrast_stats(acts_NF[:n_a], acts_NF[n_a:], n_permutations=n_permutations, seed=seed)
        n_tested[sid] = int(stats.tested_F.sum())
        frames.append(stats.frame().with_columns(pl.lit(sid).alias("sae_id"), pl.lit(hooks[sid]).alias("hook")))
    table = pl.concat(frames)
    table = table.with_columns(pl.Series("q_value", benjamini_hochberg(table["p_value"].to_numpy())))
    top = ranked(table, k, alpha=alpha)
    rows_KD = [saes[s].W_dec[i].detach().float().cpu().numpy() for s, i in zip(top["sae_id"], top["latent"], strict=True)]
    one_width = len({len(r) for r in rows_KD}) == 1
    groups = duplicate_groups(np.stack(rows_KD), duplicate_threshold) if one_width else np.arange(top.height)
    top = top.with_columns(pl.Series("group", groups, dtype=pl.Int64), (pl.col("q_value") <= alpha).alias("significant"))
    columns = ["rank", "sae_id", "hook", "latent", "mean_a", "mean_b", "diff", "auroc", "effect_size",
               "p_value", "q_value", "significant", "group"]
    return ContrastResult(
        n_a=n_a, n_b=len(texts_b), pool=pool, n_permutations=n_permutations, alpha=alpha,
        duplicate_threshold=duplicate_threshold, n_tested=n_tested,
        n_significant=int((table["q_value"] <= alpha).sum()), table=top.select(columns),
    )
