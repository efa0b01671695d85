"""Figure set-up shared by the analysis figures: a pyplot-free Agg `Figure` (written as a PNG
by `store.atomic.save_png`).

The Agg canvas is attached to each figure, so the process-wide matplotlib backend is left
alone (a notebook that imports the atlas keeps its inline figures)."""

from __future__ import annotations

from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def new_figure(width: float, height: float, ncols: int = 1) -> tuple[Figure, Any]:
    """A constrained-layout `Figure` of `width` x `height` inches on an Agg canvas (no global
    pyplot state) and its `ncols` axes (one `Axes` when `ncols` is 1, else an array)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, ncols)

