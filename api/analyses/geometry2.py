"""Hierarchical, linear and map analyses: the orchestration that composes a model handle,
an atlas' SAEs and cached activations with `geometry`.

- `run_hierarchy`: concept vectors in the causal basis of a model's unembedding over a
  concept tree (curated, WordNet or JSON), the edge/simplex tests with controls;
- `run_feature_hierarchy`: the same tree on an SAE's features matched to each concept;
- `run_probe`: probes per hook on cached activations (position ridge or concept
  classification), k-sparse probes on neurons vs SAE latents;
- `run_crystals`: held-out LDA silhouette of word-pair relations;
- `run_lobes`: co-occurrence lobes of an SAE vs its geometric clusters;
- `run_galaxy`: decoder-spectrum power law and TwoNN dimension per SAE;
- `run_map`: the UMAP map of an SAE (`saes/<id>/map.parquet`).

Each writes `analyses/<kind>/<run>.*` through `geometry.results` (and PNG figures beside
it) when given an atlas.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from geometry.canvas import save_png
from geometry.causal import causal_basis, unembedding_rows
from geometry.clusters import spectral_clusters
from geometry.concept_vectors import concept_vector
from geometry.crystals import CrystalResult, crystal_quality, difference_vectors, relation_pairs
from geometry.figures import (
    crystals_figure,
    galaxy_figure,
    hierarchy_figure,
    lobes_figure,
    map_figure,
    probe_figure,
)
from geometry.galaxy import covariance_spectrum, power_law_fit, twonn_dimension
from geometry.hierarchy import (
    HierarchyResult,
    feature_hierarchy,
    hierarchy_tests,
    match_by_activation,
    match_by_decoder,
    summarize_edges,
)
from geometry.lobes import compare_labels, cooccurrence_knn, spectral_lobes
from geometry.maps import (
    attach_labels,
    feature_map,
    labels_from_clusters,
    map_frame,
    read_map,
    write_map,
)
from geometry.probes import compare_sparse_probes, probe_layers
from geometry.results import run_paths, write_analysis
from geometry.trees import (
    ConceptTree,
    TokenizedTree,
    curated_tree,
    tokenize_tree,
    tree_from_json,
    wordnet_tree,
)
from saes.atlas_saes import load_atlas_sae
from saes.encode import sae_activation_matrix
from store.activations import ActivationReader
from store.errors import InvalidInputError, NotFoundError
from store.hooks import hook_layer
from store.layout import AtlasLayout
from store.tables import load_occurrence
from store.vectors import unit_rows

TREES = ("curated", "wordnet")


def encoder_of(tokenizer: Any) -> Any:
    """`text -> ids` without special tokens, for an HF tokenizer."""
    return lambda text: tokenizer.encode(text, add_special_tokens=False)


def load_tree(spec: str | Path = "curated", *, wordnet_root: str = "entity.n.01") -> ConceptTree:
    """A concept tree: "curated", "wordnet" (NotFoundError when no database is installed)
    or a path to a JSON tree."""
    if str(spec) == "curated":
        return curated_tree()
    if str(spec) == "wordnet":
        tree = wordnet_tree(wordnet_root)
        if tree is None:
            raise NotFoundError("no WordNet database found (install Debian's wordnet-base or set "
                                "WNSEARCHDIR to a folder with data.noun and index.noun)")
        return tree
    return tree_from_json(spec)


def _save(fig: Any, atlas: str | Path, kind: str, run: str, suffix: str) -> str:
    pq, _ = run_paths(atlas, kind, run)
    return save_png(fig, pq.with_name(f"{run}.{suffix}.png")).name


# --------------------------------------------------------------------------- hierarchy
@dataclass
class HierarchyReport:
    """A hierarchy run: tables, tokenized tree, parameters and where it was written."""

    result: HierarchyResult
    tokenized: TokenizedTree
    params: dict[str, Any]
    features: pl.DataFrame | None = None
    json_path: Path | None = None
    figures: list[str] = field(default_factory=list)


def run_hierarchy(
    W_U: Any,
    tokenizer: Any,
    *,
    tree: str | Path = "curated",
    metric: str = "causal",
    estimator: str = "lda",
    min_tokens: int = 5,
    max_nodes: int | None = None,
    heldout_frac: float = 0.2,
    floor: float = 1e-6,
    seed: int = 0,
    wordnet_root: str = "entity.n.01",
    atlas: str | Path | None = None,
    run: str | None = None,
) -> HierarchyReport:
    """Hierarchy tests of a model (`W_U [d_model, d_vocab]` and its tokenizer) on a tree."""
    gamma = unembedding_rows(W_U)
    basis = causal_basis(gamma, metric=metric, floor=floor)
    tokenized = tokenize_tree(load_tree(tree, wordnet_root=wordnet_root), encoder_of(tokenizer),
                              min_tokens=min_tokens, max_nodes=max_nodes)
    result = hierarchy_tests(basis.unembed(gamma), tokenized, estimator=estimator,
                             heldout_frac=heldout_frac, seed=seed)
    params = {"tree": str(tree), "tree_source": tokenized.tree.source, "metric": metric, "estimator": estimator,
              "min_tokens": min_tokens, "max_nodes": max_nodes, "heldout_frac": heldout_frac, "floor": floor,
              "seed": seed, "n_floored": basis.n_floored, "n_concepts": len(tokenized.tree.nodes),
              "n_words": len(tokenized.word_ids)}
    report = HierarchyReport(result, tokenized, params)
    if atlas is not None:
        run = run or f"{Path(str(tree)).stem}-{metric}-{estimator}"
        report.figures = [_save(hierarchy_figure(result.edges, f"hierarchy ({metric}, {estimator})"),
                                atlas, "hierarchy", run, "edges")]
        report.json_path = write_analysis(
            atlas, "hierarchy", run, parameters=params, summary=result.summary,
            tables={"main": result.edges, "concepts": result.concepts, "simplices": result.simplices},
            extra={"figures": report.figures, "dropped_words": tokenized.dropped_words})
    return report


def _sae(atlas: str | Path, sae_id: str) -> Any:
    return load_atlas_sae(atlas, sae_id)


def run_feature_hierarchy(
    atlas: str | Path,
    sae_id: str,
    W_U: Any,
    tokenizer: Any,
    *,
    tree: str | Path = "curated",
    match: str = "decoder",
    metric: str = "causal",
    min_tokens: int = 5,
    split: str = "heldout",
    max_tokens: int = 200_000,
    seed: int = 0,
    run: str | None = None,
) -> HierarchyReport:
    """Map each concept to its best SAE latent (`match`: "decoder" cosine with the concept
    vector, or "activation" selectivity on its tokens in the cached split) and test whether
    child features sit orthogonally off their parents. Decoder rows enter the causal basis
    of the unembedding through `CausalBasis.embed`."""
    if match not in ("decoder", "activation"):
        raise InvalidInputError(f"unknown match {match!r}; valid: decoder, activation")
    report = run_hierarchy(W_U, tokenizer, tree=tree, metric=metric, min_tokens=min_tokens, seed=seed)
    gamma = unembedding_rows(W_U)
    basis = causal_basis(gamma, metric=metric)
    g = basis.unembed(gamma)
    sae = _sae(atlas, sae_id)
    directions = basis.embed(sae.W_dec.detach().float().numpy())
    tokenized = report.tokenized
    if match == "decoder":
        vectors = {n: concept_vector(g[ids]) for n, ids in tokenized.token_ids.items()}
        matches = match_by_decoder(vectors, directions)
    else:
        acts, token_ids = sae_activation_matrix(sae, ActivationReader(atlas, sae.cfg.hook_name), split=split,
                                                max_tokens=max_tokens)
        matches = match_by_activation(acts, token_ids, tokenized.token_ids)
    table = feature_hierarchy(g, tokenized, directions, matches, seed=seed)
    report.features = table
    report.params |= {"sae_id": sae_id, "match": match, "split": split, "max_tokens": max_tokens}
    run = run or f"{sae_id}-{match}"
    summary = summarize_edges(table) | {"n_same_latent": int(table["same_latent"].sum()) if table.height else 0}
    report.figures = [_save(hierarchy_figure(table.drop("cos_decoders"), f"features of {sae_id}"),
                            atlas, "hierarchy", run, "features")]
    report.json_path = write_analysis(atlas, "hierarchy", run, parameters=report.params, summary=summary,
                                      tables={"main": table}, extra={"figures": report.figures})
    return report


# --------------------------------------------------------------------------- probes
def _hook_acts(atlas: str | Path, hook: str, max_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(acts [N, d], token_ids [N], positions [N])` from the start of a hook's cache (BOS excluded)."""
    rows = list(ActivationReader(atlas, hook).rows("all", max_tokens=max_tokens))
    if not rows:
        raise InvalidInputError(f"hook {hook!r} has no cached tokens")
    return tuple(torch.cat([getattr(r, name) for r in rows]).numpy() for name in ("acts", "token_ids", "positions"))


def run_probe(
    atlas: str | Path,
    hooks: list[str],
    *,
    target: str = "position",
    token_ids: np.ndarray | None = None,
    sae_id: str | None = None,
    max_tokens: int = 20_000,
    ks: tuple[int, ...] = (1, 2, 4, 8, 16),
    seed: int = 0,
    run: str | None = None,
) -> dict[str, Any]:
    """Probes on cached activations of each hook. `target="position"` fits a ridge probe of
    the token position; otherwise `target` names a concept whose `token_ids` are the
    positive class (logistic per layer, plus k-sparse probes on the neurons of the SAE's
    hook vs its latents when `sae_id` is given)."""
    if not hooks:
        raise InvalidInputError("name at least one cached hook to probe")
    layers, labels = {}, None
    for hook in hooks:
        X, toks, pos = _hook_acts(atlas, hook, max_tokens)
        layers[hook] = X
        if target == "position":
            labels = pos.astype(np.float64)
        else:
            if token_ids is None:
                raise InvalidInputError(f"target {target!r} needs the concept's token ids")
            labels = np.isin(toks, token_ids)
    n = min(len(X) for X in layers.values())
    layers = {h: X[:n] for h, X in layers.items()}
    labels = labels[:n]
    kind = "ridge" if target == "position" else "logistic"
    per_layer = probe_layers(layers, labels, kind, seed=seed)
    tables, figures = {"main": per_layer}, []
    run = run or f"{target}-{kind}"
    if sae_id is not None and kind == "logistic":
        sae = _sae(atlas, sae_id)
        hook = sae.cfg.hook_name
        X = layers[hook] if hook in layers else _hook_acts(atlas, hook, n)[0][:n]
        with torch.inference_mode():
            latents = sae.encode(torch.from_numpy(X).float()).numpy()
        tables["sparse"] = compare_sparse_probes({"neurons": X, "latents": latents}, labels, ks, seed=seed)
        figures.append(_save(probe_figure(tables["sparse"], f"k-sparse probes: {target}"), atlas, "probe", run, "sparse"))
    figures.append(_save(probe_figure(per_layer, f"{kind} probe: {target}"), atlas, "probe", run, "layers"))
    params = {"hooks": hooks, "target": target, "kind": kind, "sae_id": sae_id, "max_tokens": max_tokens,
              "n_rows": n, "positives": int(np.sum(labels)) if kind == "logistic" else None, "ks": list(ks),
              "seed": seed}
    js = write_analysis(atlas, "probe", run, parameters=params, tables=tables, extra={"figures": figures},
                        summary={"best_layer": per_layer.sort("test_score", descending=True)["layer"][0]})
    return {"tables": tables, "params": params, "json_path": js, "figures": figures}


# --------------------------------------------------------------------------- crystals
@torch.inference_mode()
def word_vectors(handle: Any, token_ids: np.ndarray, hook: str | None = None) -> np.ndarray:
    """Representations `[N, d]` of single tokens: rows of the input embedding `W_E`, or the
    residual at `hook` on the prompt `[BOS, token]` (last position)."""
    ids = np.asarray(token_ids, dtype=np.int64)
    if hook is None:
        return handle.bridge.W_E.detach().float().numpy()[ids]
    handle.check_hook(hook)
    bos = handle.bos_token_id if handle.bos_token_id is not None else ids[0]
    tokens = torch.stack([torch.full((len(ids),), int(bos)), torch.from_numpy(ids)], 1)
    _, cache = handle.bridge.run_with_cache(tokens, names_filter=lambda name: name == hook)
    return cache[hook][:, -1].float().numpy()


def run_crystals(
    handle: Any, *, hook: str | None = None, n_null: int = 50, test_frac: float = 0.3, seed: int = 0,
    atlas: str | Path | None = None, run: str | None = None,
) -> tuple[CrystalResult, dict[str, Any]]:
    """Crystal quality of the built-in word-pair relations on a model's embeddings (or the
    residual at `hook`): held-out LDA silhouette against a random-label null."""
    pairs, labels, words = relation_pairs(encoder_of(handle.tokenizer))
    flat = np.unique(pairs)
    X = word_vectors(handle, flat, hook)
    local = np.searchsorted(flat, pairs)
    result = crystal_quality(difference_vectors(X, local), labels, test_frac=test_frac, n_null=n_null, seed=seed)
    params = {"hook": hook, "source": "W_E" if hook is None else hook, "n_pairs": len(pairs),
              "relations": sorted({*labels.tolist()}), "n_null": n_null, "test_frac": test_frac, "seed": seed}
    if atlas is not None:
        run = run or f"crystals-{'embed' if hook is None else re.sub(r'[^A-Za-z0-9._-]', '_', hook)}"
        fig = _save(crystals_figure(result, f"crystals ({params['source']})"), atlas, "crystals", run, "silhouette")
        table = pl.DataFrame({"a": [w[0] for w in words], "b": [w[1] for w in words], "relation": labels.tolist()})
        params["json_path"] = str(write_analysis(atlas, "crystals", run, parameters=params, summary=result.summary(),
                                                 tables={"main": table}, extra={"figures": [fig]}))
    return result, params


# --------------------------------------------------------------------------- lobes
def run_lobes(
    atlas: str | Path, sae_id: str, *, measure: str = "jaccard", k: int = 20, n_clusters: int = 10,
    n_perm: int = 100, seed: int = 0, run: str | None = None,
) -> dict[str, Any]:
    """Co-occurrence lobes of an SAE (from its summary's occurrence matrix), compared by AMI
    with spectral clusters of its decoder rows; labels are attached to its map if any."""
    occ, _ = load_occurrence(atlas, sae_id)
    lobes = spectral_lobes(cooccurrence_knn(occ, measure=measure, k=k), n_clusters, seed=seed)
    W = _sae(atlas, sae_id).W_dec.detach().float().numpy()
    geometric = labels_from_clusters(spectral_clusters(W, n_clusters, seed=seed, min_size=1), len(W))
    cmp = compare_labels(lobes, geometric, n_perm=n_perm, seed=seed)
    table = pl.DataFrame({"latent": np.arange(len(W), dtype=np.int32), "lobe": lobes, "geometric": geometric})
    run = run or f"{sae_id}-{measure}"
    params = {"sae_id": sae_id, "measure": measure, "k": k, "n_clusters": n_clusters, "n_perm": n_perm,
              "seed": seed, "n_blocks": int(occ.shape[0])}
    fig = _save(lobes_figure({"lobes vs geometric": cmp}), atlas, "lobes", run, "ami")
    js = write_analysis(atlas, "lobes", run, parameters=params, summary=cmp.__dict__, tables={"main": table},
                        extra={"figures": [fig]})
    if (AtlasLayout(atlas).sae_dir(sae_id) / "map.json").exists():
        attach_labels(atlas, sae_id, {f"lobe_{measure}": lobes, "geometric": geometric})
    return {"comparison": cmp, "table": table, "params": params, "json_path": js}


# --------------------------------------------------------------------------- galaxy
def run_galaxy(
    atlas: str | Path, sae_ids: list[str] | None = None, *, ranks: tuple[int, int] = (10, 150),
    twonn_points: int = 20000, seed: int = 0, run: str = "galaxy",
) -> dict[str, Any]:
    """Power-law slope of the unit-decoder covariance spectrum and TwoNN dimension for each
    SAE (all SAEs of the atlas by default), ordered by layer."""
    ids = sae_ids or AtlasLayout(atlas).sae_ids()
    if not ids:
        raise NotFoundError(f"atlas {atlas} has no SAEs yet; train one with `sae-atlas train`")
    rows, spectra, fits = [], {}, {}
    for sae_id in ids:
        sae = _sae(atlas, sae_id)
        W = sae.W_dec.detach().float().numpy()
        ev = covariance_spectrum(W, unit=True)
        fit = power_law_fit(ev, ranks)
        spectra[sae_id], fits[sae_id] = ev, fit
        tn = twonn_dimension(unit_rows(W), max_points=twonn_points, seed=seed)
        rows.append({"sae_id": sae_id, "hook": sae.cfg.hook_name, "layer": hook_layer(sae.cfg.hook_name),
                     "d_sae": len(W), "slope": fit.slope, "alpha": fit.alpha, "fit_r2": fit.r2,
                     "rank_lo": fit.lo, "rank_hi": fit.hi, "twonn_dimension": tn.dimension})
    table = pl.DataFrame(rows).sort(["layer", "sae_id"])
    order = table["sae_id"].to_list()
    fig = _save(galaxy_figure({i: spectra[i] for i in order}, {i: fits[i] for i in order}), atlas, "galaxy", run,
                "spectra")
    params = {"sae_ids": order, "ranks": list(ranks), "twonn_points": twonn_points, "seed": seed}
    js = write_analysis(atlas, "galaxy", run, parameters=params, tables={"main": table}, extra={"figures": [fig]},
                        summary={"alpha_by_sae": dict(zip(order, table["alpha"].to_list(), strict=True))})
    return {"table": table, "params": params, "json_path": js}


# --------------------------------------------------------------------------- maps
def run_map(
    atlas: str | Path, sae_id: str, *, k_overlap: int = 10, n_neighbors: int = 15, min_dist: float = 0.1,
    seed: int = 0, n_epochs: int | None = None, labels: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """UMAP map of an SAE's decoder rows into `saes/<id>/map.parquet` (+ `map.png`), keeping
    label columns of an earlier map unless `labels` replaces them."""
    W = _sae(atlas, sae_id).W_dec.detach().float().numpy()
    fmap = feature_map(W, k_overlap=k_overlap, n_neighbors=n_neighbors, min_dist=min_dist, seed=seed,
                       n_epochs=n_epochs)
    keep: dict[str, np.ndarray] = {}
    if (AtlasLayout(atlas).sae_dir(sae_id) / "map.json").exists():
        old, meta = read_map(atlas, sae_id)
        if old.height == len(W):
            keep = {c: old[c].to_numpy() for c in meta.get("label_columns", [])}
    frame = map_frame(fmap, keep | (labels or {}))
    path = write_map(atlas, sae_id, frame, fmap.params, fmap.summary)
    save_png(map_figure(frame, title=f"map of {sae_id}"), path.with_name("map.png"))
    return {"frame": frame, "summary": fmap.summary, "params": fmap.params, "path": path}
