"""What every evaluation of the suite declares and receives.

An eval module under `saes.eval` exposes one `EvalSpec`: its name, its config dataclass
and its run function. The run function takes the `EvalInputs` of one SAE (the atlas, the
SAE, the device and the model, loaded lazily and once) and its config, and returns an
`EvalOutcome`: the metrics by category (SAEBench's `eval_result_metrics`), the details
and unstructured results. `saes.eval.results` turns that into SAEBench's output layout.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Generic, TypeVar

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.atlas_saes import hook_of, load_atlas_sae
from sae_atlas.saes.eval.names import (
    EVAL_NAMES as EVAL_NAMES,  # re-exported: the suite and its readers
)
from sae_atlas.saes.eval.names import EvalName
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE

Config = TypeVar("Config")


@dataclass
class EvalInputs:
    """One SAE of an atlas as an eval sees it; the SAE and the model load on first use.
    `model` returns the atlas's model (InvalidInputError when the run was asked to use none)."""

    atlas: Path
    sae_id: str
    device: str
    model: Callable[[], ModelHandle]

    @cached_property
    def sae(self) -> SAE:
        """The SAE (weights verified), in eval mode on `device`."""
        return load_atlas_sae(self.atlas, self.sae_id, device=self.device)

    @property
    def hook(self) -> str:
        """The hook the SAE reads."""
        return hook_of(self.sae, self.sae_id)

    def checked_model(self) -> tuple[ModelHandle, str]:
        """`(model, hook)` once the SAE's width matches the model's and the model has its
        hook (InvalidInputError otherwise)."""
        handle = self.model()
        if handle.d_model != self.sae.cfg.d_in:
            raise InvalidInputError(f"SAE {self.sae_id!r} has d_in={self.sae.cfg.d_in} but {handle.name} "
                                    f"has d_model={handle.d_model}")
        return handle, handle.check_hook(self.hook)


@dataclass
class EvalOutcome:
    """What an eval found: `metrics` as `{category: {metric: value}}` (flat values, SAEBench
    names), per-item `details` and free-form `unstructured` results."""

    metrics: dict[str, dict[str, Any]]
    details: list[dict[str, Any]] = field(default_factory=list)
    unstructured: Any = None


@dataclass(frozen=True)
class EvalSpec(Generic[Config]):
    """One evaluation: its suite name, SAEBench's `eval_type_id`, its config type and run.
    `check_sources(root, sae_id)`, when given, raises IntegrityError once a stored result's
    sources other than the weights (e.g. the activation cache) have changed."""

    name: EvalName
    eval_type_id: str
    config_type: type[Config]
    run: Callable[[EvalInputs, Config], EvalOutcome]
    check_sources: Callable[[Path, str], object] | None = None

    def config_dict(self, config: Config) -> dict[str, Any]:
        """The config as recorded in `eval_config`, JSON-normalised (tuples as lists), so it
        compares equal to a stored one (InvalidInputError for another eval's config)."""
        if not isinstance(config, self.config_type):
            raise InvalidInputError(f"eval {self.name!r} takes a {self.config_type.__name__}, "
                                    f"got {type(config).__name__}")
        return json.loads(json.dumps(dataclasses.asdict(config)))  # type: ignore[call-overload]
