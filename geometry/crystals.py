"""The maths layer of `crystals`; its other layers: `sae_atlas.api.analyses.crystals`
(analysis-run).

Crystals: parallelogram / trapezoid structure of word-pair difference vectors (Li,
Michaud, Tegmark et al. 2024, "The Geometry of Concepts: Sparse Autoencoder Feature
Structure").

The difference vectors `x(a) - x(b)` of pairs in the same relation (man:woman,
king:queen) should cluster. A distractor such as word length often dominates the first
principal component; linear discriminant analysis (LDA) projects it out. Quality is
the silhouette of the relation labels in LDA space, computed on HELD-OUT pairs (LDA fit
on the rest) and compared with a random-label null: in high dimension, in-sample LDA
separates even random labels, so an in-sample silhouette proves nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from sklearn.decomposition import PCA
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.metrics import silhouette_score

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.splits import stratified_split
from sae_atlas.geometry.trees import single_token_id


@dataclass
class CrystalResult:
    """Held-out LDA silhouette of relation labels against a random-label null, plus the
    PCA (no LDA) and in-sample numbers for comparison."""

    heldout_silhouette: float
    null_mean: float
    null_std: float
    null_values: list[float]
    z_score: float
    p_value: float  # share of null draws >= the observed silhouette (with +1 smoothing)
    pca_silhouette: float  # held-out, top PCs of the training pairs, no LDA
    insample_silhouette: float
    insample_null_mean: float
    n_train: int
    n_test: int
    n_relations: int
    test_coords: np.ndarray  # held-out pairs in the first 2 LDA dimensions
    test_labels: np.ndarray

    def summary(self) -> dict[str, float | int]:
        """The scalar fields, for results JSON."""
        return {k: v for k, v in self.__dict__.items() if isinstance(v, (int, float))}


def difference_vectors(X_VD: np.ndarray, pairs_P2: np.ndarray) -> np.ndarray:
    """`X[a] - X[b]` for every pair `(a, b)` of row indices."""
    pairs = np.asarray(pairs_P2, dtype=np.int64)
    X = np.asarray(X_VD, dtype=np.float64)
    if pairs.ndim != 2 or pairs.shape[1] != 2 or pairs.min() < 0 or pairs.max() >= len(X):
        raise InvalidInputError(f"pairs must be [P, 2] row indices in [0, {len(X)}), got shape {pairs.shape}")
    return X[pairs[:, 0]] - X[pairs[:, 1]]


def _lda_silhouettes(
    X: np.ndarray, y: np.ndarray, tr: np.ndarray, te: np.ndarray, shrinkage: str | float | None
) -> tuple[float, float, np.ndarray]:
    solver = "svd" if shrinkage is None else "eigen"
    lda = LinearDiscriminantAnalysis(solver=solver, shrinkage=shrinkage).fit(X[tr], y[tr])
    Z_te, Z_tr = lda.transform(X[te]), lda.transform(X[tr])
    return float(silhouette_score(Z_te, y[te])), float(silhouette_score(Z_tr, y[tr])), Z_te


def crystal_quality(
    diffs_PD: np.ndarray, labels_P: np.ndarray, *, test_frac: float = 0.3, n_null: int = 20, seed: int = 0,
    shrinkage: str | float | None = "auto",
) -> CrystalResult:
    """Score how well relation labels cluster the difference vectors (see module docstring).

    `shrinkage` is the LDA covariance shrinkage: "auto" (Ledoit-Wolf), a float in [0, 1],
    or None for plain LDA.
    """
    X = np.asarray(diffs_PD, dtype=np.float64)
    y = np.asarray(labels_P)
    if X.ndim != 2 or len(X) != len(y):
        raise InvalidInputError(f"difference vectors must be [P, d] with one label each, got {X.shape}, {y.shape}")
    if len(np.unique(y)) < 2:
        raise InvalidInputError("need at least 2 relations to score crystals")
    rng = np.random.default_rng(seed)
    tr, te = stratified_split(y, test_frac, rng)
    held, insample, Z_te = _lda_silhouettes(X, y, tr, te, shrinkage)
    n_pc = min(len(np.unique(y)) - 1, X.shape[1], len(tr) - 1)
    pca = PCA(n_components=max(n_pc, 1), random_state=seed).fit(X[tr])
    pca_sil = float(silhouette_score(pca.transform(X[te]), y[te]))
    null, null_in = [], []
    for _ in range(n_null):
        fake = rng.permutation(y)
        try:
            h, i, _ = _lda_silhouettes(X, fake, tr, te, shrinkage)
        except ValueError:  # a permutation left a label with one test row: skip it
            continue
        null.append(h)
        null_in.append(i)
    null_arr = np.array(null) if null else np.array([np.nan])
    sd = float(null_arr.std()) if len(null) > 1 else float("nan")
    return CrystalResult(
        heldout_silhouette=held,
        null_mean=float(null_arr.mean()),
        null_std=sd,
        null_values=[float(v) for v in null],
        z_score=float((held - null_arr.mean()) / sd) if sd and sd > 0 else float("nan"),
        p_value=float((1 + (null_arr >= held).sum()) / (1 + len(null))),
        pca_silhouette=pca_sil,
        insample_silhouette=insample,
        insample_null_mean=float(np.mean(null_in)) if null_in else float("nan"),
        n_train=len(tr),
        n_test=len(te),
        n_relations=len(np.unique(y)),
        test_coords=Z_te[:, :2],
        test_labels=y[te],
    )


# Built-in word-pair relations (both words are common; tokenizer filtering keeps the pairs
# whose two words are single tokens with a leading space).
RELATIONS: dict[str, list[tuple[str, str]]] = {
    "gender": [("man", "woman"), ("king", "queen"), ("boy", "girl"), ("father", "mother"),
               ("brother", "sister"), ("son", "daughter"), ("husband", "wife"), ("uncle", "aunt"),
               ("prince", "princess"), ("actor", "actress"), ("male", "female"), ("he", "she"),
               ("his", "her"), ("nephew", "niece"), ("lord", "lady"), ("god", "goddess"),
               ("waiter", "waitress"), ("Mr", "Mrs")],
    "plural": [("dog", "dogs"), ("cat", "cats"), ("car", "cars"), ("house", "houses"), ("tree", "trees"),
               ("book", "books"), ("bird", "birds"), ("apple", "apples"), ("river", "rivers"),
               ("city", "cities"), ("table", "tables"), ("door", "doors"), ("hand", "hands"),
               ("eye", "eyes"), ("word", "words"), ("friend", "friends"), ("school", "schools")],
    "past_tense": [("walk", "walked"), ("play", "played"), ("jump", "jumped"), ("look", "looked"),
                   ("talk", "talked"), ("work", "worked"), ("call", "called"), ("ask", "asked"),
                   ("move", "moved"), ("live", "lived"), ("love", "loved"), ("open", "opened"),
                   ("start", "started"), ("help", "helped"), ("turn", "turned"), ("want", "wanted")],
    "comparative": [("big", "bigger"), ("small", "smaller"), ("fast", "faster"), ("slow", "slower"),
                    ("tall", "taller"), ("old", "older"), ("young", "younger"), ("long", "longer"),
                    ("short", "shorter"), ("strong", "stronger"), ("high", "higher"), ("low", "lower"),
                    ("hard", "harder"), ("cold", "colder"), ("warm", "warmer"), ("dark", "darker")],
    "capital": [("France", "Paris"), ("Germany", "Berlin"), ("Japan", "Tokyo"), ("Italy", "Rome"),
                ("Spain", "Madrid"), ("Russia", "Moscow"), ("China", "Beijing"), ("Egypt", "Cairo"),
                ("England", "London"), ("Greece", "Athens"), ("Canada", "Ottawa"), ("Kenya", "Nairobi"),
                ("Peru", "Lima"), ("Cuba", "Havana"), ("Austria", "Vienna"), ("Poland", "Warsaw")],
}


def relation_pairs(
    encode: Callable[[str], list[int]], relations: dict[str, list[tuple[str, str]]] | None = None,
    *, min_pairs: int = 3,
) -> tuple[np.ndarray, np.ndarray, list[tuple[str, str]]]:
    """Token-id pairs `[P, 2]`, relation labels `[P]` and the kept word pairs, keeping the
    pairs whose two words are single tokens (with a leading space) and relations with at
    least `min_pairs` such pairs."""
    ids, labels, words = [], [], []
    for name, pairs in (relations or RELATIONS).items():
        kept = [(a, b, single_token_id(a, encode), single_token_id(b, encode)) for a, b in pairs]
        kept = [k for k in kept if k[2] is not None and k[3] is not None]
        if len(kept) < min_pairs:
            continue
        for a, b, ia, ib in kept:
            ids.append((ia, ib))
            labels.append(name)
            words.append((a, b))
    if len({*labels}) < 2:
        raise InvalidInputError("fewer than 2 relations have enough single-token pairs for this tokenizer")
    return np.array(ids, dtype=np.int64), np.array(labels), words
