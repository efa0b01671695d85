"""Figures of the depth analysis: ID and local ID against depth with their intervals, lens
agreement and KL against depth, the layer-by-layer CKA heat map, and a few tokens' states
in the top-2 principal components of each of several layers."""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.figure import Figure

from sae_atlas.geometry.canvas import new_figure


def depth_profile_figure(main: pl.DataFrame, title: str = "depth profile") -> Figure:
    """Per layer: TwoNN and MLE (bootstrap band) and the local-ID median (10-90% band);
    logit- and tuned-lens top-1 agreement with the final prediction; their KL to it."""
    fig, (a, b, c) = new_figure(13, 4, 3)
    x = main["layer"].to_numpy()
    a.plot(x, main["twonn"].to_numpy(), marker="o", label="TwoNN")
    if "twonn_low" in main.columns:  # runs stored before TwoNN had an interval have none
        a.fill_between(x, main["twonn_low"].to_numpy(), main["twonn_high"].to_numpy(), alpha=0.25, color="C0")
    a.plot(x, main["mle"].to_numpy(), marker="s", label="MLE")
    a.fill_between(x, main["mle_low"].to_numpy(), main["mle_high"].to_numpy(), alpha=0.25, color="C1")
    a.plot(x, main["lid_q50"].to_numpy(), marker="^", label="local ID (median)")
    a.fill_between(x, main["lid_q10"].to_numpy(), main["lid_q90"].to_numpy(), alpha=0.15, color="C2")
    a.set_xlabel("layer")
    a.set_ylabel("intrinsic dimension")
    a.legend(fontsize=7)
    for kind, colour in (("logit", "C0"), ("tuned", "C3")):
        b.plot(x, main[f"{kind}_top1"].to_numpy(), marker="o", color=colour, label=f"{kind} lens")
        c.semilogy(x, np.maximum(main[f"{kind}_kl"].to_numpy(), 1e-8), marker="o", color=colour, label=f"{kind} lens")
    b.axhline(0.5, color="grey", lw=0.8, ls=":")
    b.set_ylim(0, 1.02)
    b.set_xlabel("layer")
    b.set_ylabel("top-1 agreement with the final prediction")
    c.set_xlabel("layer")
    c.set_ylabel("KL(final || lens), nats")
    b.legend(fontsize=7)
    fig.suptitle(title)
    return fig


def cka_figure(layers: list[int], cka_LL: np.ndarray, title: str = "debiased linear CKA", *,
               layers_b: list[int] | None = None) -> Figure:
    """Heat map of CKA between every pair of layers (with `layers_b`: rows `layers` of one
    model, columns `layers_b` of another)."""
    fig, ax = new_figure(6, 5)
    im = ax.imshow(cka_LL, vmin=0, vmax=1, cmap="viridis", origin="lower", aspect="auto")
    columns = layers if layers_b is None else layers_b
    for axis, names in ((ax.set_yticks, layers), (ax.set_xticks, columns)):
        ticks = np.linspace(0, len(names) - 1, min(len(names), 10)).round().astype(int)
        axis(ticks, [names[t] for t in ticks])
    ax.set_xlabel("layer" if layers_b is None else "layer of B")
    ax.set_ylabel("layer" if layers_b is None else "layer of A")
    fig.colorbar(im, ax=ax, label="CKA")
    ax.set_title(title)
    return fig


def shift_figure(shift: pl.DataFrame, title: str = "B minus A") -> Figure:
    """Per layer: the MLE and mean local-ID shift from model A to B with bootstrap bands,
    layers with p < 0.05 ringed."""
    fig, ax = new_figure(6, 4)
    x = shift["layer"].to_numpy()
    for name, label, colour in (("mle", "MLE dimension", "C1"), ("lid", "mean local ID", "C2")):
        ax.plot(x, shift[f"{name}_shift"].to_numpy(), marker="o", color=colour, label=label)
        ax.fill_between(x, shift[f"{name}_shift_low"].to_numpy(), shift[f"{name}_shift_high"].to_numpy(),
                        alpha=0.2, color=colour)
        hit = shift[f"{name}_shift_p"].to_numpy() < 0.05
        ax.scatter(x[hit], shift[f"{name}_shift"].to_numpy()[hit], s=90, facecolors="none", edgecolors="k")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("layer")
    ax.set_ylabel("dimension shift (B - A)")
    ax.legend(fontsize=7)
    ax.set_title(title)
    return fig


def trajectory_figure(states_MLD: np.ndarray, layers: list[int], picked: np.ndarray, labels: list[str],
                      panels: int = 6, title: str = "token states in each layer's top-2 PCs") -> Figure:
    """For up to `panels` layers spread over the depth: the subsampled token cloud (grey) in
    that layer's top-2 principal components, with the `picked` tokens coloured alike in
    every panel so each one's path through the layers can be followed."""
    chosen = sorted(set(np.linspace(0, len(layers) - 1, min(panels, len(layers))).round().astype(int)))
    fig, axes = new_figure(2.6 * len(chosen), 2.8, len(chosen))
    for ax, i in zip(np.atleast_1d(axes), chosen, strict=True):
        X = states_MLD[:, i].astype(np.float64)
        Xc = X - X.mean(axis=0)
        _, _, Vt = np.linalg.svd(Xc, full_matrices=False)
        P = Xc @ Vt[:2].T
        ax.scatter(P[:, 0], P[:, 1], s=2, color="lightgrey")
        for j, (row, label) in enumerate(zip(picked, labels, strict=True)):
            ax.scatter(P[row, 0], P[row, 1], s=30, color=f"C{j % 10}", label=label if i == chosen[0] else None)
        ax.set_title(f"layer {layers[i]}", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    np.atleast_1d(axes)[0].legend(fontsize=6)
    fig.suptitle(title)
    return fig
