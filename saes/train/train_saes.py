"""Train one SAE per cached hook of an atlas and record them in `atlas.json`.

Each SAE gets the id `<hook>-<architecture>-<d_sae>` and its own directory
`saes/<sae_id>/` (SAELens weights, `training.json`). All SAEs of one call train together
in one loop (`saes.train.loop`) from one cached source that reads every hook's batches
(each hook's batches are exactly those a run of that hook alone reads); the run's
checkpoints live in the SAE's folder (one SAE) or `saes/.train-<digest of the SAE ids>/`
(several) while it runs.
Under torchrun, several hooks are dealt to the ranks (module-sharded: each rank trains
its SAEs on the whole batches) and a single hook is trained data-parallel (DDP) by all
ranks. Given `hook_out`, a hook trains a transcoder that predicts another cached hook at
the same tokens (id `<hook>-to-<hook_out>-<architecture>[-skip]-<d_sae>`).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, get_args

import torch

from sae_atlas.errors import InvalidInputError, UnknownHookError
from sae_atlas.saes.atlas_records import trained_record
from sae_atlas.saes.distributed import DistContext, barrier, init_distributed
from sae_atlas.saes.formats.saelens import OUR_KEY
from sae_atlas.saes.sae.base import SAEConfig, architecture_class
from sae_atlas.saes.train.checkpoint import remove_checkpoints
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.loop import Distribute as LoopDistribute
from sae_atlas.saes.train.loop import LoopRun, train_dictionaries
from sae_atlas.saes.train.paired_rows import PairedReader
from sae_atlas.saes.train.sources import CachedSource
from sae_atlas.saes.train.trainer import SAEDictionary
from sae_atlas.store.activations import ActivationReader
from sae_atlas.store.atomic import read_json
from sae_atlas.store.layout import AtlasLayout, check_id

Distribute = Literal["auto", "data", "modules"]
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


def completed(sae_dir: Path, sae_cfg: SAEConfig, train_cfg: TrainConfig) -> dict[str, Any] | None:
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


@dataclass(frozen=True)
class Planned:
    """One SAE of a call: the hook(s) it reads, its config, id and folder."""

    hook: str
    hook_out: str
    reader: ActivationReader | PairedReader | None  # None: streamed from the model, no cache
    sae_cfg: SAEConfig
    sae_id: str
    sae_dir: Path


def _plan(layout: AtlasLayout, hook: str, hook_out: str, architecture: str, d_sae: int | None,
          expansion: int | None, k: int | None, options: dict[str, Any], seed: int) -> Planned:
    reader = _reader(layout.root, hook, hook_out)
    sae_cfg = _sae_config(reader, architecture, d_sae, expansion, k, options, seed)
    sae_id = sae_id_for(hook, architecture, sae_cfg.d_sae, hook_out, sae_cfg.skip)
    return Planned(hook, hook_out, reader, sae_cfg, sae_id, layout.sae_dir(sae_id))


class Saved(Protocol):
    """What `to_train` reads of a planned dictionary saved like an SAE (a `Planned`, or a
    streamed crosscoder): its config, id and folder."""

    @property
    def sae_cfg(self) -> SAEConfig: ...
    @property
    def sae_id(self) -> str: ...
    @property
    def sae_dir(self) -> Path: ...


S = TypeVar("S", bound=Saved)


def to_train(planned: list[S], train_cfg: TrainConfig, overwrite: bool, ctx: DistContext | None) -> list[S]:
    """The dictionaries not yet finished with this configuration (an overwritten one is
    cleared first); InvalidInputError when one is saved with a different configuration."""
    if overwrite and (ctx is None or ctx.is_main):
        for p in planned:
            for name in ("training.json", "cfg.json"):
                (p.sae_dir / name).unlink(missing_ok=True)
            remove_checkpoints(p.sae_dir)
    barrier(ctx)
    todo = [p for p in planned if completed(p.sae_dir, p.sae_cfg, train_cfg) is None]
    for p in todo:
        if diff := _saved_differences(p.sae_dir, p.sae_cfg, train_cfg):
            raise InvalidInputError(
                f"SAE {p.sae_id!r} already exists with a different configuration (differs in "
                f"{', '.join(diff)}); pass overwrite=True (`--overwrite`) to replace it"
            )
    return todo


def run_dir(layout: AtlasLayout, sae_ids: Sequence[str]) -> Path:
    """Where a call training `sae_ids` keeps its checkpoints: one SAE's own folder, or for
    several `saes/.train-<digest>/` (the same folder for the same SAEs, so a rerun after a
    kill finds it; dot-named, so no SAE listing sees it)."""
    if len(sae_ids) == 1:
        return layout.sae_dir(sae_ids[0])
    return layout.root / "saes" / f".train-{zlib.crc32(' '.join(sorted(sae_ids)).encode()):08x}"


def remove_run(folder: Path) -> None:
    remove_checkpoints(folder)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def sae_dictionaries(todo: list[Planned], train_cfg: TrainConfig, device: str) -> list[SAEDictionary]:
    """The loop's dictionary of every planned SAE, each built from its own seed."""
    dictionaries = []
    for p in todo:
        resolved = train_cfg.resolve(p.sae_cfg.d_in, p.sae_cfg.d_sae)
        torch.manual_seed(resolved.seed)  # each SAE built from its own seed, independent of the others
        dictionaries.append(SAEDictionary(p.sae_cfg, resolved, device, name=p.sae_id, hook=p.hook,
                                          hook_out=p.hook_out or None))
    return dictionaries


def save_trained(run: LoopRun, todo: list[Planned], eval_rows: Callable[[Planned], Iterable[torch.Tensor] | None],
                 ctx: DistContext | None, distribute: LoopDistribute) -> None:
    """Fold and save this rank's finished SAEs into their folders (`eval_rows(p)`: the raw
    held-out rows of one, paired for a transcoder); rank 0 writes under data-parallel."""
    by_id = {p.sae_id: p for p in todo}
    world = 1 if ctx is None or distribute == "modules" else ctx.world_size  # ranks that split its batches
    for d in run.dictionaries:
        p = by_id.get(d.name)
        if p is None:
            continue  # a dictionary of another kind in the same run, saved by its caller
        assert isinstance(d, SAEDictionary)
        d.finish(p.sae_dir, eval_rows(p), wall_seconds=run.wall_seconds, world_size=world,
                 write=distribute == "modules" or ctx is None or ctx.is_main)


def _train_together(todo: list[Planned], train_cfg: TrainConfig, folder: Path, distribute: LoopDistribute,
                    ctx: DistContext | None) -> None:
    """Train the SAEs of `todo` in one loop over their caches and save each (see module doc)."""
    hooks: dict[str, ActivationReader] = {}
    for p in todo:
        if isinstance(p.reader, PairedReader):
            hooks.update({p.hook: p.reader.input, p.hook_out: p.reader.output})
        elif p.reader is not None:
            hooks[p.hook] = p.reader
    B, seed = train_cfg.batch_size, train_cfg.seed
    source = CachedSource(hooks, B, seed=seed, ctx=ctx, needed=f"{train_cfg.total_steps} batches of {B} tokens")
    dictionaries = sae_dictionaries(todo, train_cfg, train_cfg.device if ctx is None else ctx.device(train_cfg.device))
    desc = f"train {todo[0].sae_cfg.architecture} {todo[0].hook}" if len(todo) == 1 else f"train {len(todo)} SAEs"
    run = train_dictionaries(dictionaries, source, checkpoint_dir=folder, ctx=ctx, distribute=distribute, desc=desc)

    def heldout(p: Planned) -> Iterable[torch.Tensor]:
        assert p.reader is not None
        return itertools.islice(p.reader.batches(B, seed=seed, split="heldout"), max(1, HELDOUT_EVAL_TOKENS // B))

    save_trained(run, todo, heldout, ctx, distribute)


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
    Under torchrun, `distribute="modules"` deals the SAEs to the ranks (each sees whole
    batches; more ranks than SAEs are refused), `"data"` trains every SAE data-parallel
    (DDP), and `"auto"` shards modules when there are at least as many SAEs as ranks. Returns `{hook: summary}` with the SAE id and its metrics.
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
    planned = [_plan(layout, hook, outputs.get(hook, ""), architecture, d_sae, expansion, k, options, train_cfg.seed)
               for hook in chosen]
    ctx = init_distributed()
    folder = run_dir(layout, [p.sae_id for p in planned])
    todo = to_train(planned, train_cfg, overwrite, ctx)
    if distribute == "auto":
        world = 1 if ctx is None else ctx.world_size
        distribute = "modules" if 1 < len(todo) and world <= len(todo) else "data"
    if todo:
        _train_together(todo, train_cfg, folder, distribute, ctx)
    barrier(ctx)
    if ctx is None or ctx.is_main:
        remove_run(folder)  # also after a run killed between the last save and its cleanup
    return register_trained(layout, planned, train_cfg, ctx)


def register_trained(layout: AtlasLayout, planned: Sequence[Planned], train_cfg: TrainConfig,
                     ctx: DistContext | None) -> dict[str, dict[str, Any]]:
    """Every planned SAE's atlas.json record by hook, read back from its finished folder
    (InvalidInputError for one that did not complete); rank 0 adds them to atlas.json."""
    results = {}
    for p in planned:  # every rank reads the finished records; rank 0 writes atlas.json
        record = completed(p.sae_dir, p.sae_cfg, train_cfg)
        if record is None:
            raise InvalidInputError(f"training of {p.sae_id} did not complete")
        results[p.hook] = trained_record(p.sae_id, p.sae_cfg, record)
    if ctx is None or ctx.is_main:
        meta = layout.read_meta() if layout.atlas_json.exists() else {}
        layout.update_meta(saes={**meta.get("saes", {}), **{r["sae_id"]: r for r in results.values()}})
    barrier(ctx)
    return results
