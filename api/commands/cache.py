"""`sae-atlas cache`: cache residual-stream activations of a model over a corpus."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

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
from sae_atlas.saes.models import DEFAULT_MODEL

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
    atlas: Path = typer.Option(Path("atlas-demo"), help="Atlas directory (created if missing)."),
    model: str = typer.Option(DEFAULT_MODEL, help="Model: smollm2-135m, a HF id, a local folder or .gguf."),
    hook: list[str] = typer.Option([], help="Hook to cache (repeatable); default: resid_post at --layers spread layers."),
    layers: int = typer.Option(3, min=1, help="Number of layers spread over the depth when no --hook is given."),
    corpus: str = corpus_option(),
    text_field: str = text_field_option(),
    tokens: int = typer.Option(131072, min=1, help="Tokens to cache per hook."),
    context: int = context_option(),
    no_bos: bool = no_bos_option(),
    dtype: str = typer.Option("float32", help="Stored dtype: float32, float16 or bfloat16."),
    batch_blocks: int = batch_blocks_option(),
    shard_blocks: int = typer.Option(64, min=1, help="Blocks per shard file."),
    seed: int = typer.Option(0, help="Seed of the document order."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    device: str = device_option(),
    model_dtype: str = model_dtype_option(),
) -> None:
    """Cache activations of several hooks in one pass; re-running resumes an interrupted run.

    Under `torchrun --nproc_per_node=R -m sae_atlas cache ...` rank `k mod R` writes shard `k`
    (the same shards as one process) and rank 0 writes the manifests at the end."""
    from sae_atlas.saes.cache import cache_activations
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.devices import use_by_default
    from sae_atlas.saes.distributed import init_distributed
    from sae_atlas.saes.models import load_model

    ctx = init_distributed()
    where = use_by_default(device, model_dtype)
    handle = load_model(model, device=ctx.device(str(where)) if ctx else where)
    hooks = list(hook) or handle.default_hooks(layers)
    spec = CorpusSpec(source=corpus, text_field=text_field, context_size=context,
                      prepend_bos=not no_bos, seed=seed)
    summary = cache_activations(handle, atlas, hooks, corpus=spec, n_tokens=tokens, dtype=dtype,
                                batch_blocks=batch_blocks, shard_blocks=shard_blocks,
                                progress=not json_out, ctx=ctx)
    if ctx is not None and not ctx.is_main:
        return
    if json_out:
        print_json(summary)
    else:
        print_cache_summary(summary)


def register(app: typer.Typer) -> None:
    """Add the `cache` verb."""
    app.command("cache")(cache_command)
