"""The representations that the cross-atlas concept analyses read (a circle of A fitted in B,
the emergence table): an SAE of an atlas (`ATLAS[:SAE]`: its model, hook and codes) or a
model's hook alone; and their activations at a concept's tokens, one model pass per model
and concept (`saes.intervene.concept_codes`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sae_atlas.api.context import AtlasContext, models_locked
from sae_atlas.api.sae_view import SaeView
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.atlas_saes import hook_of
from sae_atlas.saes.intervene.concept_codes import concept_feature_acts
from sae_atlas.saes.intervene.concepts import CategoryConcept, OrderedConcept
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE

Concept = OrderedConcept | CategoryConcept


@dataclass
class ConceptSide:
    """One representation: a label, the model and hook it reads, and the SAE (None: the
    model's activations only) with its atlas and id."""

    label: str
    handle: ModelHandle
    hook: str
    sae: SAE | None = None
    root: Path | None = None
    sae_id: str | None = None
    ctx: AtlasContext | None = None
    """The atlas whose context loaded the model (its model lock is held while it runs)."""

    def describe(self) -> dict[str, str | None]:
        """JSON-ready: label, atlas, SAE id, hook and model name."""
        return {"label": self.label, "atlas": str(self.root.resolve()) if self.root else None,
                "sae": self.sae_id, "hook": self.hook, "model": self.handle.name}


@dataclass
class SideActs:
    """A side's activations at the concept tokens `[N, d]` and its SAE codes `[N, F]` (None
    without an SAE)."""

    X_ND: np.ndarray
    codes_NF: np.ndarray | None


def atlas_side(view: SaeView, *, device: str = "cpu") -> ConceptSide:
    """An SAE of an opened atlas: its SAE, hook and model (both through its atlas's context),
    labelled `<atlas folder>:<sae>`."""
    sae = view.module(device)
    handle = view.ctx.model(device)
    root = view.ctx.root
    return ConceptSide(f"{root.resolve().name}:{view.sae_id}", handle, hook_of(sae, view.sae_id), sae, root,
                       view.sae_id, view.ctx)


def model_side(ctx: AtlasContext, model: str, hook: str, *, device: str = "cpu") -> ConceptSide:
    """A model's hook without an SAE (the model loaded through `ctx`, the operation's atlas),
    labelled `<model>:<hook>`."""
    handle = ctx.model_of(model, device)
    return ConceptSide(f"{handle.name}:{hook}", handle, handle.check_hook(hook), ctx=ctx)


def concept_acts(sides: Sequence[ConceptSide], concept: Concept) -> tuple[np.ndarray, list[SideActs]]:
    """Every side's activations at the concept token of each of `concept`'s prompts (one pass
    per model) and the prompts' values; the labels must be distinct."""
    labels = [s.label for s in sides]
    if len(set(labels)) != len(labels):
        raise InvalidInputError(f"each representation may be named once; got {', '.join(labels)}")
    out: dict[str, SideActs] = {}
    values = None
    with models_locked(*(s.ctx for s in sides if s.ctx is not None)):
        for handle in {id(s.handle): s.handle for s in sides}.values():
            group = [s for s in sides if s.handle is handle]
            with_sae = [s for s in group if s.sae is not None]
            acts = concept_feature_acts(handle, {s.label: s.sae for s in with_sae}, {s.label: s.hook for s in with_sae},
                                        concept, extra_hooks=[s.hook for s in group])
            values = acts.values_N
            for s in group:
                out[s.label] = SideActs(acts.residual[s.hook].astype(np.float64),
                                        acts.features[s.label] if s.sae is not None else None)
    assert values is not None
    return values, [out[label] for label in labels]
