"""The parameter layer of `evals`; its other layers: `sae_atlas.api.http.routers.evals` (HTTP),
`sae_atlas.api.results.evals` (typed-result), `sae_atlas.api.services.evals` (service).

The evaluation suite's parameters (`Atlas.eval`, `sae-atlas eval`): which evals on which
SAEs, the core eval's sizes and each other eval's inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from sae_atlas.api.operations.fields import JsonInt, SafeId
from sae_atlas.api.operations.operation import WHICH_SAES, Operation
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.eval.names import (
    DEFAULT_CE_BLOCKS,
    DEFAULT_TOKENS,
    EVAL_NAMES,
    BackendName,
    EvalName,
    NegativesSource,
)


class EvalParams(Operation):
    """The evaluation suite on trained SAEs; finished results are kept unless `force`."""

    renamed = {"sae_ids": "saes", "n_tokens": "tokens"}

    saes: list[SafeId] | None = Field(default=None, description=f"{WHICH_SAES}: every trained SAE")
    suite: list[EvalName] = Field(default_factory=lambda: ["core"], min_length=1,
                                  description=f"the evals to run, in order ({', '.join(EVAL_NAMES)}); a text may "
                                              "name several, comma-separated")
    tokens: JsonInt = Field(default=DEFAULT_TOKENS, ge=1, description="held-out tokens for the activation metrics "
                                                                      "(with from_model: corpus tokens streamed)")
    ce_blocks: JsonInt = Field(default=DEFAULT_CE_BLOCKS, ge=1, description="held-out blocks the model runs on for "
                                                                            "CE / KL")
    no_model: bool = Field(default=False, description="skip the CE / KL metrics (no model forward passes)")
    from_model: bool = Field(default=False, description="core: activation metrics over corpus tokens streamed "
                                                        "through the model")
    batch_blocks: JsonInt = Field(default=8, ge=1, description="with from_model: blocks per forward pass")
    probe_data: Path | None = Field(default=None, description="sparse_probing: a .jsonl labelled set (a 'text' "
                                                              "field and label_field)")
    label_field: str = Field(default="label", min_length=1, description="sparse_probing: the label field of "
                                                                         "probe_data")
    probe_sets: list[str] | None = Field(default=None, description="sparse_probing: labelled sets to probe: topics, "
                                                                   "code_vs_prose (built in) or a SAEBench set by "
                                                                   "name, read from the hub, e.g. fancyzhx/ag_news "
                                                                   "(default: the built-in sets)")
    per_class: JsonInt | None = Field(default=None, ge=2, description="sparse_probing: texts per class of each "
                                                                      "named set (default 32)")
    ground_truth: Path | None = Field(default=None, description="ground_truth: a .safetensors planted dictionary "
                                                                "with W_dec [n_atoms, d]")
    autointerp_backend: BackendName = Field(default="lexical", description="autointerp: lexical (offline proxy, no "
                                            "LLM), openai (an OpenAI-compatible chat endpoint; key in "
                                            "$SAE_ATLAS_AUTOINTERP_KEY) or hf (autointerp_model run in-process)")
    autointerp_url: str = Field(default="", description="autointerp: the endpoint's base URL, e.g. "
                                                        "http://127.0.0.1:8000/v1")
    autointerp_model: str = Field(default="", description="autointerp: the model the endpoint serves (openai) or "
                                                          "the model spec to load, e.g. smollm2-135m (hf)")
    autointerp_latents: JsonInt = Field(default=32, ge=1, description="autointerp: latents explained and scored "
                                                                      "(seeded sample)")
    autointerp_negatives: NegativesSource = Field(default="random", description="autointerp: non-activating windows "
                                                  "from random other latents, or 'similar' (the nearest latents by "
                                                  "decoder cosine, in blocks where the latent never fires)")
    force: bool = Field(default=False, description="recompute evals whose results are already finished")

    @field_validator("suite", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """`"core,mdl"` or `["core,mdl", "meta"]` as the names in order, without repeats
        (`saes.eval.suite.parse_suite`: an unknown name is refused by name, the valid ones listed)."""
        from sae_atlas.saes.eval.suite import parse_suite

        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
            return value
        try:
            return parse_suite(",".join(value))
        except InvalidInputError as exc:
            raise ValueError(str(exc)) from None
