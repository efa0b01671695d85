"""`sae-atlas train`: train one SAE per cached hook of an atlas, or (`--from-model`) every
requested SAE or transcoder from one streamed forward of the model, no cache."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import typer

from sae_atlas.api.commands.common import handle_errors, print_json, print_table
from sae_atlas.api.commands.corpus_options import (
    batch_blocks_option,
    context_option,
    corpus_option,
    no_bos_option,
    text_field_option,
)
from sae_atlas.api.commands.device_options import device_option, model_dtype_option
from sae_atlas.errors import InvalidInputError
from sae_atlas.store.layout import AtlasLayout

_FROM_MODEL = "With --from-model"
# config-file keys that mirror the command-line options (file spelling -> our name)
_CLI_KEYS = {
    "hook": "hooks", "hooks": "hooks", "arch": "architecture", "architecture": "architecture",
    "d_sae": "d_sae", "expansion": "expansion", "k": "k", "tokens": "total_tokens",
    "total_tokens": "total_tokens", "batch_size": "batch_size", "lr": "lr", "seed": "seed",
}


@functools.cache
def _train_keys() -> frozenset[str]:
    """TrainConfig's fields (imported here: the module loads no torch until a command runs)."""
    from sae_atlas.saes.train.config import TrainConfig

    return frozenset(f.name for f in dataclasses.fields(TrainConfig))


@functools.cache
def _sae_keys() -> frozenset[str]:
    """The SAEConfig fields a config file may set."""
    from sae_atlas.saes.sae.base import SAEConfig

    return frozenset(f.name for f in dataclasses.fields(SAEConfig)) - {
        "architecture", "d_in", "d_sae", "k", "model_name", "hook_name", "context_size",
        "prepend_bos", "dataset_path", "seed", "hook_name_out", "d_out",
    }


def read_config_file(path: Path) -> dict[str, Any]:
    """Options from a TOML or JSON file, keys spelled like the options (`-` or `_`)."""
    if not path.exists():
        raise InvalidInputError(f"config file {path} does not exist")
    try:
        if path.suffix == ".toml":
            import tomllib

            raw = tomllib.loads(path.read_text())
        else:
            raw = json.loads(path.read_text())
    except (ValueError, ImportError) as exc:
        raise InvalidInputError(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise InvalidInputError(f"config file {path} must hold a table/object of options")
    options = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        name = _CLI_KEYS.get(name, name)
        if name not in _CLI_KEYS.values() and name not in _train_keys() | _sae_keys():
            valid = sorted(set(_CLI_KEYS) | _train_keys() | _sae_keys())
            raise InvalidInputError(f"unknown key {key!r} in {path}; valid: {', '.join(valid)}")
        options[name] = [value] if name == "hooks" and isinstance(value, str) else value
    return options


def _one_pass_tokens(atlas: Path, hooks: list[str]) -> int:
    """Tokens in the smallest cached training split (the default run length)."""
    from sae_atlas.store.activations import ActivationReader

    return min(ActivationReader(atlas, h).count_tokens("train") for h in hooks)


@handle_errors
def train_command(
    atlas: Path = typer.Option(Path("atlas-demo"), help="Atlas directory with cached activations."),
    hook: list[str] = typer.Option([], help="Hook to train on (repeatable); default: every cached hook."),
    arch: str = typer.Option(None, help="standard, topk, batchtopk, jumprelu or matryoshka (default topk)."),
    d_sae: int = typer.Option(None, min=1, help="Dictionary size (default: --expansion x d_in)."),
    expansion: int = typer.Option(None, min=1, help="d_sae as a multiple of d_in (default 8)."),
    k: int = typer.Option(None, min=1, help="Active latents per token for topk/batchtopk/matryoshka (default 32)."),
    tokens: int = typer.Option(None, min=1, help="Training tokens (default: one pass over the cached train split, at most 2M)."),
    batch_size: int = typer.Option(None, min=1, help="Tokens per step (default 4096)."),
    lr: float = typer.Option(None, help="Adam learning rate (default 2e-4 / sqrt(d_sae / 2**14))."),
    seed: int = typer.Option(None, help="Seed of initialisation and data order (default 0)."),
    device: str = device_option(None, "Default: the config file's device, else cpu."),
    config: Path = typer.Option(None, help="TOML/JSON file with the same keys (and any TrainConfig/SAEConfig field); flags win."),
    overwrite: bool = typer.Option(False, help="Retrain SAEs that already finished with this configuration."),
    transcode: bool = typer.Option(False, help="Train transcoders: each --hook (an MLP input, e.g. "
                                   "blocks.L.ln2.hook_normalized) predicts blocks.L.hook_mlp_out, cached in the same run."),
    skip: bool = typer.Option(False, help="Transcoders with a linear skip connection (W_skip)."),
    cross_layer: bool = typer.Option(False, "--cross-layer", help="With --transcode: one cross-layer transcoder "
                                     "reading every --hook (blocks.0..L-1 of one site) and writing every later "
                                     "blocks.L.hook_mlp_out; --arch jumprelu (default) or topk."),
    json_out: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    from_model: bool = typer.Option(False, "--from-model", help="Stream the tokens through the model (one forward "
                                    "for every --hook, no cache) instead of reading cached activations."),
    model: str = typer.Option("", help=f"{_FROM_MODEL}: the model (default: the atlas's, else smollm2-135m)."),
    model_dtype: str = model_dtype_option(),
    dict_dtype: str = typer.Option("float32", help=f"{_FROM_MODEL}: autocast of the dictionaries' training: "
                                   "float32 (none), bfloat16 or float16."),
    corpus: str = corpus_option(_FROM_MODEL),
    text_field: str = text_field_option(_FROM_MODEL),
    context: int = context_option(_FROM_MODEL),
    no_bos: bool = no_bos_option(_FROM_MODEL),
    corpus_seed: int = typer.Option(0, help=f"{_FROM_MODEL}: seed of the document order."),
    batch_blocks: int = batch_blocks_option(_FROM_MODEL),
    buffer_tokens: int = typer.Option(None, min=1, help=f"{_FROM_MODEL}: tokens of the mixing buffer that shuffles "
                                      "across documents (default: 262,144, at most a quarter of free memory and the run's tokens)."),
    heldout_tokens: int = typer.Option(None, min=0, help=f"{_FROM_MODEL}: tokens after the training tokens kept "
                                       "for held-out metrics (default: a tenth of --tokens, at most 262,144)."),
    checkpoint_every: int = typer.Option(None, min=1, help="Training tokens between resumable checkpoints "
                                         "(default: a tenth of the run)."),
    distribute_modules: bool = typer.Option(False, "--distribute-modules", help="Under torchrun: each rank trains "
                                            "its own share of the dictionaries on the whole batches."),
) -> None:
    """Train SAEs (or, with --transcode, per-layer transcoders) on cached activations, or
    with --from-model from one streamed forward of the model; an interrupted run resumes
    from its checkpoints.

    Under `torchrun --nproc_per_node=N`, several hooks are split over the processes and
    a single hook is trained data-parallel; with --from-model each rank streams its own
    share of the corpus.
    """
    from sae_atlas.saes.devices import resolve_device
    from sae_atlas.saes.train.atlas import train_saes
    from sae_atlas.saes.train.config import TrainConfig
    from sae_atlas.saes.transcoders.sites import mlp_output_hook

    options = read_config_file(config) if config is not None else {}
    flags = {"hooks": list(hook) or None, "architecture": arch, "d_sae": d_sae,
             "expansion": expansion, "k": k, "total_tokens": tokens, "batch_size": batch_size,
             "lr": lr, "seed": seed, "device": device}
    options.update({key: value for key, value in flags.items() if value is not None})
    if checkpoint_every is not None:
        options["checkpoint_every_tokens"] = checkpoint_every
    options["device"] = str(resolve_device(options.get("device", TrainConfig.device)))
    if skip:
        options["skip"] = True
    if options.get("skip") and not transcode:
        raise InvalidInputError("--skip is for transcoders: add --transcode")
    if transcode and not options.get("hooks"):
        raise InvalidInputError("--transcode needs the MLP inputs to read: --hook blocks.L.ln2.hook_normalized ...")
    if cross_layer and not transcode:
        raise InvalidInputError("--cross-layer trains a cross-layer transcoder: add --transcode")
    if from_model:
        from sae_atlas.saes.corpus import CorpusSpec
        from sae_atlas.saes.train.from_model import StreamOptions

        stream = StreamOptions(CorpusSpec(source=corpus, text_field=text_field, context_size=context,
                                          prepend_bos=not no_bos, seed=corpus_seed), batch_blocks=batch_blocks,
                               buffer_tokens=buffer_tokens, heldout_tokens=heldout_tokens, dict_dtype=dict_dtype)
        if cross_layer and distribute_modules:
            raise InvalidInputError("--distribute-modules deals dictionaries to the ranks; one cross-layer transcoder "
                                    "trains data-parallel (drop --distribute-modules)")
        handle = _streamed_model(atlas, model, model_dtype, options["device"])
        if cross_layer:
            _train_clt(atlas, options, overwrite, json_out, handle=handle, stream=stream)
            return
        _train_from_model(atlas, options, handle, stream, transcode=transcode,
                          distribute="modules" if distribute_modules else "data", overwrite=overwrite,
                          json_out=json_out)
        return
    if distribute_modules:
        raise InvalidInputError("--distribute-modules is an option of --from-model (cached training deals several "
                                "hooks to the ranks by itself)")
    if cross_layer:
        _train_clt(atlas, options, overwrite, json_out)
        return
    hooks = options.pop("hooks", None) or AtlasLayout(atlas).cached_hooks()
    hook_out = {hook: mlp_output_hook(hook) for hook in hooks} if transcode else None
    if not hooks:
        raise InvalidInputError(f"no cached activations in {atlas}; run `sae-atlas cache` first")
    architecture = options.pop("architecture", "topk")
    width, expand, k_value = options.pop("d_sae", None), options.pop("expansion", None), options.pop("k", 32)
    train_opts = {key: options.pop(key) for key in list(options) if key in _train_keys()}
    train_opts.setdefault("progress", not json_out)
    if "total_tokens" not in train_opts:
        train_opts["total_tokens"] = min(TrainConfig.total_tokens, _one_pass_tokens(atlas, hooks))
    results = train_saes(
        atlas, hooks, architecture=architecture, d_sae=width, expansion=expand, k=k_value,
        sae_options=options, train_cfg=TrainConfig(**train_opts), overwrite=overwrite, hook_out=hook_out,
    )
    _print_results(results, json_out)


def _print_results(results: dict[str, dict[str, Any]], json_out: bool) -> None:
    if json_out:
        print_json(results)
        return
    print_table(
        "trained SAEs (held-out metrics)",
        ["hook", "sae_id", "d_sae", "k", "FVU", "L0", "dead", "train FVU"],
        [(h, r["sae_id"], r["d_sae"], r["k"], r["fvu"], r["l0"], r["dead_fraction"], r["train_fvu"])
         for h, r in results.items()],
    )


def _streamed_model(atlas: Path, model: str, model_dtype: str, device: str) -> Any:
    """`--from-model`'s model (the named one, else the atlas's, else the default) on this
    rank's device, its weights in `model_dtype`."""
    from sae_atlas.api.commands.common import model_of_atlas
    from sae_atlas.saes.devices import use_by_default
    from sae_atlas.saes.distributed import init_distributed

    ctx = init_distributed()
    where = use_by_default(device, model_dtype)
    return model_of_atlas(model, atlas, device=ctx.device(str(where)) if ctx else str(where))


def _train_from_model(atlas: Path, options: dict[str, Any], handle: Any, stream: Any, *, transcode: bool,
                      distribute: Any, overwrite: bool, json_out: bool) -> None:
    """`--from-model`: train SAEs (or per-layer transcoders) from the model's stream."""
    from sae_atlas.saes.distributed import init_distributed
    from sae_atlas.saes.train.config import TrainConfig
    from sae_atlas.saes.train.from_model import train_from_model

    hooks = options.pop("hooks", None)
    if not hooks:
        raise InvalidInputError("--from-model needs the hooks to train on: --hook blocks.L.hook_resid_post ...")
    architecture = options.pop("architecture", "topk")
    width, expand, k_value = options.pop("d_sae", None), options.pop("expansion", None), options.pop("k", 32)
    train_opts = {key: options.pop(key) for key in list(options) if key in _train_keys()}
    train_opts.setdefault("progress", not json_out)
    train_cfg = TrainConfig(**train_opts)
    ctx = init_distributed()
    results = train_from_model(handle, atlas, hooks, architecture=architecture, d_sae=width, expansion=expand,
                               k=k_value, sae_options=options, train_cfg=train_cfg, stream=stream,
                               transcode=transcode, distribute=distribute, overwrite=overwrite)
    if ctx is None or ctx.is_main:
        _print_results(results, json_out)


def _train_clt(atlas: Path, options: dict[str, Any], overwrite: bool, json_out: bool, *, handle: Any = None,
               stream: Any = None) -> None:
    """`--transcode --cross-layer`: train one CLT over the hooks (every layer's MLP input),
    from the cache, or from the stream of `handle` (`--from-model`)."""
    from sae_atlas.saes.distributed import init_distributed
    from sae_atlas.saes.train.config import TrainConfig
    from sae_atlas.saes.train.from_model import train_clt_from_model
    from sae_atlas.saes.transcoders.clt import CLTConfig
    from sae_atlas.saes.transcoders.clt_atlas import train_atlas_clt

    hooks = options.pop("hooks")
    architecture = options.pop("architecture", "jumprelu")
    width, expand, k_value = options.pop("d_sae", None), options.pop("expansion", None), options.pop("k", 32)
    train_opts = {key: options.pop(key) for key in list(options) if key in _train_keys()}
    train_opts.setdefault("progress", not json_out)
    if "total_tokens" not in train_opts and handle is None:
        train_opts["total_tokens"] = min(TrainConfig.total_tokens, _one_pass_tokens(atlas, hooks))
    clt_keys = {f.name for f in dataclasses.fields(CLTConfig)}
    unusable = sorted(key for key in options if key not in clt_keys)
    if unusable:
        raise InvalidInputError(f"options {unusable} do not apply to a cross-layer transcoder")
    args = {"architecture": architecture, "d_sae": width, "expansion": expand or 8, "k": k_value, "options": options,
            "train_cfg": TrainConfig(**train_opts), "overwrite": overwrite}
    record = (train_atlas_clt(atlas, hooks, **args) if handle is None
              else train_clt_from_model(handle, atlas, hooks, stream=stream, **args))
    ctx = init_distributed()
    if ctx is not None and not ctx.is_main:
        return
    if json_out:
        print_json(record)
        return
    print_table("trained cross-layer transcoder (held-out metrics)",
                ["clt_id", "layers", "d_sae", "k", "FVU", "L0", "dead", "train FVU"],
                [(record["clt_id"], record["n_layers"], record["d_sae"], record["k"], record["fvu"], record["l0"],
                  record["dead_fraction"], record["train_fvu"])])


def register(app: typer.Typer) -> None:
    """Add the `train` verb."""
    app.command("train")(train_command)
