"""`POST /graph`: the attribution graph of a prompt's next token (circuit-tracer's method),
pruned, scored, with supernodes and node interventions; `GET /graphs` and `GET /graphs/{run}`:
the graphs stored in the atlas (`sae-atlas graph ... --store RUN`), read without the model.

`POST /graph` is off unless the server was started with `--allow-interventions` (403 otherwise), bounded
like the other interventions (`api.bounds`: prompt characters and graph tokens, logit
nodes, active features, node edits) and run on the worker's one-thread model queue."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import ConfigDict, Field

from sae_atlas.api.bounds import MAX_GRAPH_NODE_EDITS, MAX_GRAPH_TARGETS, MAX_SAES_PER_QUERY
from sae_atlas.api.http.deps import AtlasDep, ModelQueueDep, SettingsDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.interventions import _queued, _Request, require_interventions
from sae_atlas.api.http.routers.params import DATA_ERRORS, Run, error_responses
from sae_atlas.api.http.schemas import ErrorBody, JsonInt, SafeId, _Strict
from sae_atlas.api.results.graph import GraphView, StoredGraph
from sae_atlas.api.services.graphs import stored_graph, stored_graphs
from sae_atlas.store.layout import check_id

router = APIRouter(tags=["interventions"], responses=DATA_ERRORS)
GRAPH_BOUND = {400: {"model": ErrorBody, "description": (
    "input that only the model, the atlas or the graph can judge: a prompt of more tokens than a graph takes, "
    "a target that is not one token of the vocabulary or names a token twice, a node edit naming no feature node "
    "or supernode of this graph, more active features than a graph takes, SAE ids that do not make one graph "
    "(transcoders beside residual SAEs, two at one hook) or none of the atlas's several CLTs chosen")}}


class NodeEditRequest(_Strict):
    """An edit of one graph node (a feature node id such as `1_12_5`, or a supernode label)."""

    node: str = Field(min_length=1, max_length=300)
    kind: Literal["ablate", "clamp", "steer"] = "ablate"
    value: float = Field(default=0.0, ge=-1e6, le=1e6, description="clamp: the activation; steer: added to it")
    recompute: bool = Field(default=True, description="downstream features re-encode (false: they stay fixed)")


ONE_KIND_OF_DICTIONARY = {"not": {"required": ["sae_ids", "clt"], "properties": {
    "sae_ids": {"type": "array", "minItems": 1}, "clt": {"type": "string"}}}}
"""The schema of a graph request names SAEs (`sae_ids`) or a CLT (`clt`), not both (the
service refuses both with a 400 naming the two)."""


class GraphRequest(_Request):
    """An attribution graph of the next token after `text`."""

    model_config = ConfigDict(json_schema_extra=ONE_KIND_OF_DICTIONARY)

    targets: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        default=None, max_length=MAX_GRAPH_TARGETS, description="target tokens (default: the top predictions)")
    sae_ids: list[SafeId] | None = Field(default=None, max_length=MAX_SAES_PER_QUERY,
                                         description="dictionaries (default: the transcoders, else residual SAEs)")
    max_logits: JsonInt = Field(default=5, ge=1, le=MAX_GRAPH_TARGETS)
    cumulative_prob: float = Field(default=0.95, gt=0.0, le=1.0)
    node_threshold: float = Field(default=0.8, ge=0.0, le=1.0)
    edge_threshold: float = Field(default=0.98, ge=0.0, le=1.0)
    supernodes: bool = Field(default=True, description="collapse stored circles, concept spans and lobes")
    by_position: bool = Field(default=False, description="one supernode per group and position")
    interventions: list[NodeEditRequest] = Field(default_factory=list, max_length=MAX_GRAPH_NODE_EDITS)
    top: JsonInt = Field(default=20, ge=1, le=200, description="influential nodes to list")
    freeze_mlps: bool = Field(default=False, description="transcoders at some layers only: the other MLPs frozen "
                              "(their outputs are error nodes)")
    clt: SafeId | None = Field(default=None, description="cross-layer transcoder of the graph (default: the atlas's "
                               "only CLT, if it has one)")


@router.post("/graph", summary="Attribution graph of the next token (circuit-tracer graph JSON inside)",
             response_model=GraphView, responses={**error_responses(403, 404, 413), **GRAPH_BOUND})
async def post_graph(atlas: AtlasDep, settings: SettingsDep, queue: ModelQueueDep, body: GraphRequest) -> Response:
    require_interventions(settings)
    return await _queued(queue, lambda: atlas.graph(
        body.text, body.targets or None, sae_ids=body.sae_ids or None, max_logits=body.max_logits,
        cumulative_prob=body.cumulative_prob, node_threshold=body.node_threshold, edge_threshold=body.edge_threshold,
        supernodes="geometry" if body.supernodes else None, by_position=body.by_position,
        interventions=[e.model_dump() for e in body.interventions], top=body.top, freeze_mlps=body.freeze_mlps,
        clt=body.clt))


@router.get("/graphs", summary="The attribution graphs stored in the atlas (`sae-atlas graph ... --store RUN`)",
            response_model=list[StoredGraph])
def get_graphs(atlas: AtlasDep) -> Response:
    return json_body(stored_graphs(atlas.root))


@router.get("/graphs/{run}", summary="One stored attribution graph (files verified)", response_model=GraphView,
            responses=error_responses(400, 404))
def get_graph(atlas: AtlasDep, run: str = Run) -> Response:
    return json_body(stored_graph(atlas.root, check_id(run, "graph run name")))
