"""Evaluate SAEs on held-out tokens (SAEBench-named metrics) and record `eval.json`.

The one evaluation entry point of the project (the CLI's `eval`, the demo and training's
held-out metrics all come through `saes.eval`).

`evaluate_sae` computes the reconstruction and sparsity metrics of
`saes.train.reconstruction` over held-out activations, BOS positions excluded, and, given
a model, the spliced-in CE / KL metrics of `saes.eval.downstream` on held-out token
blocks. `evaluate_atlas_sae` does this for one SAE of an atlas and writes
`saes/<sae_id>/eval.json` with the metrics, the parameters, the versions used and what the
results were derived from: the sha256 of the SAE weights and of the activation manifest
(`--from-model` evaluations record the corpus and model in their parameters instead).
`read_eval` refuses results derived from other weights or another activation cache.
A transcoder is evaluated on paired held-out rows (`saes.train.paired_rows.PairedReader`:
FVU etc. of its predicted output against the output hook) and, given a model, with its MLP
replaced by it (`saes.eval.transcoder.replacement_metrics`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from sae_atlas.errors import IntegrityError, InvalidInputError
from sae_atlas.saes.atlas_records import EVAL_FILE
from sae_atlas.saes.atlas_saes import hook_of, load_atlas_sae
from sae_atlas.saes.eval.downstream import downstream_metrics
from sae_atlas.saes.eval.names import DEFAULT_CE_BLOCKS, DEFAULT_TOKENS
from sae_atlas.saes.eval.transcoder import replacement_metrics
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.train.paired_rows import PairedReader
from sae_atlas.saes.train.reconstruction import reconstruction_metrics
from sae_atlas.store.activations import ActivationReader
from sae_atlas.store.atomic import atomic_write_json, read_json
from sae_atlas.store.integrity import (
    WEIGHTS_FILE,
    WEIGHTS_SHA256,
    cached_sha256,
    check_weights_record,
)
from sae_atlas.store.layout import AtlasLayout, created_with

ACTIVATIONS_SHA256 = "activations_sha256"  # the manifest of the activation cache an eval read
CE_BATCH_BLOCKS = 4


def _limited(batches: Iterable[torch.Tensor], n_tokens: int) -> Iterator[torch.Tensor]:
    left = n_tokens
    for batch in batches:
        yield batch[:left]
        left -= min(left, batch.shape[0])
        if left == 0:
            return


def _token_batches(reader: ActivationReader | PairedReader, n_blocks: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """`(token_ids, is_bos)` of the first `n_blocks` held-out blocks, a few blocks at a time."""
    left = n_blocks
    for blocks in reader.blocks(split="heldout"):
        for start in range(0, min(left, blocks.token_ids.shape[0]), CE_BATCH_BLOCKS):
            stop = min(start + CE_BATCH_BLOCKS, left)
            yield blocks.token_ids[start:stop], blocks.is_bos[start:stop]
        left -= min(left, blocks.token_ids.shape[0])
        if left == 0:
            return


def evaluate_sae(
    sae: SAE,
    reader_or_batches: ActivationReader | PairedReader | Iterable[torch.Tensor],
    *,
    model_handle: ModelHandle | None = None,
    hook: str | None = None,
    n_tokens: int = DEFAULT_TOKENS,
    ce_blocks: int = DEFAULT_CE_BLOCKS,
) -> dict[str, Any]:
    """Metrics of `sae` over held-out data: reconstruction and sparsity on up to `n_tokens`
    non-BOS tokens, and with `model_handle` (needs an `ActivationReader`, whose token ids the
    model runs on) CE / KL with the SAE spliced in at `hook` (default: the reader's hook)
    over `ce_blocks` held-out blocks. Batches passed directly must already exclude BOS
    (`reader.batches(..., exclude_bos=True)` does). The SAE is evaluated in eval mode."""
    if n_tokens <= 0 or ce_blocks <= 0:
        raise InvalidInputError(f"n_tokens and ce_blocks must be positive, got {n_tokens}, {ce_blocks}")
    reader = reader_or_batches if isinstance(reader_or_batches, ActivationReader | PairedReader) else None
    if reader is not None and reader.d != sae.cfg.d_in:
        raise InvalidInputError(
            f"SAE has d_in={sae.cfg.d_in} but hook {reader.hook!r} has d={reader.d}; "
            "evaluate it on the hook it was trained on"
        )
    if model_handle is not None and reader is None:
        raise InvalidInputError("CE / KL metrics need token ids: pass an ActivationReader, not batches")
    was_training = sae.training
    sae.eval()
    try:
        rows = ((r.acts for r in reader.rows("heldout", max_tokens=n_tokens)) if reader is not None
                else _limited(reader_or_batches, n_tokens))
        metrics = reconstruction_metrics(sae, rows)
        if model_handle is not None:
            target = model_handle.check_hook(hook or reader.hook)
            if model_handle.d_model != sae.cfg.d_in:
                raise InvalidInputError(
                    f"SAE has d_in={sae.cfg.d_in} but model {model_handle.name} has d_model={model_handle.d_model}"
                )
            blocks = _token_batches(reader, ce_blocks)
            if sae.is_transcoder:
                model_handle.check_hook(sae.cfg.hook_name_out)
                metrics.update(replacement_metrics([sae], model_handle.bridge, blocks))
            else:
                metrics.update(downstream_metrics(sae, model_handle.bridge, target, blocks))
    finally:
        sae.train(was_training)
    return metrics


def write_eval(sae_dir: str | Path, record: dict[str, Any]) -> Path:
    """Write `record` plus the sha256 of the folder's weights and the `created_with`
    versions to `<sae_dir>/eval.json` atomically."""
    path = Path(sae_dir) / EVAL_FILE
    weights = cached_sha256(Path(sae_dir) / WEIGHTS_FILE)
    atomic_write_json(path, {**record, WEIGHTS_SHA256: weights, "created_with": created_with()})
    return path


def eval_repair(root: str | Path, sae_id: str) -> str:
    """The command that re-computes an SAE's eval.json."""
    return f"re-run `sae-atlas eval {root} --sae {sae_id}`"


def read_eval(root: str | Path, sae_id: str) -> dict[str, Any]:
    """The SAE's eval.json, checked against what it was derived from: IntegrityError naming
    it when it records other weights than the SAE's current ones, or another activation
    manifest than the hook's current one (an eval whose cache was since removed stands).
    Results written before evaluations recorded their sources are read as before."""
    path = AtlasLayout(root).require_sae(sae_id) / EVAL_FILE
    repair = eval_repair(root, sae_id)
    record = read_json(path, repair)
    if not isinstance(record, dict):
        raise IntegrityError(path, "not a JSON object", repair)
    check_weights_record(root, sae_id, record, path, repair)
    recorded = record.get(ACTIVATIONS_SHA256)
    if recorded is not None:
        hook = record["parameters"]["hook"]
        manifest = AtlasLayout(root).activation_dir(hook) / "manifest.json"
        if manifest.exists() and cached_sha256(manifest) != recorded:
            raise IntegrityError(path, "stale: computed on another activation cache than the current "
                                 f"activations/{hook}/manifest.json", repair)
    return record


def evaluate_atlas_sae(
    atlas: str | Path,
    sae_id: str,
    *,
    n_tokens: int = DEFAULT_TOKENS,
    ce_blocks: int = DEFAULT_CE_BLOCKS,
    with_model: bool = True,
    model_handle: ModelHandle | None = None,
) -> dict[str, Any]:
    """Evaluate one SAE of an atlas on its hook's held-out split and write its `eval.json`
    (`{"metrics", "parameters", "seconds", "activations_sha256", "weights_sha256", "created_with"}`).

    The model (for CE / KL) is `model_handle` or the one recorded in atlas.json; with
    `with_model=False` only the activation metrics are computed. Returns the eval record.
    """
    layout = AtlasLayout(atlas)
    sae_dir = layout.require_sae(sae_id)
    sae = load_atlas_sae(atlas, sae_id)
    hook = hook_of(sae, sae_id)
    reader = PairedReader(atlas, hook, sae.cfg.hook_name_out) if sae.is_transcoder else ActivationReader(atlas, hook)
    if reader.d != sae.cfg.d_in:
        raise InvalidInputError(f"SAE {sae_id!r} has d_in={sae.cfg.d_in} but hook {hook!r} has d={reader.d}")
    activations = cached_sha256(reader.dir / "manifest.json")
    if with_model and model_handle is None:
        from sae_atlas.saes.models import load_model

        model_handle = load_model(layout.read_meta()["model"])
    started = time.perf_counter()
    metrics = evaluate_sae(sae, reader, model_handle=model_handle if with_model else None,
                           hook=hook, n_tokens=n_tokens, ce_blocks=ce_blocks)
    parameters = {
        "sae_id": sae_id,
        "hook": hook,
        **({"hook_out": sae.cfg.hook_name_out} if sae.is_transcoder else {}),
        "architecture": sae.cfg.architecture,
        "split": "heldout",
        "n_tokens_requested": n_tokens,
        "ce_blocks_requested": ce_blocks if with_model else 0,
        "exclude_bos": True,
        "model": getattr(model_handle, "name", None) if with_model else None,
    }
    record = {"metrics": metrics, "parameters": parameters, "seconds": round(time.perf_counter() - started, 3),
              ACTIVATIONS_SHA256: activations}
    write_eval(sae_dir, record)
    return record
