"""`autointerp`: can an explainer describe a latent well enough for a scorer to find it?

delphi's and SAEBench's automated interpretability: a seeded sample of `n_latents` alive
latents (fired in the summary, with top examples); per latent an explanation from its
`n_explain` highest top examples, then the `detection` and `fuzzing` scorers on held-out
activating windows drawn across activation quantiles and on non-activating windows: the
stored examples of other latents (their windows overlapping the latent's own examples left
out; its activation there is not stored, at a sparse latent's density nearly all are
silent), or with `negatives="similar"` hard negatives (delphi's FAISS negatives, in
decoder space): the stored examples of the latent's `n_similar` nearest latents by decoder
cosine (the SAE's FAISS index) from blocks where the occurrence matrix says the latent
never fires. See `saes.eval.autointerp_scoring` for the samples and delphi's metrics and
`saes.eval.autointerp_backends` for the back-ends (`lexical`, `openai`, `hf`). The default `lexical` back-end is a
LEXICAL PROXY, not LLM autointerp: its results say so (`autointerp.backend`,
`eval_result_unstructured.backend`) and its config records `backend: "lexical"`.

Metrics: category `autointerp` (`autointerp_score`, the mean over latents of the detection
balanced accuracy, its `autointerp_std_dev`, `backend`, `n_latents`), and `detection` /
`fuzzing` (`<scorer>_balanced_accuracy`, `_f1`, `_auc` over the pooled samples of all
latents, as delphi aggregates). Details: one row per latent with its explanation and
per-scorer scores; unstructured: the back-end, the sampled latents skipped for want of
held-out windows, and the summary tables' sha256 (a stored result of rebuilt tables is
recomputed).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast, get_args

import numpy as np
import polars as pl

from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.saes.eval.autointerp_backends import (
    KEY_ENV,
    AutointerpBackend,
    HuggingFaceBackend,
    LexicalBackend,
    OpenAIBackend,
)
from sae_atlas.saes.eval.autointerp_scoring import (
    SCORERS,
    Judgement,
    Sample,
    ScorerName,
    classification_scores,
    latent_examples,
    scorer_samples,
)
from sae_atlas.saes.eval.names import BackendName, NegativesSource
from sae_atlas.saes.eval.results import read_result, result_paths, result_repair
from sae_atlas.saes.eval.spec import EvalInputs, EvalOutcome, EvalSpec
from sae_atlas.store.search import FeatureSearch
from sae_atlas.store.tables import (
    EXAMPLES_FILE,
    FEATURES_FILE,
    FeatureTables,
    load_occurrence,
    read_sidecar,
)

REPORTED = ("balanced_accuracy", "f1", "auc")
SUMMARY_FILES = (FEATURES_FILE, EXAMPLES_FILE)


@dataclass(frozen=True)
class AutointerpConfig:
    """The back-end (`openai`: its endpoint URL, model, timeout and samples per request; the
    key comes from $SAE_ATLAS_AUTOINTERP_KEY; `hf`: `model` is the spec of the model run
    in-process), latents evaluated, windows per latent shown to the explainer / scored
    activating / scored non-activating, where the non-activating ones come from ("random":
    other latents' examples; "similar": those of the `n_similar` nearest latents by decoder
    cosine, from blocks where the latent never fires), and the seed."""

    backend: BackendName = "lexical"
    url: str = ""
    model: str = ""
    timeout_s: float = 60.0
    batch_size: int = 5
    n_latents: int = 32
    n_explain: int = 10
    n_activating: int = 10
    n_non_activating: int = 10
    negatives: NegativesSource = "random"
    n_similar: int = 10
    seed: int = 0


@functools.cache
def hf_backend(spec: str, device: str) -> HuggingFaceBackend:
    """The in-process back-end of a model spec, loaded once per process and device."""
    return HuggingFaceBackend(json.loads(spec) if spec.lstrip().startswith("{") else spec, device=device)


def build_backend(config: AutointerpConfig, device: str = "cpu") -> AutointerpBackend:
    """The config's back-end; an `openai` endpoint that does not answer or an `hf` model that
    does not load is refused here."""
    if config.backend == "lexical":
        return LexicalBackend()
    if config.backend == "hf":
        if not config.model:
            raise InvalidInputError("the hf autointerp back-end needs --autointerp-model (a model spec)")
        return hf_backend(config.model, device)
    backend = OpenAIBackend(config.url, config.model, key=os.environ.get(KEY_ENV, ""), timeout_s=config.timeout_s,
                            batch_size=config.batch_size)
    backend.check()
    return backend


def autointerp_config(backend: str, *, url: str = "", model: str = "", n_latents: int = 32,
                      negatives: str = "random") -> AutointerpConfig:
    """The config of the command-line options, checked now: an unknown back-end or source of
    negatives, an `openai` endpoint that does not answer or an `hf` model that does not load
    is refused (InvalidInputError) before any work."""
    if backend not in get_args(BackendName):
        raise InvalidInputError(f"unknown autointerp back-end {backend!r}; valid: {', '.join(get_args(BackendName))}")
    if negatives not in get_args(NegativesSource):
        raise InvalidInputError(f"unknown autointerp negatives {negatives!r}; valid: "
                                f"{', '.join(get_args(NegativesSource))}")
    chosen = cast(NegativesSource, negatives)
    if backend == "lexical":
        return AutointerpConfig(n_latents=n_latents, negatives=chosen)
    config = AutointerpConfig(cast(BackendName, backend), url=url, model=model, n_latents=n_latents, negatives=chosen)
    build_backend(config)
    return config


def sampled_latents(features: pl.DataFrame, examples: pl.DataFrame, n: int, seed: int) -> list[int]:
    """Up to `n` latents (seeded, ascending) that fired and have top examples."""
    with_top = set(examples.filter(pl.col("kind") == "top")["latent"].unique().to_list())
    alive = [int(i) for i in features.filter(pl.col("n_active") > 0)["latent"].to_list() if i in with_top]
    chosen = np.random.default_rng(seed).choice(len(alive), size=min(n, len(alive)), replace=False)
    return sorted(alive[i] for i in chosen)


class SimilarNegatives:
    """Hard-negative pools of one SAE: its FAISS decoder index and its occurrence matrix."""

    def __init__(self, root: Path, sae_id: str, examples: pl.DataFrame, k: int) -> None:
        self.search, self.sae_id, self.examples, self.k = FeatureSearch(root), sae_id, examples, k
        occurrence, self.block_index = load_occurrence(root, sae_id)
        self.occurrence = occurrence.tocsc()

    def pool(self, latent: int) -> pl.DataFrame:
        """The stored examples of the latent's nearest latents in blocks where it never fires."""
        nearest = [match.latent for match in self.search.similar(self.sae_id, latent, self.k)]
        fired = self.block_index[self.occurrence[:, latent].nonzero()[0]].tolist()
        return self.examples.filter(pl.col("latent").is_in(nearest) & ~pl.col("block").is_in(fired))


def _pooled(judged: dict[ScorerName, tuple[list[Sample], list[Judgement]]], scorer: ScorerName) -> dict[str, Any]:
    samples, judgements = judged[scorer]
    scores = classification_scores(samples, judgements)
    return {f"{scorer}_{key}": scores[key] for key in REPORTED}


def run_autointerp(inputs: EvalInputs, config: AutointerpConfig) -> EvalOutcome:
    """Explain and score a sample of the SAE's latents from its summary tables."""
    backend = build_backend(config, inputs.device)
    tables = FeatureTables(inputs.atlas, inputs.sae_id)
    pooled: dict[ScorerName, tuple[list[Sample], list[Judgement]]] = {scorer: ([], []) for scorer in SCORERS}
    details: list[dict[str, Any]] = []
    skipped: list[int] = []
    similar = (SimilarNegatives(inputs.atlas, inputs.sae_id, tables.examples, config.n_similar)
               if config.negatives == "similar" else None)
    for latent in sampled_latents(tables.features, tables.examples, config.n_latents, config.seed):
        pool = tables.examples if similar is None else similar.pool(latent)
        examples = latent_examples(latent, tables.examples_for(latent), pool, n_explain=config.n_explain,
                                   n_activating=config.n_activating, n_non_activating=config.n_non_activating,
                                   seed=config.seed)
        if not examples.explain or not examples.activating or not examples.non_activating:
            skipped.append(latent)
            continue
        explanation = backend.explain(examples.explain)
        row: dict[str, Any] = {"latent": latent, "explanation": explanation}
        for scorer in SCORERS:
            samples = scorer_samples(scorer, examples, config.seed)
            judgements = backend.judge(scorer, explanation, samples)
            pooled[scorer][0].extend(samples)
            pooled[scorer][1].extend(judgements)
            row.update({f"{scorer}_{key}": value for key, value in classification_scores(samples, judgements).items()})
        details.append(row)
    if not details:
        raise InvalidInputError(f"SAE {inputs.sae_id!r} has no latent with held-out activating examples to explain "
                                "and score; summarize with more top or band examples")
    per_latent = np.array([row["detection_balanced_accuracy"] for row in details])
    metrics = {"autointerp": {"autointerp_score": float(per_latent.mean()),
                              "autointerp_std_dev": float(per_latent.std()),
                              "backend": backend.description, "n_latents": len(details)},
               **{scorer: _pooled(pooled, scorer) for scorer in SCORERS}}
    summary = {name: tables.sidecar["files"][name]["sha256"] for name in SUMMARY_FILES}
    return EvalOutcome(metrics, details, {"backend": backend.description, "skipped_latents": skipped,
                                              "summary_sha256": summary})


def check_summary(root: Path, sae_id: str) -> None:
    """IntegrityError once the summary tables a stored result was computed from are gone or
    were rebuilt (the result is then recomputed)."""
    path = result_paths(root, sae_id, "autointerp")[0]
    repair = result_repair(root, sae_id, "autointerp")
    try:
        files = read_sidecar(root, sae_id)["files"]
    except NotFoundError as exc:
        raise IntegrityError(path, f"its summary tables are gone ({exc})", repair) from exc
    stored = (read_result(root, sae_id, "autointerp")["eval_result_unstructured"] or {}).get("summary_sha256")
    if stored != {name: files[name]["sha256"] for name in SUMMARY_FILES}:
        raise IntegrityError(path, "computed from other summary tables than the SAE's current ones", repair)


AUTOINTERP: EvalSpec[AutointerpConfig] = EvalSpec("autointerp", "autointerp", AutointerpConfig, run_autointerp,
                                                  check_sources=check_summary)
