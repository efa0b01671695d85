"""Figure set-up shared by the analysis figures: a pyplot-free Agg `Figure` and an atomic PNG writer.

The Agg canvas is attached to each figure, so the process-wide matplotlib backend is left
alone (a notebook that imports the atlas keeps its inline figures)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sae_atlas.store.atomic import atomic_path, remove_temporaries


def new_figure(width: float, height: float, ncols: int = 1) -> tuple[Figure, Any]:
    """A constrained-layout `Figure` of `width` x `height` inches on an Agg canvas (no global
    pyplot state) and its `ncols` axes (one `Axes` when `ncols` is 1, else an array)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, ncols)


def save_png(fig: Figure, path: str | Path, dpi: int = 110) -> Path:
    """Write `fig` as a PNG atomically (first removing what a killed write of it left) and
    return the path."""
    remove_temporaries(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    return Path(path)
