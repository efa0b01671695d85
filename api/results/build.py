"""The typed-result layer of `build`; its other layers: `sae_atlas.api.operations.build`
(parameter), `sae_atlas.api.services.build` (service).

What the build operations report (the same idea as `api.operations.build` and
`api.services.build`, at the result layer): `IndexInfo`, one FAISS index built or kept
(`Atlas.index`), and `ImportedSae` / `ImportedClt`, what `Atlas.add_sae` imported."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from typing_extensions import NotRequired, TypedDict

from sae_atlas.api.results.wire import Number


class IndexedSae(TypedDict):
    """One SAE's block of rows in the model-wide index."""

    sae_id: str
    hook: str
    layer: int | None
    start: int
    count: int
    weights_sha256: str


class IndexInfo(TypedDict):
    """One FAISS index (an SAE's, or the model-wide one with `saes`): its sidecar, where it
    lives and whether this call (re)wrote it."""

    type: Annotated[str, Field(description="the FAISS index type, e.g. IndexFlatIP")]
    params: dict[str, Any]
    exact: bool
    build_seconds: float
    n: int
    d: int
    recall_at_10: Number
    weights_sha256: str
    path: str
    rebuilt: Annotated[bool, Field(description="written by this call (false: kept, it verified)")]
    index_sha256: NotRequired[str]
    created_with: NotRequired[dict[str, str]]
    sae_id: NotRequired[str]
    hook: NotRequired[str]
    layer: NotRequired[int | None]
    saes: NotRequired[list[IndexedSae]]
    excluded: NotRequired[Annotated[list[dict[str, Any]], Field(
        description="SAEs of another width, left out of the model-wide index")]]


class ImportProblem(TypedDict):
    """One reason to distrust an imported SAE (`saes.importing.guard`)."""

    cause: str
    message: str


class ImportedSae(TypedDict):
    """An imported SAE: its id, hook, architecture, held-out metrics, the misload guard's
    problems (`suspect`: imported with --force despite them) and its provenance."""

    sae_id: str
    hook: str
    architecture: str
    metrics: dict[str, Any]
    suspect: bool
    problems: list[ImportProblem]
    source: dict[str, Any]


class ImportedClt(TypedDict):
    """An imported cross-layer transcoder: its id, the hooks it reads and writes, metrics
    and the guard's problems."""

    clt_id: str
    hooks_in: list[str]
    hooks_out: list[str]
    metrics: dict[str, Any]
    problems: list[ImportProblem]
    suspect: bool


Imported = ImportedSae | ImportedClt
