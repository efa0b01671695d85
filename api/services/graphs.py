"""Stored attribution graphs: a `GraphView` kept as the analysis run `analyses/graph/<run>`.

The run's main table is the graph's most influential nodes (what the Geometry page lists),
`nodes` holds each circuit-tracer node as its JSON (node dicts differ in their keys),
`links` the pruned edges, and the run's summary everything else of the view (prompt,
targets, scores, sizes, supernodes, the graph's metadata and qParams). Every file is
verified on read (`store.analysis_runs`), so a damaged graph is named, never drawn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from sae_atlas.api.results.graph import GraphView, StoredGraph
from sae_atlas.store.analysis_runs import list_runs, read_analysis, write_analysis
from sae_atlas.store.layout import check_id

KIND = "graph"
GRAPH_PARTS = ("nodes", "links")


def store_graph(root: str | Path, run: str, view: GraphView) -> Path:
    """Write `view` as `analyses/graph/<run>`; returns the run's JSON path."""
    data = view.to_dict()
    graph = data.pop("graph")
    top = pl.DataFrame(data["top_nodes"], infer_schema_length=None) if data["top_nodes"] else pl.DataFrame()
    nodes = pl.DataFrame({"node_id": [str(n["node_id"]) for n in graph["nodes"]],
                          "json": [json.dumps(n) for n in graph["nodes"]]}, schema={"node_id": pl.String, "json": pl.String})
    links = pl.DataFrame({"source": [str(e["source"]) for e in graph["links"]],
                          "target": [str(e["target"]) for e in graph["links"]],
                          "weight": [float(e["weight"]) for e in graph["links"]]},
                         schema={"source": pl.String, "target": pl.String, "weight": pl.Float64})
    summary = {**data, "graph": {key: value for key, value in graph.items() if key not in GRAPH_PARTS}}
    return write_analysis(root, KIND, check_id(run, "graph run name"), parameters={"text": view.text},
                          summary=summary, tables={"main": top, "nodes": nodes, "links": links})


def stored_graphs(root: str | Path) -> list[StoredGraph]:
    """Each stored graph's run, prompt, targets and pruned size (files verified)."""
    rows: list[StoredGraph] = []
    for run in list_runs(root, KIND):
        summary = read_analysis(root, KIND, run).meta["summary"]
        size = summary["size"]
        rows.append(StoredGraph(run=run, text=summary["text"], targets=[t["token"] for t in summary["targets"]],
                                kind=summary["kind"], kept_nodes=size["kept_nodes"], kept_edges=size["kept_edges"]))
    return rows


def stored_graph(root: str | Path, run: str) -> dict[str, Any]:
    """One stored graph as `GraphView.to_dict()` gave it (NotFoundError lists the runs)."""
    stored = read_analysis(root, KIND, run)
    view = dict(stored.meta["summary"])
    graph = dict(view.pop("graph"))
    graph["nodes"] = [json.loads(text) for text in stored.tables["nodes"]["json"].to_list()]
    graph["links"] = stored.tables["links"].to_dicts()
    return {**view, "graph": graph}
