"""Linear CKA between layers (Kornblith et al. 2019, "Similarity of Neural Network
Representations Revisited") with the debiased HSIC estimator (Song et al. 2012), computed
from streamed feature-space statistics so the token-by-token Gram matrices never exist.

With `K = X X^T`, `L = Y Y^T` of `n` paired rows and `K~`, `L~` their diagonals zeroed,

    HSIC(X, Y) = [tr(K~ L~) + (1'K~1)(1'L~1) / ((n-1)(n-2)) - 2/(n-2) 1'K~L~1] / (n(n-3))

and `CKA = HSIC(X, Y) / sqrt(HSIC(X, X) HSIC(Y, Y))`. Every term is a function of sums over
rows: `C = X^T Y`, `s_x = sum x`, `a_xy = sum |y|^2 x`, `a_yx = sum |x|^2 y`, `sum |x|^2`,
`sum |x|^2 |y|^2`:

    tr(K~ L~) = ||C||_F^2 - sum |x|^2 |y|^2
    1'K~1     = |s_x|^2 - sum |x|^2
    1'K~L~1   = s_x' C s_y - s_x . a_xy - s_y . a_yx + sum |x|^2 |y|^2

so `CKAAccumulator` keeps `d_i x d_j` moments per layer pair (memory independent of the
token count), merges ranks exactly by adding them, and equals `debiased_cka` on the pooled
rows up to rounding. The estimator is invariant to translating either side, so no
centring pass is needed; sums are kept in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sae_atlas.errors import InvalidInputError


def _hsic(n: float, cross_sq: float, sum_x: np.ndarray, sum_y: np.ndarray, C: np.ndarray, a_xy: np.ndarray,
          a_yx: np.ndarray, sq_x: float, sq_y: float, sq_xy: float) -> float:
    trace = cross_sq - sq_xy
    ones_k, ones_l = float(sum_x @ sum_x) - sq_x, float(sum_y @ sum_y) - sq_y
    ones_kl = float(sum_x @ C @ sum_y) - float(sum_x @ a_xy) - float(sum_y @ a_yx) + sq_xy
    return (trace + ones_k * ones_l / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * ones_kl) / (n * (n - 3))


def _ratio(xy: float, xx: float, yy: float) -> float:
    denom = np.sqrt(max(xx, 0.0) * max(yy, 0.0))
    return float(xy / denom) if denom > 0 else float("nan")


def debiased_cka(X_ND: np.ndarray, Y_NE: np.ndarray) -> float:
    """Debiased linear CKA of two paired row sets from their `n x n` Gram matrices (the
    in-memory reference for `CKAAccumulator`; NaN when a side is constant)."""
    X, Y = np.asarray(X_ND, dtype=np.float64), np.asarray(Y_NE, dtype=np.float64)
    if X.ndim != 2 or Y.ndim != 2 or len(X) != len(Y):
        raise InvalidInputError(f"CKA needs two [n, d] arrays with paired rows, got shapes {X.shape} and {Y.shape}")
    if len(X) < 4:
        raise InvalidInputError(f"debiased CKA needs at least 4 paired rows, got {len(X)}")
    n = len(X)

    def hsic(K: np.ndarray, L: np.ndarray) -> float:
        K, L = K - np.diag(np.diag(K)), L - np.diag(np.diag(L))
        one_K, one_L = K.sum(axis=0), L.sum(axis=0)
        return float(((K * L).sum() + one_K.sum() * one_L.sum() / ((n - 1) * (n - 2))
                      - 2.0 / (n - 2) * (one_K @ one_L)) / (n * (n - 3)))

    K, L = X @ X.T, Y @ Y.T
    return _ratio(hsic(K, L), hsic(K, K), hsic(L, L))


@dataclass
class CKAAccumulator:
    """Streamed debiased linear CKA between every pair of a fixed set of layers.

    `update({layer: rows [n, d_layer]})` adds a batch (the same tokens at every layer);
    `merge(other)` adds another accumulator's sums (ranks that split the tokens); `result()`
    gives the `[L, L]` CKA matrix in `layers` order. With `split`, the layers are two sets,
    `layers[:split]` and `layers[split:]` (say, two models' layers on paired tokens), and only
    the pairs across the sets are kept (memory `d_a x d_b` per pair, none within a set);
    `result()` is NaN within a set, off the diagonal."""

    layers: list[Any] = field(default_factory=list)
    split: int | None = None
    n: int = 0
    _sum: list[np.ndarray] = field(default_factory=list, repr=False)  # per layer: sum x
    _sq: list[np.ndarray] = field(default_factory=list, repr=False)  # per layer: sum |x|^2 (0-d)
    _cross: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, repr=False)  # i <= j: X_i^T X_j
    _a: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, repr=False)  # (i, j): sum |x_j|^2 x_i
    _sqxy: dict[tuple[int, int], float] = field(default_factory=dict, repr=False)  # i <= j: sum |x_i|^2 |x_j|^2

    def _kept(self, i: int, j: int) -> bool:
        """Whether the sums of layer pair `(i, j)` are kept (every pair, or with `split` a
        layer with itself and the pairs across the two sets)."""
        return self.split is None or i == j or (i < self.split) != (j < self.split)

    def _start(self, dims: Sequence[int]) -> None:
        L = len(dims)
        if self.split is not None and not 0 < self.split < L:
            raise InvalidInputError(f"CKA split {self.split} must leave layers on both sides of {L} layers")
        self._sum = [np.zeros(d) for d in dims]
        self._sq = [np.zeros(()) for _ in dims]
        for i in range(L):
            for j in range(L):
                if not self._kept(i, j):
                    continue
                self._a[i, j] = np.zeros(dims[i])
                if j >= i:
                    self._cross[i, j] = np.zeros((dims[i], dims[j]))
                    self._sqxy[i, j] = 0.0

    def update(self, batch_by_layer: Mapping[Any, Any]) -> None:
        """Add one batch: `{layer: rows [n, d]}` (numpy or torch), the same `n` tokens at
        every layer; the first batch fixes the layers and their widths."""
        if not batch_by_layer:
            raise InvalidInputError("a CKA batch needs at least one layer")
        if not self.layers:
            self.layers = list(batch_by_layer)
        elif list(batch_by_layer) != self.layers:
            raise InvalidInputError(f"CKA batch layers {list(batch_by_layer)} differ from the first batch's {self.layers}")
        rows = [_as_float64(batch_by_layer[layer], layer) for layer in self.layers]
        n = len(rows[0])
        if any(len(r) != n for r in rows):
            raise InvalidInputError(f"CKA batch layers hold different token counts: {[len(r) for r in rows]}")
        if not self._sum:
            self._start([r.shape[1] for r in rows])
        if any(r.shape[1] != s.shape[0] for r, s in zip(rows, self._sum, strict=True)):
            raise InvalidInputError(f"CKA batch widths {[r.shape[1] for r in rows]} differ from the first batch's "
                                    f"{[s.shape[0] for s in self._sum]}")
        norms = [np.einsum("nd,nd->n", r, r) for r in rows]
        for i, r in enumerate(rows):
            self._sum[i] += r.sum(axis=0)
            self._sq[i] += norms[i].sum()
            for j in range(len(rows)):
                if not self._kept(i, j):
                    continue
                self._a[i, j] += norms[j] @ r
                if j >= i:
                    self._cross[i, j] += r.T @ rows[j]
                    self._sqxy[i, j] += float(norms[i] @ norms[j])
        self.n += n

    def merge(self, other: CKAAccumulator) -> None:
        """Add `other`'s sums (exact: the result equals one accumulator over both token sets)."""
        if not other.n:
            return
        if not self.n:
            self.layers, self.split = list(other.layers), other.split
            self._start([s.shape[0] for s in other._sum])
        if other.layers != self.layers or other.split != self.split or [s.shape for s in other._sum] != [s.shape for s in self._sum]:
            raise InvalidInputError(f"cannot merge CKA sums over layers {other.layers} into {self.layers}")
        for i in range(len(self._sum)):
            self._sum[i] += other._sum[i]
            self._sq[i] += other._sq[i]
        for key in self._cross:
            self._cross[key] += other._cross[key]
            self._sqxy[key] += other._sqxy[key]
        for key in self._a:
            self._a[key] += other._a[key]
        self.n += other.n

    def map_sums(self, fn: Callable[[np.ndarray], np.ndarray]) -> None:
        """Replace every sum (the token count included, as a 0-d array) by `fn(sum)`, in a
        fixed order: how ranks add their sums with a collective."""
        self._sum = [fn(a) for a in self._sum]
        self._sq = [fn(a) for a in self._sq]
        for key in sorted(self._cross):
            self._cross[key] = fn(self._cross[key])
            self._sqxy[key] = float(fn(np.array(self._sqxy[key])))
        for key in sorted(self._a):
            self._a[key] = fn(self._a[key])
        self.n = int(fn(np.array(float(self.n))))

    def _pair_hsic(self, i: int, j: int) -> float:
        lo, hi = min(i, j), max(i, j)
        C = self._cross[lo, hi] if i <= j else self._cross[lo, hi].T
        return _hsic(float(self.n), float((self._cross[lo, hi] ** 2).sum()), self._sum[i], self._sum[j], C,
                     self._a[i, j], self._a[j, i], float(self._sq[i]), float(self._sq[j]), self._sqxy[lo, hi])

    def result(self) -> np.ndarray:
        """Debiased linear CKA `[L, L]` between every pair of kept layers (NaN for a constant
        layer, and with `split` within a set); `result()[:split, split:]` is the cross block."""
        if self.n < 4:
            raise InvalidInputError(f"debiased CKA needs at least 4 tokens, got {self.n}")
        L = len(self.layers)
        self_hsic = [self._pair_hsic(i, i) for i in range(L)]
        out = np.eye(L)
        for i in range(L):
            for j in range(i + 1, L):
                out[i, j] = out[j, i] = (_ratio(self._pair_hsic(i, j), self_hsic[i], self_hsic[j])
                                         if self._kept(i, j) else float("nan"))
        return out


def _as_float64(rows: Any, layer: Any) -> np.ndarray:
    if hasattr(rows, "detach"):  # a torch tensor
        rows = rows.detach().to("cpu").double().numpy()
    arr = np.asarray(rows, dtype=np.float64)
    if arr.ndim != 2:
        raise InvalidInputError(f"CKA rows of layer {layer!r} must be [n, d], got shape {arr.shape}")
    return arr
