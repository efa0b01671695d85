"""The service layer of `train`; its other layers: `sae_atlas.api.commands.train` (CLI),
`sae_atlas.api.operations.train` (parameter).

Training over an atlas's context (`Atlas.train`, `sae-atlas train`): SAEs, per-layer
transcoders or a cross-layer transcoder from the atlas's caches (`saes.train.train_saes`,
`saes.transcoders.clt_atlas`), or with `from_model` every requested dictionary from one
streamed forward of the context's model (`saes.train_from_model`; with `model_b`, model B
loaded as `train-crosscoder --model-b` loads it runs on the same tokens), whose crosscoders are
then stored as `train-crosscoder` stores one (relative decoder norms under
`analyses/crosscoder/<id>`)."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.train import TrainParams
from sae_atlas.api.services.build import run_model
from sae_atlas.api.services.crosscoder import KIND as CROSSCODER_KIND
from sae_atlas.api.services.crosscoder import model_b_spec, relative_norm_table
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.compare.crosscoder import SideScales, crosscoder_dir, read_crosscoder_sides
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.devices import resolve_device
from sae_atlas.saes.distributed import init_distributed
from sae_atlas.saes.formats.saelens import load_saelens
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.train_saes import train_saes
from sae_atlas.saes.train_from_model import StreamOptions, train_clt_from_model, train_from_model
from sae_atlas.saes.transcoders.clt import CLTConfig
from sae_atlas.saes.transcoders.clt_atlas import train_atlas_clt
from sae_atlas.saes.transcoders.sites import mlp_output_hook
from sae_atlas.store.activations import ActivationReader
from sae_atlas.store.analysis_runs import write_analysis

# `config` keys spelled as the parameters (or as the CLI options) -> the run's own names
_PARAM_KEYS = {"hook": "hooks", "hooks": "hooks", "arch": "architecture", "architecture": "architecture",
               "d_sae": "d_sae", "expansion": "expansion", "k": "k", "tokens": "total_tokens",
               "total_tokens": "total_tokens", "batch_size": "batch_size", "lr": "lr", "seed": "seed",
               "skip": "skip", "checkpoint_every": "checkpoint_every_tokens"}
# SAEConfig fields a run sets itself (from the hooks, the model and the parameters)
_DERIVED = {"architecture", "d_in", "d_sae", "k", "model_name", "hook_name", "context_size", "prepend_bos",
            "dataset_path", "seed", "hook_name_out", "d_out"}


@functools.cache
def _train_keys() -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(TrainConfig))


@functools.cache
def _sae_keys() -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(SAEConfig)) - _DERIVED


def settings(params: TrainParams, device: str | None) -> dict[str, Any]:
    """The run's settings by their run names: `params.config` (InvalidInputError naming an
    unknown key), then the parameters given (they win), the device resolved."""
    options: dict[str, Any] = {}
    for key, value in (params.config or {}).items():
        name = _PARAM_KEYS.get(key.replace("-", "_"), key.replace("-", "_"))
        if name not in set(_PARAM_KEYS.values()) | _train_keys() | _sae_keys():
            valid = sorted(set(_PARAM_KEYS) | _train_keys() | _sae_keys())
            raise InvalidInputError(f"unknown key {key!r} in the training settings (config); valid: {', '.join(valid)}")
        options[name] = [value] if name == "hooks" and isinstance(value, str) else value
    given = {"hooks": params.hooks, "architecture": params.arch, "d_sae": params.d_sae,
             "expansion": params.expansion, "k": params.k, "total_tokens": params.tokens,
             "batch_size": params.batch_size, "lr": params.lr, "seed": params.seed,
             "checkpoint_every_tokens": params.checkpoint_every, "skip": params.skip or None}
    options.update({key: value for key, value in given.items() if value is not None})
    options["device"] = str(resolve_device(device or options.get("device") or TrainConfig.device))
    return options


def _check(params: TrainParams, options: dict[str, Any]) -> None:
    """InvalidInputError for parameters that do not go together (named as the CLI's options,
    the same names with `_` in Python)."""
    if options.get("skip") and not params.transcode:
        raise InvalidInputError("--skip is for transcoders: add --transcode")
    if params.transcode and not options.get("hooks"):
        raise InvalidInputError("--transcode needs the MLP inputs to read: --hook blocks.L.ln2.hook_normalized ...")
    if params.cross_layer and not params.transcode:
        raise InvalidInputError("--cross-layer trains a cross-layer transcoder: add --transcode")
    if params.crosscoders and not params.from_model:
        raise InvalidInputError("--crosscoder trains from the model's stream: add --from-model (`train-crosscoder` "
                                "trains one on its own)")
    if params.model_b is not None and not params.crosscoders:
        raise InvalidInputError("--model-b is side B of crosscoders: add --crosscoder HOOK_A,HOOK_B (HOOK_B of "
                                "model B) and --from-model")
    if params.crosscoders and params.cross_layer:
        raise InvalidInputError("a cross-layer transcoder trains alone: train the --crosscoder pairs in another run")
    if params.distribute_modules and not params.from_model:
        raise InvalidInputError("--distribute-modules is an option of --from-model (cached training deals several "
                                "hooks to the ranks by itself)")
    if params.distribute_modules and params.cross_layer:
        raise InvalidInputError("--distribute-modules deals dictionaries to the ranks; one cross-layer transcoder "
                                "trains data-parallel (drop --distribute-modules)")


def _pop_dictionary(options: dict[str, Any], default_arch: str) -> dict[str, Any]:
    """The architecture, width and k of the run's dictionaries, and its TrainConfig."""
    architecture = options.pop("architecture", default_arch)
    width, expansion, k = options.pop("d_sae", None), options.pop("expansion", None), options.pop("k", 32)
    train = {key: options.pop(key) for key in list(options) if key in _train_keys()}
    return {"architecture": architecture, "d_sae": width, "expansion": expansion, "k": k, "train": train}


def _one_pass_tokens(root: Path, hooks: list[str]) -> int:
    """Tokens in the smallest cached training split (the default run length)."""
    return min(ActivationReader(root, h).count_tokens("train") for h in hooks)


def run_train(ctx: AtlasContext, params: TrainParams, *, corpus: CorpusSpec | None, device: str | None,
              progress: bool) -> dict[str, dict[str, Any]]:
    """Train what `params` asks for (see `TrainParams`); returns every dictionary's record:
    SAEs and transcoders by hook, crosscoders and a cross-layer transcoder by id. Under
    torchrun every rank calls this; rank 0 writes atlas.json."""
    options = settings(params, device)
    _check(params, options)
    try:
        if params.cross_layer:
            return _train_clt(ctx, params, options, corpus, progress)
        if params.from_model:
            return _train_streamed(ctx, params, options, corpus, progress)
        return _train_cached(ctx, params, options, progress)
    finally:
        ctx.reread_meta()


def _train_cached(ctx: AtlasContext, params: TrainParams, options: dict[str, Any],
                  progress: bool) -> dict[str, dict[str, Any]]:
    hooks = options.pop("hooks", None) or ctx.layout.cached_hooks()
    if not hooks:
        raise InvalidInputError(f"no cached activations in {ctx.root}; run `sae-atlas cache` first")
    run = _pop_dictionary(options, "topk")
    train = run["train"]
    train.setdefault("progress", progress)
    if "total_tokens" not in train:
        train["total_tokens"] = min(TrainConfig.total_tokens, _one_pass_tokens(ctx.root, hooks))
    hook_out = {hook: mlp_output_hook(hook) for hook in hooks} if params.transcode else None
    return train_saes(ctx.root, hooks, architecture=run["architecture"], d_sae=run["d_sae"],
                      expansion=run["expansion"], k=run["k"], sae_options=options,
                      train_cfg=TrainConfig(**train), overwrite=params.overwrite, hook_out=hook_out)


def _stream(params: TrainParams, corpus: CorpusSpec | None) -> StreamOptions:
    return StreamOptions(corpus or CorpusSpec(), batch_blocks=params.batch_blocks, dict_dtype=params.dict_dtype,
                         buffer_tokens=params.buffer_tokens, heldout_tokens=params.heldout_tokens)


def _train_streamed(ctx: AtlasContext, params: TrainParams, options: dict[str, Any], corpus: CorpusSpec | None,
                    progress: bool) -> dict[str, dict[str, Any]]:
    hooks = options.pop("hooks", None) or []
    run = _pop_dictionary(options, "topk")
    run["train"].setdefault("progress", progress)
    handle, _ = run_model(ctx, run["train"]["device"])
    model_b = ctx.model_of(model_b_spec(params.model_b), str(handle.device)) if params.model_b is not None else None
    stream = _stream(params, corpus)
    records = ctx.run_locked(lambda: train_from_model(
        handle, ctx.root, hooks, architecture=run["architecture"], d_sae=run["d_sae"], expansion=run["expansion"],
        k=run["k"], sae_options=options, train_cfg=TrainConfig(**run["train"]), stream=stream,
        transcode=params.transcode, crosscoders=[tuple(pair) for pair in params.crosscoders or []], model_b=model_b,
        distribute="modules" if params.distribute_modules else "data", overwrite=params.overwrite))
    dist = init_distributed()
    if dist is None or dist.is_main:
        for record in records.values():
            if record.get("kind") == "crosscoder":
                _store_crosscoder(ctx.root, record, stream.corpus)
    return records


def _store_crosscoder(root: Path, record: dict[str, Any], corpus: CorpusSpec) -> None:
    """A streamed crosscoder's relative decoder norms as `analyses/crosscoder/<id>`, with the
    parameters `train-crosscoder` records."""
    cc_id = record["sae_id"]
    folder = crosscoder_dir(root, cc_id)
    stored = read_crosscoder_sides(folder)
    scales = SideScales(int(stored["d_a"]), float(stored["scale_a"]), float(stored["scale_b"]))
    table, summary = relative_norm_table(load_saelens(folder), scales,
                                         {"fvu": record["train_fvu"], "l0": record["train_l0"]})
    parameters = {**stored["sides"], "d_sae": record["d_sae"], "k": record["k"], "n_tokens": record["tokens"],
                  "corpus": dataclasses.asdict(corpus), "folder": f"crosscoders/{cc_id}", "from_model": True}
    write_analysis(root, CROSSCODER_KIND, cc_id, parameters=parameters,
                   summary={**summary, "heldout_fvu": record["fvu"]}, tables={"main": table})


def _train_clt(ctx: AtlasContext, params: TrainParams, options: dict[str, Any], corpus: CorpusSpec | None,
               progress: bool) -> dict[str, dict[str, Any]]:
    """One CLT over the hooks (every layer's MLP input), from the cache or the stream."""
    hooks = options.pop("hooks")
    run = _pop_dictionary(options, "jumprelu")
    train = run["train"]
    train.setdefault("progress", progress)
    if "total_tokens" not in train and not params.from_model:
        train["total_tokens"] = min(TrainConfig.total_tokens, _one_pass_tokens(ctx.root, hooks))
    clt_keys = {f.name for f in dataclasses.fields(CLTConfig)}
    if unusable := sorted(key for key in options if key not in clt_keys):
        raise InvalidInputError(f"settings {unusable} do not apply to a cross-layer transcoder")
    args = {"architecture": run["architecture"], "d_sae": run["d_sae"], "expansion": run["expansion"] or 8,
            "k": run["k"], "options": options,
            "train_cfg": TrainConfig(**train), "overwrite": params.overwrite}
    if not params.from_model:
        record = train_atlas_clt(ctx.root, hooks, **args)
    else:
        handle, _ = run_model(ctx, train["device"])
        record = ctx.run_locked(lambda: train_clt_from_model(handle, ctx.root, hooks, stream=_stream(params, corpus),
                                                             **args))
    return {record["clt_id"]: record}
