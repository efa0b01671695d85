"""The HTTP layer of `graph`; its other layers: `sae_atlas.api.commands.graph` (CLI),
`sae_atlas.api.operations.graph` (parameter), `sae_atlas.api.results.graph` (typed-result),
`sae_atlas.api.services.graph` (service), `sae_atlas.saes.circuits.graph` (engine).

`POST /graph`: the attribution graph of a prompt's next token (circuit-tracer's method),
pruned, scored, with supernodes and node interventions; `GET /graphs` and `GET /graphs/{run}`:
the graphs stored in the atlas (`sae-atlas graph ... --store RUN`), read without the model.

`POST /graph` is off unless the server was started with `--allow-interventions` (403 otherwise), bounded
like the other interventions (`api.bounds`: prompt characters and graph tokens, logit
nodes, active features, node edits) and run on the worker's one-thread model queue."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import ConfigDict

from sae_atlas.api.http.deps import AtlasDep, ModelQueueDep, SettingsDep
from sae_atlas.api.http.json_body import json_body
from sae_atlas.api.http.routers.interventions import _queued, require_interventions
from sae_atlas.api.http.routers.params import DATA_ERRORS, Run, error_responses
from sae_atlas.api.http.schemas import ErrorBody
from sae_atlas.api.operations.graph import GraphParams
from sae_atlas.api.results.graph import GraphView, StoredGraph
from sae_atlas.api.services.graphs import stored_graph, stored_graphs
from sae_atlas.store.layout import check_id

router = APIRouter(tags=["interventions"], responses=DATA_ERRORS)
GRAPH_BOUND = {400: {"model": ErrorBody, "description": (
    "input that only the model, the atlas or the graph can judge: a prompt of more tokens than a graph takes, "
    "a target that is not one token of the vocabulary or names a token twice, a node edit naming no feature node "
    "or supernode of this graph, a supernode naming a dictionary the graph is not over, more active features than "
    "a graph takes, SAE ids that do not make one graph "
    "(transcoders beside residual SAEs, two at one hook) or none of the atlas's several CLTs chosen")}}


ONE_KIND_OF_DICTIONARY = {"not": {"required": ["saes", "clt"], "properties": {
    "saes": {"type": "array", "minItems": 1}, "clt": {"type": "string"}}}}
"""The schema of a graph request names SAEs (`saes`) or a CLT (`clt`), not both (the
service refuses both with a 400 naming the two)."""


class GraphRequest(GraphParams):
    """An attribution graph of the next token after `text` (`api.operations.graph.GraphParams`;
    the old field names `sae_ids` and `target` are still accepted)."""

    model_config = ConfigDict(json_schema_extra=ONE_KIND_OF_DICTIONARY)


@router.post("/graph", summary="Attribution graph of the next token (circuit-tracer graph JSON inside)",
             response_model=GraphView, responses={**error_responses(403, 404, 413), **GRAPH_BOUND})
async def post_graph(atlas: AtlasDep, settings: SettingsDep, queue: ModelQueueDep, body: GraphRequest) -> Response:
    require_interventions(settings)
    return await _queued(queue, lambda: atlas.graph(**dict(body)))


@router.get("/graphs", summary="The attribution graphs stored in the atlas (`sae-atlas graph ... --store RUN`)",
            response_model=list[StoredGraph])
def get_graphs(atlas: AtlasDep) -> Response:
    return json_body(stored_graphs(atlas.root))


@router.get("/graphs/{run}", summary="One stored attribution graph (files verified)", response_model=GraphView,
            responses=error_responses(400, 404))
def get_graph(atlas: AtlasDep, run: str = Run) -> Response:
    return json_body(stored_graph(atlas.root, check_id(run, "graph run name")))
