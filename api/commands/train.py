"""The CLI layer of `train`; its other layers: `sae_atlas.api.operations.train` (parameter),
`sae_atlas.api.services.train` (service).

`sae-atlas train`: train one SAE per cached hook of an atlas, or (`--from-model`) every
requested SAE, transcoder and crosscoder from one streamed forward of the model, no cache.
A thin call of `Atlas.train` (the parameters: `api.operations.train.TrainParams`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from sae_atlas.api.commands.common import (
    OLD_ATLAS_OPTION,
    atlas_argument,
    handle_errors,
    main_rank,
    print_json,
    print_table,
    the_atlas,
)
from sae_atlas.api.commands.corpus_options import (
    batch_blocks_option,
    context_option,
    corpus_option,
    no_bos_option,
    text_field_option,
)
from sae_atlas.api.commands.device_options import device_option, model_dtype_option
from sae_atlas.errors import InvalidInputError

_FROM_MODEL = "With --from-model"
DEFAULT_ATLAS = Path("atlas-demo")


def read_config_file(path: Path) -> dict[str, Any]:
    """The settings of a TOML or JSON file (keys spelled like the options, `-` or `_`;
    `Atlas.train` checks them)."""
    if not path.exists():
        raise InvalidInputError(f"config file {path} does not exist")
    try:
        if path.suffix == ".toml":
            import tomllib

            raw = tomllib.loads(path.read_text())
        else:
            raw = json.loads(path.read_text())
    except ValueError as exc:
        raise InvalidInputError(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise InvalidInputError(f"config file {path} must hold a table/object of options")
    return raw


def _pairs(values: list[str]) -> list[tuple[str, str]] | None:
    """`--crosscoder HOOK_A,HOOK_B` values as pairs (InvalidInputError for another shape)."""
    pairs = []
    for value in values:
        parts = [part.strip() for part in value.split(",")]
        if len(parts) != 2 or not all(parts):
            raise InvalidInputError(f"--crosscoder takes two hooks of the model as HOOK_A,HOOK_B, got {value!r}")
        pairs.append((parts[0], parts[1]))
    return pairs or None


@handle_errors
def train_command(
    atlas: Path | None = atlas_argument(DEFAULT_ATLAS, help="Atlas directory (created by --from-model if missing)."),
    old_atlas: Path | None = OLD_ATLAS_OPTION,
    hooks: list[str] = typer.Option([], "--hook", help="Hook to train on (repeatable); default: every cached hook."),
    arch: str = typer.Option(None, help="standard, topk, batchtopk, jumprelu or matryoshka (default topk; "
                             "jumprelu with --cross-layer)."),
    d_sae: int = typer.Option(None, help="Dictionary size (default: --expansion x d_in)."),
    expansion: int = typer.Option(None, help="d_sae as a multiple of d_in (default 8)."),
    k: int = typer.Option(None, help="Active latents per token for topk/batchtopk/matryoshka and crosscoders "
                          "(default 32)."),
    tokens: int = typer.Option(None, help="Training tokens (default: one pass over the cached train split, at "
                               "most 2M; 2M with --from-model)."),
    batch_size: int = typer.Option(None, help="Tokens per step (default 4096)."),
    lr: float = typer.Option(None, help="Adam learning rate (default 2e-4 / sqrt(d_sae / 2**14))."),
    seed: int = typer.Option(None, help="Seed of initialisation and data order (default 0)."),
    device: str = device_option(None, "Default: the config file's device, else cpu."),
    config: Path = typer.Option(None, help="TOML/JSON file with the same keys (and any TrainConfig/SAEConfig "
                                "field); flags win."),
    overwrite: bool = typer.Option(False, help="Retrain dictionaries that already finished with this configuration."),
    transcode: bool = typer.Option(False, help="Train transcoders: each --hook (an MLP input, e.g. "
                                   "blocks.L.ln2.hook_normalized) predicts blocks.L.hook_mlp_out (cached in the "
                                   "same run, or streamed)."),
    skip: bool = typer.Option(False, help="Transcoders with a linear skip connection (W_skip)."),
    cross_layer: bool = typer.Option(False, "--cross-layer", help="With --transcode: one cross-layer transcoder "
                                     "reading every --hook (blocks.0..L-1 of one site) and writing every later "
                                     "blocks.L.hook_mlp_out; --arch jumprelu (default) or topk."),
    crosscoders: list[str] = typer.Option([], "--crosscoder", metavar="HOOK_A,HOOK_B",
                                          help=f"{_FROM_MODEL}: a crosscoder of two hooks of the model, trained in "
                                          "the same forward (repeatable; HOOK_B of --model-b when given)."),
    model_b: str = typer.Option(None, help=f"{_FROM_MODEL} and --crosscoder: model B (smollm2-135m, a Hugging Face "
                                "id or folder, a .gguf, tiny JSON), run on the same tokens; every HOOK_B is its "
                                "hook. Same tokenizer needed (else `train-crosscoder --model-b`)."),
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
    batch_blocks: int = batch_blocks_option(_FROM_MODEL, bounded=False),
    buffer_tokens: int = typer.Option(None, help=f"{_FROM_MODEL}: tokens of the mixing buffer that shuffles "
                                      "across documents (default: 262,144, at most a quarter of free memory and "
                                      "the run's tokens)."),
    heldout_tokens: int = typer.Option(None, help=f"{_FROM_MODEL}: tokens after the training tokens kept for "
                                       "held-out metrics (default: a tenth of --tokens, at most 262,144)."),
    checkpoint_every: int = typer.Option(None, help="Training tokens between resumable checkpoints (default: a "
                                         "tenth of the run)."),
    distribute_modules: bool = typer.Option(False, "--distribute-modules", help="With --from-model under torchrun: "
                                            "each rank trains its own share of the dictionaries on the whole "
                                            "batches."),
) -> None:
    """Train SAEs (or, with --transcode, per-layer transcoders) on cached activations, or
    with --from-model from one streamed forward of the model; an interrupted run resumes
    from its checkpoints.

    A thin call of `Atlas.train`. Under `torchrun --nproc_per_node=N`, several hooks are
    split over the processes and a single hook is trained data-parallel; with --from-model
    each rank streams its own share of the corpus.
    """
    from sae_atlas.api.atlas import Atlas
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.devices import use_by_default
    from sae_atlas.saes.train.config import TrainConfig

    settings = read_config_file(config) if config is not None else None
    device = device or (settings or {}).get("device") or TrainConfig.device
    where = str(use_by_default(device, model_dtype)) if from_model else device
    records = Atlas.create(the_atlas(atlas, old_atlas, DEFAULT_ATLAS), model=model or None).train(
        list(hooks) or None, arch=arch, d_sae=d_sae, expansion=expansion, k=k, tokens=tokens, batch_size=batch_size,
        lr=lr, seed=seed, transcode=transcode, skip=skip, cross_layer=cross_layer, crosscoders=_pairs(crosscoders),
        model_b=model_b, from_model=from_model, dict_dtype=dict_dtype, batch_blocks=batch_blocks,
        buffer_tokens=buffer_tokens, heldout_tokens=heldout_tokens, checkpoint_every=checkpoint_every,
        distribute_modules=distribute_modules, overwrite=overwrite, config=settings,
        corpus=CorpusSpec(source=corpus, text_field=text_field, context_size=context, prepend_bos=not no_bos,
                          seed=corpus_seed),
        device=where, progress=not json_out)
    if not main_rank():
        return
    if cross_layer:
        _print_clt(next(iter(records.values())), json_out)
    elif json_out:
        print_json(records)
    else:
        print_table(
            "trained dictionaries (held-out metrics)",
            ["hook", "id", "d_sae", "k", "FVU", "L0", "dead", "train FVU"],
            [(r["hook"] + (f" + {r['hook_b']}" if r.get("kind") == "crosscoder" else ""), r["sae_id"], r["d_sae"],
              r["k"], r["fvu"], r["l0"], r["dead_fraction"], r["train_fvu"]) for r in records.values()],
        )


def _print_clt(record: dict[str, Any], json_out: bool) -> None:
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
