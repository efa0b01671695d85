"""The import layer of `clt`; its other layers: `sae_atlas.saes.transcoders.clt` (engine).

Import a circuit-tracer cross-layer transcoder into an atlas (`clts/<clt_id>/`).

The CLT is read (`saes.transcoders.circuit_tracer_clt`), checked against the atlas's model (as
many layers as the model, its width, hooks the model has), then judged like an imported
SAE by the misload guard's rules on tokens streamed through the model over the atlas's
corpus: refused when it predicts the MLP outputs worse than their mean (FVU > 1), when no
feature fires, or when a CLT with JumpReLU thresholds fires on over a quarter of its width
per layer (thresholds lost or misread; a ReLU CLT, all thresholds 0, is dense by design). `force` keeps a refused CLT marked suspect. An accepted one is saved with
`source.json` (provenance) and `eval.json` (metrics) and registered under atlas.json's `clts`;
importing the same source again after a kill between the two registers the saved CLT.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.corpus import CorpusSpec, iter_blocks
from sae_atlas.saes.eval.transcoder import replacement_metrics
from sae_atlas.saes.importing.guard import DENSE_SHARE, MAX_FVU, Problem
from sae_atlas.saes.importing.origins import resolve_source
from sae_atlas.saes.importing.pipeline import MisloadError
from sae_atlas.saes.models import ModelHandle, load_model
from sae_atlas.saes.transcoders.circuit_tracer_clt import (
    is_circuit_tracer_clt,
    load_circuit_tracer_clt,
)
from sae_atlas.saes.transcoders.clt import CrossLayerTranscoder
from sae_atlas.saes.transcoders.clt_data import clt_metrics, streamed_rows
from sae_atlas.saes.transcoders.clt_store import clt_record, load_clt_folder, register_clt, save_clt
from sae_atlas.store.atomic import atomic_write_json, read_json, sha256_file
from sae_atlas.store.layout import AtlasLayout, check_id, created_with

DEFAULT_TOKENS = 2048
DEFAULT_CE_BLOCKS = 4


@dataclass
class CLTImportResult:
    """What `import_clt` did: the CLT id, its hooks, metrics and any problems (suspect)."""

    clt_id: str
    hooks_in: list[str]
    hooks_out: list[str]
    metrics: dict[str, Any]
    problems: list[Problem]

    @property
    def suspect(self) -> bool:
        return bool(self.problems)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "problems": [p.to_dict() for p in self.problems], "suspect": self.suspect}


def check_against_model(clt: CrossLayerTranscoder, handle: ModelHandle) -> None:
    """InvalidInputError (UnknownHookError for a hook) unless the CLT fits the model: one
    encoder per layer of the model, the model's width, hooks the model has."""
    cfg = clt.cfg
    if cfg.n_layers != handle.n_layers:
        raise InvalidInputError(f"the CLT has {cfg.n_layers} layers but model {handle.name} has {handle.n_layers}; "
                                "a CLT needs one encoder per layer of its model")
    if cfg.d_model != handle.d_model:
        raise InvalidInputError(f"the CLT has d_model={cfg.d_model} but model {handle.name} has "
                                f"d_model={handle.d_model}; it belongs to another model")
    for hook in cfg.hooks_in + cfg.hooks_out:
        handle.check_hook(hook)


def judge(clt: CrossLayerTranscoder, metrics: dict[str, Any]) -> list[Problem]:
    """The misload guard's verdict on a CLT's metrics (see the module doc)."""
    problems = []
    if not metrics["fvu"] <= MAX_FVU:
        problems.append(Problem("fvu", f"FVU {metrics['fvu']:.3g} > 1 (per layer "
                                f"{', '.join(f'{v:.3g}' for v in metrics['fvu_per_layer'])}): the CLT predicts the "
                                "MLP outputs worse than their mean; it belongs to another model, hook or normalisation"))
    has_thresholds = clt.cfg.architecture == "jumprelu" and bool((clt.threshold > 0).any())
    if has_thresholds and max(metrics["l0_per_layer"]) > DENSE_SHARE * clt.cfg.d_sae:
        problems.append(Problem("threshold", f"L0 per layer {max(metrics['l0_per_layer']):.1f} of {clt.cfg.d_sae} "
                                "features: the CLT has lost its thresholds"))
    if metrics["dead_fraction"] >= 1.0:
        problems.append(Problem("dead", f"no feature fires on {metrics['n_tokens']} tokens"))
    return problems


def _ce_blocks(handle: ModelHandle, spec: CorpusSpec, n_blocks: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`(token_ids, is_bos)` of the corpus's first `n_blocks` blocks (the CE loss blocks)."""
    out = []
    for blocks in iter_blocks(handle.tokenizer, spec, max_blocks=n_blocks):
        is_bos = torch.zeros_like(blocks.token_ids, dtype=torch.bool)
        is_bos[:, 0] = spec.prepend_bos
        out.append((blocks.token_ids.to(handle.device), is_bos))
    return out


def import_clt(atlas: str | Path, source: str | Path, *, clt_id: str | None = None, force: bool = False,
               n_tokens: int = DEFAULT_TOKENS, ce_blocks: int = DEFAULT_CE_BLOCKS,
               model_handle: ModelHandle | None = None) -> CLTImportResult:
    """Import the circuit-tracer CLT at SOURCE (a folder or `hf://org/repo/path[@rev]`) into
    the atlas (see the module doc); an accepted CLT's metrics include the CE loss recovered
    with every MLP replaced by it on `ce_blocks` corpus blocks (`saes.eval.transcoder.replacement_metrics`). MisloadError naming the cause when the guard refuses it
    (unless `force`); nothing is left in the atlas by a refused import."""
    layout = AtlasLayout(atlas)
    meta = layout.read_meta()
    resolved = resolve_source(source)
    if not is_circuit_tracer_clt(resolved.folder):
        raise InvalidInputError(f"{resolved.folder} is not a circuit-tracer CLT (a config.yaml with model_kind: "
                                "cross_layer_transcoder beside W_enc_<i> / W_dec_<i>.safetensors)")
    clt = load_circuit_tracer_clt(resolved.folder)
    handle = model_handle or load_model(meta["model"])
    check_against_model(clt, handle)
    clt.cfg.model_name = clt.cfg.model_name or str(meta.get("model_name", ""))
    name = str(resolved.source).rstrip("/").rsplit("/", 1)[-1]
    clt_id = check_id(clt_id or f"clt-{clt.cfg.architecture}-{clt.cfg.d_sae}-{name}", "CLT id")
    if (layout.clt_dir(clt_id) / "cfg.json").exists():
        finished = _finish_interrupted(layout, clt_id, resolved.source)
        if finished is not None:
            return finished
        raise InvalidInputError(f"CLT id {clt_id!r} already exists in {layout.root}; choose another with --id")
    started = time.perf_counter()
    spec = CorpusSpec(**(meta.get("corpus") or {}))
    clt = clt.to(handle.device)
    metrics = clt_metrics(clt, streamed_rows(handle, clt.cfg, spec, n_tokens))
    problems = judge(clt, metrics)
    if ce_blocks and not problems:  # a CLT the guard distrusts may not even splice (it writes before it reads)
        metrics.update(replacement_metrics(clt, handle.bridge, _ce_blocks(handle, spec, ce_blocks)))
    if problems and not force:
        causes = "; ".join(f"{p.cause}: {p.message}" for p in problems)
        raise MisloadError(f"import refused: {causes}. Pass --force to keep it marked suspect", problems)
    verdict = {"suspect": bool(problems), "problems": [p.to_dict() for p in problems]}
    files = {p.name: sha256_file(p) for p in sorted(resolved.folder.iterdir()) if p.is_file()}
    staging = layout.root / ".import-staging" / clt_id
    shutil.rmtree(staging, ignore_errors=True)
    try:
        save_clt(clt.cpu(), staging)
        atomic_write_json(staging / "source.json", {
            "source": resolved.source, "kind": resolved.kind, "format": "circuit_tracer_clt", **resolved.provenance,
            "original_files": files, **verdict, "imported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "created_with": created_with()})
        atomic_write_json(staging / "eval.json", {"metrics": metrics, **verdict, "seconds": time.perf_counter() - started,
                                                  "parameters": {"n_tokens": n_tokens, "ce_blocks": ce_blocks,
                                                                 "split": "streamed"}})
        layout.clt_dir(clt_id).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, layout.clt_dir(clt_id))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    register_clt(atlas, clt_record(clt_id, clt.cfg, metrics, source={"kind": resolved.kind, "source": resolved.source,
                                                                     "format": "circuit_tracer_clt"}, **verdict))
    return CLTImportResult(clt_id, clt.cfg.hooks_in, clt.cfg.hooks_out, metrics, problems)


def _finish_interrupted(layout: AtlasLayout, clt_id: str, source: str) -> CLTImportResult | None:
    """The result of an import of `source` as `clt_id` that was moved into place but killed
    before atlas.json recorded it, now registered; None when that is not the case."""
    folder = layout.clt_dir(clt_id)
    if clt_id in (layout.read_meta().get("clts") or {}) or not (folder / "source.json").is_file():
        return None
    repair = f"remove {folder} and import again"
    provenance = read_json(folder / "source.json", repair)
    if provenance.get("source") != source:
        return None
    metrics = read_json(folder / "eval.json", repair)["metrics"]
    cfg = load_clt_folder(folder).cfg  # verifies the weights
    verdict = {"suspect": provenance["suspect"], "problems": provenance["problems"]}
    register_clt(layout.root, clt_record(clt_id, cfg, metrics, source={
        "kind": provenance["kind"], "source": source, "format": provenance["format"]}, **verdict))
    problems = [Problem(p["cause"], p["message"]) for p in provenance["problems"]]
    return CLTImportResult(clt_id, cfg.hooks_in, cfg.hooks_out, metrics, problems)
