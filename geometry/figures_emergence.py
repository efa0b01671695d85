"""The emergence heat map (matplotlib Agg, no pyplot state): a concept x member grid of one
score, the cells at or above the threshold framed. `geometry.canvas.save_png` writes it.
Its own module: `geometry.figures` imports scikit-learn, which the `Atlas` facade must not load."""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from sae_atlas.geometry.canvas import new_figure


def emergence_figure(scored: pl.DataFrame, members: list[str], metric: str, threshold: float,
                     title: str = "emergence") -> Figure:
    """Heat map of `metric` per concept (rows) and member (columns, in series order) from the
    scored emergence table; cells at or above `threshold` are marked with a frame."""
    concepts = scored["concept"].unique(maintain_order=True).to_list()
    M = np.full((len(concepts), len(members)), np.nan)
    for r in scored.iter_rows(named=True):
        M[concepts.index(r["concept"]), members.index(r["member"])] = r[metric]
    fig, ax = new_figure(1.4 * len(members) + 3, 0.6 * len(concepts) + 2)
    im = ax.imshow(M, vmin=min(0.5, np.nanmin(M)), vmax=1.0, cmap="viridis", aspect="auto")
    for i, j in np.ndindex(M.shape):
        ax.text(j, i, f"{M[i, j]:.2f}", ha="center", va="center", color="w" if M[i, j] < 0.8 else "k", fontsize=8)
        if M[i, j] >= threshold:
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="C3", lw=2))
    ax.set_xticks(range(len(members)), members, rotation=30, ha="right")
    ax.set_yticks(range(len(concepts)), concepts)
    fig.colorbar(im, ax=ax, label=metric)
    ax.set_title(f"{title} (frame: {metric} >= {threshold:g})")
    return fig
