"""The maths layer of `hierarchy`; its other layers: `sae_atlas.api.analyses.hierarchy`
(analysis-run).

Hierarchy and categorical-simplex tests over concept trees (Park et al. 2024, "The
Geometry of Categorical and Hierarchical Concepts in Large Language Models").

In the causal basis, a child concept's vector differs from its parent's by a vector
orthogonal to the parent: `cos(l_child - l_parent, l_parent) ~ 0` (and likewise against
the grandparent, and `l_child - l_parent` against `l_parent - l_grandparent`). Controls:
a random token set of the parent's size standing in for the parent, and the same tree on
row-shuffled unembeddings. Siblings form a simplex: their vectors have affine rank k-1
and their differences are orthogonal to the parent. The same edge test runs on SAE
features matched to each concept, by decoder cosine or by activation on its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import scipy.sparse as sp

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.causal import cosine
from sae_atlas.geometry.concept_vectors import Estimator, concept_vector, fit_concepts
from sae_atlas.geometry.trees import TokenizedTree
from sae_atlas.geometry.vectors import unit_rows


@dataclass
class HierarchyResult:
    """Tables of one hierarchy run: concepts (projection checks), edges, simplices."""

    concepts: pl.DataFrame
    edges: pl.DataFrame
    simplices: pl.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)


def _vectors(g_VD: np.ndarray, token_ids: dict[str, np.ndarray], estimator: Estimator) -> dict[str, np.ndarray]:
    return {n: concept_vector(g_VD[ids], estimator=estimator) for n, ids in token_ids.items()}


def _random_sets(token_ids: dict[str, np.ndarray], n_vocab: int, seed: int) -> dict[str, np.ndarray]:
    """For each concept, a seeded random token set of the same size outside the tree's tokens."""
    rng = np.random.default_rng(seed)
    used = np.unique(np.concatenate(list(token_ids.values())))
    pool = np.setdiff1d(np.arange(n_vocab), used)
    return {n: rng.choice(pool, size=len(ids), replace=False) for n, ids in token_ids.items()}


def edge_cosines(vectors: dict[str, np.ndarray], tree: Any, child: str) -> dict[str, float | None]:
    """`cos(l_c - l_p, l_p)`, `cos(l_c - l_gp, l_gp)` and `cos(l_c - l_p, l_p - l_gp)` of one node."""
    node = tree.nodes[child]
    lc, lp = vectors[child], vectors[node.parent]
    grand = tree.nodes[node.parent].parent
    out: dict[str, float | None] = {"cos_child_parent": cosine(lc - lp, lp), "cos_child_grandparent": None,
                                    "cos_chain": None}
    if grand is not None:
        lg = vectors[grand]
        out["cos_child_grandparent"] = cosine(lc - lg, lg)
        out["cos_chain"] = cosine(lc - lp, lp - lg)
    return out


def affine_rank(vectors_KD: np.ndarray, rtol: float = 1e-6) -> tuple[int, np.ndarray]:
    """Affine rank of k points (rank of their differences from the centroid) and the
    singular values of those differences."""
    diffs = vectors_KD - vectors_KD.mean(axis=0)
    s = np.linalg.svd(diffs, compute_uv=False)
    return int((s > rtol * max(float(s[0]), 1e-300)).sum()), s


def hierarchy_tests(
    g_VD: np.ndarray,
    tokenized: TokenizedTree,
    *,
    estimator: Estimator = "lda",
    heldout_frac: float = 0.2,
    seed: int = 0,
    shuffled_control: bool = True,
) -> HierarchyResult:
    """Run the concept checks, edge table with controls and simplex checks on a tree.

    `g_VD` are the unembedding rows in the chosen basis (`CausalBasis.unembed`); token ids
    index its rows. Concept vectors for the edges use each concept's full token set; the
    projection checks use a seeded held-out split.
    """
    g = np.asarray(g_VD, dtype=np.float64)
    tree, token_ids = tokenized.tree, tokenized.token_ids
    if len(tree.nodes) < 2:
        raise InvalidInputError("the concept tree needs at least one parent-child edge after tokenization")
    fits = fit_concepts(g, token_ids, estimator=estimator, heldout_frac=heldout_frac, seed=seed)
    vectors = _vectors(g, token_ids, estimator)
    randoms = _vectors(g, _random_sets(token_ids, len(g), seed + 1), estimator)
    shuffled = None
    if shuffled_control:
        perm = np.random.default_rng(seed + 2).permutation(len(g))
        shuffled = _vectors(g[perm], token_ids, estimator)
    rows = []
    for child, parent in tree.edges():
        row: dict[str, Any] = {"child": child, "parent": parent, "grandparent": tree.nodes[parent].parent,
                               "n_child": len(token_ids[child]), "n_parent": len(token_ids[parent])}
        row.update(edge_cosines(vectors, tree, child))
        lc, lr = vectors[child], randoms[parent]
        row["cos_random_parent"] = cosine(lc - lr, lr)
        row["cos_shuffled"] = edge_cosines(shuffled, tree, child)["cos_child_parent"] if shuffled else None
        rows.append(row)
    edges = pl.DataFrame(rows, schema={
        "child": pl.String, "parent": pl.String, "grandparent": pl.String, "n_child": pl.Int64,
        "n_parent": pl.Int64, "cos_child_parent": pl.Float64, "cos_child_grandparent": pl.Float64,
        "cos_chain": pl.Float64, "cos_random_parent": pl.Float64, "cos_shuffled": pl.Float64,
    })
    concepts = pl.DataFrame(
        [{"concept": f.name, "parent": tree.nodes[f.name].parent, "n_tokens": f.n_tokens, "n_train": f.n_train,
          "norm": float(np.linalg.norm(vectors[f.name])), "heldout_projection": f.heldout_projection,
          "random_projection": f.random_projection} for f in fits.values()],
        schema={"concept": pl.String, "parent": pl.String, "n_tokens": pl.Int64, "n_train": pl.Int64,
                "norm": pl.Float64, "heldout_projection": pl.Float64, "random_projection": pl.Float64},
    )
    simplices = simplex_table(vectors, tree)
    return HierarchyResult(concepts, edges, simplices, summarize_edges(edges, concepts, simplices))


def simplex_table(vectors: dict[str, np.ndarray], tree: Any) -> pl.DataFrame:
    """One row per node with >= 2 children: affine rank of the children's vectors (k-1 for
    a simplex) and the largest / mean |cos(l_i - l_j, l_parent)| over sibling pairs."""
    rows = []
    for name, node in tree.nodes.items():
        kids = node.children
        if len(kids) < 2:
            continue
        V = np.stack([vectors[k] for k in kids])
        rank, s = affine_rank(V)
        cos = [abs(cosine(V[i] - V[j], vectors[name])) for i in range(len(kids)) for j in range(i + 1, len(kids))]
        rows.append({"parent": name, "children": list(kids), "k": len(kids), "affine_rank": rank,
                     "singular_values": s.tolist(), "max_abs_cos_diff_parent": float(max(cos)),
                     "mean_abs_cos_diff_parent": float(np.mean(cos))})
    return pl.DataFrame(rows, schema={
        "parent": pl.String, "children": pl.List(pl.String), "k": pl.Int64, "affine_rank": pl.Int64,
        "singular_values": pl.List(pl.Float64), "max_abs_cos_diff_parent": pl.Float64,
        "mean_abs_cos_diff_parent": pl.Float64,
    })


def _abs_stats(col: pl.Series) -> dict[str, float | None]:
    vals = np.abs(col.drop_nulls().to_numpy())
    if len(vals) == 0:
        return {"mean_abs": None, "max_abs": None}
    return {"mean_abs": float(vals.mean()), "max_abs": float(vals.max())}


def summarize_edges(edges: pl.DataFrame, concepts: pl.DataFrame | None = None,
                    simplices: pl.DataFrame | None = None) -> dict[str, Any]:
    """Mean / max |cos| of every cosine column of an edge table, plus concept-check means."""
    out: dict[str, Any] = {"n_edges": edges.height}
    for col in edges.columns:
        if col.startswith("cos_"):
            out[col] = _abs_stats(edges[col])
    if concepts is not None and concepts.height:
        out["mean_heldout_projection"] = float(concepts["heldout_projection"].drop_nans().mean() or 0.0)
        out["mean_random_projection"] = float(concepts["random_projection"].drop_nans().mean() or 0.0)
    if simplices is not None and simplices.height:
        out["simplex_full_rank_share"] = float((simplices["affine_rank"] == simplices["k"] - 1).mean())
        out["simplex_mean_abs_cos_diff_parent"] = float(simplices["mean_abs_cos_diff_parent"].mean())
    return out


# SAE features -----------------------------------------------------------------------------
def match_by_decoder(
    vectors: dict[str, np.ndarray], directions_FD: np.ndarray, top_k: int = 1
) -> dict[str, list[tuple[int, float]]]:
    """Each concept's `top_k` latents by cosine between the concept vector and the latent's
    decoder direction (both in the same basis: use `CausalBasis.embed` on decoder rows)."""
    D = np.asarray(directions_FD, dtype=np.float64)
    unit = unit_rows(D, np.float64)
    out = {}
    for name, vec in vectors.items():
        cos = unit @ (vec / max(float(np.linalg.norm(vec)), 1e-12))
        top = np.argsort(-cos, kind="stable")[:top_k]
        out[name] = [(int(i), float(cos[i])) for i in top]
    return out


def match_by_activation(
    acts_TF: np.ndarray | sp.spmatrix,
    token_ids_T: np.ndarray,
    token_sets: dict[str, np.ndarray],
    top_k: int = 1,
) -> dict[str, list[tuple[int, float]]]:
    """Each concept's `top_k` latents by selectivity on its tokens: mean activation over
    the rows whose token is in the concept minus the mean over the other rows.

    `acts_TF` is a `[tokens x d_sae]` activation matrix (dense or scipy sparse) and
    `token_ids_T` the token of each row. Concepts with no row in the matrix are omitted.
    """
    acts = sp.csr_matrix(acts_TF) if not sp.issparse(acts_TF) else acts_TF.tocsr()
    tokens = np.asarray(token_ids_T)
    if acts.shape[0] != len(tokens):
        raise InvalidInputError(f"activation rows ({acts.shape[0]}) and token ids ({len(tokens)}) differ in length")
    total = np.asarray(acts.sum(axis=0)).ravel()
    out = {}
    for name, ids in token_sets.items():
        mask = np.isin(tokens, ids)
        n_in = int(mask.sum())
        if n_in == 0:
            continue
        inside = np.asarray(acts[mask].sum(axis=0)).ravel()
        n_out = max(len(tokens) - n_in, 1)
        score = inside / n_in - (total - inside) / n_out
        top = np.argsort(-score, kind="stable")[:top_k]
        out[name] = [(int(i), float(score[i])) for i in top]
    return out


def feature_concept_vector(direction_D: np.ndarray, g_ND: np.ndarray) -> np.ndarray:
    """A latent's direction scaled like a concept vector: `(gbar . u) u` with `u` the unit
    direction and `gbar` the mean of the concept's token vectors."""
    u = direction_D / max(float(np.linalg.norm(direction_D)), 1e-12)
    return float(np.asarray(g_ND).mean(axis=0) @ u) * u


def feature_hierarchy(
    g_VD: np.ndarray,
    tokenized: TokenizedTree,
    directions_FD: np.ndarray,
    matches: dict[str, list[tuple[int, float]]],
    *,
    seed: int = 0,
) -> pl.DataFrame:
    """The edge test on SAE features: for every tree edge whose two concepts have matched
    latents, `cos(l_fc - l_fp, l_fp)` with `l_f` from `feature_concept_vector`, the raw
    cosine of the two decoder directions, and as control a seeded random concept that is
    neither an ancestor nor a descendant of the child standing in for the parent."""
    g = np.asarray(g_VD, dtype=np.float64)
    D = np.asarray(directions_FD, dtype=np.float64)
    rng = np.random.default_rng(seed)
    tree, ids = tokenized.tree, tokenized.token_ids
    rows = []
    for child, parent in tree.edges():
        if child not in matches or parent not in matches:
            continue
        (fc, mc), (fp, mp) = matches[child][0], matches[parent][0]
        lc = feature_concept_vector(D[fc], g[ids[child]])
        lp = feature_concept_vector(D[fp], g[ids[parent]])
        others = [n for n in matches if n != child and n in ids and n not in tree.ancestors(child)
                  and child not in tree.ancestors(n)]
        control = others[int(rng.integers(len(others)))] if others else None
        cos_control = None
        if control is not None:
            lr = feature_concept_vector(D[matches[control][0][0]], g[ids[control]])
            cos_control = cosine(lc - lr, lr)
        rows.append({"child": child, "parent": parent, "child_latent": fc, "parent_latent": fp,
                     "child_match": mc, "parent_match": mp, "same_latent": fc == fp,
                     "cos_child_parent": cosine(lc - lp, lp) if fc != fp else None,
                     "cos_decoders": cosine(D[fc], D[fp]), "control_concept": control,
                     "cos_random_parent": cos_control})
    return pl.DataFrame(rows, schema={
        "child": pl.String, "parent": pl.String, "child_latent": pl.Int64, "parent_latent": pl.Int64,
        "child_match": pl.Float64, "parent_match": pl.Float64, "same_latent": pl.Boolean,
        "cos_child_parent": pl.Float64, "cos_decoders": pl.Float64, "control_concept": pl.String,
        "cos_random_parent": pl.Float64,
    })
