"""What atlas.json records of each SAE, and registering an SAE folder it does not list.

Training records a trained SAE once it finishes (`saes.train.train_saes`), import an imported
one once it passed the misload guard (`saes.importing.pipeline`): `trained_record` and
`imported_record` are those records. A folder that atlas.json does not list (a run killed
before it registered the SAE, or an atlas.json restored from elsewhere) is *unregistered*
(`store.layout.AtlasLayout.unregistered_sae_ids`); `register_sae` verifies its weights and
records it again from what the folder holds (`folder_record`): its config (cfg.json) and
`training.json` (trained) or `source.json` and `eval.json` (imported).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.saes.formats.saelens import CFG_FILE, OUR_KEY
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.atomic import read_json
from sae_atlas.store.layout import AtlasLayout

TRAINING_FILE = "training.json"
SOURCE_FILE = "source.json"
EVAL_FILE = "eval.json"  # an SAE folder's eval results (`saes.eval.evaluate` writes it)


def _identity(sae_id: str, cfg: SAEConfig) -> dict[str, Any]:
    record = {"sae_id": sae_id, "hook": cfg.hook_name, "architecture": cfg.architecture,
              "d_in": cfg.d_in, "d_sae": cfg.d_sae, "k": cfg.k}
    if cfg.is_transcoder:  # it reads `hook` and writes `hook_out`
        record.update(hook_out=cfg.hook_name_out, d_out=cfg.output_dim, skip=cfg.skip)
    return record


def trained_record(sae_id: str, cfg: SAEConfig, training: dict[str, Any]) -> dict[str, Any]:
    """The atlas.json record of a trained SAE: its config, tokens, input scale, final
    training metrics and held-out metrics (from its `training.json` content)."""
    heldout = training.get("heldout_metrics") or {}
    final = training.get("final_metrics") or {}
    return {**_identity(sae_id, cfg), "tokens": training["train_config"]["total_tokens"],
            "input_scale": training.get("input_scale"), "train_fvu": final.get("fvu"), "train_l0": final.get("l0"),
            "fvu": heldout.get("fvu"), "l0": heldout.get("l0"), "dead_fraction": heldout.get("dead_fraction")}


def imported_record(sae_id: str, cfg: SAEConfig, metrics: dict[str, Any], provenance: dict[str, Any]) -> dict[str, Any]:
    """The atlas.json record of an imported SAE: its config, the metrics measured at import,
    where it came from (`source`: kind, SOURCE, format) and whether it is `suspect`."""
    return {**_identity(sae_id, cfg), "fvu": metrics.get("fvu"), "l0": metrics.get("l0"),
            "dead_fraction": metrics.get("dead_fraction"),
            "source": {"kind": provenance["kind"], "source": provenance["source"], "format": provenance["format"]},
            "suspect": provenance["suspect"]}


def _object(path: Path, repair: str) -> dict[str, Any]:
    data = read_json(path, repair)
    if not isinstance(data, dict):
        raise IntegrityError(path, "not a JSON object", repair)
    return data


def saved_config(folder: Path, repair: str) -> SAEConfig:
    """The config an atlas SAE folder was saved with (its cfg.json's `sae_atlas` section),
    read without loading the weights; IntegrityError when cfg.json does not hold one."""
    cfg = _object(folder / CFG_FILE, repair)
    try:
        return SAEConfig.from_dict(cfg[OUR_KEY]["sae_config"])
    except (KeyError, TypeError, InvalidInputError) as exc:
        raise IntegrityError(folder / CFG_FILE, f"no valid {OUR_KEY}.sae_config section ({exc})", repair) from exc


def folder_record(folder: Path, sae_id: str) -> dict[str, Any]:
    """The record of the SAE saved in `folder`, rebuilt from its config (`saved_config`) and
    its `source.json` and `eval.json` (imported) or its complete `training.json` (trained);
    IntegrityError naming the file that is missing, unreadable or unfinished."""
    if (folder / SOURCE_FILE).is_file():
        repair = f"import SAE {sae_id!r} again (delete saes/{sae_id}/ first)"
        cfg = saved_config(folder, repair)
        try:
            provenance = _object(folder / SOURCE_FILE, repair)
            metrics = _object(folder / EVAL_FILE, repair)["metrics"]
            return imported_record(sae_id, cfg, metrics, provenance)
        except (KeyError, TypeError) as exc:
            raise IntegrityError(folder / SOURCE_FILE, f"lacks the import record's field {exc}", repair) from exc
    repair = f"train SAE {sae_id!r} again (`sae-atlas train`), or delete saes/{sae_id}/"
    if not (folder / TRAINING_FILE).is_file():
        raise IntegrityError(folder / TRAINING_FILE, f"file is missing, and so is {SOURCE_FILE}: the folder records "
                             "neither a finished training nor an import", repair)
    training = _object(folder / TRAINING_FILE, repair)
    if training.get("status") != "complete":
        raise IntegrityError(folder / TRAINING_FILE, f"the training did not finish (status "
                             f"{training.get('status')!r})", repair)
    try:
        return trained_record(sae_id, saved_config(folder, repair), training)
    except (KeyError, TypeError) as exc:
        raise IntegrityError(folder / TRAINING_FILE, f"lacks the training record's field {exc}", repair) from exc


def register_sae(root: str | Path, sae_id: str) -> dict[str, Any]:
    """Writes: record an unregistered SAE in atlas.json after verifying its weights
    (`folder_record`); the record. NotFoundError for an id with no folder, InvalidInputError
    for one atlas.json already lists."""
    layout = AtlasLayout(root)
    if sae_id in layout.registered_sae_ids():
        raise InvalidInputError(f"SAE {sae_id!r} is already registered in {layout.atlas_json.name}")
    if sae_id not in layout.unregistered_sae_ids():
        folder = layout.sae_dir(sae_id)
        if folder.is_dir():  # a folder that lost its cfg.json is named, not taken for no folder
            raise IntegrityError(folder / CFG_FILE, "file is missing, so the folder cannot be registered",
                                 f"restore it, or re-run the `sae-atlas train` or `sae-atlas import` that wrote "
                                 f"saes/{folder.name}/")
        unregistered = ", ".join(layout.unregistered_sae_ids()) or "(none)"
        raise NotFoundError(f"no SAE folder saes/{layout.sae_dir(sae_id).name}/ with a cfg.json; "
                            f"unregistered SAEs: {unregistered}")
    load_atlas_sae(root, sae_id)  # every file it loads from verifies
    record = folder_record(layout.sae_dir(sae_id), sae_id)
    saes = dict(layout.read_meta().get("saes") or {})
    saes[sae_id] = record
    layout.update_meta(saes=saes)
    return record
