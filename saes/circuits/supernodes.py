"""Supernodes: groups of feature nodes collapsed into one node with summed edges.

A group names latents of the graph's dictionaries, e.g. the features of a stored circle,
concept span or co-occurrence lobe (`store.geometry_records` records, read by the api
layer); every active node of those latents joins the supernode, at every position or one
supernode per position. Edges into and out of a supernode are the sums of its members'
edges; edges between members disappear (as circuit-tracer's frontend draws them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.circuits.graph import Graph

Group = list[tuple[str, int]]  # (dictionary id, latent)


@dataclass
class Supernode:
    """A label and the graph nodes it collapses."""

    label: str
    members: list[int]


def supernodes(graph: Graph, groups: dict[str, Group], *, by_position: bool = False) -> list[Supernode]:
    """One supernode per group (or per group and position) holding the group's active
    feature nodes; groups with no active node are left out. InvalidInputError for an
    unknown dictionary; a node already in an earlier supernode stays there."""
    f = graph.features
    taken: set[int] = set()
    out = []
    for label, group in groups.items():
        wanted = torch.zeros(len(f), dtype=torch.bool)
        for sid, latent in group:
            if sid not in graph.dictionaries:
                raise InvalidInputError(f"supernode {label!r} names {sid!r}, which is not in the graph; "
                                        f"dictionaries: {graph.dictionaries}")
            wanted |= (f.dictionary == graph.dictionaries.index(sid)) & (f.latent == latent)
        members = [i for i in wanted.nonzero()[:, 0].tolist() if i not in taken]
        if not members:
            continue
        if by_position:
            for p in sorted({int(f.pos[i]) for i in members}):
                out.append(Supernode(f"{label} @{p}", [i for i in members if int(f.pos[i]) == p]))
        else:
            out.append(Supernode(label, members))
        taken.update(members)
    return out


@dataclass
class Collapsed:
    """The adjacency with supernodes: `nodes[j]` lists the original nodes of new node `j`
    (one for a plain node), `labels[j]` its supernode label or None."""

    adjacency: torch.Tensor
    nodes: list[list[int]]
    labels: list[str | None]

    def index_of(self, original: int) -> int:
        """The new node holding original node `original`."""
        return next(j for j, members in enumerate(self.nodes) if original in members)


def collapse(graph: Graph, groups: list[Supernode]) -> Collapsed:
    """`graph.adjacency` with each supernode's members merged: `A' = P A P^T`, `P` the
    membership matrix, the supernodes' self-edges set to zero."""
    in_group = {i: g for g, s in enumerate(groups) for i in s.members}
    nodes: list[list[int]] = [s.members for s in groups]
    labels: list[str | None] = [s.label for s in groups]
    for i in range(graph.n_nodes):
        if i not in in_group:
            nodes.append([i])
            labels.append(None)
    P = torch.zeros(len(nodes), graph.n_nodes, dtype=graph.adjacency.dtype)
    for j, members in enumerate(nodes):
        P[j, members] = 1
    A = P @ graph.adjacency @ P.T
    A[torch.arange(len(groups)), torch.arange(len(groups))] = 0
    return Collapsed(A, nodes, labels)
