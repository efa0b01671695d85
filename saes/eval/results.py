"""Eval results on disk: `saes/<sae_id>/evals/<eval>.json` in SAEBench's output layout.

The result file holds exactly SAEBench's `BaseEvalOutput` fields (`eval_type_id`,
`eval_config`, `eval_id`, `datetime_epoch_millis`, `eval_result_metrics`,
`eval_result_details`, `eval_result_unstructured`, `sae_bench_commit_hash`, `sae_lens_id`,
`sae_lens_release_id`, `sae_lens_version`, `sae_cfg_dict`; the SAEBench / SAELens
provenance fields are null: neither ran). Beside it, written last, the sidecar
`<eval>.sha256.json` records the result's sha256, the sha256 of the weights it was
computed from (`store.integrity.WEIGHTS_SHA256`), the seconds it took and the versions.
`read_result` verifies both, so a truncated, edited or stale result is refused by name;
`finished_result` is the resume test of the suite.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from sae_atlas.errors import IntegrityError
from sae_atlas.saes.eval.spec import EVAL_NAMES, EvalName, EvalOutcome, EvalSpec
from sae_atlas.store.atomic import atomic_write_json, read_json, remove_temporaries
from sae_atlas.store.integrity import (
    CHECKSUM_SECTION,
    WEIGHTS_SHA256,
    cached_sha256,
    check_weights_record,
    sae_cfg,
    weights_record,
)
from sae_atlas.store.layout import AtlasLayout, created_with

EVALS_DIR = "evals"
SAEBENCH_KEYS = ("eval_type_id", "eval_config", "eval_id", "datetime_epoch_millis", "eval_result_metrics",
                 "eval_result_details", "eval_result_unstructured", "sae_bench_commit_hash", "sae_lens_id",
                 "sae_lens_release_id", "sae_lens_version", "sae_cfg_dict")
RESULT_SHA256 = "sha256"


def result_paths(root: str | Path, sae_id: str, name: EvalName) -> tuple[Path, Path]:
    """`(result json, sidecar json)` of one eval of an SAE (NotFoundError for an unknown id)."""
    folder = AtlasLayout(root).require_sae(sae_id) / EVALS_DIR
    return folder / f"{name}.json", folder / f"{name}.sha256.json"


def result_repair(root: str | Path, sae_id: str, name: EvalName) -> str:
    """The command that recomputes one eval result."""
    return f"re-run `sae-atlas eval {root} --sae {sae_id} --suite {name}`"


def saebench_output(spec: EvalSpec[Any], config: Any, outcome: EvalOutcome, sae_cfg_dict: dict[str, Any]) -> dict[str, Any]:
    """The SAEBench `BaseEvalOutput` dict of one eval run."""
    return {
        "eval_type_id": spec.eval_type_id,
        "eval_config": spec.config_dict(config),
        "eval_id": str(uuid.uuid4()),
        "datetime_epoch_millis": int(time.time() * 1000),
        "eval_result_metrics": outcome.metrics,
        "eval_result_details": outcome.details,
        "eval_result_unstructured": outcome.unstructured,
        "sae_bench_commit_hash": None,
        "sae_lens_id": None,
        "sae_lens_release_id": None,
        "sae_lens_version": None,
        "sae_cfg_dict": sae_cfg_dict,
    }


def write_result(root: str | Path, sae_id: str, spec: EvalSpec[Any], config: Any, outcome: EvalOutcome,
                 seconds: float) -> dict[str, Any]:
    """Write one eval's result and then its sidecar, atomically; returns the result dict.
    The weights' sha256 is read (and verified) before the result is written."""
    weights = weights_record(root, sae_id)
    cfg = {key: value for key, value in sae_cfg(root, sae_id).items() if key != CHECKSUM_SECTION}
    output = saebench_output(spec, config, outcome, cfg)
    path, sidecar = result_paths(root, sae_id, spec.name)
    for written in (path, sidecar):
        remove_temporaries(written)  # what a write killed before its rename left
    atomic_write_json(path, output)
    atomic_write_json(sidecar, {"eval": spec.name, RESULT_SHA256: cached_sha256(path), **weights,
                                "seconds": round(seconds, 3), "created_with": created_with()})
    return output


def read_result(root: str | Path, sae_id: str, name: EvalName) -> dict[str, Any]:
    """One eval's result after checking it against its sidecar (IntegrityError naming the
    file and the repair when either is missing, corrupt, or derived from other weights; a
    result left without its sidecar is named as the orphan it is)."""
    path, sidecar = result_paths(root, sae_id, name)
    repair = result_repair(root, sae_id, name)
    if not sidecar.exists() and path.exists():
        raise IntegrityError(path, f"has no sidecar {sidecar.name} beside it (deleted, or a write interrupted "
                             "between the two files), so it cannot be verified", repair)
    meta = read_json(sidecar, repair)
    if not isinstance(meta, dict):
        raise IntegrityError(sidecar, "not a JSON object", repair)
    if not path.is_file():
        raise IntegrityError(path, "file is missing", repair)
    if cached_sha256(path) != meta.get(RESULT_SHA256):
        raise IntegrityError(path, f"sha256 does not match {sidecar.name} (corrupt, truncated or "
                             "interrupted while written)", repair)
    if meta.get(WEIGHTS_SHA256) is None:
        raise IntegrityError(sidecar, f"records no {WEIGHTS_SHA256}", repair)
    check_weights_record(root, sae_id, meta, path, repair)
    output = read_json(path, repair)
    if not isinstance(output, dict) or any(key not in output for key in SAEBENCH_KEYS):
        raise IntegrityError(path, "not an eval result in SAEBench's layout", repair)
    return output


def finished_result(root: str | Path, sae_id: str, spec: EvalSpec[Any], config: Any) -> dict[str, Any] | None:
    """The stored result of `spec` when it verifies and was computed with `config`; None
    when there is none, it is damaged or stale, or it used another config (to be re-run)."""
    path, sidecar = result_paths(root, sae_id, spec.name)
    if not sidecar.exists():
        return None
    try:
        output = read_result(root, sae_id, spec.name)
        if spec.check_sources is not None:
            spec.check_sources(Path(root), sae_id)
    except IntegrityError:
        return None
    return output if output["eval_config"] == spec.config_dict(config) else None


def stored_evals(root: str | Path, sae_id: str) -> list[EvalName]:
    """The evals with a result or a sidecar in the SAE's evals folder (verified by
    `read_result`, so a result without its sidecar reads as damaged, not as never run)."""
    return [name for name in EVAL_NAMES if any(p.exists() for p in result_paths(root, sae_id, name))]
