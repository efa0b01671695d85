"""The CLI layer of `feature`; its other layers: `sae_atlas.api.results.feature` (typed-result).

`sae-atlas feature ATLAS SAE_ID INDEX`: one feature's card on the command line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sae_atlas.api.commands.common import (
    console,
    handle_errors,
    open_atlas,
    print_json,
    print_table,
)

if TYPE_CHECKING:
    from sae_atlas.api.results.feature import Feature


def print_feature(feature: Feature) -> None:
    """Stats, top examples (centre token bracketed), logit effects and neighbours as tables."""
    s = feature.stats
    console.rule(f"[bold]{feature.sae_id} / feature {feature.index}[/] ({feature.hook})")
    if feature.label:
        console.print(f"label: {feature.label}", markup=False)
    print_table("stats", ["field", "value"], [(k, s[k]) for k in
                ("n_active", "density", "mean_act", "mean_active_act", "max_act", "decoder_norm")])
    rows = []
    for e in feature.examples:
        tokens = [f"[{t}]" if i == e["centre"] else t for i, t in enumerate(e["tokens"])]
        rows.append((e["act"], " ".join(tokens)))
    print_table("top examples", ["act", "context"], rows)
    print_table("logit effects", ["promotes", "+", "suppresses", "-"], [
        (p["token"], p["value"], n["token"], n["value"])
        for p, n in zip(feature.top_logits, feature.bottom_logits, strict=False)
    ])
    if feature.neighbours is not None:
        print_table("similar features", ["latent", "cosine", "label"],
                    [(n["latent"], n["cosine"], n.get("label") or "") for n in feature.neighbours])
    if feature.cross_layer is not None:
        print_table("cross-layer", ["sae_id", "latent", "cosine", "label"],
                    [(n["sae_id"], n["latent"], n["cosine"], n.get("label") or "") for n in feature.cross_layer])


@handle_errors
def feature_command(
    atlas: Path = typer.Argument(..., help="Atlas directory."),
    sae_id: str = typer.Argument(..., help="SAE id (see `sae-atlas search saes`)."),
    index: int = typer.Argument(..., help="Latent index."),
    examples: int = typer.Option(10, help="Top examples to show (1..50)."),
    neighbours: int = typer.Option(8, help="Similar features to show (1..100)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one feature: stats, top examples, logit effects, neighbours, cross-layer matches.
    The options are `api.operations.pages.FeaturePageParams`, checked there."""
    feature = open_atlas(atlas).feature(sae_id, index, examples=examples, neighbours=neighbours)
    if json_out:
        print_json(feature.to_dict())
    else:
        print_feature(feature)


def register(app: typer.Typer) -> None:
    """Add the `feature` verb."""
    app.command("feature")(feature_command)
