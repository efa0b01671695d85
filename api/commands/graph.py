"""The CLI layer of `graph`; its other layers: `sae_atlas.api.http.routers.graph` (HTTP),
`sae_atlas.api.operations.graph` (parameter), `sae_atlas.api.results.graph` (typed-result),
`sae_atlas.api.services.graph` (service), `sae_atlas.saes.circuits.graph` (engine).

`sae-atlas graph ATLAS "prompt" --target " Tuesday"`: the attribution graph of a prediction,
written as circuit-tracer graph JSON."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sae_atlas.api.commands.common import handle_errors, open_atlas, print_json, print_table
from sae_atlas.errors import InvalidInputError


@handle_errors
def graph_command(
    atlas: Path = typer.Argument(..., help="Atlas directory."),
    text: str = typer.Argument(..., help="The prompt."),
    targets: list[str] = typer.Option(None, "--target", help="Target token (repeatable; default: the top "
                                      "predictions up to --cumulative-prob)."),
    saes: list[str] = typer.Option(None, "--sae", help="Dictionaries of the graph (repeatable; default: the "
                                   "atlas's CLT, else its transcoders, else its residual-stream SAEs)."),
    max_logits: int = typer.Option(5, help="Most logit nodes without --target (1..10)."),
    cumulative_prob: float = typer.Option(0.95, help="Logit nodes up to this probability (0, 1]."),
    node_threshold: float = typer.Option(0.8, help="Cumulative influence of the kept nodes [0, 1]."),
    edge_threshold: float = typer.Option(0.98, help="Cumulative influence of the kept edges [0, 1]."),
    supernodes: bool = typer.Option(True, help="Collapse stored circles, concept spans and lobes."),
    by_position: bool = typer.Option(False, "--by-position", help="One supernode per group and position."),
    interventions: list[str] = typer.Option(None, "--intervene", help="A node edit as JSON, e.g. "
                                            '\'{"node": "1_12_5", "kind": "ablate"}\' (repeatable).'),
    top: int = typer.Option(20, help="Influential nodes to list (1..200)."),
    freeze_mlps: bool = typer.Option(False, "--freeze-mlps", help="Transcoders at some layers only: freeze the "
                                     "other MLPs (their outputs become error nodes)."),
    clt: str = typer.Option(None, "--clt", help="Cross-layer transcoder of the graph (default: the atlas's only "
                            "CLT, if it has one)."),
    out: Path = typer.Option(Path("graph.json"), "--out", help="Where to write the graph JSON."),
    store: str = typer.Option(None, "--store", help="Also store the graph in the atlas as analyses/graph/RUN "
                              "(the explorer's Graph page shows stored graphs without the model)."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Attribution graph (circuit-tracer's method): direct effects among active features,
    errors, tokens and logits with attention and norms frozen, pruned by influence. The
    options are `api.operations.graph.GraphParams`, checked there (as `Atlas.graph` and
    `POST /graph`; tests/api/test_operation_agreement.py holds them equal)."""
    edits = []
    for item in interventions or []:
        try:
            edits.append(json.loads(item))
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"--intervene {item!r} is not valid JSON: {exc}") from exc
    result = open_atlas(atlas).graph(text, targets or None, saes=saes or None, max_logits=max_logits,
                                     cumulative_prob=cumulative_prob, node_threshold=node_threshold,
                                     edge_threshold=edge_threshold, supernodes=supernodes, by_position=by_position,
                                     interventions=edits, top=top, freeze_mlps=freeze_mlps, clt=clt)
    path = result.save(out)
    if store:
        from sae_atlas.api.services.graphs import store_graph

        store_graph(atlas, store, result)
    if json_out:
        print_json({k: v for k, v in result.to_dict().items() if k != "graph"} | {"path": str(path)})
        return
    typer.echo(str(result))
    print_table("most influential nodes", ["node", "sae_id", "latent", "token", "activation", "influence", "label"],
                [[n["node_id"], n["sae_id"], n["latent"], repr(n["token"]), n["activation"], n["influence"],
                  n["label"]] for n in result.top_nodes[:15]])
    for i in result.interventions:
        print_table(f"{i['kind']} {i['node']} (value {i['value']:g})", ["logit", "measured", "direct", "total"],
                    zip(i["tokens"], i["measured"], i["direct"], i["total"], strict=True))
    typer.echo(f"wrote {path}" + (f"; stored analyses/graph/{store} in {atlas}" if store else ""))


def register(app: typer.Typer) -> None:
    """Add the `graph` verb."""
    app.command("graph")(graph_command)
