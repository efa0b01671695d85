"""The parameters of the operations that bring dictionaries and their texts into an atlas:
`add_sae` (`sae-atlas import`), `register` (folders and runs on disk that the atlas does not
list) and `import_explanations` (writes, so no HTTP route)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from sae_atlas.api.operations.fields import SafeId
from sae_atlas.api.operations.operation import Operation


class ImportParams(Operation):
    """Import a pretrained SAE (or a circuit-tracer cross-layer transcoder) after the misload
    guard, evaluate it on the hook's held-out activations and register it."""

    source: str = Field(min_length=1, description="a folder (SAELens, Gemma Scope, Llama Scope, sparsify, "
                                                  "dictionary_learning), a circuit-tracer layer file beside its "
                                                  "config.yaml, RELEASE/SAE_ID from the registry, or "
                                                  "hf://org/repo/path[@revision]")
    hook: str | None = Field(default=None, min_length=1, description="hook the SAE reads (TransformerLens, "
                                                                      "SAELens or HF module name; default: the "
                                                                      "one it records)")
    sae_id: SafeId | None = Field(default=None, description="id in the atlas (default: "
                                                            "<hook>-<architecture>-<d_sae>-<source>)")
    link: bool = Field(default=False, description="symlink the weights instead of copying (unconverted SAELens "
                                                  "files only)")
    force: bool = Field(default=False, description="keep an SAE the misload guard refuses, marked suspect")
    registry: Path | None = Field(default=None, description="registry YAML in SAELens' pretrained_saes.yaml schema")
    with_model: bool = Field(default=True, description="CE loss recovered (false: no model forward passes)")
    clt: bool = Field(default=False, description="`source` is a circuit-tracer cross-layer transcoder (detected "
                                                 "by itself for a local folder)")


class RegisterParams(Operation):
    """Register again the SAE folders and analysis runs on disk that atlas.json or their
    kind's runs.json does not list, after checking their files (with neither named: every
    unregistered one)."""

    saes: list[SafeId] | None = Field(default=None, description="SAE ids whose folders atlas.json does not list")
    analyses: list[str] | None = Field(default=None, description="analysis runs KIND/RUN their runs.json does not "
                                                                 "list (e.g. circular/my-run)")


class ExplanationsParams(Operation):
    """Store the explanations of one SAE from a Neuronpedia export (.json) or a CSV of
    feature,explanation, replacing an earlier import of the same source."""

    sae_id: SafeId = Field(description="the SAE the explanations belong to")
    path: Path = Field(description="the explanations file")
    source: str | None = Field(default=None, min_length=1, description="the set's name (default: the file name)")
