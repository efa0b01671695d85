"""The names of the suite's evals and the core eval's default sizes (a light module: the CLI's
options read them without importing torch)."""

from __future__ import annotations

from typing import Literal, get_args

EvalName = Literal["core", "sparse_probing", "meta", "mdl", "ground_truth", "absorption", "autointerp", "scr",
                   "tpp"]
EVAL_NAMES: tuple[EvalName, ...] = get_args(EvalName)
NegativesSource = Literal["random", "similar"]
"""Where autointerp's negative examples come from: random latents' or similar latents'."""
BackendName = Literal["lexical", "openai", "hf"]
"""The autointerp judges: a lexical proxy, an OpenAI-compatible server, a local HF model."""

DEFAULT_TOKENS = 65536
DEFAULT_CE_BLOCKS = 8
