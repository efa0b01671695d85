"""Figures for circular features (matplotlib, Agg; no pyplot state).

Each function returns a `matplotlib.figure.Figure`, which a notebook displays inline, and
`geometry.canvas.save_png` writes one atomically. Figures: a discovered cluster's 2-D projection coloured by
token, the circle probe per layer (R^2 and the best layer's circle plane coloured by
concept value), and the intervention curve (answer change against target shift per method).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from sae_atlas.geometry.canvas import new_figure


def cluster_projection_figure(
    row: Mapping[str, Any], *, vocab: Sequence[str] | None = None, n_colored: int = 12
) -> Figure:
    """Scatter of a cluster's tokens on (PC1, PC2), the most frequent `n_colored` tokens in
    colour (labelled with `vocab` strings when given) and the rest grey. `row` is one row of
    the discovery table as a dict."""
    x, y = np.asarray(row["proj_x"]), np.asarray(row["proj_y"])
    tokens = np.asarray(row["proj_token_ids"])
    fig, ax = new_figure(5.5, 5)
    uniq, counts = np.unique(tokens, return_counts=True)
    top = uniq[np.argsort(-counts, kind="stable")[:n_colored]]
    rest = ~np.isin(tokens, top)
    ax.scatter(x[rest], y[rest], s=6, c="0.8", label="other")
    cmap = matplotlib.colormaps["tab20"]
    for i, t in enumerate(top):
        sel = tokens == t
        name = vocab[t] if vocab is not None and 0 <= t < len(vocab) else str(int(t))
        ax.scatter(x[sel], y[sel], s=8, color=cmap(i % 20), label=repr(name) if vocab else name)
    ax.set_xlabel("PC1")
    ax.set_ylabel("PC2")
    ax.set_title(f"cluster {row['cluster_id']} ({row['size']} features), score {row['score']:.3f}")
    ax.legend(fontsize=7, markerscale=2, loc="best")
    return fig


def circle_probe_figure(
    table: Any,
    probe: Any,
    acts_ND: np.ndarray,
    values_N: np.ndarray,
    value_names: Sequence[str],
    best_layer: int,
) -> Figure:
    """Left: R^2 (in-sample, leave-one-out, permuted-label null) per layer, filled markers
    where the unsupervised order is cyclic. Right: the best layer's activations in the circle plane coloured by
    concept value, with the per-value means labelled."""
    fig, (ax, ax2) = new_figure(11, 4.8, 2)
    layers = np.asarray(table["layer"])
    r2, loo = np.asarray(table["r2"]), np.asarray(table["r2_loo"])
    cyclic = np.asarray(table["cyclic_order"], dtype=bool)
    ax.plot(layers, r2, "-", color="C0", label="R$^2$")
    ax.plot(layers, loo, "--", color="C1", label="leave-one-out R$^2$")
    if "r2_null" in table.columns:
        ax.plot(layers, np.asarray(table["r2_null"]), ":", color="0.5", label="permuted-label null")
    ax.scatter(layers[cyclic], loo[cyclic], color="C1", zorder=3, label="cyclic order")
    ax.scatter(layers[~cyclic], loo[~cyclic], facecolors="none", edgecolors="C1", zorder=3)
    ax.set_xlabel("layer")
    ax.set_ylabel("R$^2$")
    ax.set_ylim(min(0.0, float(np.nanmin(loo))), 1.05)
    ax.set_title("circle probe per layer")
    ax.legend(fontsize=8)
    coords = (np.asarray(acts_ND) - probe.mean_D) @ probe.plane_D2
    cmap = matplotlib.colormaps["twilight"]
    p = len(value_names)
    ax2.scatter(coords[:, 0], coords[:, 1], c=[cmap(v / p) for v in values_N], s=14)
    for v, name in enumerate(value_names):
        sel = values_N == v
        if sel.any():
            m = coords[sel].mean(0)
            ax2.annotate(name, m, fontsize=8, ha="center", weight="bold")
    ax2.set_aspect("equal", adjustable="datalim")
    ax2.set_title(f"layer {best_layer}: circle plane (R$^2$ {probe.r2:.2f})")
    return fig


def intervention_figure(table: Any, *, layer: int, metric: str = "delta_logit_diff") -> Figure:
    """Mean `metric` (default: change in logit(new) - logit(old) versus clean) against the
    target shift, one line per method; `table` has columns method, shift, metric."""
    fig, ax = new_figure(6, 4.2)
    methods = list(dict.fromkeys(table["method"]))
    shifts, vals, meth = np.asarray(table["shift"]), np.asarray(table[metric]), np.asarray(table["method"])
    for i, m in enumerate(methods):
        sel = meth == m
        order = np.argsort(shifts[sel])
        ax.plot(shifts[sel][order], vals[sel][order], "o-", color=f"C{i}", label=m)
    ax.axhline(0.0, color="0.6", lw=0.8)
    ax.set_xlabel("target shift (steps)")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title(f"intervention at layer {layer}")
    ax.legend(fontsize=8)
    return fig


def circle_transfer_figure(outputs: Mapping[str, np.ndarray], values_N: np.ndarray, value_names: Sequence[str],
                           rows: Mapping[str, Mapping[str, Any]], title: str = "") -> Figure:
    """One panel per circle probe output (`<side>_<space>` -> `[N, 2]`, e.g. A's and B's
    refitted probes and A's probe read on B): each prompt's output coloured by concept value,
    the per-value means labelled, the unit circle for reference; `rows` gives each panel's
    R^2 and p-value."""
    keys = list(outputs)
    fig, axes = new_figure(4.2 * len(keys), 4.4, len(keys))
    axes = np.atleast_1d(axes)
    cmap = matplotlib.colormaps["hsv"]
    t = np.linspace(0, 2 * np.pi, 200)
    for ax, key in zip(axes, keys, strict=True):
        out = np.asarray(outputs[key])
        ax.plot(np.cos(t), np.sin(t), color="0.85", lw=1)
        for v, name in enumerate(value_names):
            sel = values_N == v
            if not sel.any():
                continue
            color = cmap(v / len(value_names))
            ax.scatter(out[sel, 0], out[sel, 1], s=10, color=color, alpha=0.6)
            m = out[sel].mean(0)
            ax.annotate(str(name), m, fontsize=8, ha="center", color="k")
        r = rows.get(key, {})
        ax.set_title(f"{key.replace('_', ' ')}: R^2 {r.get('r2', float('nan')):.2f}, p {r.get('p_value') or float('nan'):.3f}",
                     fontsize=9)
        ax.set_aspect("equal")
    if title:
        fig.suptitle(title)
    return fig
