"""Geometry across depth: per-layer statistics of the residual stream streamed from one
forward over every layer (lenses here; the estimators live in `geometry/`)."""
