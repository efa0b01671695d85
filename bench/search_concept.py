"""Latency of contrast and concept search, against the naive approach, in the same run.

    PYTHONPATH=. python bench/search_concept.py [--atlas atlas-demo] [--texts 64] [--repeats 3]

Both approaches run the model once over the same texts / prompts and encode every token
with every SAE (that part is shared and timed once); they differ in the search:

1. Contrast (`geometry.contrast.contrast_stats`): rank-sum permutation tests of the
   features active on some text, sequential (500 permutations each; only features whose
   p-value still needs resolution get more, up to 20 000), against the naive dense
   comparison: every feature of every SAE, 20 000 permutations each.
2. Concept search (`geometry.concept_search.search_concept`, weekdays): the greedy span
   over the selective features, against the greedy span over every feature (the
   decoder-direction search without the selectivity filter), both run to 8 features
   (`min_gain=0`: random SAEs explain little, so a gain threshold would stop at once).

Without `--atlas`, the SAEs are TopK SAEs of the demo's sizes (3 x 4608 latents, k 32, at
layers 8/15/22 of SmolLM2-135M) with random weights: cost does not depend on training.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl
import torch

from sae_atlas.geometry.concept_search import greedy_span, search_concept, value_means
from sae_atlas.geometry.contrast import _rank_sums_exceed, contrast_stats
from sae_atlas.saes.encoding.texts import pooled_feature_acts
from sae_atlas.saes.intervene.concept_codes import concept_feature_acts
from sae_atlas.saes.intervene.concepts import MONTHS, WEEKDAYS, weekdays
from sae_atlas.saes.models import load_model
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig

N_PERMUTATIONS = 20_000


def _texts(n: int) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(0)
    places = ["office", "school", "station", "market", "library", "harbour"]
    a = [f"On {WEEKDAYS[i % 7]} we met at the {places[rng.integers(6)]} before noon." for i in range(n)]
    b = [f"In {MONTHS[i % 12]} we met at the {places[rng.integers(6)]} before noon." for i in range(n)]
    return a, b


def _saes(handle: Any, atlas: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    if atlas:
        from sae_atlas import Atlas

        opened = Atlas(atlas)
        return ({s: opened.sae(s).module() for s in opened.sae_ids}, {s: opened.sae_info(s)["hook"] for s in opened.sae_ids})
    saes, hooks = {}, {}
    for i, layer in enumerate((8, 15, 22)):
        hook = f"blocks.{layer}.hook_resid_post"
        cfg = SAEConfig(architecture="topk", d_in=handle.d_model, d_sae=4608, k=32, hook_name=hook, seed=i)
        saes[f"L{layer}"], hooks[f"L{layer}"] = build_sae(cfg).eval(), hook
    return saes, hooks


def _best(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def naive_contrast(a_NF: np.ndarray, b_MF: np.ndarray) -> np.ndarray:
    """Every feature, the full number of permutations: the dense comparison."""
    from scipy.stats import rankdata

    R = rankdata(np.concatenate([a_NF, b_MF]), axis=0, method="average")
    n = len(a_NF)
    observed = np.abs(R[:n].sum(0) - n * (len(R) + 1) / 2.0)
    exceed = _rank_sums_exceed(R, n, observed, N_PERMUTATIONS, np.random.default_rng(0))
    return (1.0 + exceed) / (1.0 + N_PERMUTATIONS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atlas", default=None, help="an atlas whose SAEs to use (default: random demo-sized SAEs)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--texts", type=int, default=64, help="texts per contrast set")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    handle = load_model(args.model)
    saes, hooks = _saes(handle, args.atlas)
    print(f"model {args.model}; SAEs {', '.join(f'{s} ({hooks[s]}, {saes[s].cfg.d_sae})' for s in saes)}")

    texts_a, texts_b = _texts(args.texts)
    t_model, acts = _best(lambda: pooled_feature_acts(handle, saes, hooks, [*texts_a, *texts_b]), 1)
    n = len(texts_a)
    t_ours, stats = _best(lambda: {s: contrast_stats(x[:n], x[n:], n_permutations=N_PERMUTATIONS)
                                   for s, x in acts.items()}, args.repeats)
    t_naive, naive_p = _best(lambda: {s: naive_contrast(x[:n], x[n:]) for s, x in acts.items()}, 1)
    agree = np.mean([np.mean((stats[s].p_value_F <= 0.01) == (naive_p[s] <= 0.01)) for s in acts])
    tested = sum(int(st.tested_F.sum()) for st in stats.values())
    total = sum(x.shape[1] for x in acts.values())
    rows = [("contrast", f"{2 * n} texts", t_model, t_ours, t_naive,
             f"{tested}/{total} features tested; p<=0.01 agreement {agree:.4f}")]

    concept = weekdays()
    t_cmodel, cacts = _best(lambda: concept_feature_acts(handle, saes, hooks, concept), 1)
    W = {s: sae.W_dec.detach().float().numpy() for s, sae in saes.items()}

    def ours() -> dict[str, Any]:
        return {s: search_concept(cacts.residual[hooks[s]], cacts.features[s], cacts.values_N, W[s], "ordered", 7,
                                  min_selectivity=0.3, min_gain=0.0) for s in saes}

    def naive() -> dict[str, Any]:
        return {s: greedy_span(value_means(cacts.residual[hooks[s]], cacts.values_N), W[s], np.arange(W[s].shape[0]),
                               min_gain=0.0, max_features=8) for s in saes}

    t_cours, fits = _best(ours, args.repeats)
    t_cnaive, spans = _best(naive, args.repeats)
    spans_note = "; ".join(f"{s}: span {len(f.span.latents)} of {int(f.features['selective'].sum())} selective, "
                           f"naive span {len(spans[s].latents)}" for s, f in fits.items())
    rows.append(("concept", f"{len(cacts.texts)} prompts", t_cmodel, t_cours, t_cnaive, spans_note))

    table = pl.DataFrame(rows, schema=["search", "input", "model+encode s", "ours s", "naive s", "note"], orient="row")
    with pl.Config(tbl_width_chars=200, fmt_str_lengths=120):
        print(table)
    for search, _, shared, mine, base, _ in rows:
        print(f"{search}: search {base / mine:.1f}x faster than naive; end to end {shared + mine:.2f} s vs "
              f"{shared + base:.2f} s ({(shared + base) / (shared + mine):.2f}x)")


if __name__ == "__main__":
    main()
