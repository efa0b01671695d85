"""The typed-result layer of `evals`; its other layers: `sae_atlas.api.http.routers.evals` (HTTP),
`sae_atlas.api.operations.evals` (parameter), `sae_atlas.api.services.evals` (service).

`EvalResult`: one stored eval result as sent over HTTP (`GET /saes/{sae_id}/evals/{eval}`),
SAEBench's `BaseEvalOutput` fields as `saes.eval.results` writes them."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from typing_extensions import TypedDict


class EvalResult(TypedDict):
    """One eval of one SAE in SAEBench's output layout (the SAEBench / SAELens provenance
    fields are null: neither ran)."""

    eval_type_id: Annotated[str, Field(description="SAEBench's eval type, e.g. absorption_first_letter")]
    eval_config: Annotated[dict[str, Any], Field(description="the settings the eval ran with")]
    eval_id: str
    datetime_epoch_millis: int
    eval_result_metrics: Annotated[dict[str, dict[str, Any]], Field(
        description="category -> metric -> value (the board's '<eval>/<metric>' columns)")]
    eval_result_details: Annotated[list[dict[str, Any]], Field(
        description="per-item rows, e.g. one per first letter (absorption) or per latent (autointerp)")]
    eval_result_unstructured: Annotated[Any, Field(description="free-form results, e.g. why nothing was scored")]
    sae_bench_commit_hash: str | None
    sae_lens_id: str | None
    sae_lens_release_id: str | None
    sae_lens_version: str | None
    sae_cfg_dict: Annotated[dict[str, Any], Field(description="the SAE's cfg.json")]
