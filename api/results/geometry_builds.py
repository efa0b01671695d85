"""What the geometry analyses that are not a single stored run give back: a circle probe
run (`Atlas.circle_concept`: probes, intervention, spectra, the stored run when it has an
atlas) and one SAE's new feature map (`Atlas.build_maps`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sae_atlas.api.analyses.circular import CircleAnalysis, InterventionResult
from sae_atlas.saes.intervene.concepts import OrderedConcept


@dataclass
class CircleProbeRun:
    """The fitted probes per layer, the intervention (None without `intervene_layer`), the
    spectra summary (None without `spectra`) and the stored run's JSON (None without an atlas)."""

    concept: OrderedConcept
    model: str
    analysis: CircleAnalysis
    intervention: InterventionResult | None
    spectra: dict[str, Any] | None
    stored: Path | None

    def to_dict(self) -> dict[str, Any]:
        """The per-layer table, best layer, intervention by method, spectra and stored path."""
        return {"layers": self.analysis.table().to_dicts(), "best_layer": self.analysis.best_layer,
                "intervention": None if self.intervention is None else {
                    "clean": self.intervention.clean, "by_method": self.intervention.by_method()},
                "spectra": self.spectra, "stored": None if self.stored is None else str(self.stored)}


@dataclass(frozen=True)
class MapBuild:
    """One SAE's new feature map: its summary (features, kNN overlap and chance, per basis)
    and the map file."""

    sae_id: str
    summary: dict[str, Any]
    path: Path
