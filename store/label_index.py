"""Local full-text search over feature labels and explanations: Okapi BM25 over words
(lower-cased letters and digits, a plural `s` dropped), built in memory from the labels
tables; no network, no embedding model.

A feature's document is all of its texts (its offline label and every imported
explanation), so a query matches a feature whichever text holds the words.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import polars as pl

from sae_atlas.errors import InvalidInputError

_WORD = re.compile(r"[a-z0-9]+")
K1, B = 1.2, 0.75
HIT_SCHEMA = {"sae_id": pl.String, "latent": pl.Int64, "score": pl.Float64}


def words(text: str) -> list[str]:
    """The search words of a text: lower-cased runs of letters and digits, a trailing
    plural `s` dropped from words longer than three letters."""
    return [w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
            for w in _WORD.findall(text.lower())]


class LabelIndex:
    """BM25 over one document per feature (`labels`: columns sae_id, latent, text)."""

    def __init__(self, labels: pl.DataFrame) -> None:
        docs = labels.group_by("sae_id", "latent", maintain_order=True).agg(pl.col("text").str.join(" \n "))
        self.keys = docs.select("sae_id", "latent")
        self._postings: dict[str, list[tuple[int, int]]] = {}
        lengths = []
        for i, text in enumerate(docs["text"].to_list()):
            counts = Counter(words(text))
            lengths.append(sum(counts.values()))
            for word, n in counts.items():
                self._postings.setdefault(word, []).append((i, n))
        self._lengths = np.asarray(lengths, dtype=np.float64)
        self._mean_length = float(self._lengths.mean()) if len(lengths) else 0.0

    def __len__(self) -> int:
        return self.keys.height

    def search(self, query: str, k: int) -> pl.DataFrame:
        """The `k` best-scoring features (sae_id, latent, score; best first, ties by key)."""
        terms = words(query) if isinstance(query, str) else []
        if not terms:
            raise InvalidInputError("the query must contain at least one letter or digit")
        scores = np.zeros(len(self), dtype=np.float64)
        n_docs = len(self)
        for term in set(terms):
            postings = self._postings.get(term)
            if not postings:
                continue
            idf = math.log(1 + (n_docs - len(postings) + 0.5) / (len(postings) + 0.5))
            rows = np.fromiter((p[0] for p in postings), dtype=np.int64, count=len(postings))
            tf = np.fromiter((p[1] for p in postings), dtype=np.float64, count=len(postings))
            norm = K1 * (1 - B + B * self._lengths[rows] / max(self._mean_length, 1e-9))
            scores[rows] += idf * tf * (K1 + 1) / (tf + norm)
        hits = np.flatnonzero(scores > 0)
        order = hits[np.lexsort((hits, -scores[hits]))][:k]
        return self.keys[order].with_columns(pl.Series("score", scores[order])).select(list(HIT_SCHEMA))
