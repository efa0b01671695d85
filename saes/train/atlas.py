"""Train one SAE per cached hook of an atlas and record them in `atlas.json`.

Each SAE gets the id `<hook>-<architecture>-<d_sae>` and its own directory
`saes/<sae_id>/` (SAELens weights, `training.json`, checkpoints while running). Under
torchrun, several hooks are dealt to the ranks (per-layer distribution) and a single hook
is trained data-parallel (DDP) by all ranks. Given `hook_out`, a hook trains a transcoder
that predicts another cached hook at the same tokens (id
`<hook>-to-<hook_out>-<architecture>[-skip]-<d_sae>`), on paired rows
(`saes.transcoders.pairs.PairedReader`).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from sae_atlas.saes.distributed import DistContext, barrier, init_distributed
from sae_atlas.saes.formats.saelens import OUR_KEY
from sae_atlas.saes.registry import trained_record
from sae_atlas.saes.sae.base import SAEConfig, architecture_class
from sae_atlas.saes.train.checkpoint import remove_checkpoints
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.distributed import assign_hooks
from sae_atlas.saes.train.trainer import train_sae
from sae_atlas.saes.transcoders.pairs import PairedReader
from sae_atlas.store.activations import ActivationReader
from sae_atlas.store.atomic import read_json
from sae_atlas.store.errors import InvalidInputError, UnknownHookError
from sae_atlas.store.layout import AtlasLayout, check_id

Distribute = Literal["auto", "ddp", "per_layer"]
DISTRIBUTE_MODES: tuple[Distribute, ...] = get_args(Distribute)
DEFAULT_EXPANSION = 8
HELDOUT_EVAL_TOKENS = 262_144


def sae_id_for(hook: str, architecture: str, d_sae: int, hook_out: str = "", skip: bool = False) -> str:
    """The SAE id `<hook>-<architecture>-<d_sae>`, or a transcoder's
    `<hook>-to-<hook_out>-<architecture>[-skip]-<d_sae>` (a safe path component)."""
    if hook_out:
        return check_id(f"{hook}-to-{hook_out}-{architecture}{'-skip' if skip else ''}-{d_sae}", "SAE id")
    return check_id(f"{hook}-{architecture}-{d_sae}", "SAE id")


def _reader(root: Path, hook: str, hook_out: str) -> ActivationReader | PairedReader:
    return PairedReader(root, hook, hook_out) if hook_out else ActivationReader(root, hook)


def _sae_config(
    reader: ActivationReader | PairedReader, architecture: str, d_sae: int | None, expansion: int | None,
    k: int | None, options: dict[str, Any], seed: int,
) -> SAEConfig:
    width = d_sae if d_sae is not None else (expansion or DEFAULT_EXPANSION) * reader.d
    corpus = reader.manifest.get("extra", {}).get("corpus", {})
    if isinstance(reader, PairedReader):
        options = {**options, "hook_name_out": reader.hook_out, "d_out": reader.d_out, "apply_b_dec_to_input": False}
    return SAEConfig(
        architecture=architecture,
        d_in=reader.d,
        d_sae=width,
        k=k if architecture_class(architecture).needs_k else None,
        model_name=reader.model,
        hook_name=reader.hook,
        context_size=reader.context_size,
        prepend_bos=reader.manifest.get("prepend_bos", True),
        dataset_path=str(corpus.get("source", "")),
        seed=hook_seed(seed, reader.hook),
        **options,
    )


def hook_seed(seed: int, hook: str) -> int:
    """The initialisation seed of one hook's SAE: the run seed offset by the hook name, so
    SAEs of different layers do not start from identical dictionaries (which would make
    cross-layer matches trivial after a short run)."""
    return (seed + zlib.crc32(hook.encode())) % 2**31


def _differences(record: dict[str, Any], sae_cfg: SAEConfig, train_cfg: TrainConfig) -> list[str]:
    """Config fields in which a recorded run differs from the one asked for now."""
    resolved = train_cfg.resolve(sae_cfg.d_in, sae_cfg.d_sae).to_dict()
    recorded_sae, recorded_train = record.get("sae_config") or {}, record.get("train_config") or {}
    wanted_sae = sae_cfg.to_dict()
    return sorted(
        [f"sae_config.{key}" for key in set(recorded_sae) | set(wanted_sae)
         if recorded_sae.get(key) != wanted_sae.get(key)]
        + [f"train_config.{key}" for key, value in resolved.items()
           if key not in ("progress", "device", "log_every_steps") and recorded_train.get(key) != value]
    )


def _record(sae_dir: Path) -> dict[str, Any] | None:
    """The SAE's training record, if it has one and saved weights' config."""
    path = sae_dir / "training.json"
    if not (path.exists() and (sae_dir / "cfg.json").exists()):
        return None
    return read_json(path, f"delete {sae_dir} and train again")


def _completed(sae_dir: Path, sae_cfg: SAEConfig, train_cfg: TrainConfig) -> dict[str, Any] | None:
    """The training record if this exact SAE and run already finished, else None."""
    record = _record(sae_dir)
    if record is None or record.get("status") != "complete" or _differences(record, sae_cfg, train_cfg):
        return None
    return record


def _saved_differences(sae_dir: Path, sae_cfg: SAEConfig, train_cfg: TrainConfig) -> list[str]:
    """Config fields in which an SAE already saved in `sae_dir` differs from the one asked
    for (empty when nothing is saved). Without a complete training record (a run killed
    between writing cfg.json and training.json, or a lost training.json) only the saved
    `cfg.json` config is compared, so an identical run resumes from its checkpoints, or
    trains again, and finishes the save."""
    if not (sae_dir / "cfg.json").exists():
        return []
    record = _record(sae_dir)
    if record is not None and record.get("status") == "complete":
        return _differences(record, sae_cfg, train_cfg)
    saved = (read_json(sae_dir / "cfg.json", f"delete {sae_dir} and train again").get(OUR_KEY) or {}).get("sae_config")
    if not isinstance(saved, dict):
        return ["cfg.json (not written by sae-atlas training)"]
    wanted = {**sae_cfg.to_dict(), "dtype": saved.get("dtype", sae_cfg.dtype)}
    return sorted(f"sae_config.{key}" for key in set(saved) | set(wanted) if saved.get(key) != wanted.get(key))


def _train_one(
    root: Path, hook: str, hook_out: str, architecture: str, d_sae: int | None, expansion: int | None,
    k: int | None, options: dict[str, Any], train_cfg: TrainConfig, overwrite: bool,
    ctx: DistContext | None,
) -> None:
    layout = AtlasLayout(root)
    reader = _reader(root, hook, hook_out)
    sae_cfg = _sae_config(reader, architecture, d_sae, expansion, k, options, train_cfg.seed)
    sae_id = sae_id_for(hook, architecture, sae_cfg.d_sae, hook_out, sae_cfg.skip)
    sae_dir = layout.sae_dir(sae_id)
    if overwrite and (ctx is None or ctx.is_main):
        for name in ("training.json", "cfg.json"):
            (sae_dir / name).unlink(missing_ok=True)
        remove_checkpoints(sae_dir)
    barrier(ctx)
    if _completed(sae_dir, sae_cfg, train_cfg) is None:
        diff = _saved_differences(sae_dir, sae_cfg, train_cfg)
        if diff:
            raise InvalidInputError(
                f"SAE {sae_id!r} already exists with a different configuration (differs in "
                f"{', '.join(diff)}); pass overwrite=True (`--overwrite`) to replace it"
            )
        B, seed = train_cfg.batch_size, train_cfg.seed

        def stream(skip: int):
            return reader.batches(B, seed=seed, split="train", repeat=True, skip_batches=skip)

        heldout = itertools.islice(
            reader.batches(B, seed=seed, split="heldout"), max(1, HELDOUT_EVAL_TOKENS // B)
        )
        train_sae(sae_cfg, stream, train_cfg, out_dir=sae_dir, eval_batches=heldout, ctx=ctx)
    elif ctx is None or ctx.is_main:
        remove_checkpoints(sae_dir)  # a finished run killed between training.json and its cleanup


def train_saes(
    atlas_root: str | Path,
    hooks: Sequence[str] | None = None,
    *,
    architecture: str = "topk",
    d_sae: int | None = None,
    expansion: int | None = None,
    k: int | None = 32,
    sae_options: dict[str, Any] | None = None,
    train_cfg: TrainConfig | None = None,
    distribute: Distribute = "auto",
    overwrite: bool = False,
    hook_out: Mapping[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Train one SAE per hook (default: every cached hook) and record them in atlas.json.

    `d_sae` (or `expansion * d_in`, default 8x) sets the width; `sae_options` holds other
    `SAEConfig` fields (e.g. `l1_coefficient`, `skip`). `hook_out` maps a hook to the cached
    hook its transcoder predicts (e.g. `blocks.3.ln2.hook_normalized` ->
    `blocks.3.hook_mlp_out`); hooks it does not name train SAEs. A finished SAE with the same configuration
    is not retrained unless `overwrite`; an interrupted one resumes from its checkpoint.
    Under torchrun (`distribute="auto"`) several hooks are split over the ranks and one
    hook is trained with DDP. Returns `{hook: summary}` with the SAE id and its metrics.
    """
    root = Path(atlas_root)
    layout = AtlasLayout(root)
    cached = layout.cached_hooks()
    chosen = list(hooks) if hooks else cached
    if not chosen:
        raise InvalidInputError(f"no cached activations in {root}; run `sae-atlas cache` first")
    outputs = dict(hook_out or {})
    if set(outputs) - set(chosen):
        raise InvalidInputError(f"hook_out names hooks that are not trained: {sorted(set(outputs) - set(chosen))}")
    unknown = [h for h in [*chosen, *outputs.values()] if h not in cached]
    for hook in unknown:
        if layout.activation_dir(hook).is_dir() or hook in layout.recorded_hooks():
            ActivationReader(root, hook)  # a damaged cache: IntegrityError naming the missing manifest
    if unknown:
        raise UnknownHookError(
            f"hooks {unknown} are not cached in {root}; cached: {', '.join(cached) or '(none)'}"
        )
    if distribute not in DISTRIBUTE_MODES:
        raise InvalidInputError(f"distribute must be one of {', '.join(DISTRIBUTE_MODES)}, got {distribute!r}")
    train_cfg = train_cfg or TrainConfig()
    options = dict(sae_options or {})
    ctx = init_distributed()
    if distribute == "auto":
        distribute = "per_layer" if len(chosen) > 1 else "ddp"
    per_layer = ctx is not None and distribute == "per_layer"
    mine = assign_hooks(chosen, ctx) if per_layer else chosen
    args = (architecture, d_sae, expansion, k, options, train_cfg, overwrite)
    for hook in mine:
        _train_one(root, hook, outputs.get(hook, ""), *args, None if per_layer else ctx)
    barrier(ctx)
    results = {}
    for hook in chosen:  # every rank reads the finished records; rank 0 writes atlas.json
        reader = _reader(root, hook, outputs.get(hook, ""))
        sae_cfg = _sae_config(reader, architecture, d_sae, expansion, k, options, train_cfg.seed)
        sae_id = sae_id_for(hook, architecture, sae_cfg.d_sae, sae_cfg.hook_name_out, sae_cfg.skip)
        record = _completed(layout.sae_dir(sae_id), sae_cfg, train_cfg)
        if record is None:
            raise InvalidInputError(f"training of {sae_id} did not complete")
        results[hook] = trained_record(sae_id, sae_cfg, record)
    if ctx is None or ctx.is_main:
        meta = layout.read_meta() if layout.atlas_json.exists() else {}
        saes = dict(meta.get("saes", {}))
        saes.update({r["sae_id"]: r for r in results.values()})
        layout.update_meta(saes=saes)
    barrier(ctx)
    return results
