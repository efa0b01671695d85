"""The service layer of `circle_transfer`; its other layers: `sae_atlas.geometry.circle_transfer`
(maths).

Does a circle of atlas A exist in B? Read the concept of a stored circle run of A
(`circular/<run>`, a concept run of `analyze circular concept`, or `concept_search/<run>` of
an ordered concept), render its prompts in A's and B's models, fit the circle again on both
sides (`geometry.circle_transfer`) and store the run as `analyses/circle_transfer/<run>` in
A's atlas. B is another SAE (`ATLAS[:SAE]`: its model's activations and its codes) or a
model's hook (activations only)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sae_atlas.api.operations.concepts_across import CircleTransferParams
from sae_atlas.api.results.analysis import CircleTransferResult
from sae_atlas.api.sae_view import SaeView
from sae_atlas.api.services import analyses
from sae_atlas.api.services.concept_sides import ConceptSide, atlas_side, concept_acts, model_side
from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.circle_transfer import SideActivations, circle_transfer
from sae_atlas.geometry.figures_circular import circle_transfer_figure
from sae_atlas.saes.intervene.concepts import CategoryConcept, OrderedConcept, load_concept
from sae_atlas.store import analysis_runs
from sae_atlas.store.atomic import save_png
from sae_atlas.store.layout import AtlasLayout, check_id

KIND = "circle_transfer"
REFERENCE_KINDS = ("circular", "concept_search")
SEARCH_OPTIONS = ("min_fire_rate", "min_selectivity", "target", "max_features")


def safe_name(text: str) -> str:
    """`text` as a run name: characters other than letters, digits, '.', '_', '-' become
    '.', runs of dots one, at most 128 characters."""
    return re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9._-]", ".", text))[:128].strip(".") or "run"


def reference_concept(root: Path, ref: str) -> tuple[OrderedConcept, dict[str, Any]]:
    """The ordered concept of stored run `KIND/RUN` of the atlas at `root` and the concept
    search options it used (none for a circular concept run)."""
    kind, _, run = ref.partition("/")
    if kind not in REFERENCE_KINDS or not run:
        raise InvalidInputError(f"name the circle as KIND/RUN with KIND one of {', '.join(REFERENCE_KINDS)}; got {ref!r}")
    stored = analysis_runs.read_analysis(root, kind, check_id(run, "run name"))
    if kind == "circular":
        if stored.meta.get("type") != "concept":
            raise InvalidInputError(f"circular/{run} is a discovery run; name a concept run "
                                    "(`sae-atlas analyze circular concept --atlas ...`)")
        return load_concept(stored.meta["concept"]), {}
    parameters = stored.meta.get("parameters", {})
    concept = load_concept(parameters.get("concept", {}), categories=True)
    if isinstance(concept, CategoryConcept):
        raise InvalidInputError(f"concept_search/{run} searched categories ({concept.name!r}); a circle needs an "
                                "ordered concept")
    return concept, {k: parameters[k] for k in SEARCH_OPTIONS if k in parameters}


def run_circle_transfer(side_a: SaeView, side_b: SaeView | None, params: CircleTransferParams, *,
                        device: str = "cpu") -> CircleTransferResult:
    """Fit the circle of run `params.circle` of A (an SAE of an opened atlas) in B (an SAE
    of this or another opened atlas, or `params.model_b` at `params.hook_b`, default A's
    hook, loaded through A's context) and in A; store and return the run."""
    circle, model_b, hook_b, run = params.circle, params.model_b, params.hook_b, params.run
    n_components, n_null, n_random, alpha, seed = (params.n_components, params.n_null, params.n_random,
                                                   params.alpha, params.seed)
    if (side_b is None) == (model_b is None):
        raise InvalidInputError("name B as ATLAS[:SAE] or as a model (--model-b), not both")
    a = atlas_side(side_a, device=device)
    assert a.root is not None
    concept, search = reference_concept(a.root, circle)
    b: ConceptSide = atlas_side(side_b, device=device) if side_b is not None else \
        model_side(side_a.ctx, str(model_b), hook_b or a.hook, device=device)
    values, (acts_a, acts_b) = concept_acts([a, b], concept)
    sides = [SideActivations(acts.X_ND, acts.codes_NF,
                             None if side.sae is None else side.sae.W_dec.detach().float().cpu().numpy())
             for side, acts in ((a, acts_a), (b, acts_b))]
    fit = circle_transfer(*sides, values, concept.values, n_components=n_components, n_null=n_null,
                          n_random=n_random, alpha=alpha, seed=seed, **search)
    run = check_id(run or safe_name(f"{concept.name}-{a.sae_id}--{b.label}"), "run name")
    parameters = {"circle": circle, "concept": concept.to_dict(), "a": a.describe(), "b": b.describe(),
                  "n_prompts": int(len(values)), "n_components": n_components, "n_null": n_null,
                  "n_random": n_random, "alpha": alpha, "seed": seed, "search": search}
    figure = AtlasLayout(a.root).analysis_dir(KIND) / f"{run}.png"
    figure.parent.mkdir(parents=True, exist_ok=True)
    rows = {f"{r['side']}_{r['space']}": r for r in fit.table.iter_rows(named=True)}
    save_png(circle_transfer_figure(fit.outputs, values, concept.values, rows,
                                    title=f"{concept.name}: {a.label} in {b.label}"), figure)
    analysis_runs.write_analysis(a.root, KIND, run, parameters=parameters, summary=fit.summary, tables={"main": fit.table},
                           extra={"figures": [figure.name]})
    return analyses.analysis_as(CircleTransferResult, a.root, KIND, run)
