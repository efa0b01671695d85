"""The typed-result layer of `suite`; its other layers: `sae_atlas.saes.eval.suite` (eval).

`SuiteResults`: what one run of the evaluation suite gave (`Atlas.eval`), and
`EvalsFailed`, raised with it when some evals failed (a light module: the CLI imports it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sae_atlas.errors import AtlasError
from sae_atlas.saes.eval.names import EvalName


@dataclass
class SuiteResults:
    """Per SAE the eval.json record of `core` (`core`) and each eval's result in SAEBench's
    layout (`results`), which were kept from earlier runs, and the failures with their messages."""

    suite: list[EvalName]
    core: dict[str, dict[str, Any]] = field(default_factory=dict)
    results: dict[str, dict[EvalName, dict[str, Any]]] = field(default_factory=dict)
    kept: list[tuple[str, EvalName]] = field(default_factory=list)
    failures: dict[tuple[str, EvalName], str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """{sae: eval.json} when the suite is `core` alone, else {sae: {eval: result}}."""
        return dict(self.core) if self.suite == ["core"] else {sae: dict(evals) for sae, evals in self.results.items()}


class EvalsFailed(AtlasError):
    """Some evals of the suite failed (the others' results were written); `results` holds
    what the run gave (None where the failing step gave nothing)."""

    def __init__(self, message: str, results: SuiteResults | None = None) -> None:
        super().__init__(message)
        self.results = results
