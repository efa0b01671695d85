"""`sae-atlas summarize`: per-latent feature summaries of SAEs over held-out cached tokens, or
streamed from the model (`--from-model`, also under torchrun)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from sae_atlas.api.commands.common import (
    chosen_saes,
    console,
    handle_errors,
    open_atlas,
    print_json,
    print_table,
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
from sae_atlas.store.errors import AtlasError, InvalidInputError
from sae_atlas.store.layout import AtlasLayout

if TYPE_CHECKING:
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.summary.accumulator import SummaryParams
    from sae_atlas.saes.summary.run import SummaryReport


def _model_tensors(layout: AtlasLayout) -> dict[str, Any]:
    """Unembedding, final norm and tokenizer of the atlas' model, or {} (with a warning)."""
    from sae_atlas.saes.models import load_model

    spec = layout.read_meta().get("model") if layout.atlas_json.exists() else None
    if spec is None:
        typer.secho("no model recorded in atlas.json: summarizing without logit effects", fg="yellow", err=True)
        return {}
    try:
        handle = load_model(spec)
    except AtlasError as exc:
        typer.secho(f"cannot load model {spec!r} ({exc}): summarizing without logit effects",
                    fg="yellow", err=True)
        return {}
    return {
        "W_U": handle.W_U.detach(),
        "final_norm_weight": handle.final_norm_weight,
        "norm_kind": handle.final_norm_kind,
        "tokenizer": handle.tokenizer,
    }


def build_offline_labels(atlas: Path, reports: list[SummaryReport]) -> None:
    """Store the offline labels of the SAEs whose tables were kept (written tables carry
    their labels, stored with them under the summary lock)."""
    kept = [r.sae_id for r in reports if r.skipped]
    if kept:
        open_atlas(atlas).build_labels(kept)


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
    atlas: Path = typer.Option(..., help="Atlas directory."),
    sae: list[str] = typer.Option([], help="SAE id to summarize (repeatable); default: every SAE."),
    tokens: int = typer.Option(None, min=1, help="Held-out tokens per SAE (default: all); with --from-model, corpus tokens to stream."),
    top_k: int = typer.Option(20, min=1, help="Top activating examples kept per latent."),
    before: int = typer.Option(16, min=0, help="Context tokens before each example's centre."),
    after: int = typer.Option(4, min=0, help="Context tokens after each example's centre."),
    seed: int = typer.Option(0, help="Seed of the activation-band sampling."),
    force: bool = typer.Option(False, "--force", help="Recompute even when matching tables exist."),
    no_model: bool = typer.Option(False, "--no-model", help="Skip logit effects (do not load the model)."),
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
    batch_blocks: int = batch_blocks_option(FROM_MODEL),
    checkpoint_every: int = typer.Option(None, min=1, help="With --from-model: batches between resumable "
                                         "checkpoints (default: one a minute)."),
) -> None:
    """Summarize SAEs: density, quantiles, histograms, top and band examples, logit effects.

    With --from-model the tokens come straight from model forwards (memory flat in
    --tokens, resumable after a kill); under `torchrun --nproc_per_node=R -m sae_atlas summarize
    --from-model ...` the ranks split the batches and rank 0 writes the merged tables."""
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.devices import use_by_default
    from sae_atlas.saes.summary.accumulator import SummaryParams
    from sae_atlas.saes.summary.run import summarize_sae

    layout = AtlasLayout(atlas)
    ids = chosen_saes(layout, sae)
    if from_model:
        _summarize_from_model(layout, ids, tokens, CorpusSpec(source=corpus, text_field=text_field,
                              context_size=context, prepend_bos=not no_bos, seed=corpus_seed),
                              SummaryParams(top_k=top_k, window_before=before, window_after=after, seed=seed),
                              device=device, model_dtype=model_dtype, batch_blocks=batch_blocks,
                              checkpoint_every=checkpoint_every, force=force, with_logits=not no_model,
                              json_out=json_out)
        return
    use_by_default(device, model_dtype)
    model = {} if no_model else _model_tensors(layout)
    reports = []
    for sae_id in ids:
        if not json_out:
            console.print(f"summarizing {sae_id}")
        reports.append(summarize_sae(atlas, sae_id, n_tokens=tokens, top_k=top_k, window=(before, after),
                                     seed=seed, force=force, progress=not json_out, **model))
    build_offline_labels(atlas, reports)
    if json_out:
        print_json(reports)
    else:
        print_reports(reports)


def _summarize_from_model(layout: AtlasLayout, ids: list[str], tokens: int | None, corpus: CorpusSpec,
                          params: SummaryParams, *, device: str, model_dtype: str, batch_blocks: int,
                          checkpoint_every: int | None, force: bool, with_logits: bool, json_out: bool) -> None:
    """The --from-model path, on one process or as one torchrun rank."""
    from sae_atlas.saes.devices import use_by_default
    from sae_atlas.saes.distributed import init_distributed
    from sae_atlas.saes.models import load_model
    from sae_atlas.saes.summary.stream import summarize_from_model

    if tokens is None:
        raise InvalidInputError("--from-model needs --tokens (how many corpus tokens to stream)")
    spec = layout.read_meta().get("model") if layout.atlas_json.exists() else None
    if spec is None:
        raise InvalidInputError(f"{layout.atlas_json} records no model; --from-model needs the atlas's model")
    ctx = init_distributed()
    where = use_by_default(device, model_dtype)
    handle = load_model(spec, device=ctx.device(str(where)) if ctx else where)
    reports = summarize_from_model(handle, layout.root, ids, corpus=corpus, n_tokens=tokens, params=params,
                                   batch_blocks=batch_blocks, checkpoint_every=checkpoint_every,
                                   with_logits=with_logits, progress=not json_out, force=force, ctx=ctx)
    if ctx is not None and not ctx.is_main:
        return
    build_offline_labels(layout.root, reports)
    if json_out:
        print_json(reports)
    else:
        print_reports(reports)


def register(app: typer.Typer) -> None:
    """Add the `summarize` verb."""
    app.command("summarize")(summarize_command)
