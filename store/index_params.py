"""The FAISS index defaults a user can override (a light module: the CLI's options read them
without importing faiss)."""

APPROX_THRESHOLD = 200_000
"""Rows from which an index is approximate (IVF) instead of exact."""
