"""One stored eval result of one SAE, verified (`saes.eval.results.read_result`)."""

from __future__ import annotations

from typing import Any, cast

from sae_atlas.api.context import AtlasContext
from sae_atlas.saes.eval.results import read_result, result_repair, stored_evals
from sae_atlas.saes.eval.spec import EVAL_NAMES, EvalName
from sae_atlas.store.errors import InvalidInputError, NotFoundError


def eval_result(ctx: AtlasContext, sae_id: str, name: str) -> dict[str, Any]:
    """The SAEBench-layout result of eval `name` on SAE `sae_id`: InvalidInputError for an
    unknown eval (listing the valid ones), NotFoundError for an unknown SAE or one without
    that result (naming the command that computes it), IntegrityError for a damaged one (a
    result without its sidecar included)."""
    if name not in EVAL_NAMES:
        raise InvalidInputError(f"unknown eval {name!r}; valid: {', '.join(EVAL_NAMES)}")
    eval_name = cast(EvalName, name)
    ctx.layout.require_sae(sae_id)
    if eval_name not in stored_evals(ctx.root, sae_id):
        raise NotFoundError(f"SAE {sae_id!r} has no {name} result; {result_repair(ctx.root, sae_id, eval_name)}")
    return read_result(ctx.root, sae_id, eval_name)
