"""`sae-atlas steering-scores`: per feature, what steering with it does to the next token
(output scores, KL, promoted and suppressed tokens), stored as `saes/<id>/steering.parquet`."""

from __future__ import annotations

from pathlib import Path

import typer

from sae_atlas.api.commands.common import (
    OLD_ATLAS_OPTION,
    atlas_argument,
    chosen_saes,
    console,
    handle_errors,
    print_json,
    print_table,
    the_atlas,
)
from sae_atlas.api.commands.device_options import device_option
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.intervene.steering_params import SteeringParams
from sae_atlas.store.layout import AtlasLayout

DEFAULTS = SteeringParams()


@handle_errors
def steering_scores_command(
    atlas: Path | None = atlas_argument(),
    saes: list[str] = typer.Option(None, "--sae", help="SAE to score (repeatable; default: every SAE)."),
    n_prompts: int = typer.Option(DEFAULTS.n_prompts, "--n-prompts", "--prompts",
                                  help="Neutral prompts from the built-in corpus."),
    prompt_tokens: int = typer.Option(DEFAULTS.prompt_tokens, help="Tokens per prompt (BOS included)."),
    strength: float = typer.Option(DEFAULTS.strength, help="Steering strength: alpha = strength x the feature's "
                                   "mean active value."),
    seed: int = typer.Option(DEFAULTS.seed, help="Seed of the prompt draw."),
    top_k: int = typer.Option(DEFAULTS.top_k, help="Promoted and suppressed tokens kept per feature."),
    chunk: int = typer.Option(DEFAULTS.chunk, help="Features per batch and per resumable chunk."),
    lens_z: float = typer.Option(DEFAULTS.lens_z, help="Cheap screen first: measure only live features whose "
                                 "decoder's logit-lens peak has this z-score over the vocabulary (0: every "
                                 "feature)."),
    force: bool = typer.Option(False, "--force", help="Recompute tables that are current (same parameters and "
                               "weights)."),
    device: str = device_option(),
    json_out: bool = typer.Option(False, "--json", help="Print the reports as JSON."),
    old_atlas: Path | None = OLD_ATLAS_OPTION,
) -> None:
    """Steer every feature at the last token of neutral prompts and store its output score
    (Arad et al. 2025); a killed run resumes after its last finished chunk, and a current
    table (same parameters, same weights) is kept unless --force. Under
    `torchrun --nproc_per_node=R -m sae_atlas steering-scores ...` the ranks take the chunks in
    turn and rank 0 writes the tables and prints. The options are
    `api.operations.steering.SteeringScoresParams`, checked there (as `Atlas.steering_scores`)."""
    from sae_atlas.api.atlas import Atlas
    from sae_atlas.api.operations.steering import SteeringScoresParams
    from sae_atlas.saes.devices import resolve_device
    from sae_atlas.saes.distributed import init_distributed
    from sae_atlas.saes.models import load_model

    atlas = the_atlas(atlas, old_atlas)
    options = {"saes": saes or None, "n_prompts": n_prompts, "prompt_tokens": prompt_tokens, "strength": strength,
               "seed": seed, "top_k": top_k, "chunk": chunk, "lens_z": lens_z, "force": force}
    SteeringScoresParams.of(**options)  # refused before the model loads
    where = resolve_device(device)  # a device this machine lacks is refused before anything else
    layout = AtlasLayout(atlas)
    chosen_saes(layout, saes or [])  # named and checked before the model loads
    spec = layout.read_meta().get("model") if layout.atlas_json.exists() else None
    if spec is None:
        raise InvalidInputError(f"{layout.atlas_json} records no model; steering scores need the atlas's model")
    ctx = init_distributed()
    handle = load_model(spec, device=ctx.device(str(where)) if ctx else where)
    reports = Atlas(atlas, model=handle).steering_scores(**options, progress=not json_out, dist=ctx)
    if ctx is not None and not ctx.is_main:
        return
    if json_out:
        print_json(reports)
        return
    for r in reports:
        if r.current:
            console.print(f"{r.sae_id}: steering table is current (same parameters and weights), kept; "
                          "--force recomputes it", soft_wrap=True)
    print_table("steering scores", ["sae", "latents", "measured", "chunks computed", "chunks resumed", "table"],
                [(r.sae_id, r.n_latents, r.measured, r.chunks_computed, r.chunks_resumed, r.path) for r in reports])


def register(app: typer.Typer) -> None:
    """Add the `steering-scores` verb."""
    app.command("steering-scores")(steering_scores_command)
