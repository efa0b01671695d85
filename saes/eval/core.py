"""`core`: the held-out reconstruction, sparsity and downstream metrics in SAEBench's core layout.

The metrics are today's `eval.json` ones (`saes.eval.evaluate`: explained variance and FVU
over `sum_d Var(x_d)`, MSE, cosine, shrinkage, L0 / L1, dead and dense fractions, CE loss
recovered and KL score with the SAE spliced in; Karvonen et al. 2025, "SAEBench", core
eval, which comes from SAELens' `run_evals`). Running `core` also writes `eval.json` as
`sae-atlas eval` always did. Categories and names follow SAEBench's `CoreMetricCategories`;
`fvu` is added beside `explained_variance`, `frac_alive` is `1 - dead_fraction` and
`freq_over_10_percent` is the share of latents firing on more than 10% of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.eval.evaluate import (
    DEFAULT_CE_BLOCKS,
    DEFAULT_TOKENS,
    evaluate_atlas_sae,
    read_eval,
)
from sae_atlas.saes.eval.spec import EvalInputs, EvalOutcome, EvalSpec

CATEGORIES: dict[str, dict[str, str]] = {  # SAEBench category -> {SAEBench name: our metric}
    "model_behavior_preservation": {"kl_div_score": "kl_div_score", "kl_div_with_ablation": "kl_div_with_ablation",
                                    "kl_div_with_sae": "kl_div_with_sae"},
    "model_performance_preservation": {"ce_loss_score": "ce_loss_score",
                                       "ce_loss_with_ablation": "ce_loss_with_ablation",
                                       "ce_loss_with_sae": "ce_loss_with_sae",
                                       "ce_loss_without_sae": "ce_loss_without_sae"},
    "reconstruction_quality": {"explained_variance": "explained_variance", "fvu": "fvu", "mse": "mse",
                               "cossim": "cossim"},
    "shrinkage": {"l2_norm_in": "l2_norm_in", "l2_norm_out": "l2_norm_out", "l2_ratio": "l2_ratio",
                  "relative_reconstruction_bias": "relative_reconstruction_bias"},
    "sparsity": {"l0": "l0", "l1": "l1"},
    "token_stats": {"total_tokens_eval_reconstruction": "n_ce_positions",
                    "total_tokens_eval_sparsity_variance": "n_tokens"},
    "misc_metrics": {"freq_over_10_percent": "dense_fraction"},
}


@dataclass(frozen=True)
class CoreConfig:
    """Tokens for the activation metrics, held-out blocks the model runs on for CE / KL,
    whether the model runs at all, and where the tokens came from: "heldout" (the cache's
    held-out split) or "stream" (`eval --from-model`, corpus tokens through the model)."""

    n_tokens: int = DEFAULT_TOKENS
    ce_blocks: int = DEFAULT_CE_BLOCKS
    with_model: bool = True
    source: str = "heldout"


def core_outcome(record: dict[str, Any]) -> EvalOutcome:
    """An `eval.json` record in SAEBench's core layout (absent downstream metrics are None)."""
    metrics = record["metrics"]
    categories = {category: {name: metrics.get(ours) for name, ours in names.items()}
                  for category, names in CATEGORIES.items()}
    categories["misc_metrics"]["frac_alive"] = 1.0 - metrics["dead_fraction"]
    return EvalOutcome(categories, [], {"density_histogram": metrics["density_histogram"],
                                        "parameters": record["parameters"]})


def run_core(inputs: EvalInputs, config: CoreConfig) -> EvalOutcome:
    """Evaluate the SAE on its hook's held-out split (writing `eval.json`) and return the
    metrics in the core layout (a "stream" config is computed by `eval --from-model`)."""
    if config.source != "heldout":
        raise InvalidInputError(f"core over {config.source!r} tokens runs through `sae-atlas eval --from-model`")
    record = evaluate_atlas_sae(inputs.atlas, inputs.sae_id, n_tokens=config.n_tokens, ce_blocks=config.ce_blocks,
                                with_model=config.with_model,
                                model_handle=inputs.model() if config.with_model else None)
    return core_outcome(record)


CORE: EvalSpec[CoreConfig] = EvalSpec("core", "core", CoreConfig, run_core, check_sources=read_eval)
