"""Examples in `/openapi.json` taken from the served atlas, so that every operation can be
called (by a reader, or by schemathesis) with data that reaches a real SAE, feature, token
and analysis run: an SAE that is served, its first latent, a token its summaries name, a
stored run and its figure, a stored graph, and request bodies of each kind built from them
(a graph over the atlas's cross-layer transcoder and one over its SAEs). Nothing is added
for what the atlas lacks (no SAE served, no summaries, no stored run, no CLT)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.http.routers.graph import GraphRequest
from sae_atlas.api.http.routers.interventions import AttributeRequest, RunRequest, SteerRequest
from sae_atlas.api.http.routers.steering import SteeringQuery
from sae_atlas.api.http.schemas import CircularRequest, TextQuery, VectorQuery
from sae_atlas.api.http.schemas_meaning import ConceptQuery, ContrastQuery
from sae_atlas.api.services.graphs import stored_graphs
from sae_atlas.errors import AtlasError
from sae_atlas.saes.eval.results import stored_evals

TEXT = "the cat sat on the mat"


@dataclass(frozen=True)
class AtlasSample:
    """What the examples name: one served SAE and its width, a token of its summaries (string
    and id), and one stored run with a figure (each None when the atlas has none)."""

    sae_id: str | None = None
    d_in: int | None = None
    token: str | None = None
    token_id: int | None = None
    kind: str | None = None
    run: str | None = None
    figure: str | None = None
    eval_name: str | None = None
    comparison: str | None = None
    crosscoder: str | None = None
    clt: str | None = None
    graph: str | None = None
    depth_run: str | None = None


def atlas_sample(atlas: Atlas) -> AtlasSample:
    """The first served SAE (with a token its summaries promote and its first stored eval),
    the first stored run that is served and has a figure, the first stored comparison, the
    first stored crosscoder, the first cross-layer transcoder, the first stored graph and the
    first depth run that is served."""
    served = [row for row in atlas.saes().to_dicts() if row.get("status") == "ok"]
    runs = [row for row in atlas.analyses().to_dicts() if row["status"] == "ok" and row["figures"]]
    sae = served[0] if served else {}
    run = runs[0] if runs else {}
    token, token_id = _summary_token(atlas, sae["sae_id"]) if sae else (None, None)
    evals = stored_evals(atlas.root, sae["sae_id"]) if sae else []
    comparisons = atlas.comparisons()
    crosscoders = atlas.crosscoders()
    depth = [row["run"] for row in atlas.depth_runs() if row["status"] == "ok"]
    return AtlasSample(sae_id=sae.get("sae_id"), d_in=sae.get("d_in"), token=token, token_id=token_id,
                       kind=run.get("kind"), run=run.get("run"), figure=run["figures"][0] if run else None,
                       eval_name=evals[0] if evals else None,
                       comparison=comparisons[0]["run"] if comparisons else None,
                       crosscoder=crosscoders[0]["crosscoder"] if crosscoders else None,
                       clt=atlas.clt_ids[0] if atlas.clt_ids else None,
                       graph=_first_graph(atlas), depth_run=depth[0] if depth else None)


def _first_graph(atlas: Atlas) -> str | None:
    """The first stored graph's run, or None (also when a stored graph is damaged)."""
    try:
        graphs = stored_graphs(atlas.root)
    except AtlasError:
        return None
    return graphs[0]["run"] if graphs else None


def _summary_token(atlas: Atlas, sae_id: str) -> tuple[str | None, int | None]:
    """The first token the SAE's first latent promotes (from its summaries), or Nones."""
    try:
        first = atlas.features(sae_id)[0]
    except AtlasError:  # not summarized
        return None, None
    tokens, ids = first["top_logit_tokens"], first["top_logit_ids"]
    return (tokens[0], int(ids[0])) if tokens and ids else (None, None)


def parameter_examples(sample: AtlasSample) -> dict[tuple[str, ...], Any]:
    """An example of each parameter that names something in the atlas, by location and name,
    or by path, location and name where paths give one name different meanings."""
    examples = {("path", "sae_id"): sample.sae_id, ("query", "sae_id"): sample.sae_id,
                ("query", "saes"): [sample.sae_id] if sample.sae_id else None,
                ("path", "index"): 0 if sample.sae_id else None, ("query", "token"): sample.token,
                ("path", "token_id"): sample.token_id, ("path", "kind"): sample.kind, ("path", "run"): sample.run,
                ("path", "name"): sample.figure, ("path", "eval_name"): sample.eval_name,
                ("path", "comparison"): sample.comparison, ("path", "crosscoder"): sample.crosscoder,
                ("/graphs/{run}", "path", "run"): sample.graph, ("/depth/{run}", "path", "run"): sample.depth_run}
    return {key: value for key, value in examples.items() if value is not None}


def body_examples(sample: AtlasSample) -> dict[type[BaseModel], list[dict[str, Any]]]:
    """Example bodies of each request (those that name an SAE only when one is served, a
    CLT only when the atlas has one)."""
    graph = {"text": TEXT, "max_logits": 2}
    examples: dict[type[BaseModel], list[dict[str, Any]]] = {
        TextQuery: [{"text": TEXT, "k": 3}],
        ContrastQuery: [{"texts_a": ["the cat sat", "a cat ran"], "texts_b": ["the dog sat", "a dog ran"],
                         "k": 3, "n_permutations": 100}],
        ConceptQuery: [{"concept": "weekdays", "max_features": 2}],
        AttributeRequest: [{"text": TEXT, "target": {"kind": "loss"}, "top": 5, "verify": 1}],
        GraphRequest: [graph | {"clt": sample.clt} if sample.clt else graph],
    }
    if sample.sae_id is None:
        return examples
    sae = sample.sae_id
    steer = {"kind": "steer", "sae": sae, "feature": 0, "alpha": 2.0}
    return examples | {
        TextQuery: [{"text": TEXT, "saes": [sae], "k": 3}],
        VectorQuery: [{"vector": [1.0] * int(sample.d_in or 1), "saes": [sae], "k": 3}],
        ConceptQuery: [{"concept": "weekdays", "saes": [sae], "max_features": 2}],
        CircularRequest: [{"sae_id": sae, "max_tokens": 256}],
        RunRequest: [{"text": TEXT, "edits": [steer], "saes": [sae], "k": 3}],
        SteerRequest: [{"text": TEXT, "edits": [steer], "max_new_tokens": 4}],
        AttributeRequest: [{"text": TEXT, "target": {"kind": "loss"}, "saes": [sae], "top": 5, "verify": 1}],
        GraphRequest: [*examples[GraphRequest], graph | {"saes": [sae]}] if sample.clt else examples[GraphRequest],
        SteeringQuery: [{"target": sample.token or "the", "saes": [sae], "k": 3, "n_prompts": 4,
                         "candidates": 4}],
    }


def add_examples(document: dict[str, Any], atlas: Atlas) -> None:
    """Put the atlas's examples into an OpenAPI `document`: on each parameter the atlas
    names (`parameter_examples`) and on each request body's schema (`body_examples`)."""
    sample = atlas_sample(atlas)
    by_name = parameter_examples(sample)
    for path, operations in document.get("paths", {}).items():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                key = (parameter["in"], parameter["name"])
                example = by_name.get((path, *key), by_name.get(key))
                if example is not None:
                    parameter["schema"]["examples"] = [example]
    schemas = document.get("components", {}).get("schemas", {})
    for model, bodies in body_examples(sample).items():
        if model.__name__ in schemas:
            schemas[model.__name__]["examples"] = bodies
