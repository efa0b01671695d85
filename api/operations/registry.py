"""Every operation with its parameter object and where it is offered: the `Atlas` method,
the CLI verb and the HTTP route whose body is the object (`tests/api/test_operation_agreement.py`
walks them); and, named one by one, the operations not converted yet."""

from __future__ import annotations

from dataclasses import dataclass, field

from sae_atlas.api.operations.base import Operation
from sae_atlas.api.operations.graph import GraphParams
from sae_atlas.api.operations.search import ContrastParams, TextSearchParams


@dataclass(frozen=True)
class Surfaces:
    """One operation: its parameters and the three places that take them."""

    params: type[Operation]
    python: str
    """The `Atlas` method."""
    cli: tuple[str, ...] | None
    """The verb (a sub-verb as two words), None when the CLI does not offer it."""
    http: tuple[str, str] | None
    """(method, path) of the route whose body is `params`, None when HTTP does not offer it."""
    cli_arguments: tuple[str, ...] = ()
    """Parameters the verb takes as positional arguments (after the atlas)."""
    cli_only: tuple[str, ...] = ("json_out",)
    """Options of the verb that are not the operation's: its output (`--json`, `--out`) and
    where the model runs (`--device`)."""
    http_narrowed: tuple[str, ...] = ()
    """Parameters HTTP bounds more tightly than Python (to keep one request cheap)."""
    example: dict[str, object] = field(default_factory=dict)
    """Values of the required parameters, for calls that check the bounds."""


OPERATIONS: tuple[Surfaces, ...] = (
    Surfaces(GraphParams, "graph", ("graph",), ("POST", "/graph"), cli_arguments=("text",),
             cli_only=("out", "store", "json_out"), example={"text": "the cat sat"}),
    Surfaces(TextSearchParams, "search_text", ("search", "text"), ("POST", "/search/text"), cli_arguments=("text",),
             cli_only=("json_out", "device", "model_dtype"), example={"text": "the cat sat"}),
    Surfaces(ContrastParams, "contrast", ("search", "contrast"), ("POST", "/search/contrast"),
             cli_arguments=("texts_a", "texts_b"), http_narrowed=("texts_a", "texts_b", "n_permutations"),
             example={"texts_a": ["the cat sat", "a cat ran"], "texts_b": ["the dog sat", "a dog ran"]}),
)

NOT_CONVERTED: dict[str, str] = {
    "concept_search": "keywords typed in the method, ConceptQuery over HTTP, options in `search concept`",
    "search_vector": "keywords typed in the method, VectorQuery over HTTP, options in `search vector`",
    "search_token": "keywords typed in the method, query parameters over HTTP",
    "search_labels": "keywords typed in the method, query parameters over HTTP",
    "similar": "keywords typed in the method, query parameters over HTTP",
    "flow": "keywords typed in the method, query parameters over HTTP",
    "feature": "keywords typed in the method, query parameters over HTTP",
    "geometry_features": "keywords typed in the method, query parameters over HTTP",
    "crosscoder_latents": "keywords typed in the method, query parameters over HTTP",
    "crosscoder_latent": "keywords typed in the method, query parameters over HTTP",
    "compared_feature": "keywords typed in the method, query parameters over HTTP",
    "compare": "CompareParams (saes.compare) plus keywords and **options; no HTTP route",
    "compare_circle": "keywords and **options; no HTTP route",
    "emergence": "keywords and **options; no HTTP route",
    "train_crosscoder": "keywords and **options; no HTTP route",
    "latent_scaling": "keywords and **options; no HTTP route",
    "run_circular": "keyword typed in the method, CircularRequest over HTTP",
    "run": "keywords typed in the method, RunRequest over HTTP, options in `steer`",
    "steer": "keywords typed in the method, SteerRequest over HTTP, options in `steer`",
    "steer_stream": "keywords typed in the method, SteerRequest over HTTP",
    "attribute": "keywords typed in the method, AttributeRequest over HTTP, options in `attribute`",
    "steering_features": "steering (being changed by its own work): SteeringQuery over HTTP",
    "steer_bench": "steering (being changed by its own work): options in `steer-bench`",
    "depth_profile": "depth (being changed by its own work): keywords and **options",
    "add_sae": "keywords typed in the method, options in `import`",
    "build_labels": "one keyword (saes)",
    "import_explanations": "keywords typed in the method",
    "map": "one keyword (basis), query parameter over HTTP",
    "examples": "one keyword (kind), query parameter over HTTP",
}
"""Atlas methods that take options but have no parameter object yet: what they have instead."""
