"""Train a cross-layer transcoder on an atlas's caches and record it in atlas.json.

The CLT reads the MLP inputs given as hooks (`blocks.0.<site>` .. `blocks.{L-1}.<site>`,
every layer from 0, one site) and writes every `blocks.l.hook_mlp_out`; all 2L hooks must
have been cached in one `sae-atlas cache` run. Its id is `clt-<site>-<architecture>-<F>`
and its folder `clts/<id>/` (`saes.transcoders.clt_store`); a finished CLT with the same
configuration is not trained again unless `overwrite`, an interrupted one resumes. Under
torchrun the ranks train it data-parallel (`train_clt`) and rank 0 writes and registers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sae_atlas.errors import InvalidInputError, UnknownHookError
from sae_atlas.saes.distributed import DistContext, barrier, init_distributed
from sae_atlas.saes.train.checkpoint import remove_checkpoints
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.transcoders.clt import CLTArchitecture, CLTConfig
from sae_atlas.saes.transcoders.clt_data import CLTReader
from sae_atlas.saes.transcoders.clt_store import CFG_FILE, clt_record, register_clt
from sae_atlas.saes.transcoders.clt_train import TRAINING_FILE, train_clt
from sae_atlas.saes.transcoders.sites import MLP_OUT, check_mlp_input
from sae_atlas.store.atomic import read_json
from sae_atlas.store.hooks import BLOCK_HOOK
from sae_atlas.store.layout import AtlasLayout, check_id

HELDOUT_TOKENS = 65_536


def clt_input_site(hooks: list[str]) -> str:
    """The site inside a block that the hooks name, checked to be layers 0..L-1 in order."""
    matches = [BLOCK_HOOK.match(h) for h in hooks]
    if not hooks or not all(matches):
        raise InvalidInputError(f"a cross-layer transcoder reads one MLP input per block (blocks.L.<site>); got {hooks}")
    sites = {m.group(2) for m in matches if m}
    layers = [int(m.group(1)) for m in matches if m]
    if len(sites) > 1 or layers != list(range(len(hooks))):
        raise InvalidInputError(f"a cross-layer transcoder reads the same hook of every block from 0 on "
                                f"(blocks.0.<site>, blocks.1.<site>, ...); got {hooks}")
    check_mlp_input(hooks[0])
    return sites.pop()


@dataclass(frozen=True)
class PlannedCLT:
    """A CLT of a call: its config, id and folder."""

    cfg: CLTConfig
    clt_id: str
    folder: Path


def plan_clt(layout: AtlasLayout, hooks: list[str], *, d_model: int, model_name: str, context_size: int,
             dataset_path: str, architecture: CLTArchitecture = "jumprelu", d_sae: int | None = None,
             expansion: int = 8, k: int | None = 32, options: dict[str, Any] | None = None,
             seed: int = 0) -> PlannedCLT:
    """The CLT reading `hooks` (every layer's MLP input from 0, checked) and writing every
    `blocks.l.hook_mlp_out`: its config, id `clt-<site>-<architecture>-<F>` and folder."""
    site = clt_input_site(hooks)
    cfg = CLTConfig(architecture=architecture, n_layers=len(hooks), d_model=d_model,
                    d_sae=d_sae or expansion * d_model, k=k if architecture == "topk" else None,
                    model_name=model_name, input_site=site, output_site=MLP_OUT, context_size=context_size,
                    dataset_path=dataset_path, seed=seed, **(options or {}))
    clt_id = check_id(f"clt-{site}-{architecture}-{cfg.d_sae}", "CLT id")
    return PlannedCLT(cfg, clt_id, layout.clt_dir(clt_id))


def clt_outputs(n_layers: int) -> list[str]:
    """The MLP outputs a CLT over `n_layers` layers writes."""
    return [f"blocks.{layer}.{MLP_OUT}" for layer in range(n_layers)]


def clt_to_train(planned: PlannedCLT, train_cfg: TrainConfig, overwrite: bool, ctx: DistContext | None
                 ) -> dict[str, Any] | None:
    """The training record when this exact CLT already finished, else None (train it): an
    overwritten CLT is cleared first, one saved with another configuration is refused."""
    folder = planned.folder
    record = None if overwrite else _finished(folder, planned.cfg, train_cfg)
    if record is None:
        if overwrite and (ctx is None or ctx.is_main):
            for name in (CFG_FILE, TRAINING_FILE):
                (folder / name).unlink(missing_ok=True)
            remove_checkpoints(folder)
        elif not overwrite and (folder / TRAINING_FILE).exists():
            raise InvalidInputError(f"CLT {planned.clt_id!r} already exists with a different configuration; pass "
                                    "overwrite=True (`--overwrite`) to replace it")
        barrier(ctx)  # rank 0 cleared an overwritten CLT before any rank looks for checkpoints
    return record


def register_trained_clt(root: str | Path, planned: PlannedCLT, record: dict[str, Any],
                         ctx: DistContext | None) -> dict[str, Any]:
    """The CLT's atlas.json entry from its training record (rank 0 registers it)."""
    heldout_metrics = record.get("heldout_metrics") or {}
    entry = clt_record(planned.clt_id, planned.cfg, heldout_metrics, tokens=record["train_config"]["total_tokens"],
                       train_fvu=record["final_metrics"].get("fvu"), train_l0=record["final_metrics"].get("l0"),
                       dead_fraction=heldout_metrics.get("dead_fraction"))
    if ctx is None or ctx.is_main:
        register_clt(root, entry)
    barrier(ctx)
    return entry


def train_atlas_clt(
    root: str | Path, hooks: list[str], *, architecture: CLTArchitecture = "jumprelu", d_sae: int | None = None,
    expansion: int = 8, k: int | None = 32, options: dict[str, Any] | None = None, train_cfg: TrainConfig | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train (or resume, or find finished) the CLT reading `hooks` and record it in
    atlas.json under `clts`; returns its record. `options` holds other `CLTConfig` fields
    (`l0_coefficient`, `jumprelu_bandwidth`, ...)."""
    layout = AtlasLayout(root)
    clt_input_site(hooks)
    outputs = clt_outputs(len(hooks))
    missing = [h for h in hooks + outputs if h not in layout.cached_hooks()]
    if missing:
        raise UnknownHookError(f"hooks {missing} are not cached in {root}; cache every MLP input and output in one "
                               f"run (cached: {', '.join(layout.cached_hooks()) or 'none'})")
    reader = CLTReader(root, hooks, outputs)
    corpus = reader.manifest.get("extra", {}).get("corpus", {})
    train_cfg = train_cfg or TrainConfig()
    planned = plan_clt(layout, hooks, d_model=reader.d, model_name=reader.model, context_size=reader.context_size,
                       dataset_path=str(corpus.get("source", "")), architecture=architecture, d_sae=d_sae,
                       expansion=expansion, k=k, options=options, seed=train_cfg.seed)
    ctx = init_distributed()
    record = clt_to_train(planned, train_cfg, overwrite, ctx)
    if record is None:
        B, seed = train_cfg.batch_size, train_cfg.seed
        n_heldout = min(HELDOUT_TOKENS, reader.count_tokens("heldout"))
        heldout = next(reader.batches(n_heldout, seed=seed, split="heldout"), None) if n_heldout else None
        record = train_clt(planned.cfg, lambda skip: reader.batches(B, seed=seed, split="train", repeat=True,
                                                                    skip_batches=skip),
                           train_cfg, out_dir=planned.folder, eval_rows=heldout, ctx=ctx).record
    return register_trained_clt(root, planned, record, ctx)


def _finished(folder: Path, cfg: CLTConfig, train_cfg: TrainConfig) -> dict[str, Any] | None:
    """The training record when this exact CLT and run already finished, else None."""
    path = folder / TRAINING_FILE
    if not (path.is_file() and (folder / CFG_FILE).is_file()):
        return None
    record = read_json(path, f"delete {folder} and train again")
    resolved = train_cfg.resolve(cfg.d_model, cfg.d_sae).to_dict()
    same_train = all(record.get("train_config", {}).get(key) == value for key, value in resolved.items()
                     if key not in ("progress", "device", "log_every_steps"))
    if record.get("status") == "complete" and record.get("clt_config") == cfg.to_dict() and same_train:
        return record
    return None
