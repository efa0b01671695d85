"""`sae-atlas summarize ATLAS`: per-latent feature summaries of SAEs over held-out cached tokens, or
streamed from the model (`--from-model`, also under torchrun)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sae_atlas.api.commands.common import (
    OLD_ATLAS_OPTION,
    atlas_argument,
    handle_errors,
    main_rank,
    open_atlas,
    print_json,
    print_table,
    the_atlas,
)
from sae_atlas.api.commands.corpus_options import (
    FROM_MODEL,
    batch_blocks_option,
    context_option,
    corpus_option,
    no_bos_option,
    text_field_option,
)
from sae_atlas.api.commands.device_options import device_option, model_dtype_option

if TYPE_CHECKING:
    from sae_atlas.saes.summary.run import SummaryReport


def print_reports(reports: list[SummaryReport]) -> None:
    """One table row per summarized SAE."""
    print_table(
        "feature summaries",
        ["sae", "hook", "tokens", "latents", "dead", "examples", "logit effects", "status", "tokens/s"],
        [
            (r.sae_id, r.hook, r.n_tokens, r.n_latents, r.n_dead, r.n_examples, "yes" if r.logit_effects else "no",
             "unchanged (skipped)" if r.skipped else "written", "-" if r.skipped else round(r.tokens_per_second, 1))
            for r in reports
        ],
    )


@handle_errors
def summarize_command(
    atlas: Path | None = atlas_argument(),
    old_atlas: Path | None = OLD_ATLAS_OPTION,
    saes: list[str] = typer.Option([], "--sae", help="SAE id to summarize (repeatable); default: every SAE."),
    tokens: int = typer.Option(None, help="Held-out tokens per SAE (default: all); with --from-model, corpus tokens "
                               "to stream."),
    top_k: int = typer.Option(20, help="Top activating examples kept per latent."),
    before: int = typer.Option(16, help="Context tokens before each example's centre."),
    after: int = typer.Option(4, help="Context tokens after each example's centre."),
    seed: int = typer.Option(0, help="Seed of the activation-band sampling."),
    force: bool = typer.Option(False, "--force", help="Recompute even when matching tables exist."),
    with_model: bool = typer.Option(True, "--with-model/--no-model", help="Logit effects (--no-model: skip them, "
                                    "do not load the model)."),
    json_out: bool = typer.Option(False, "--json", help="Print the reports as JSON."),
    device: str = device_option(),
    model_dtype: str = model_dtype_option(),
    from_model: bool = typer.Option(False, "--from-model",
                                    help="Stream --tokens tokens of --corpus through the model (no cache needed)."),
    corpus: str = corpus_option(FROM_MODEL),
    text_field: str = text_field_option(FROM_MODEL),
    context: int = context_option(FROM_MODEL),
    no_bos: bool = no_bos_option(FROM_MODEL),
    corpus_seed: int = typer.Option(0, help="With --from-model: seed of the document order."),
    batch_blocks: int = batch_blocks_option(FROM_MODEL, bounded=False),
    checkpoint_every: int = typer.Option(None, help="With --from-model: batches between resumable "
                                         "checkpoints (default: one a minute)."),
) -> None:
    """Summarize SAEs: density, quantiles, histograms, top and band examples, logit effects.

    A thin call of `Atlas.summarize` (the parameters: `api.operations.build.SummarizeParams`).
    With --from-model the tokens come straight from model forwards (memory flat in --tokens,
    resumable after a kill); under `torchrun --nproc_per_node=R -m sae_atlas summarize
    --from-model ...` the ranks split the batches and rank 0 writes the merged tables."""
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.devices import use_by_default

    where = use_by_default(device, model_dtype)
    reports = open_atlas(the_atlas(atlas, old_atlas)).summarize(
        list(saes) or None, tokens=tokens, top_k=top_k, before=before, after=after, seed=seed, force=force,
        with_model=with_model, from_model=from_model, batch_blocks=batch_blocks, checkpoint_every=checkpoint_every,
        corpus=CorpusSpec(source=corpus, text_field=text_field, context_size=context, prepend_bos=not no_bos,
                          seed=corpus_seed), device=str(where), progress=not json_out)
    if not main_rank():
        return
    if json_out:
        print_json(reports)
    else:
        print_reports(reports)


def register(app: typer.Typer) -> None:
    """Add the `summarize` verb."""
    app.command("summarize")(summarize_command)
