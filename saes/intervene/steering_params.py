"""The parameters of a steering-score table (a light module: the CLI's option defaults read
them without importing torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SteeringParams:
    """How output scores are measured (recorded in the table's sidecar)."""

    n_prompts: int = 16
    prompt_tokens: int = 12  # tokens per neutral prompt, BOS included
    seed: int = 0  # order of the built-in corpus the prompts are drawn from
    strength: float = 10.0  # alpha = strength * mean_active_act
    top_k: int = 10  # promoted and suppressed tokens kept per latent
    chunk: int = 32  # latents per batch and per resumable chunk
    lens_z: float = 0.0  # measure only live latents whose logit-lens peak has this z-score (0: every latent)
