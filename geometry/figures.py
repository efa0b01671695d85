"""Figures for the hierarchy, probe, crystal, lobe, galaxy and map analyses (matplotlib
Agg, no pyplot state). Each returns a `Figure`; `geometry.canvas.save_png`
writes one atomically."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from matplotlib.figure import Figure

from sae_atlas.geometry.canvas import new_figure

if TYPE_CHECKING:  # annotations only: the analyses' modules load sklearn
    from sae_atlas.geometry.crystals import CrystalResult
    from sae_atlas.geometry.galaxy import PowerLaw
    from sae_atlas.geometry.lobes import ClusterComparison


def hierarchy_figure(edges: pl.DataFrame, title: str = "hierarchy") -> Figure:
    """Strip plot of every cosine column of an edge table (0 = orthogonal), with controls."""
    cols = [c for c in edges.columns if c.startswith("cos_") and edges[c].drop_nulls().len()]
    fig, ax = new_figure(1.4 * len(cols) + 2, 4)
    rng = np.random.default_rng(0)
    for i, col in enumerate(cols):
        vals = edges[col].drop_nulls().to_numpy()
        ax.scatter(i + rng.uniform(-0.15, 0.15, len(vals)), vals, s=12, alpha=0.7)
        ax.hlines(np.mean(np.abs(vals)), i - 0.3, i + 0.3, color="k", lw=1)
    ax.axhline(0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(cols)), [c.removeprefix("cos_") for c in cols], rotation=30, ha="right")
    ax.set_ylabel("cosine (bar: mean |cos|)")
    ax.set_title(title)
    return fig


def probe_figure(table: pl.DataFrame, title: str = "probes") -> Figure:
    """Held-out score per layer (probe_layers table) or per k and basis (compare_sparse_probes)."""
    fig, ax = new_figure(6, 4)
    if "basis" in table.columns:
        for basis in table["basis"].unique(maintain_order=True):
            t = table.filter(pl.col("basis") == basis)
            ax.plot(t["k"], t["test_accuracy"], marker="o", label=basis)
        ax.plot(t["k"], t["baseline"], ls="--", color="grey", label="majority")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k (units)")
        ax.set_ylabel("held-out accuracy")
    else:
        x = np.arange(table.height)
        ax.plot(x, table["test_score"], marker="o", label="held-out")
        ax.plot(x, table["baseline"], ls="--", color="grey", label="baseline")
        ax.set_xticks(x, table["layer"].to_list(), rotation=45, ha="right")
        ax.set_ylabel("held-out score")
    ax.legend()
    ax.set_title(title)
    return fig


def crystals_figure(result: CrystalResult, title: str = "crystals") -> Figure:
    """Held-out silhouette against the random-label null, and held-out pairs in LDA space."""
    fig, (a, b) = new_figure(10, 4, 2)
    a.hist(result.null_values, bins=15, color="grey", alpha=0.7, label="random labels")
    a.axvline(result.heldout_silhouette, color="C3", label="LDA held-out")
    a.axvline(result.pca_silhouette, color="C0", ls="--", label="PCA held-out")
    a.set_xlabel("silhouette")
    a.legend()
    coords = result.test_coords
    y = coords[:, 1] if coords.shape[1] > 1 else np.zeros(len(coords))
    for lab in np.unique(result.test_labels):
        m = result.test_labels == lab
        b.scatter(coords[m, 0], y[m], s=14, label=str(lab))
    b.set_title("held-out pairs, LDA 1-2")
    b.legend(fontsize=7)
    fig.suptitle(title)
    return fig


def lobes_figure(comparisons: dict[str, ClusterComparison], title: str = "lobes vs geometry") -> Figure:
    """AMI of each comparison beside its permutation null (mean +- 2 sd)."""
    fig, ax = new_figure(1.2 * len(comparisons) + 3, 4)
    names = list(comparisons)
    x = np.arange(len(names))
    ax.bar(x, [comparisons[n].ami for n in names], color="C2", label="AMI")
    ax.errorbar(x, [comparisons[n].null_mean for n in names], yerr=[2 * comparisons[n].null_std for n in names],
                fmt="o", color="k", label="permuted (mean +- 2 sd)")
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("adjusted mutual information")
    ax.legend()
    ax.set_title(title)
    return fig


def galaxy_figure(spectra: dict[str, np.ndarray], fits: dict[str, PowerLaw], title: str = "galaxy") -> Figure:
    """Log-log eigenvalue spectra per layer with the fitted power law over its rank range."""
    fig, (a, b) = new_figure(10, 4, 2)
    for i, (name, ev) in enumerate(spectra.items()):
        ev = ev[ev > 0]
        r = np.arange(1, len(ev) + 1)
        a.loglog(r, ev, color=f"C{i % 10}", lw=1, label=name)
        f = fits[name]
        rr = np.arange(f.lo, f.hi + 1)
        a.loglog(rr, np.exp(f.intercept) * rr ** f.slope, color=f"C{i % 10}", ls="--", lw=1)
    a.set_xlabel("rank")
    a.set_ylabel("eigenvalue")
    a.legend(fontsize=7)
    names = list(fits)
    b.plot(range(len(names)), [fits[n].alpha for n in names], marker="o")
    b.set_xticks(range(len(names)), names, rotation=45, ha="right")
    b.set_ylabel("power-law alpha (ranks 10-150)")
    fig.suptitle(title)
    return fig


def map_figure(frame: pl.DataFrame, label: str | None = None, title: str = "feature map") -> Figure:
    """Scatter of a feature map, coloured by a label column (grey = -1) or by kNN overlap."""
    fig, ax = new_figure(6, 6)
    x, y = frame["x"].to_numpy(), frame["y"].to_numpy()
    if label is None:
        sc = ax.scatter(x, y, c=frame["knn_overlap"].to_numpy(), s=3, cmap="viridis", vmin=0, vmax=1)
        fig.colorbar(sc, ax=ax, label="kNN overlap")
    else:
        lab = frame[label].to_numpy()
        ax.scatter(x[lab < 0], y[lab < 0], s=2, color="lightgrey")
        ax.scatter(x[lab >= 0], y[lab >= 0], c=lab[lab >= 0] % 20, s=4, cmap="tab20")
    ax.set_title(f"{title} (mean kNN overlap {frame['knn_overlap'].mean():.2f})")
    ax.set_xticks([])
    ax.set_yticks([])
    return fig

