"""The `sae-atlas` command line: one verb per job, `--help` on each."""

from __future__ import annotations

import typer

from sae_atlas.api.commands import (
    analyze_circular,
    analyze_depth,
    analyze_geometry,
    attribute,
    cache,
    compare_circle,
    demo,
    emergence,
    feature,
    import_sae,
    index,
    register,
    search,
    serve,
    steer,
    steer_bench,
    steering_scores,
    steering_search,
    summarize,
    train,
)
from sae_atlas.api.commands import compare as compare_verb
from sae_atlas.api.commands import eval as eval_command
from sae_atlas.api.commands import graph as graph_verb

app = typer.Typer(
    name="sae-atlas",
    help="Sparse autoencoders, feature search and feature geometry over transformer residual streams.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
analyze_app = typer.Typer(help="Geometry analyses over an atlas.", no_args_is_help=True)
app.add_typer(analyze_app, name="analyze")

for module in (cache, train, eval_command, import_sae, summarize, index, register, demo, serve, feature, search, steer,
               attribute, steering_scores, steering_search, steer_bench, compare_circle,
               emergence):
    module.register(app)
compare_verb.register(app)
graph_verb.register(app)
analyze_circular.register_analyze(analyze_app)
analyze_geometry.register_analyze(analyze_app)
analyze_depth.register_analyze(analyze_app)

