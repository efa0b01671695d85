"""Every operation with its parameter object and where it is offered: the `Atlas` method,
the CLI verb and the HTTP route whose body is the object (`tests/api/test_operation_agreement.py`
walks them); and, named one by one, the operations not converted yet."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sae_atlas.api.operations.analyses import (
    CircleConceptParams,
    CircularParams,
    CrystalsParams,
    GalaxyParams,
    HierarchyParams,
    LobesParams,
    MapBuildParams,
    ProbeParams,
)
from sae_atlas.api.operations.build import (
    CacheParams,
    DemoParams,
    IndexParams,
    LabelsParams,
    SummarizeParams,
)
from sae_atlas.api.operations.compare import CompareOptions
from sae_atlas.api.operations.concept import ConceptSearchParams
from sae_atlas.api.operations.concepts_across import CircleTransferParams, EmergenceParams
from sae_atlas.api.operations.crosscoder import CrosscoderParams, LatentScalingParams
from sae_atlas.api.operations.depth import DepthParams
from sae_atlas.api.operations.evals import EvalParams
from sae_atlas.api.operations.graph import GraphParams
from sae_atlas.api.operations.importing import ExplanationsParams, ImportParams, RegisterParams
from sae_atlas.api.operations.interventions import AttributeParams, RunParams, SteerParams
from sae_atlas.api.operations.operation import Operation
from sae_atlas.api.operations.pages import (
    CrosscoderLatentParams,
    CrosscoderLatentsParams,
    ExamplesParams,
    FeaturePageParams,
    MapParams,
)
from sae_atlas.api.operations.search import (
    ContrastParams,
    FlowParams,
    GeometrySearchParams,
    LabelSearchParams,
    SimilarParams,
    TextSearchParams,
    TokenSearchParams,
    VectorSearchParams,
)
from sae_atlas.api.operations.steering import (
    SteerBenchParams,
    SteeringScoresParams,
    SteeringSearchParams,
)
from sae_atlas.api.operations.train import TrainParams

ROTATE = {"kind": "rotate", "circle": "none"}
"""An edit that names no SAE (for the examples of steer, which needs one)."""


@dataclass(frozen=True)
class Surfaces:
    """One operation: its parameters and the three places that take them."""

    params: type[Operation]
    python: str
    """The `Atlas` method."""
    cli: tuple[str, ...] | None
    """The verb (a sub-verb as two words), None when the CLI does not offer it."""
    http: tuple[str, str] | None
    """(method, path) of the route whose body (POST) or query parameters (GET) are `params`,
    None when HTTP does not offer it."""
    cli_arguments: tuple[str, ...] = ()
    """Parameters the verb takes as positional arguments (after the atlas)."""
    cli_only: tuple[str, ...] = ("json_out",)
    """Options of the verb that are not the operation's: its output (`--json`, `--out`) and
    where the model runs (`--device`)."""
    http_narrowed: tuple[str, ...] = ()
    """Parameters HTTP bounds more tightly than Python (to keep one request cheap, or to
    take no server file)."""
    python_only: tuple[str, ...] = ()
    """Keywords of the `Atlas` method that are not the operation's: what it runs on (the other
    atlas and its SAE, the corpus, the device)."""
    http_absent: tuple[str, ...] = ()
    """Parameters HTTP does not take (what writes to the atlas: a server does not write)."""
    example: dict[str, object] = field(default_factory=dict)
    """Values of the required parameters (and Python-only keywords), for calls that check the
    bounds; "{atlas}" stands for the atlas the check runs on, "{sae}" for its first SAE (a
    route's path parameters take the values of the same names, else 0)."""
    cli_atlas: str = ""
    """How the verb takes the atlas: "" as its first argument, else this option (`--atlas`)."""
    cli_example: tuple[str, ...] = ()
    """Arguments of the verb that are not parameters, after the atlas ("{atlas}" as above)."""


OPERATIONS: tuple[Surfaces, ...] = (
    Surfaces(GraphParams, "graph", ("graph",), ("POST", "/graph"), cli_arguments=("text",),
             cli_only=("out", "store", "json_out"), example={"text": "the cat sat"}),
    Surfaces(TextSearchParams, "search_text", ("search", "text"), ("POST", "/search/text"), cli_arguments=("text",),
             cli_only=("json_out", "device", "model_dtype"), example={"text": "the cat sat"}),
    Surfaces(ContrastParams, "contrast", ("search", "contrast"), ("POST", "/search/contrast"),
             cli_arguments=("texts_a", "texts_b"), http_narrowed=("texts_a", "texts_b", "n_permutations"),
             example={"texts_a": ["the cat sat", "a cat ran"], "texts_b": ["the dog sat", "a dog ran"]}),
    Surfaces(ConceptSearchParams, "concept_search", ("search", "concept"), ("POST", "/search/concept"),
             cli_arguments=("concept",), http_narrowed=("concept",), http_absent=("save",),
             example={"concept": "weekdays"}),
    Surfaces(CompareOptions, "compare", ("compare",), None, python_only=("other", "sae", "other_sae", "corpus", "device"),
             cli_only=("side_a", "side_b", "corpus", "text_field", "context", "no_bos", "top", "json_out", "device",
                       "model_dtype"), example={"other": "{atlas}"}, cli_example=("{atlas}",)),
    Surfaces(EmergenceParams, "emergence", ("emergence",), None, python_only=("members", "device"),
             cli_only=("members", "json_out", "device", "model_dtype"), example={"members": ["a", "b"]},
             cli_example=("{atlas}:a", "{atlas}:b")),
    Surfaces(CircleTransferParams, "compare_circle", ("compare-circle",), None,
             python_only=("other", "sae", "other_sae", "device"),
             cli_only=("side_a", "side_b", "json_out", "device", "model_dtype"),
             example={"circle": "circular/none"}, cli_example=("--circle", "circular/none")),
    Surfaces(CrosscoderParams, "train_crosscoder", ("train-crosscoder",), None,
             python_only=("corpus", "device", "progress"),
             cli_only=("corpus", "text_field", "context", "json_out", "device", "model_dtype"),
             example={"hook_a": "x", "hook_b": "y"}, cli_example=("--hook-a", "x", "--hook-b", "y")),
    Surfaces(LatentScalingParams, "latent_scaling", ("latent-scaling",), None, python_only=("corpus", "device"),
             cli_only=("corpus", "text_field", "context", "json_out", "device", "model_dtype"),
             example={"cc_id": "x"}, cli_example=("--id", "x")),
    Surfaces(CircularParams, "run_circular", ("analyze", "circular", "discover"), ("POST", "/analyses/circular"),
             cli_only=("top", "json_out"), http_narrowed=("max_tokens",), example={"sae_id": "x"},
             cli_example=("--sae", "x")),
    Surfaces(CircleConceptParams, "circle_concept", ("analyze", "circular", "concept"), None),
    Surfaces(HierarchyParams, "analyze_hierarchy", ("analyze", "hierarchy"), None),
    Surfaces(ProbeParams, "analyze_probe", ("analyze", "probe"), None, example={"hooks": ["blocks.0.hook_resid_post"]},
             cli_example=("--hooks", "blocks.0.hook_resid_post")),
    Surfaces(CrystalsParams, "analyze_crystals", ("analyze", "crystals"), None),
    Surfaces(LobesParams, "analyze_lobes", ("analyze", "lobes"), None, example={"sae_id": "x"},
             cli_example=("--sae", "x")),
    Surfaces(GalaxyParams, "analyze_galaxy", ("analyze", "galaxy"), None),
    Surfaces(MapBuildParams, "build_maps", ("analyze", "map"), None),
    Surfaces(EvalParams, "eval", ("eval",), None, python_only=("corpus", "device", "progress"),
             cli_only=("corpus", "context", "json_out", "device", "model_dtype")),
    Surfaces(VectorSearchParams, "search_vector", ("search", "vector"), ("POST", "/search/vector"),
             cli_arguments=("vector",), example={"vector": [1.0]}),
    Surfaces(TokenSearchParams, "search_token", ("search", "token"), ("GET", "/search/token"),
             cli_arguments=("token",), cli_only=("as_id", "json_out"), example={"token": "the"}),
    Surfaces(LabelSearchParams, "search_labels", ("search", "labels"), ("GET", "/search/labels"),
             cli_arguments=("query",), cli_only=("rebuild", "import_path", "source", "json_out"),
             example={"query": "cat"}),
    Surfaces(GeometrySearchParams, "geometry_features", ("search", "geometry"), ("GET", "/search/geometry"),
             cli_only=("rebuild", "json_out")),
    Surfaces(SimilarParams, "similar", ("search", "similar"), ("GET", "/saes/{sae_id}/features/{index}/similar"),
             python_only=("sae_id", "index"), cli_only=("sae_id", "index", "json_out"),
             example={"sae_id": "{sae}", "index": 0}, cli_example=("{sae}", "0")),
    Surfaces(FlowParams, "flow", ("search", "flow"), ("GET", "/saes/{sae_id}/features/{index}/flow"),
             python_only=("sae_id", "index"), cli_only=("sae_id", "index", "json_out"),
             example={"sae_id": "{sae}", "index": 0}, cli_example=("{sae}", "0")),
    Surfaces(FeaturePageParams, "feature", ("feature",), ("GET", "/saes/{sae_id}/features/{index}"),
             python_only=("sae_id", "index"), cli_only=("sae_id", "index", "json_out"),
             example={"sae_id": "{sae}", "index": 0}, cli_example=("{sae}", "0")),
    Surfaces(FeaturePageParams, "compared_feature", None, ("GET", "/compare/{comparison}/{side}/features/{index}"),
             python_only=("run", "side", "index"), example={"run": "none", "side": "a", "index": 0}),
    Surfaces(ExamplesParams, "examples", None, ("GET", "/saes/{sae_id}/features/{index}/examples"),
             python_only=("sae_id", "index"), example={"sae_id": "{sae}", "index": 0}),
    Surfaces(MapParams, "map", None, ("GET", "/saes/{sae_id}/map"), python_only=("sae_id",),
             example={"sae_id": "{sae}"}),
    Surfaces(CrosscoderLatentsParams, "crosscoder_latents", ("search", "crosscoder"),
             ("GET", "/crosscoders/{crosscoder}/latents"), python_only=("crosscoder",),
             cli_only=("crosscoder", "latent", "k", "json_out"), example={"crosscoder": "none"}, cli_example=("none",)),
    Surfaces(CrosscoderLatentParams, "crosscoder_latent", ("search", "crosscoder"),
             ("GET", "/crosscoders/{crosscoder}/latents/{index}"), python_only=("crosscoder", "latent"),
             cli_only=("crosscoder", "latent", "latent_class", "sort", "descending", "offset", "limit", "json_out"),
             example={"crosscoder": "none", "latent": 0}, cli_example=("none", "--latent", "0")),
    Surfaces(TrainParams, "train", ("train",), None, python_only=("corpus", "device", "progress"),
             cli_only=("model", "corpus", "text_field", "context", "no_bos", "corpus_seed", "json_out", "device",
                       "model_dtype")),
    Surfaces(CacheParams, "cache", ("cache",), None, python_only=("corpus", "device", "progress"),
             cli_only=("model", "corpus", "text_field", "context", "no_bos", "seed", "json_out", "device",
                       "model_dtype")),
    Surfaces(SummarizeParams, "summarize", ("summarize",), None, python_only=("corpus", "device", "progress"),
             cli_only=("corpus", "text_field", "context", "no_bos", "corpus_seed", "json_out", "device",
                       "model_dtype")),
    Surfaces(IndexParams, "index", ("index",), None),
    Surfaces(LabelsParams, "build_labels", None, None),
    Surfaces(ImportParams, "add_sae", ("import",), None, cli_arguments=("source",), example={"source": "x"}),
    Surfaces(RegisterParams, "register", ("register",), None),
    Surfaces(ExplanationsParams, "import_explanations", None, None, example={"sae_id": "x", "path": "x.csv"}),
    Surfaces(DemoParams, "demo", ("demo",), None, python_only=("device", "report"),
             cli_only=("model", "json_out", "device", "model_dtype")),
    Surfaces(RunParams, "run", None, ("POST", "/run"), example={"text": "the cat sat"}),
    Surfaces(SteerParams, "steer", ("steer",), ("POST", "/steer"), cli_arguments=("text",),
             example={"text": "the cat sat", "edits": [ROTATE]}, cli_example=("--edit", json.dumps(ROTATE))),
    Surfaces(SteerParams, "steer_stream", None, ("POST", "/steer/stream"),
             example={"text": "the cat sat", "edits": [ROTATE]}),
    Surfaces(AttributeParams, "attribute", ("attribute",), ("POST", "/attribute"), cli_arguments=("text",),
             cli_only=("other", "kind", "position", "json_out"), example={"text": "the cat sat", "target": " cat"},
             cli_example=("--target", " cat")),
    Surfaces(SteeringSearchParams, "steering_features", ("steering-search",), ("POST", "/steering/search"),
             cli_arguments=("target",), cli_only=("as_ids", "concept", "contrast_a", "contrast_b", "json_out"),
             http_narrowed=("target", "n_prompts", "candidates", "confirm_prompts", "prompts", "combine"),
             example={"target": " cat"}),
    Surfaces(SteerBenchParams, "steer_bench", ("steer-bench",), None, cli_arguments=("targets",),
             cli_only=("concept", "contrast_a", "contrast_b", "out", "plot", "json_out"),
             example={"targets": [" cat"]}),
    Surfaces(SteeringScoresParams, "steering_scores", ("steering-scores",), None, python_only=("progress", "dist"),
             cli_only=("device", "json_out")),
    Surfaces(DepthParams, "depth_profile", ("analyze", "depth"), None, python_only=("corpus", "progress"),
             cli_only=("model", "corpus", "text_field", "context", "no_bos", "json_out", "device", "model_dtype")),
)

NOT_CONVERTED: dict[str, str] = {
}
"""Atlas methods that take options but have no parameter object yet: what they have instead."""
