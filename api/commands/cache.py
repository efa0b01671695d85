"""The CLI layer of `cache`; its other layers: `sae_atlas.saes.cache` (engine).

`sae-atlas cache`: cache residual-stream activations of a model over a corpus."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

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

DEFAULT_ATLAS = Path("atlas-demo")
if TYPE_CHECKING:
    from sae_atlas.saes.cache import CacheSummary


def print_cache_summary(summary: CacheSummary) -> None:
    """The cache summary as a table: tokens, hooks, shards, throughput, location."""
    status = "already complete" if summary.already_complete else (
        f"resumed from block {summary.resumed_from_blocks}" if summary.resumed_from_blocks else "fresh"
    )
    print_table(
        "activation cache",
        ["field", "value"],
        [
            ("atlas", summary.atlas),
            ("model", summary.model),
            ("hooks", ", ".join(summary.hooks)),
            ("tokens per hook", summary.n_tokens),
            ("blocks per hook", summary.n_blocks),
            ("shards (all hooks)", summary.n_shards),
            ("run", status),
            ("seconds", round(summary.seconds, 1)),
            ("tokens/s", round(summary.tokens_per_second, 1)),
        ],
    )


@handle_errors
def cache_command(
    atlas: Path | None = atlas_argument(DEFAULT_ATLAS, help="Atlas directory (created if missing)."),
    old_atlas: Path | None = OLD_ATLAS_OPTION,
    model: str = typer.Option("", help="Model: smollm2-135m, a HF id, a local folder or .gguf (default: the "
                              "atlas's, else smollm2-135m)."),
    hooks: list[str] = typer.Option([], "--hook", help="Hook to cache (repeatable); default: resid_post at --layers "
                                    "spread layers."),
    layers: int = typer.Option(3, help="Number of layers spread over the depth when no --hook is given."),
    corpus: str = corpus_option(),
    text_field: str = text_field_option(),
    tokens: int = typer.Option(131072, help="Tokens to cache per hook."),
    context: int = context_option(),
    no_bos: bool = no_bos_option(),
    dtype: str = typer.Option("float32", help="Stored dtype: float32, float16 or bfloat16."),
    batch_blocks: int = batch_blocks_option(bounded=False),
    shard_blocks: int = typer.Option(64, help="Blocks per shard file."),
    seed: int = typer.Option(0, help="Seed of the document order."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    device: str = device_option(),
    model_dtype: str = model_dtype_option(),
) -> None:
    """Cache activations of several hooks in one pass; re-running resumes an interrupted run.

    A thin call of `Atlas.cache` (the parameters: `api.operations.build.CacheParams`). Under
    `torchrun --nproc_per_node=R -m sae_atlas cache ...` rank `k mod R` writes shard `k` (the
    same shards as one process) and rank 0 writes the manifests at the end."""
    from sae_atlas.api.atlas import Atlas
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.devices import use_by_default

    where = use_by_default(device, model_dtype)
    summary = Atlas.create(the_atlas(atlas, old_atlas, DEFAULT_ATLAS), model=model or None).cache(
        list(hooks) or None, layers=layers, tokens=tokens, dtype=dtype, batch_blocks=batch_blocks,
        shard_blocks=shard_blocks, corpus=CorpusSpec(source=corpus, text_field=text_field, context_size=context,
                                                     prepend_bos=not no_bos, seed=seed),
        device=str(where), progress=not json_out)
    if not main_rank():
        return
    if json_out:
        print_json(summary)
    else:
        print_cache_summary(summary)


def register(app: typer.Typer) -> None:
    """Add the `cache` verb."""
    app.command("cache")(cache_command)
