"""The typed-result layer of `graph`; its other layers: `sae_atlas.api.commands.graph` (CLI),
`sae_atlas.api.http.routers.graph` (HTTP), `sae_atlas.api.operations.graph` (parameter),
`sae_atlas.api.services.graph` (service), `sae_atlas.saes.circuits.graph` (engine).

The result of `Atlas.graph`: an attribution graph, pruned, with its scores, the most
influential nodes, interventions on nodes, and the circuit-tracer graph JSON
(`saes.circuits.export`) that `save()` writes and the explorer's Graph page draws."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from typing_extensions import TypedDict

from sae_atlas.api.results.html import escape, format_value, rows_table
from sae_atlas.api.results.wire import JsonResult, Number, PythonOnly
from sae_atlas.store.atomic import atomic_write_json


class GraphTarget(TypedDict):
    """A logit node: the token, its probability and its demeaned logit."""

    token: str
    token_id: int
    prob: float
    value: Number


class GraphNode(TypedDict):
    """An influential node of the pruned graph (a feature, an error, a token or a supernode)."""

    node_id: str
    kind: str
    sae_id: str | None
    latent: int | None
    position: int
    token: str
    activation: Number
    influence: Number
    label: str


class NodeIntervention(TypedDict):
    """An edit of graph nodes and, per logit node, the measured change of its demeaned logit
    beside the graph's direct and total predictions."""

    node: str
    kind: str
    value: float
    recompute: bool
    tokens: list[str]
    measured: list[Number]
    direct: list[Number]
    total: list[Number]


class StoredGraph(TypedDict):
    """A graph stored in the atlas (`analyses/graph/<run>`): its prompt, targets and pruned size."""

    run: str
    text: str
    targets: list[str]
    kind: str
    kept_nodes: int
    kept_edges: int


@dataclass
class GraphView(JsonResult):
    """An attribution graph of one prompt (see `saes.circuits`)."""

    text: str
    tokens: list[str]
    kind: str  # transcoders | clt | residual
    linear: bool  # exact direct effects (transcoders, clt) or first-order (residual SAEs)
    dictionaries: list[str]
    targets: list[GraphTarget]
    scores: dict[str, Number]  # replacement, completeness of the full graph
    pruned_scores: dict[str, Number]  # the same after pruning
    size: dict[str, int]  # nodes / edges before and after pruning
    top_nodes: list[GraphNode]
    supernodes: list[list[str]]  # [label, node_id, ...]
    interventions: list[NodeIntervention]
    graph: dict[str, Any]  # circuit-tracer graph JSON (metadata, qParams, nodes, links)
    build_seconds: float
    circuit: PythonOnly[Any] = field(repr=False, default=None)  # saes.circuits.graph.Graph

    def save(self, path: str | Path) -> Path:
        """Write the circuit-tracer graph JSON to `path` (atomically); returns the path."""
        path = Path(path)
        atomic_write_json(path, self.graph)
        return path

    def __str__(self) -> str:
        s, p, z = self.scores, self.pruned_scores, self.size
        return (f"{self.kind} graph of {self.text!r} -> " + ", ".join(t["token"] for t in self.targets)
                + f"; nodes {z['nodes']} -> {z['kept_nodes']}, edges {z['edges']} -> {z['kept_edges']}; "
                f"replacement {s['replacement']:.3f} (pruned {p['replacement']:.3f}), "
                f"completeness {s['completeness']:.3f} (pruned {p['completeness']:.3f})")

    def _repr_html_(self) -> str:
        targets = ", ".join(f"{escape(repr(t['token']))} (p={t['prob']:.3f})" for t in self.targets)
        z = self.size
        edges = "exact direct effects" if self.linear else "first-order edges"
        head = (f"<div><b>{escape(self.kind)} attribution graph</b> ({edges}) of <i>{escape(self.text)}</i> "
                f"&rarr; {targets}</div><div>nodes {z['nodes']} &rarr; {z['kept_nodes']}, edges {z['edges']} "
                f"&rarr; {z['kept_edges']} after pruning; replacement score "
                f"{format_value(self.scores['replacement'])}, completeness {format_value(self.scores['completeness'])}"
                f" (pruned: {format_value(self.pruned_scores['replacement'])}, "
                f"{format_value(self.pruned_scores['completeness'])})</div>")
        table = rows_table(self.top_nodes[:15], ["node_id", "kind", "sae_id", "latent", "token", "activation",
                                                 "influence", "label"])
        inter = "".join(
            f"<div>{escape(i['kind'])} {escape(i['node'])}: "
            + rows_table([{"token": t, "measured": m, "direct": d, "total": o} for t, m, d, o in
                          zip(i["tokens"], i["measured"], i["direct"], i["total"], strict=True)],
                         ["token", "measured", "direct", "total"]) + "</div>" for i in self.interventions)
        return head + table + inter
