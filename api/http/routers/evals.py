"""The HTTP layer of `evals`; its other layers: `sae_atlas.api.operations.evals` (parameter),
`sae_atlas.api.results.evals` (typed-result), `sae_atlas.api.services.evals` (service).

`/saes/{sae_id}/evals/{eval_name}`: one SAE's stored eval result, verified, in SAEBench's layout."""

from __future__ import annotations

from fastapi import APIRouter, Path
from fastapi.responses import Response

from sae_atlas.api.http.deps import AtlasDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.params import DATA_ERRORS, SaeId, error_responses
from sae_atlas.api.results.evals import EvalResult
from sae_atlas.saes.eval.spec import EvalName

router = APIRouter(tags=["evals"], responses=DATA_ERRORS)


@router.get("/saes/{sae_id}/evals/{eval_name}", summary="One eval result of one SAE (SAEBench layout)",
            response_model=EvalResult, responses=error_responses(400, 404))
def get_eval(atlas: AtlasDep, sae_id: str = SaeId,
             eval_name: EvalName = Path(description="the eval, as named in `sae-atlas eval --suite`")) -> Response:
    return json_body(atlas.eval_result(sae_id, eval_name))
