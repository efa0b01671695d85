"""The service layer of `emergence`; its other layers: `sae_atlas.api.commands.emergence` (CLI),
`sae_atlas.geometry.emergence` (maths).

The emergence table: over a series of SAEs (`ATLAS[:SAE]` each: checkpoints, layers or
sizes, in the order given), per concept and member the best single-latent selectivity and
the probe accuracies of the concept's prompts against control prompts (the same templates
with other words in the value's place, `saes.intervene.concepts.control_concept`), the
first member reaching a threshold and where the concept falls below and re-appears
(`geometry.emergence`). Stored as `analyses/emergence/<run>` in the first member's atlas,
with a heat map."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from sae_atlas.api.bounds import MAX_PROMPTS
from sae_atlas.api.operations.concepts_across import EmergenceParams
from sae_atlas.api.results.analysis import EmergenceResult
from sae_atlas.api.sae_view import SaeView
from sae_atlas.api.services import analyses
from sae_atlas.api.services.circle_transfer import safe_name
from sae_atlas.api.services.concept_sides import atlas_side, concept_acts
from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.emergence import (
    SCORE_SCHEMA,
    emergence_tables,
    member_scores,
)
from sae_atlas.geometry.figures_emergence import emergence_figure
from sae_atlas.saes.intervene.concepts import control_concept, load_concept
from sae_atlas.store import analysis_runs
from sae_atlas.store.atomic import save_png
from sae_atlas.store.layout import AtlasLayout, check_id

KIND = "emergence"
MAX_MEMBERS = 64


def run_emergence(members: Sequence[SaeView], params: EmergenceParams, *, device: str = "cpu") -> EmergenceResult:
    """Score every concept of `params` (a built-in name, a dict or JSON file as concept
    search takes, or a concept object) on every member (an SAE of an opened atlas; each
    atlas's model loaded through its context) and store the run; the stored result."""
    metric, threshold, test_frac, seed, run = params.metric, params.threshold, params.test_frac, params.seed, params.run
    if not 2 <= len(members) <= MAX_MEMBERS:
        raise InvalidInputError(f"name 2..{MAX_MEMBERS} members (ATLAS[:SAE]) in series order, got {len(members)}")
    concepts = params.concepts
    loaded = [c if hasattr(c, "prompts") else load_concept(c, categories=True) for c in concepts]
    names = [c.name for c in loaded]
    if len(set(names)) != len(names):
        raise InvalidInputError(f"each concept may be named once; got {', '.join(names)}")
    for c in loaded:
        if len(c.prompts()) > MAX_PROMPTS:
            raise InvalidInputError(f"concept {c.name!r} renders {len(c.prompts())} prompts; the maximum is {MAX_PROMPTS}")
    sides = [atlas_side(m, device=device) for m in members]
    if len({s.root.resolve() for s in sides if s.root}) == 1:  # one atlas: its SAE ids say enough
        for s in sides:
            s.label = str(s.sae_id)
    labels = [s.label for s in sides]
    rows = []
    for concept in loaded:
        values, positives = concept_acts(sides, concept)
        _, controls = concept_acts(sides, control_concept(concept))
        for label, pos, neg in zip(labels, positives, controls, strict=True):
            rows.append({"concept": concept.name, "member": label,
                         **member_scores(pos.codes_NF, neg.codes_NF, values, test_frac=test_frac, seed=seed)})
    schema = {"concept": pl.String, "member": pl.String, **SCORE_SCHEMA}
    scored, onset = emergence_tables(pl.DataFrame(rows, schema=schema), labels, metric=metric, threshold=threshold)
    root = sides[0].root
    assert root is not None
    run = check_id(run or safe_name(f"{'-'.join(names)}--{'-'.join(str(s.sae_id) for s in sides)}"), "run name")
    figure = AtlasLayout(root).analysis_dir(KIND) / f"{run}.png"
    figure.parent.mkdir(parents=True, exist_ok=True)
    save_png(emergence_figure(scored, labels, metric, threshold, title=f"emergence / {run}"), figure)
    parameters = {"members": [s.describe() for s in sides], "concepts": [c.to_dict() for c in loaded],
                  "controls": {c.name: control_concept(c).values for c in loaded}, "metric": metric,
                  "threshold": threshold, "test_frac": test_frac, "seed": seed}
    summary = {"metric": metric, "threshold": threshold, "members": labels, "onsets": onset.to_dicts()}
    analysis_runs.write_analysis(root, KIND, run, parameters=parameters, summary=summary,
                           tables={"main": scored, "onsets": onset}, extra={"figures": [figure.name]})
    return analyses.analysis_as(EmergenceResult, root, KIND, run)
