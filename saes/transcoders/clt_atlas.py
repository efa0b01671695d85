"""Train a cross-layer transcoder on an atlas's caches and record it in atlas.json.

The CLT reads the MLP inputs given as hooks (`blocks.0.<site>` .. `blocks.{L-1}.<site>`,
every layer from 0, one site) and writes every `blocks.l.hook_mlp_out`; all 2L hooks must
have been cached in one `sae-atlas cache` run. Its id is `clt-<site>-<architecture>-<F>`
and its folder `clts/<id>/` (`saes.transcoders.clt_store`); a finished CLT with the same
configuration is not trained again unless `overwrite`, an interrupted one resumes. Under
torchrun the ranks train it data-parallel (`train_clt`) and rank 0 writes and registers it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sae_atlas.saes.distributed import barrier, init_distributed
from sae_atlas.saes.train.checkpoint import remove_checkpoints
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.transcoders.clt import CLTArchitecture, CLTConfig
from sae_atlas.saes.transcoders.clt_data import CLTReader
from sae_atlas.saes.transcoders.clt_store import CFG_FILE, clt_record, register_clt
from sae_atlas.saes.transcoders.clt_train import TRAINING_FILE, train_clt
from sae_atlas.saes.transcoders.sites import MLP_OUT, check_mlp_input
from sae_atlas.store.atomic import read_json
from sae_atlas.store.errors import InvalidInputError, UnknownHookError
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


def train_atlas_clt(
    root: str | Path, hooks: list[str], *, architecture: CLTArchitecture = "jumprelu", d_sae: int | None = None,
    expansion: int = 8, k: int | None = 32, options: dict[str, Any] | None = None, train_cfg: TrainConfig | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train (or resume, or find finished) the CLT reading `hooks` and record it in
    atlas.json under `clts`; returns its record. `options` holds other `CLTConfig` fields
    (`l0_coefficient`, `jumprelu_bandwidth`, ...)."""
    layout = AtlasLayout(root)
    site = clt_input_site(hooks)
    outputs = [f"blocks.{layer}.{MLP_OUT}" for layer in range(len(hooks))]
    missing = [h for h in hooks + outputs if h not in layout.cached_hooks()]
    if missing:
        raise UnknownHookError(f"hooks {missing} are not cached in {root}; cache every MLP input and output in one "
                               f"run (cached: {', '.join(layout.cached_hooks()) or 'none'})")
    reader = CLTReader(root, hooks, outputs)
    corpus = reader.manifest.get("extra", {}).get("corpus", {})
    train_cfg = train_cfg or TrainConfig()
    cfg = CLTConfig(architecture=architecture, n_layers=len(hooks), d_model=reader.d,
                    d_sae=d_sae or expansion * reader.d, k=k if architecture == "topk" else None,
                    model_name=reader.model, input_site=site, output_site=MLP_OUT, context_size=reader.context_size,
                    dataset_path=str(corpus.get("source", "")), seed=train_cfg.seed, **(options or {}))
    clt_id = check_id(f"clt-{site}-{architecture}-{cfg.d_sae}", "CLT id")
    folder = layout.clt_dir(clt_id)
    ctx = init_distributed()
    record = None if overwrite else _finished(folder, cfg, train_cfg)
    if record is None:
        if overwrite and (ctx is None or ctx.is_main):
            for name in (CFG_FILE, TRAINING_FILE):
                (folder / name).unlink(missing_ok=True)
            remove_checkpoints(folder)
        elif not overwrite and (folder / TRAINING_FILE).exists():
            raise InvalidInputError(f"CLT {clt_id!r} already exists with a different configuration; pass "
                                    "overwrite=True (`--overwrite`) to replace it")
        barrier(ctx)  # rank 0 cleared an overwritten CLT before any rank looks for checkpoints
        B, seed = train_cfg.batch_size, train_cfg.seed
        n_heldout = min(HELDOUT_TOKENS, reader.count_tokens("heldout"))
        heldout = next(reader.batches(n_heldout, seed=seed, split="heldout"), None) if n_heldout else None
        record = train_clt(cfg, lambda skip: reader.batches(B, seed=seed, split="train", repeat=True,
                                                            skip_batches=skip),
                           train_cfg, out_dir=folder, eval_rows=heldout, ctx=ctx).record
    heldout_metrics = record.get("heldout_metrics") or {}
    entry = clt_record(clt_id, cfg, heldout_metrics, tokens=record["train_config"]["total_tokens"],
                       train_fvu=record["final_metrics"].get("fvu"), train_l0=record["final_metrics"].get("l0"),
                       dead_fraction=heldout_metrics.get("dead_fraction"))
    if ctx is None or ctx.is_main:
        register_clt(root, entry)
    barrier(ctx)
    return entry


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
