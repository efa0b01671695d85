"""The parameter layer of `analyses`; its other layers: `sae_atlas.api.http.routers.analyses`
(HTTP), `sae_atlas.api.services.analyses` (service).

The geometry analyses' parameters (`Atlas.run_circular`, `Atlas.circle_concept`, ...;
`sae-atlas analyze ...`; `POST /analyses/circular`): each analysis stored as a run under
`analyses/<kind>/`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from sae_atlas.api.operations.fields import JsonInt, SafeId
from sae_atlas.api.operations.operation import WHICH_SAES, Operation
from sae_atlas.geometry.causal import Metric
from sae_atlas.geometry.circular_discovery import ClusterMethod
from sae_atlas.geometry.concept_vectors import Estimator
from sae_atlas.store.activations import Split

Match = Literal["decoder", "activation"]
"""How a concept finds its SAE latent: by decoder direction or by activations."""

Measure = Literal["jaccard", "dice", "overlap", "phi"]
"""How co-occurrence is scored between two features (`geometry.lobes`)."""


def comma_separated(value: Any) -> Any:
    """A text, or texts, naming several items comma-separated (`"a,b"`, `["a,b", "c"]`), as
    the items in order (an empty text: none); any other value unchanged."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not any(isinstance(item, str) for item in value):
        return value
    return [part.strip() for item in value for part in str(item).split(",") if part.strip()] or None


Listed = BeforeValidator(comma_separated)
"""Items of a list parameter, also given as comma-separated texts (the CLI's `--layers 3,6,9`)."""
Model = Annotated[str | None, Field(default=None, min_length=1,
                                    description="model spec (default: the atlas's model, else smollm2-135m)")]


class CircularParams(Operation):
    """Circular (multi-dimensional) feature discovery on one SAE: its features clustered by
    decoder direction, each cluster's reconstruction scored for irreducibility, the ranked
    table stored as `analyses/circular/<run>`."""

    sae_id: SafeId = Field(description="the SAE whose features are clustered")
    method: ClusterMethod = Field(default="graph", description="graph (kNN cosine components) or spectral")
    k: JsonInt = Field(default=2, ge=1, le=1000, description="graph: neighbours per feature")
    threshold: float = Field(default=0.5, ge=-1.0, le=1.0, description="graph: cosine cutoff of an edge")
    n_clusters: JsonInt = Field(default=0, ge=0, description="spectral: number of clusters (0: min(F // 20, 256))")
    split: Split = Field(default="heldout", description="the cached split to encode: heldout, train or all")
    max_tokens: JsonInt = Field(default=200_000, ge=1, description="cached tokens to encode")
    min_tokens: JsonInt = Field(default=32, ge=4, description="clusters firing on fewer tokens are skipped")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of spectral clustering and subsamples")
    run: SafeId | None = Field(default=None, description="run name (default <sae_id>-<method>)")
    token_strings: bool = Field(default=False, description="show the clusters' top tokens as strings (loads the "
                                                           "atlas model's tokenizer)")


class CircleConceptParams(Operation):
    """A circle probe per layer on a cyclic concept, an optional intervention along the fitted
    circle beside baselines, and optional periodic spectra of residual dimensions or SAE
    features; stored as `analyses/circular/<run>` when run over an atlas."""

    concept: str = Field(default="weekdays", min_length=1, max_length=1000,
                         description="weekdays, months or a JSON file {name, values, templates, offsets}")
    model: Model = None
    layers: Annotated[list[JsonInt], Listed] = Field(default_factory=lambda: [3, 6, 9, 12], min_length=1,
                                  description="layers to probe (resid_post); a text may name several, "
                                              "comma-separated")
    n_components: JsonInt = Field(default=5, ge=2, le=64, description="principal components fed to the probe")
    intervene_layer: JsonInt = Field(default=-1, ge=-1, description="layer to intervene at (-1: none)")
    shifts: Annotated[list[JsonInt] | None, Listed] = Field(default=None, description="target shifts in steps (default 1..p-1); a "
                                                                   "text may name several, comma-separated")
    run: SafeId | None = Field(default=None, description="run name (default <concept>-<model>)")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of the random-subspace baseline")
    spectra: bool = Field(default=False, description="Fourier spectra against the concept index (at the best layer, "
                                                     "or at sae_id's layer)")
    sae_id: SafeId | None = Field(default=None, description="with spectra: use this SAE's features (its layer must "
                                                            "be probed)")


class HierarchyParams(Operation):
    """Parent-child orthogonality of concept vectors (Park et al. 2024), with controls, stored
    as `analyses/hierarchy/<run>`; with `sae_id`, of that SAE's features matched to the concepts."""

    model: Model = None
    tree: str = Field(default="curated", min_length=1, description="curated, wordnet, or a JSON tree file")
    metric: Metric = Field(default="causal", description="causal (whitened unembedding) or euclidean")
    estimator: Estimator = Field(default="lda", description="concept vector estimator: lda or mean")
    min_tokens: JsonInt = Field(default=5, ge=2, description="concepts with fewer single-token words are dropped")
    sae_id: SafeId | None = Field(default=None, description="also test this SAE's features matched to the concepts")
    match: Match = Field(default="decoder", description="feature matching: decoder or activation")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of splits and controls")
    run: SafeId | None = Field(default=None, description="run name")


class ProbeParams(Operation):
    """Linear probes per layer on cached activations, stored as `analyses/probe/<run>`."""

    hooks: Annotated[list[str], Listed] = Field(min_length=1, description="cached hooks, one probe each")
    target: str = Field(default="position", min_length=1, description="position (ridge) or a curated concept "
                                                                      "name, e.g. animal")
    sae_id: SafeId | None = Field(default=None, description="SAE for k-sparse probes on neurons vs latents "
                                                            "(concept targets)")
    model: Model = None
    max_tokens: JsonInt = Field(default=20_000, ge=10, description="tokens per hook")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of the train/test split")
    run: SafeId | None = Field(default=None, description="run name (default <target>-<kind>)")


class CrystalsParams(Operation):
    """Word-pair relation crystals: held-out LDA silhouette against a random-label null,
    stored as `analyses/crystals/<run>`."""

    model: Model = None
    hook: str | None = Field(default=None, min_length=1, description="residual hook to read words at (default: the "
                                                                     "input embeddings W_E)")
    n_null: JsonInt = Field(default=50, ge=2, description="random-label null draws")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of the split and null")
    run: SafeId | None = Field(default=None, description="run name (default crystals-<source>)")


class LobesParams(Operation):
    """Co-occurrence lobes of one SAE compared with its geometric clusters by AMI, stored as
    `analyses/lobes/<run>` (and as label columns of its map when it has one)."""

    sae_id: SafeId = Field(description="the SAE (its feature summary's occurrence matrix is read)")
    measure: Measure = Field(default="jaccard", description="jaccard, dice, overlap or phi (clipped at 0)")
    k: JsonInt = Field(default=20, ge=1, description="co-occurrence neighbours kept per feature")
    n_clusters: JsonInt = Field(default=10, ge=2, description="number of lobes")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of spectral clustering and permutations")
    run: SafeId | None = Field(default=None, description="run name (default <sae_id>-<measure>)")


class GalaxyParams(Operation):
    """Decoder covariance power-law slope (ranks 10-150) and TwoNN dimension per SAE, stored
    as `analyses/galaxy/<run>`."""

    saes: Annotated[list[SafeId] | None, Listed] = Field(default=None, description=f"{WHICH_SAES}: every SAE")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="seed of the TwoNN subsample")
    run: SafeId = Field(default="galaxy", description="run name")


class MapBuildParams(Operation):
    """UMAP maps of each SAE into `saes/<id>/map.parquet`, with kNN overlap: of the unit
    decoder rows, and of the activation co-occurrence graph once the SAE is summarized."""

    saes: Annotated[list[SafeId] | None, Listed] = Field(default=None, description=f"{WHICH_SAES}: every SAE")
    k_overlap: JsonInt = Field(default=10, ge=1, description="neighbours checked by the kNN-overlap score")
    n_neighbors: JsonInt = Field(default=15, ge=2, description="UMAP n_neighbors")
    min_dist: float = Field(default=0.1, ge=0.0, le=1.0, description="UMAP min_dist")
    seed: JsonInt = Field(default=0, ge=0, le=2**31 - 1, description="UMAP seed")
