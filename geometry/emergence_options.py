"""The emergence table's metrics and default concepts (a light module: the CLI's options read
them without importing the analysis)."""

from __future__ import annotations

from typing import Literal, get_args

Metric = Literal["auroc", "k1_accuracy", "probe_accuracy", "value_selectivity"]
METRICS: tuple[str, ...] = get_args(Metric)
DEFAULT_CONCEPTS = ("weekdays", "months", "numbers", "colours")
