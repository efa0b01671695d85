"""A circle probe per layer on a cyclic concept (`api.analyses.circular`), with an optional
intervention and optional periodic spectra, stored as a concept run when it has an atlas."""

from __future__ import annotations

from pathlib import Path

from sae_atlas.api.analyses.circular import (
    METHODS,
    concept_spectra,
    run_circle_analysis,
    run_intervention,
    spectra_summary,
    write_concept_run,
)
from sae_atlas.api.operations.analyses import CircleConceptParams
from sae_atlas.api.results.geometry_builds import CircleProbeRun
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.saes.intervene.concepts import OrderedConcept, load_concept
from sae_atlas.saes.models import ModelHandle


def run_circle_probe(handle: ModelHandle, params: CircleConceptParams, root: Path | None) -> CircleProbeRun:
    """Writes (with `root`): the circle probes of `params.concept` on `handle` at `params.layers`,
    the intervention and spectra asked for, stored as `analyses/circular/<run>` of `root`."""
    concept = load_concept(params.concept)
    assert isinstance(concept, OrderedConcept)  # load_concept refuses category sets here
    analysis = run_circle_analysis(handle, concept, params.layers, n_components=params.n_components)
    spectra = None
    if params.spectra:
        sae, layer = None, analysis.best_layer
        if params.sae_id:
            if root is None:
                raise InvalidInputError("spectra of an SAE's features (sae_id) need an atlas")
            sae = load_atlas_sae(root, params.sae_id)
            layer = handle.hook_layer(handle.check_hook(sae.cfg.hook_name))
            if layer not in analysis.probes:
                raise InvalidInputError(f"SAE {params.sae_id!r} reads layer {layer}; add it to the layers")
        spectra = {"layer": layer, "sae": params.sae_id, **spectra_summary(*concept_spectra(analysis, layer, sae))}
    intervention = None
    if params.intervene_layer >= 0:
        intervention = run_intervention(handle, analysis, params.intervene_layer, shifts=params.shifts,
                                        methods=METHODS, seed=params.seed)
    stored = None
    if root is not None:
        name = params.run or f"{concept.name}-{handle.name}".replace("/", "_")
        stored = write_concept_run(root, name, analysis, intervention, model=handle.name,
                                   extra={"spectra": spectra} if spectra else None)
    return CircleProbeRun(concept, handle.name, analysis, intervention, spectra, stored)
