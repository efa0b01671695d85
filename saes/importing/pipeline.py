"""Import a pretrained SAE into an atlas: convert, judge, register.

`import_sae(atlas, SOURCE)` resolves SOURCE (`saes.importing.origins`), reads it with the
matching `saes.formats` reader, maps its hook to the atlas's TransformerLens name, writes
it in our SAELens layout into a staging folder, reloads it from there and evaluates it on
the hook's held-out activations (or, for a hook the atlas has not cached, on a small
sample streamed through the model; `saes.importing.judge_rows`): FVU, L0, dead fraction
and, with the model, CE loss recovered. The misload guard (`saes.importing.guard`) refuses
an SAE that looks wrongly loaded, naming the cause; `force=True` keeps it, marked
`suspect`. An accepted SAE is moved to `saes/<sae_id>/` with `source.json` (provenance)
and `eval.json`, and registered in `atlas.json`; from then on every tool treats it like a
trained one.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from sae_atlas.errors import InvalidInputError, UnknownHookError
from sae_atlas.saes.atlas_records import SOURCE_FILE, imported_record
from sae_atlas.saes.eval.evaluate import EVAL_FILE, write_eval
from sae_atlas.saes.formats import declared_normalization, detect_layout, load_any
from sae_atlas.saes.formats.foreign_hooks import to_atlas_hook
from sae_atlas.saes.formats.saelens import WEIGHTS_FILE, load_saelens, relink_weights, save_saelens
from sae_atlas.saes.importing.guard import Problem, check_sae
from sae_atlas.saes.importing.judge_rows import ImportActivations
from sae_atlas.saes.importing.origins import ResolvedSource, resolve_source
from sae_atlas.saes.models import ModelHandle, load_model
from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.transcoders.circuit_tracer_clt import is_circuit_tracer_clt
from sae_atlas.store.atomic import atomic_write_json, read_json, sha256_file
from sae_atlas.store.layout import AtlasLayout, check_id, created_with

STAGING_DIR = ".import-staging"
DEFAULT_TOKENS = 8192
DEFAULT_CE_BLOCKS = 4
_WEIGHT_SUFFIXES = (".safetensors", ".npz", ".pt", ".pth", ".bin")


class MisloadError(InvalidInputError):
    """The misload guard refused an import; `problems` name the causes."""

    def __init__(self, message: str, problems: list[Problem]) -> None:
        super().__init__(message)
        self.problems = problems


@dataclass
class ImportResult:
    """What `import_sae` did: the SAE id, its hook, its metrics and any problems (suspect)."""

    sae_id: str
    hook: str
    architecture: str
    metrics: dict[str, Any]
    problems: list[Problem]
    source: dict[str, Any]

    @property
    def suspect(self) -> bool:
        return bool(self.problems)

    def to_dict(self) -> dict[str, Any]:
        return {"sae_id": self.sae_id, "hook": self.hook, "architecture": self.architecture,
                "metrics": self.metrics, "suspect": self.suspect,
                "problems": [p.to_dict() for p in self.problems], "source": self.source}


def _original_files(folder: Path) -> dict[str, str | None]:
    """Every file of the source folder (relative names) with the sha256 of the weight files
    (a single-file source, a circuit-tracer layer, with its set's config)."""
    if folder.is_file():
        return {folder.name: sha256_file(folder), "config.yaml": None}
    files = sorted(p for p in folder.rglob("*") if p.is_file() and ".cache" not in p.parts)
    return {str(p.relative_to(folder)): sha256_file(p) if p.suffix in _WEIGHT_SUFFIXES else None for p in files}


def _slug(text: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", text.removeprefix("hf://").strip("/")).strip("-.")
    return slug[-48:].lstrip("-.") or "imported"


def _resolve_hook(sae: SAE, hook: str | None, layout: AtlasLayout, model: Any) -> tuple[str, str, list[Problem]]:
    """(the atlas hook to import at, the hook the SAE records, a `hook` problem when
    `--hook` and the recorded hook both name hooks of this model and differ)."""
    recorded = sae.cfg.hook_name
    if not (hook or recorded):
        raise InvalidInputError("the SAE records no hook; pass the hook it reads with --hook "
                                f"(cached: {', '.join(layout.cached_hooks()) or 'none'})")
    name = str(layout.read_meta().get("model_name", "the model"))

    def to_hook(spelling: str) -> str:  # cached hooks first: the model is loaded only if needed
        try:
            return to_atlas_hook(spelling, layout.cached_hooks(), model_name=name)
        except UnknownHookError:
            return to_atlas_hook(spelling, model().hook_names, model_name=name)

    target = to_hook(hook or recorded)
    if hook and recorded:
        try:
            mapped = to_hook(recorded)
        except UnknownHookError:
            mapped = None  # a name from another model family: trust --hook
        if mapped is not None and mapped != target:
            return target, recorded, [Problem("hook", f"hook mismatch: the SAE was trained on {recorded!r} "
                                              f"({mapped}) but --hook is {hook!r} ({target}); drop --hook "
                                              "or pass the SAE's own hook")]
    return target, recorded, []


def _output_hook(sae: SAE, layout: AtlasLayout, model: Any) -> str:
    """The atlas hook a transcoder writes (its recorded output hook, mapped like its input);
    '' for an SAE."""
    if not sae.is_transcoder:
        return ""
    name = str(layout.read_meta().get("model_name", "the model"))
    try:
        return to_atlas_hook(sae.cfg.hook_name_out, layout.cached_hooks(), model_name=name)
    except UnknownHookError:
        return to_atlas_hook(sae.cfg.hook_name_out, model().hook_names, model_name=name)


def _verdict(problems: list[Problem]) -> dict[str, Any]:
    """The guard's verdict as recorded in source.json and eval.json."""
    return {"suspect": bool(problems), "problems": [p.to_dict() for p in problems]}


def _refusal(problems: list[Problem]) -> str:
    causes = "; ".join(f"{p.cause}: {p.message}" for p in problems)
    return f"import refused: {causes}. Pass --force to keep it marked suspect"


def _norm_scale(source: ResolvedSource, acts: ImportActivations, d_in: int) -> tuple[float, str]:
    """The `expected_average_only_in` factor: the registry's, else sqrt(d_in) / mean ||x||."""
    if source.norm_scaling_factor is not None:
        return source.norm_scaling_factor, "registry"
    mean_norm = float(acts.rows().norm(dim=-1).mean())
    if not mean_norm > 0:
        raise InvalidInputError(f"hook {acts.hook} has zero activations; cannot estimate the norm scaling factor")
    return d_in**0.5 / mean_norm, f"estimated from {acts.rows().shape[0]} tokens of {acts.hook}"


def _link_weights(staging: Path, source_file: Path) -> None:
    """Replace the staged weights by a symbolic link to `source_file`, after checking the
    source holds exactly the staged tensors (only an unconverted SAELens file can)."""
    mine, theirs = load_file(str(staging / WEIGHTS_FILE)), load_file(str(source_file))
    # the exported JumpReLU threshold is exp(log_threshold): equal up to float rounding
    same = set(mine) == set(theirs) and all(
        torch.equal(mine[k], theirs[k]) if k != "threshold" else torch.allclose(mine[k], theirs[k], rtol=1e-6, atol=0)
        for k in mine)
    if not same:
        raise InvalidInputError(f"--link needs a SAELens {WEIGHTS_FILE} that is used unconverted; {source_file} "
                                "had to be converted, so the SAE must be copied (drop --link)")
    relink_weights(staging, source_file)


def import_sae(
    atlas: str | Path,
    source: str | Path,
    *,
    hook: str | None = None,
    sae_id: str | None = None,
    link: bool = False,
    force: bool = False,
    registry: str | Path | None = None,
    n_tokens: int = DEFAULT_TOKENS,
    ce_blocks: int = DEFAULT_CE_BLOCKS,
    with_model: bool = True,
    model_handle: ModelHandle = None,
    model_loader: Callable[[], ModelHandle] | None = None,
) -> ImportResult:
    """Import SOURCE (a folder in a known layout, `RELEASE/SAE_ID`, `hf://org/repo/path[@rev]`)
    into the atlas at `atlas` (see the module doc). The model is `model_handle`, else what
    `model_loader` returns when it is first needed, else atlas.json's. Raises MisloadError
    naming the cause when the guard refuses it (unless `force`), InvalidInputError /
    UnknownHookError for bad input; nothing is left in the atlas by a refused import."""
    layout = AtlasLayout(atlas)
    meta = layout.read_meta()
    handle: dict[str, Any] = {"model": model_handle}

    def model() -> Any:
        if handle["model"] is None:
            handle["model"] = model_loader() if model_loader is not None else load_model(meta["model"])
        return handle["model"]

    resolved = resolve_source(source, registry=registry)
    if is_circuit_tracer_clt(resolved.folder):
        raise InvalidInputError(f"{resolved.folder} is a cross-layer transcoder: import it with "
                                "`saes.importing.clt.import_clt` (`sae-atlas import` does so by itself)")
    folder_layout = detect_layout(resolved.folder)
    if link and folder_layout != "saelens":
        raise InvalidInputError(f"--link needs a SAELens folder whose {WEIGHTS_FILE} is used unconverted; "
                                f"{resolved.folder} is {folder_layout}, so the SAE must be copied (drop --link)")
    needs_scale = declared_normalization(resolved.folder) == "expected_average_only_in"
    sae = load_any(resolved.folder, norm_scaling_factor=1.0 if needs_scale else None)
    target, recorded, hook_problems = _resolve_hook(sae, hook, layout, model)
    if hook_problems and not force:
        raise MisloadError(_refusal(hook_problems), hook_problems)
    target_out = _output_hook(sae, layout, model)
    acts = ImportActivations(layout, target, model, n_tokens, hook_out=target_out)
    if acts.width != sae.cfg.d_in:
        raise MisloadError(f"import refused: d_in mismatch: the SAE has d_in={sae.cfg.d_in} but {target} has "
                           f"d={acts.width}; it belongs to another model or hook",
                           [Problem("hook", f"d_in {sae.cfg.d_in} != {acts.width}")])
    conversions: dict[str, Any] = {}
    if needs_scale:
        scale, origin = _norm_scale(resolved, acts, sae.cfg.d_in)
        sae = load_any(resolved.folder, norm_scaling_factor=scale)
        conversions["norm_scaling_factor"] = {"value": scale, "from": origin}
    sae.cfg.hook_name, sae.cfg.hook_name_out = target, target_out
    sae.cfg.model_name = sae.cfg.model_name or str(meta.get("model_name", ""))
    hooks = f"{target}-to-{target_out}" if target_out else target
    sae_id = check_id(sae_id or f"{hooks}-{sae.cfg.architecture}-{sae.cfg.d_sae}-{_slug(resolved.source)}", "SAE id")
    if (layout.sae_dir(sae_id) / "cfg.json").exists() or sae_id in (meta.get("saes") or {}):
        finished = _finish_interrupted(layout, sae_id, resolved.source)
        if finished is not None:
            return finished
        raise InvalidInputError(f"SAE id {sae_id!r} already exists in {layout.root}; choose another with --id")
    staging = layout.root / STAGING_DIR / sae_id
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        save_saelens(sae, staging)
        if link:
            _link_weights(staging, resolved.folder / WEIGHTS_FILE)
        stored = load_saelens(staging)  # judge exactly what was written
        started = time.perf_counter()
        metrics = acts.metrics(stored, with_model, ce_blocks)
        others = {} if stored.is_transcoder else acts.same_width_hooks()
        problems = hook_problems + check_sae(stored, acts.rows(), metrics, hook=target,
                                             expected_l0=resolved.expected_l0, other_hooks=others)
        if problems and not force:
            raise MisloadError(_refusal(problems), problems)
        provenance = {
            "source": resolved.source, "kind": resolved.kind, "format": folder_layout,
            **resolved.provenance, "original_hook": recorded or None, "hook": target,
            **({"hook_out": target_out} if target_out else {}),
            "architecture": stored.cfg.architecture, "dtype": stored.cfg.dtype,
            "original_files": _original_files(resolved.folder), "conversions": conversions, "linked": link,
            **_verdict(problems), "imported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "created_with": created_with(),
        }
        atomic_write_json(staging / SOURCE_FILE, provenance)
        parameters = {"sae_id": sae_id, "hook": target, **({"hook_out": target_out} if target_out else {}),
                      "architecture": stored.cfg.architecture,
                      "split": "heldout" if acts.cached else "streamed", "n_tokens_requested": n_tokens,
                      "ce_blocks_requested": ce_blocks if with_model else 0, "exclude_bos": True,
                      "model": getattr(handle["model"], "name", None) if with_model else None}
        write_eval(staging, {"metrics": metrics, **_verdict(problems), "parameters": parameters,
                             "seconds": round(time.perf_counter() - started, 3)})
        layout.sae_dir(sae_id).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, layout.sae_dir(sae_id))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            staging.parent.rmdir()  # only when no other import is staged
    _register(layout, sae_id, stored, metrics, provenance)
    return ImportResult(sae_id, target, stored.cfg.architecture, metrics, problems, provenance)


def _finish_interrupted(layout: AtlasLayout, sae_id: str, source: str) -> ImportResult | None:
    """The result of an import of `source` as `sae_id` that was moved into place but killed
    before `atlas.json` recorded it, now registered; None when that is not the case."""
    folder = layout.sae_dir(sae_id)
    if sae_id in (layout.read_meta().get("saes") or {}) or not (folder / SOURCE_FILE).is_file():
        return None
    repair = f"remove {folder} and import again"
    provenance = read_json(folder / SOURCE_FILE, repair)
    if provenance.get("source") != source:
        return None
    record = read_json(folder / EVAL_FILE, repair)
    sae = load_saelens(folder)
    _register(layout, sae_id, sae, record["metrics"], provenance)
    problems = [Problem(p["cause"], p["message"]) for p in provenance.get("problems", [])]
    return ImportResult(sae_id, sae.cfg.hook_name, sae.cfg.architecture, record["metrics"], problems, provenance)


def _register(layout: AtlasLayout, sae_id: str, sae: SAE, metrics: dict[str, Any], provenance: dict[str, Any]) -> None:
    """Record the imported SAE in atlas.json next to the trained ones."""
    meta = layout.read_meta()
    saes = dict(meta.get("saes") or {})
    saes[sae_id] = imported_record(sae_id, sae.cfg, metrics, provenance)
    layout.update_meta(saes=saes)
