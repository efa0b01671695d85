"""The analysis-run layer of `hierarchy`; its other layers: `sae_atlas.geometry.hierarchy` (maths).

Hierarchy analyses: concept vectors in the causal basis of a model's unembedding over a
concept tree (curated, WordNet or JSON) with the edge/simplex tests and their controls
(`run_hierarchy`), and the same tree on an SAE's features matched to each concept
(`run_feature_hierarchy`). Results under `analyses/hierarchy/`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from sae_atlas.api.analyses.run_files import encoder_of, run_figure
from sae_atlas.api.operations.analyses import Match
from sae_atlas.errors import InvalidInputError, NotFoundError
from sae_atlas.geometry.causal import Metric, causal_basis, unembedding_rows
from sae_atlas.geometry.concept_vectors import Estimator, concept_vector
from sae_atlas.geometry.figures import hierarchy_figure
from sae_atlas.geometry.hierarchy import (
    HierarchyResult,
    feature_hierarchy,
    hierarchy_tests,
    match_by_activation,
    match_by_decoder,
    summarize_edges,
)
from sae_atlas.geometry.trees import (
    ConceptTree,
    TokenizedTree,
    curated_tree,
    tokenize_tree,
    tree_from_json,
    wordnet_tree,
)
from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.saes.encoding.cached import sae_activation_matrix
from sae_atlas.store.activations import ActivationReader, Split
from sae_atlas.store.analysis_runs import write_analysis

TREES = ("curated", "wordnet")


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
    metric: Metric = "causal",
    estimator: Estimator = "lda",
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
        report.figures = [run_figure(hierarchy_figure(result.edges, f"hierarchy ({metric}, {estimator})"),
                                atlas, "hierarchy", run, "edges")]
        report.json_path = write_analysis(
            atlas, "hierarchy", run, parameters=params, summary=result.summary,
            tables={"main": result.edges, "concepts": result.concepts, "simplices": result.simplices},
            extra={"figures": report.figures, "dropped_words": tokenized.dropped_words})
    return report


def run_feature_hierarchy(
    atlas: str | Path,
    sae_id: str,
    W_U: Any,
    tokenizer: Any,
    *,
    tree: str | Path = "curated",
    match: Match = "decoder",
    metric: Metric = "causal",
    min_tokens: int = 5,
    split: Split = "heldout",
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
    sae = load_atlas_sae(atlas, sae_id)
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
    report.figures = [run_figure(hierarchy_figure(table.drop("cos_decoders"), f"features of {sae_id}"),
                            atlas, "hierarchy", run, "features")]
    report.json_path = write_analysis(atlas, "hierarchy", run, parameters=report.params, summary=summary,
                                      tables={"main": table}, extra={"figures": report.figures})
    return report
