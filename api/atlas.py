"""`Atlas(path)`: the whole atlas from Python and notebooks.

```python
from sae_atlas import Atlas
atlas = Atlas("atlas-demo")
atlas.saes()                          # one typed row per SAE (`.frame`: as a polars frame)
sae = atlas.sae(sae_id)               # one SAE, its id checked once: info, tables, map, labels
f = atlas.feature(sae_id, 12)         # stats, histogram, top examples, logits, neighbours, map
atlas.similar(sae_id, 12, k=10)       # decoder-direction neighbours (FAISS)
atlas.search_vector(v, k=10)          # features nearest to a direction
atlas.search_text("the cat sat")      # which features fire on each token (runs the model)
atlas.search_token("monday")          # features whose examples centre on / promote a token
atlas.flow(sae_id, 12)                # best matches of the feature in the other layers' SAEs
atlas.map(sae_id, basis="decoder"); atlas.analyses(); atlas.analysis(kind, run)
atlas.contrast(texts_a, texts_b)      # features separating two sets of texts (runs the model)
atlas.concept_search("weekdays")      # features carrying a concept, their span and its geometry
atlas.compare_circle("circular/weekdays-smollm2-135m", other, sae=a, other_sae=b)   # A's circle fitted in B
atlas.emergence([sae8, sae15, sae22], ["weekdays", "months"])   # where concepts emerge over a series
atlas.geometry_features(in_circle=True, period=7)   # features by the geometry they belong to
atlas.search_labels("weekday")        # features by words in their labels and explanations
atlas.run(text, edits); atlas.steer(text, edits); atlas.attribute(text, target)
atlas.graph("Today is Monday, so tomorrow is", targets=" Tuesday")   # attribution graph
atlas.steering_features(" Friday")   # features ranked by measured steering effect, with a ready edit
atlas.comparison(run); atlas.compared_feature(run, "b", 7)   # a stored comparison; a side's feature card
atlas.crosscoder_latents(cc, latent_class="b_only"); atlas.crosscoder_latent(cc, 3)   # model diffing
atlas.eval(suite="core,mdl")         # the evaluation suite (`sae-atlas eval`), results in SAEBench's layout
atlas.run_circular(sae_id); atlas.analyze_lobes(sae_id); atlas.build_maps()   # the `analyze` verbs
new = Atlas.create("my-atlas", model="smollm2-135m")   # a folder that is not an atlas yet
new.cache(layers=3, tokens=131_072); new.summarize(); new.index()   # `sae-atlas cache / summarize / index`
atlas.add_sae(source); atlas.register(); Atlas.create("atlas-demo").demo()   # `import`, `register`, `demo`
```

Every method is a short delegation to a service (`api.services`), over one
`api.context.AtlasContext` and the `api.sae_view.SaeView` of each SAE it names. Files are
read lazily and kept; the model is loaded only by what runs it. Results are typed
(`api.results`): `to_dict()` is what the HTTP service sends, `_repr_html_()` shows them in
Jupyter and, where a picture helps, `.plot()` draws them.

Reading never writes. These methods write, and say so: `add_sae`, `build_labels`,
`import_explanations`, `rebuild_geometry`, `concept_search(save=...)`, `run_circular`,
`compare_circle` and `emergence`, `eval`, `latent_scaling`, `circle_concept`, the
`analyze_*` methods and `build_maps`, `cache`, `summarize`, `index`, `register` and `demo`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, cast

import polars as pl

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.analyses import (
    CircleConceptParams,
    CircularParams,
    CrystalsParams,
    GalaxyParams,
    HierarchyParams,
    LobesParams,
    MapBuildParams,
    Measure,
    ProbeParams,
)
from sae_atlas.api.operations.analyses import Match as ConceptMatch
from sae_atlas.api.operations.build import (
    CacheParams,
    DemoParams,
    IndexParams,
    LabelsParams,
    StoredDtype,
    SummarizeParams,
)
from sae_atlas.api.operations.compare import CompareOptions
from sae_atlas.api.operations.concept import ConceptSearchParams
from sae_atlas.api.operations.concepts_across import CircleTransferParams, EmergenceParams
from sae_atlas.api.operations.crosscoder import CrosscoderParams, LatentScalingParams
from sae_atlas.api.operations.depth import DepthParams
from sae_atlas.api.operations.evals import EvalParams
from sae_atlas.api.operations.graph import GraphParams
from sae_atlas.api.operations.importing import ExplanationsParams, ImportParams, RegisterParams
from sae_atlas.api.operations.interventions import AttributeParams, RunParams, SteerParams
from sae_atlas.api.operations.pages import (
    CrosscoderLatentParams,
    CrosscoderLatentsParams,
    ExamplesParams,
    FeaturePageParams,
    MapParams,
)
from sae_atlas.api.operations.search import (
    ContrastParams,
    FlowParams,
    GeometrySearchParams,
    LabelSearchParams,
    SimilarParams,
    TextSearchParams,
    TokenSearchParams,
    VectorSearchParams,
)
from sae_atlas.api.operations.steering import (
    SteerBenchParams,
    SteeringScoresParams,
    SteeringSearchParams,
    user_prompts,
)
from sae_atlas.api.operations.train import Architecture, DictDtype, TrainParams
from sae_atlas.api.results.analysis import (
    AnalysisResult,
    AnalysisRunFiles,
    CircleTransferResult,
    CircularDiscovery,
    CrosscoderRun,
    DepthProfile,
    EmergenceResult,
)
from sae_atlas.api.results.atlas_json import AtlasMeta
from sae_atlas.api.results.board import Board
from sae_atlas.api.results.build import Imported, IndexInfo
from sae_atlas.api.results.compare import CompareResult, CompareRunRow, Side
from sae_atlas.api.results.crosscoder import CrosscoderLatentCard, CrosscoderLatents, CrosscoderRow
from sae_atlas.api.results.depth import DepthRun, DepthRunRow
from sae_atlas.api.results.evals import EvalResult
from sae_atlas.api.results.feature import Feature, LatentSummary, Match, StoredExample
from sae_atlas.api.results.feature_map import MapPoint
from sae_atlas.api.results.geometry_builds import CircleProbeRun, MapBuild
from sae_atlas.api.results.graph import GraphView
from sae_atlas.api.results.interventions import AttributionView, RunView, SteerView
from sae_atlas.api.results.meaning import ConceptResult, ContrastResult, GeometryFeature, LabelHit
from sae_atlas.api.results.registration import Registration
from sae_atlas.api.results.rows import Rows
from sae_atlas.api.results.sae import SaeInfo, SaeStatus
from sae_atlas.api.results.search import TextSearch, TokenFeatures
from sae_atlas.api.results.steering import SteerBench, SteeringSearch
from sae_atlas.api.results.suite import SuiteResults
from sae_atlas.api.sae_view import MapScores, SaeView, open_sae
from sae_atlas.api.services import (
    analyses,
    board,
    build,
    circle_probe,
    compare_features,
    crosscoder_reads,
    features,
    geometry_runs,
    interventions,
    labels,
    meaning,
    registration,
    saes,
    search,
)
from sae_atlas.api.services import circle_transfer as circle_service
from sae_atlas.api.services import compare as compare_service
from sae_atlas.api.services import crosscoder as crosscoder_service
from sae_atlas.api.services import demo as demo_service
from sae_atlas.api.services import depth_runs as depth_service
from sae_atlas.api.services import emergence as emergence_service
from sae_atlas.api.services import evals as evals_service
from sae_atlas.api.services import graph as graph_service
from sae_atlas.api.services import steering as steering_service
from sae_atlas.api.services.steer_stream import SteerStream, steer_stream
from sae_atlas.api.services.train import run_train
from sae_atlas.errors import IntegrityError, NotFoundError
from sae_atlas.geometry.causal import Metric as CausalMetric
from sae_atlas.geometry.circular_discovery import ClusterMethod
from sae_atlas.geometry.concept_vectors import Estimator
from sae_atlas.geometry.emergence_options import Metric
from sae_atlas.geometry.trajectories import TrajectorySpace
from sae_atlas.saes.cache import CacheSummary
from sae_atlas.saes.compare.crosscoder import LatentClass
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.distributed import DistContext
from sae_atlas.saes.encoding.texts import Pool
from sae_atlas.saes.eval.names import BackendName, EvalName, NegativesSource
from sae_atlas.saes.intervene.attribution import AttributionMode
from sae_atlas.saes.intervene.output_scores import SteeringReport
from sae_atlas.saes.intervene.steering_prompts import PROMPT_STYLES, PromptStyle
from sae_atlas.saes.intervene.steering_search import SteerMode
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.summary.run import SummaryReport
from sae_atlas.store.activations import Split
from sae_atlas.store.geometry_records import rebuild_geometry_records
from sae_atlas.store.layout import AtlasLayout
from sae_atlas.store.maps import Basis
from sae_atlas.store.search import Filters


class Atlas:
    """One atlas directory: its SAEs, summaries, indexes, maps, analyses and model."""

    def __init__(self, root: str | Path, *, model: Any = None) -> None:
        """Open the atlas at `root`; `model` (a ModelHandle or spec) overrides atlas.json's."""
        self.ctx = AtlasContext(root, model)

    @classmethod
    def create(cls, root: str | Path, *, model: Any = None) -> Atlas:
        """An atlas to build at `root` (`cache`, training from the model): the existing one
        when `root` has an atlas.json, else one that need not exist yet, whose write operations
        create it and run `model` (a spec or ModelHandle; default the recorded model, else
        `saes.models.DEFAULT_MODEL`). Writes nothing itself."""
        atlas = cls.__new__(cls)
        atlas.ctx = AtlasContext.create(root, model)
        return atlas

    def __repr__(self) -> str:
        return f"Atlas({str(self.root)!r}, saes={self.sae_ids})"

    @property
    def root(self) -> Path:
        return self.ctx.root

    @property
    def layout(self) -> AtlasLayout:
        return self.ctx.layout

    @property
    def meta(self) -> AtlasMeta:
        """atlas.json as read when the atlas was opened (or last changed through it)."""
        return cast(AtlasMeta, self.ctx.meta)

    # SAEs ---------------------------------------------------------------------------------
    def sae(self, sae_id: str) -> SaeView:
        """One SAE, its id checked once (NotFoundError listing the valid ids)."""
        return open_sae(self.ctx, sae_id)

    @property
    def sae_ids(self) -> list[str]:
        """Ids of the SAEs with saved weights or registered in atlas.json (a registered SAE
        whose files are missing stays listed; reading it raises IntegrityError)."""
        return self.ctx.sae_ids()

    @property
    def clt_ids(self) -> list[str]:
        """Ids of the cross-layer transcoders saved under clts/ or registered in atlas.json
        (their records: atlas.json's `clts`)."""
        return self.ctx.layout.clt_ids()

    def _views(self, sae_ids: list[str] | None) -> list[SaeView]:
        """The named SAEs, or every SAE (NotFoundError when the atlas has none)."""
        ids = list(sae_ids) if sae_ids else self.sae_ids
        if not ids:
            raise NotFoundError(f"the atlas {self.root} has no SAEs yet")
        return [self.sae(sae_id) for sae_id in ids]

    def _spliced(self, sae_ids: list[str] | None) -> list[SaeView]:
        """The named SAEs, or every SAE (none when the atlas has none: an edit may need none)."""
        return [self.sae(sae_id) for sae_id in sae_ids or self.sae_ids]

    def saes(self) -> Rows[SaeStatus]:
        """One row per SAE: id, hook, architecture, widths, held-out metrics and `status`:
        "ok"; "damaged" with `problem` naming the damaged file and its repair; or
        "unregistered" (a folder atlas.json does not list) with the `sae-atlas register` command."""
        return saes.listing(self.ctx)

    def board(self) -> Board:
        """The eval board: one row per SAE (`sae_id`, `status`, `problem`), one `<eval>/<metric>`
        column per metric of its verified `evals/<eval>.json` results (`sae-atlas eval --suite`);
        `.frame` is the same board as one polars frame."""
        return board.board(self.ctx)

    def eval_result(self, sae_id: str, name: str) -> EvalResult:
        """One verified eval result of an SAE in SAEBench's layout (`saes/<id>/evals/<name>.json`;
        NotFoundError when it has none, naming the command that computes it)."""
        return evals_service.eval_result(self.ctx, sae_id, name)

    def eval(self, saes: list[str] | None = None, *, suite: str | Sequence[EvalName] = ("core",),
             tokens: int = EvalParams.default("tokens"), ce_blocks: int = EvalParams.default("ce_blocks"),
             no_model: bool = False, from_model: bool = False, batch_blocks: int = EvalParams.default("batch_blocks"),
             probe_data: str | Path | None = None, label_field: str = EvalParams.default("label_field"),
             probe_sets: list[str] | None = None, per_class: int | None = None,
             ground_truth: str | Path | None = None,
             autointerp_backend: BackendName = EvalParams.default("autointerp_backend"), autointerp_url: str = "",
             autointerp_model: str = "", autointerp_latents: int = EvalParams.default("autointerp_latents"),
             autointerp_negatives: NegativesSource = EvalParams.default("autointerp_negatives"),
             force: bool = False,
             corpus: CorpusSpec | None = None, device: str | None = None, progress: bool = True,
             sae_ids: list[str] | None = None, n_tokens: int | None = None) -> SuiteResults | None:
        """Writes: run the evaluation suite (`suite`: "core", "sparse_probing", "meta", "mdl",
        "ground_truth", "absorption", "autointerp", "scr", "tpp"; a text may name several,
        comma-separated) on the SAEs `saes` (default every trained one), with the atlas's model
        on `device`; each result in `saes/<id>/evals/<eval>.json` (SAEBench's layout; core also
        in eval.json). Finished results are kept unless `force`. With `from_model`, core streams
        `tokens` tokens of `corpus` through the model. EvalsFailed (with `.results`) when some
        evals failed; None on torchrun ranks other than 0. The parameters are
        `api.operations.evals.EvalParams` (`sae_ids`, `n_tokens`: deprecated old names)."""
        params = EvalParams.of(saes=saes, suite=suite, tokens=tokens, ce_blocks=ce_blocks, no_model=no_model,
                               from_model=from_model, batch_blocks=batch_blocks, probe_data=probe_data,
                               label_field=label_field, probe_sets=probe_sets, per_class=per_class,
                               ground_truth=ground_truth, autointerp_backend=autointerp_backend,
                               autointerp_url=autointerp_url, autointerp_model=autointerp_model,
                               autointerp_latents=autointerp_latents, autointerp_negatives=autointerp_negatives,
                               force=force, sae_ids=sae_ids, n_tokens=n_tokens)
        return evals_service.run_evals(self.ctx, params, corpus=corpus, device=device, progress=progress)

    def sae_status(self, sae_id: str) -> SaeStatus:
        """`sae_info` plus `status` "ok"; for a damaged SAE what atlas.json records of it,
        `status` "damaged" and the `problem`; "unregistered" for a folder atlas.json lacks."""
        return saes.status(self.ctx, sae_id)

    def sae_info(self, sae_id: str) -> SaeInfo:
        """Facts about one SAE (from atlas.json and its cfg.json); NotFoundError if unknown."""
        return self.sae(sae_id).info

    def damage(self, sae_id: str) -> IntegrityError | None:
        """What makes an SAE unservable (`SaeView.damage`); None when its files verify."""
        return self.sae(sae_id).damage()

    def damaged(self) -> dict[str, str]:
        """The damaged SAEs and what is wrong with each: the file (relative to the atlas),
        the problem and the repair."""
        return saes.damaged(self.ctx)

    def preload(self) -> None:
        """Load now what feature pages and searches read (summary tables, maps, indexes and
        the neighbour tables of every SAE pair of one width), so that no request pays for it.
        A damaged SAE does not stop the others: `saes()` reports it and its own pages raise."""
        saes.preload(self.ctx)

    def add_sae(self, source: str | Path, *, hook: str | None = None, sae_id: str | None = None,
                link: bool = False, force: bool = False, registry: str | Path | None = None,
                with_model: bool = True, clt: bool = False) -> Imported:
        """Writes: import a pretrained SAE (a folder in a known layout, `RELEASE/SAE_ID` from
        a registry, or `hf://org/repo/path[@revision]`) or a circuit-tracer CLT (`clt`) after
        the misload guard, with this atlas's model; returns what was imported and its metrics.
        The parameters are `api.operations.importing.ImportParams`."""
        params = ImportParams.of(source=str(source), hook=hook, sae_id=sae_id, link=link, force=force,
                                 registry=registry, with_model=with_model, clt=clt)
        return saes.add_sae(self.ctx, params)

    def register(self, *, saes: list[str] | None = None, analyses: list[str] | None = None) -> list[Registration]:
        """Writes: register again SAE folders atlas.json does not list (`saes`) and analysis runs
        (`analyses`, KIND/RUN) their runs.json does not list, after checking their files; with
        neither, every unregistered one. One row per attempt ("registered" or why it was
        refused). The parameters are `api.operations.importing.RegisterParams`."""
        return registration.register(self.ctx, RegisterParams.of(saes=saes, analyses=analyses))

    # building (writes; the model is this atlas's, see `Atlas.create`) ---------------------
    def train(self, hooks: list[str] | None = None, *, arch: Architecture | None = None, d_sae: int | None = None,
              expansion: int | None = None, k: int | None = None, tokens: int | None = None,
              batch_size: int | None = None, lr: float | None = None, seed: int | None = None,
              transcode: bool = False, skip: bool = False, cross_layer: bool = False,
              crosscoders: list[tuple[str, str]] | None = None, model_b: str | dict[str, Any] | None = None,
              from_model: bool = False, dict_dtype: DictDtype = TrainParams.default("dict_dtype"),
              batch_blocks: int = TrainParams.default("batch_blocks"), buffer_tokens: int | None = None,
              heldout_tokens: int | None = None, checkpoint_every: int | None = None,
              distribute_modules: bool = False, overwrite: bool = False, config: dict[str, Any] | None = None,
              corpus: CorpusSpec | None = None, device: str | None = None,
              progress: bool = True) -> dict[str, dict[str, Any]]:
        """Writes: SAEs at `hooks` (transcoders with `transcode`, one cross-layer transcoder
        with `cross_layer`) from this atlas's caches, or with `from_model` from one streamed
        forward of its model over `corpus` (default the builtin text), creating the atlas if
        needed, every pair of `crosscoders` trained as a crosscoder in the same forward
        (HOOK_B of `model_b` when given, run on the same tokens); resumable after kill -9. Returns the records: SAEs by hook, crosscoders and a CLT by
        id. The parameters are `api.operations.train.TrainParams`."""
        params = TrainParams.of(hooks=hooks, arch=arch, d_sae=d_sae, expansion=expansion, k=k, tokens=tokens,
                                batch_size=batch_size, lr=lr, seed=seed, transcode=transcode, skip=skip,
                                cross_layer=cross_layer, crosscoders=crosscoders, model_b=model_b,
                                from_model=from_model,
                                dict_dtype=dict_dtype, batch_blocks=batch_blocks, buffer_tokens=buffer_tokens,
                                heldout_tokens=heldout_tokens, checkpoint_every=checkpoint_every,
                                distribute_modules=distribute_modules, overwrite=overwrite, config=config)
        return run_train(self.ctx, params, corpus=corpus, device=device, progress=progress)

    def cache(self, hooks: list[str] | None = None, *, layers: int = CacheParams.default("layers"),
              tokens: int = CacheParams.default("tokens"), dtype: StoredDtype = CacheParams.default("dtype"),
              batch_blocks: int = CacheParams.default("batch_blocks"),
              shard_blocks: int = CacheParams.default("shard_blocks"), corpus: CorpusSpec | None = None,
              device: str | None = None, progress: bool = True) -> CacheSummary:
        """Writes: cache `hooks` (default: resid_post at `layers` spread layers) of this atlas's
        model over `tokens` tokens of `corpus` (default: the builtin text) on `device`, creating
        the atlas if needed; re-running resumes an interrupted run (also after kill -9). Under
        torchrun each rank writes its share of the shards. The parameters are
        `api.operations.build.CacheParams`."""
        params = CacheParams.of(hooks=hooks, layers=layers, tokens=tokens, dtype=dtype, batch_blocks=batch_blocks,
                                shard_blocks=shard_blocks)
        return build.cache(self.ctx, params, corpus=corpus, device=device, progress=progress)

    def summarize(self, saes: list[str] | None = None, *, tokens: int | None = None,
                  top_k: int = SummarizeParams.default("top_k"), before: int = SummarizeParams.default("before"),
                  after: int = SummarizeParams.default("after"), seed: int = SummarizeParams.default("seed"),
                  force: bool = False, with_model: bool = True, from_model: bool = False,
                  batch_blocks: int = SummarizeParams.default("batch_blocks"), checkpoint_every: int | None = None,
                  corpus: CorpusSpec | None = None, device: str | None = None,
                  progress: bool = True) -> list[SummaryReport]:
        """Writes: the feature tables of `saes` (default all): density, quantiles, histograms,
        top and band examples, logit effects (`with_model`), over held-out cached tokens or,
        `from_model`, `tokens` tokens of `corpus` streamed through this atlas's model
        (resumable; ranks split under torchrun); then their offline labels. The parameters are
        `api.operations.build.SummarizeParams`."""
        params = SummarizeParams.of(saes=saes, tokens=tokens, top_k=top_k, before=before, after=after, seed=seed,
                                    force=force, with_model=with_model, from_model=from_model,
                                    batch_blocks=batch_blocks, checkpoint_every=checkpoint_every)
        return build.summarize(self.ctx, self._views(params.saes), params, corpus=corpus, device=device,
                               progress=progress)

    def index(self, saes: list[str] | None = None, *, rebuild: bool = False,
              approx_threshold: int = IndexParams.default("approx_threshold"),
              seed: int = IndexParams.default("seed")) -> list[IndexInfo]:
        """Writes: the FAISS index of each SAE (default all) and the model-wide one; indexes
        that verify are kept unless `rebuild`. Their descriptions, `rebuilt` telling which were
        (re)written. The parameters are `api.operations.build.IndexParams`."""
        return build.index(self.ctx, IndexParams.of(saes=saes, rebuild=rebuild, approx_threshold=approx_threshold,
                                                    seed=seed))

    def demo(self, *, tokens: int = DemoParams.default("tokens"),
             train_tokens: int = DemoParams.default("train_tokens"), layers: int = DemoParams.default("layers"),
             seed: int = DemoParams.default("seed"), device: str | None = None,
             report: demo_service.Report | None = None) -> demo_service.DemoBuilt:
        """Writes: every step of the demo on this atlas's model (`Atlas.create(root)`: the default
        one) and the builtin corpus: cache, one TopK SAE per layer evaluated, summaries, indexes,
        circles, hierarchy, maps and what the explorer's pages open on; steps that finished are
        kept. `report` receives what each step shows (`api.services.demo.Report`). What was
        built. The parameters are `api.operations.build.DemoParams`."""
        params = DemoParams.of(tokens=tokens, train_tokens=train_tokens, layers=layers, seed=seed)
        return demo_service.run_demo(self.ctx, params, device=device, report=report or (lambda shown: None))

    # features -----------------------------------------------------------------------------
    def feature(self, sae_id: str, index: int, *, examples: int = FeaturePageParams.default("examples"),
                neighbours: int = FeaturePageParams.default("neighbours")) -> Feature:
        """Everything about one feature: stats, histogram, top examples, logit effects,
        nearest decoder neighbours in its SAE, best cross-layer matches and map position.
        The parameters are `api.operations.pages.FeaturePageParams`."""
        params = FeaturePageParams.of(examples=examples, neighbours=neighbours)
        return features.feature_page(self.sae(sae_id), index, examples=params.examples, neighbours=params.neighbours)

    def examples(self, sae_id: str, index: int, kind: Literal["top", "band"] | None = None) -> Rows[StoredExample]:
        """All stored example contexts of a feature (top-k and activation bands; `kind`: only
        one of them). The parameters are `api.operations.pages.ExamplesParams`."""
        return features.examples(self.sae(sae_id), index, ExamplesParams.of(kind=kind).kind)

    def features(self, sae_id: str) -> Rows[LatentSummary]:
        """The SAE's per-latent summary table (features.parquet)."""
        return Rows(LatentSummary, self.sae(sae_id).tables().features)

    # searches -----------------------------------------------------------------------------
    def similar(self, sae_id: str, index: int, k: int = SimilarParams.default("k")) -> Rows[Match]:
        """The `k` latents of the same SAE whose decoder directions are nearest (cosine).
        The parameters are `api.operations.search.SimilarParams`."""
        return search.similar(self.sae(sae_id), index, SimilarParams.of(k=k).k)

    def search_vector(self, vector: Any, *, saes: list[str] | None = None, k: int = VectorSearchParams.default("k"),
                      in_circle: bool | None = None, period: float | None = None, lobe: int | None = None,
                      sae_id: str | None = None) -> Rows[Match]:
        """Latents whose decoder directions are nearest to `vector` (length d_in), in the
        SAEs `saes` of that width (default all); columns sae_id, latent, cosine. The
        geometry filters (`in_circle`, `period`, `lobe`) keep the features whose geometry
        records match (see `geometry_features`). The parameters are
        `api.operations.search.VectorSearchParams` (`sae_id`: the deprecated old name of `saes`)."""
        params = VectorSearchParams.of(vector=vector, saes=saes, sae_id=sae_id, k=k, in_circle=in_circle,
                                       period=period, lobe=lobe)
        filters = Filters(in_circle=params.in_circle, period=params.period, lobe=params.lobe)
        return search.by_vector(self.ctx, params.vector, self._views(params.saes), params.k, filters)

    def flow(self, sae_id: str, index: int, k: int = FlowParams.default("k")) -> Rows[Match]:
        """Cross-layer flow: the best-matching latents of this feature in the other SAEs of the
        model (by decoder cosine); columns sae_id, hook, latent, cosine. The parameters are
        `api.operations.search.FlowParams`."""
        return search.flow(self.sae(sae_id), index, FlowParams.of(k=k).k)

    def search_token(self, token: str | int, *, saes: list[str] | None = None,
                     k: int = TokenSearchParams.default("k"), sae_id: str | None = None) -> TokenFeatures:
        """Features whose top examples centre on `token` and features whose logit effects
        promote it (a token id, or a string looked up in the model's vocabulary), in the
        SAEs `saes` (default all). The parameters are `api.operations.search.TokenSearchParams`
        (`sae_id`: the deprecated old name of `saes`)."""
        params = TokenSearchParams.of(token=token, saes=saes, sae_id=sae_id, k=k)
        return search.search_token(self.ctx, params.token, self._views(params.saes), params.k)

    def search_text(self, text: str, *, saes: list[str] | None = None, k: int = TextSearchParams.default("k"),
                    include_special: bool = TextSearchParams.default("include_special"),
                    sae_ids: list[str] | None = None) -> TextSearch:
        """Run the model on `text` and encode each token with each SAE (`saes`, default all):
        per token, the `k` most active features and their labels; BOS and the model's other
        special tokens are left out unless `include_special`. Loads the model (atlas.json
        "model") on first use. The parameters are `api.operations.search.TextSearchParams`
        (`sae_ids`: the deprecated old name of `saes`)."""
        params = TextSearchParams.of(text=text, saes=saes, sae_ids=sae_ids, k=k, include_special=include_special)
        return search.search_text(self.ctx, self._views(params.saes), params)

    def contrast(self, texts_a: list[str], texts_b: list[str], *, saes: list[str] | None = None,
                 k: int = ContrastParams.default("k"), pool: Pool = ContrastParams.default("pool"),
                 n_permutations: int = ContrastParams.default("n_permutations"),
                 alpha: float = ContrastParams.default("alpha"),
                 duplicate_threshold: float = ContrastParams.default("duplicate_threshold"),
                 seed: int = ContrastParams.default("seed"), sae_ids: list[str] | None = None) -> ContrastResult:
        """Features that separate two sets of texts (runs the model): each text's activations
        pooled over its tokens (`pool`), per feature the difference of means, AUROC, Cohen's
        d, a permutation p-value and a Benjamini-Hochberg q-value; the best `k`, with
        near-duplicates (decoder cosine >= `duplicate_threshold`) grouped. The parameters
        are `api.operations.search.ContrastParams` (`sae_ids`: the deprecated old name of `saes`)."""
        params = ContrastParams.of(texts_a=texts_a, texts_b=texts_b, saes=saes, sae_ids=sae_ids, k=k, pool=pool,
                                   n_permutations=n_permutations, alpha=alpha,
                                   duplicate_threshold=duplicate_threshold, seed=seed)
        return meaning.contrast(self.ctx, self._views(params.saes), params)

    def concept_search(self, concept: Any, *, saes: list[str] | None = None,
                       min_fire_rate: float = ConceptSearchParams.default("min_fire_rate"),
                       min_selectivity: float = ConceptSearchParams.default("min_selectivity"),
                       target: float = ConceptSearchParams.default("target"),
                       max_features: int = ConceptSearchParams.default("max_features"),
                       seed: int = ConceptSearchParams.default("seed"), save: str | None = None,
                       sae_ids: list[str] | None = None) -> ConceptResult:
        """Which features carry a concept (runs the model on its prompts): per SAE the
        features that fire on the concept tokens and vary with the value, the smallest
        group whose decoder span explains `target` of the variation across values, and the
        span's geometry (circle probe, cyclic order and period for an ordered concept;
        held-out LDA accuracy for categories). `concept`: a built-in name (weekdays,
        months, colours), a dict or JSON file (`values`, `templates`, `kind`), or a concept
        object. Writes with `save`: the result as analysis run `concept_search/<save>`, and
        the rebuilt geometry records. The parameters are
        `api.operations.concept.ConceptSearchParams` (`sae_ids`: the deprecated old name of `saes`)."""
        params = ConceptSearchParams.of(concept=concept, saes=saes, sae_ids=sae_ids, min_fire_rate=min_fire_rate,
                                        min_selectivity=min_selectivity, target=target, max_features=max_features,
                                        seed=seed, save=save)
        return meaning.concept_search(self.ctx, self._views(params.saes), params)

    def geometry_features(self, saes: list[str] | str | None = None, *, in_circle: bool | None = None,
                          period: float | None = None, lobe: int | None = None,
                          kind: Literal["circle", "concept", "hierarchy", "lobe"] | None = None,
                          sae_id: str | None = None) -> Rows[GeometryFeature]:
        """Geometry records (circles, concept spans, hierarchy nodes, lobes) of the features
        of `saes` (default all; one id is a list of one) that pass the filters, e.g. every
        feature of a period-7 circle: `in_circle=True, period=7`. Built from the stored
        analyses by `rebuild_geometry()`. The parameters are
        `api.operations.search.GeometrySearchParams` (`sae_id`: the deprecated old name of `saes`)."""
        params = GeometrySearchParams.of(saes=saes, sae_id=sae_id, in_circle=in_circle, period=period, lobe=lobe,
                                         kind=kind)
        return meaning.geometry_features(self._views(params.saes), in_circle=params.in_circle, period=params.period,
                                         lobe=params.lobe, kind=params.kind)

    def rebuild_geometry(self) -> dict[str, int]:
        """Writes: every SAE's geometry records, from the stored analysis runs; rows per SAE."""
        return rebuild_geometry_records(self.root)

    # labels -------------------------------------------------------------------------------
    def build_labels(self, saes: list[str] | None = None) -> dict[str, int]:
        """Writes: every (or each given) summarized SAE's offline labels; labels per SAE. The
        parameters are `api.operations.build.LabelsParams`."""
        params = LabelsParams.of(saes=saes)
        return {view.sae_id: labels.build_labels(view) for view in self._views(params.saes)}

    def import_explanations(self, sae_id: str, path: str | Path, *, source: str | None = None) -> int:
        """Writes: explanations for one SAE from a Neuronpedia explanations export (.json) or
        a CSV of feature,explanation; `source` (default: the file name) names the set. The
        parameters are `api.operations.importing.ExplanationsParams`."""
        params = ExplanationsParams.of(sae_id=sae_id, path=path, source=source)
        return labels.import_explanations(self.sae(params.sae_id), params.path, params.source or params.path.stem)

    def search_labels(self, query: str, *, saes: list[str] | None = None, k: int = LabelSearchParams.default("k"),
                      sae_id: str | None = None) -> Rows[LabelHit]:
        """Features of `saes` (default all) whose label or imported explanations match
        `query` (BM25, local): columns sae_id, latent, score, label, explanations. The
        parameters are `api.operations.search.LabelSearchParams` (`sae_id`: the deprecated
        old name of `saes`)."""
        params = LabelSearchParams.of(query=query, saes=saes, sae_id=sae_id, k=k)
        return labels.search_labels(self.ctx, params.query, self._views(params.saes), params.k)

    # interventions (the model runs in saes.intervene) -------------------------------------
    def run(self, text: str, edits: list[Any] | None = None, *, saes: list[str] | None = None,
            k: int = RunParams.default("k"), sae_ids: list[str] | None = None) -> RunView:
        """Run the model on `text` with `saes` (default: every SAE; and every SAE an edit
        names) spliced in, error term kept, and `edits` applied (dicts or
        `saes.intervene.edits` specs): next-token predictions vs clean, and each SAE's
        feature activations. The parameters are `api.operations.interventions.RunParams`
        (`sae_ids`: the deprecated old name of `saes`)."""
        params = RunParams.of(text=text, edits=edits or [], saes=saes, sae_ids=sae_ids, k=k)
        return interventions.run(self.ctx, self._spliced(params.saes), params)

    def steer(self, text: str, edits: list[Any] | None = None, *, saes: list[str] | None = None,
              feature: int | None = None, alpha: float = SteerParams.default("alpha"),
              at: Literal["all", "last"] = SteerParams.default("at"),
              max_new_tokens: int = SteerParams.default("max_new_tokens"),
              temperature: float = SteerParams.default("temperature"), seed: int = SteerParams.default("seed"),
              sae: str | list[str] | None = None, sae_ids: list[str] | None = None) -> SteerView:
        """Generate from `text` without and with the edits (and a steer of `feature` of the one
        SAE in `saes` by `alpha` at `at`), same seed, `saes` (default: every SAE) spliced in;
        the texts and the next-token shift. The parameters are
        `api.operations.interventions.SteerParams` (`sae`, `sae_ids`: deprecated old names of `saes`)."""
        params = SteerParams.of(text=text, edits=edits or [], saes=saes, feature=feature, alpha=alpha, at=at,
                                max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                sae=[sae] if isinstance(sae, str) else sae, sae_ids=sae_ids)
        return interventions.steer(self.ctx, self._spliced(params.saes), params)

    def steer_stream(self, text: str, edits: list[Any] | None = None, *, saes: list[str] | None = None,
                     feature: int | None = None, alpha: float = SteerParams.default("alpha"),
                     at: Literal["all", "last"] = SteerParams.default("at"),
                     max_new_tokens: int = SteerParams.default("max_new_tokens"),
                     temperature: float = SteerParams.default("temperature"), seed: int = SteerParams.default("seed"),
                     sae: str | list[str] | None = None, sae_ids: list[str] | None = None) -> SteerStream:
        """`steer` checked now and generated as it is iterated: one step's baseline and edited
        tokens at a time, then `.result` is what `steer` returns (the same parameters)."""
        params = SteerParams.of(text=text, edits=edits or [], saes=saes, feature=feature, alpha=alpha, at=at,
                                max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                sae=[sae] if isinstance(sae, str) else sae, sae_ids=sae_ids)
        return steer_stream(self.ctx, self._spliced(params.saes), params)

    def attribute(self, text: str, target: Any, *, saes: list[str] | None = None,
                  top: int = AttributeParams.default("top"), verify: int = AttributeParams.default("verify"),
                  mode: AttributionMode = AttributeParams.default("mode"),
                  sae_ids: list[str] | None = None) -> AttributionView:
        """Activation x gradient attribution of `target` (a token, or `{"kind": "logit" |
        "logit_diff" | "loss", ...}`) to the features of `saes` (default: every SAE) on `text`,
        with the completeness check and the top features' true ablation effects. `mode`:
        "linearized" (parts sum to the target) or "gradient" (the model's own gradient). The
        parameters are `api.operations.interventions.AttributeParams` (`sae_ids`: the
        deprecated old name of `saes`)."""
        params = AttributeParams.of(text=text, target=target, saes=saes, sae_ids=sae_ids, top=top, verify=verify,
                                    mode=mode)
        return interventions.attribute_text(self.ctx, self._views(params.saes), params)

    def graph(self, text: str, targets: str | int | list[str | int] | None = None, *,
              saes: list[str] | None = None, max_logits: int = GraphParams.default("max_logits"),
              cumulative_prob: float = GraphParams.default("cumulative_prob"),
              node_threshold: float = GraphParams.default("node_threshold"),
              edge_threshold: float = GraphParams.default("edge_threshold"),
              supernodes: bool | dict[str, list[tuple[str, int]]] = GraphParams.default("supernodes"),
              by_position: bool = GraphParams.default("by_position"),
              interventions: list[dict[str, Any]] | None = None, top: int = GraphParams.default("top"),
              freeze_mlps: bool = GraphParams.default("freeze_mlps"), clt: str | None = None,
              sae_ids: list[str] | None = None, target: str | int | list[str | int] | None = None) -> GraphView:
        """Attribution graph of the next token after `text` (circuit-tracer's method,
        `saes.circuits`): logit nodes for `targets` (tokens) or the top predictions up to
        `cumulative_prob`, over the atlas's cross-layer transcoder (`clt`, or its only one by
        default), else its transcoders (one per MLP) or residual SAEs (`saes` chooses),
        pruned by influence, scored, with supernodes (True: from the stored geometry, circles,
        concept spans, lobes; or `{label: [(sae_id, latent), ...]}`) and `interventions`
        (`{"node": node id or supernode label, "kind": "ablate" | "clamp" | "steer",
        "value": ...}`) beside the graph's prediction. `freeze_mlps`: transcoders at some
        layers only, the other MLPs frozen (their outputs error nodes). `.save(path)` writes
        the graph JSON. The parameters are `api.operations.graph.GraphParams`; `sae_ids` and
        `target` are their deprecated old names, and `supernodes="geometry"` / `None` the old
        spellings of True / False."""
        if supernodes is None or isinstance(supernodes, str):
            warnings.warn("supernodes='geometry' / None are deprecated: pass True / False", DeprecationWarning,
                          stacklevel=2)
            supernodes = supernodes == "geometry"
        single = (targets if targets is not None else target)
        if isinstance(single, (str, int)):
            targets, target = [single], None
        params = GraphParams.of(text=text, targets=targets, target=target, saes=saes, sae_ids=sae_ids,
                                max_logits=max_logits, cumulative_prob=cumulative_prob, node_threshold=node_threshold,
                                edge_threshold=edge_threshold, supernodes=supernodes, by_position=by_position,
                                interventions=interventions or [], top=top, freeze_mlps=freeze_mlps, clt=clt)
        views = [] if params.clt else [self.sae(s) for s in params.saes or self.sae_ids]
        return graph_service.graph(self.ctx, views, params)

    def steering_features(self, target: Any, *, saes: list[str] | None = None,
                          k: int = SteeringSearchParams.default("k"),
                          mode: SteerMode = SteeringSearchParams.default("mode"),
                          ratio: float = SteeringSearchParams.default("ratio"),
                          kl_bound: float = SteeringSearchParams.default("kl_bound"),
                          n_prompts: int = SteeringSearchParams.default("n_prompts"), seed: int | None = None,
                          candidates: int = SteeringSearchParams.default("candidates"),
                          confirm_prompts: int = SteeringSearchParams.default("confirm_prompts"),
                          styles: Sequence[PromptStyle] = PROMPT_STYLES, prompts: Sequence[str] | str | Path = (),
                          category: Any = None, include_dead: bool = SteeringSearchParams.default("include_dead"),
                          combine: int = SteeringSearchParams.default("combine"),
                          sae_ids: list[str] | None = None) -> SteeringSearch:
        """Features ranked by their MEASURED effect toward `target` (a token, a list of tokens,
        `{"kind": "concept", "concept": "weekdays"}` or `{"kind": "contrast", "texts_a": [...],
        "texts_b": [...]}`): steered at the last token of held-out neutral prompts, each with
        the smallest strength raising the target's probability `ratio`-fold under `kl_bound`
        (KL on the rest of the distribution) and its ready edit (`mode` "add" or "clamp").
        Ranked on one prompt set and confirmed on a disjoint one of each style in `styles`
        (neutral, in-context and question templates of the target's class or `category`,
        the user's `prompts`: a list or a file); latents below the density floor are left out
        unless `include_dead`; `combine` features are also fitted together.
        Needs the SAEs' summaries and steering tables (`sae-atlas steering-scores`). The
        parameters are `api.operations.steering.SteeringSearchParams` (`sae_ids`: the
        deprecated old name of `saes`)."""
        params = SteeringSearchParams.of(target=target, saes=saes, sae_ids=sae_ids, k=k, mode=mode, ratio=ratio,
                                         kl_bound=kl_bound, n_prompts=n_prompts, seed=seed, candidates=candidates,
                                         confirm_prompts=confirm_prompts, styles=list(styles),
                                         prompts=user_prompts(prompts), category=category,
                                         include_dead=include_dead, combine=combine)
        return steering_service.steering_features(self.ctx, self._views(params.saes), params)

    def steer_bench(self, targets: list[Any], *, saes: list[str] | None = None,
                    ratio: float = SteerBenchParams.default("ratio"),
                    kl_bound: float = SteerBenchParams.default("kl_bound"),
                    n_prompts: int = SteerBenchParams.default("n_prompts"),
                    candidates: int = SteerBenchParams.default("candidates"),
                    prompt_prefix: str = SteerBenchParams.default("prompt_prefix"),
                    confirm_prompts: int = SteerBenchParams.default("confirm_prompts"),
                    styles: Sequence[PromptStyle] = PROMPT_STYLES, prompts: Sequence[str] | str | Path = (),
                    combine: int = SteerBenchParams.default("combine"),
                    sae_ids: list[str] | None = None) -> SteerBench:
        """An AxBench-style benchmark per target: the best-ranked feature (added and clamped),
        the fitted combination, the top-activating feature, a difference of means, a probe, a
        random feature (matched norms) and prompting, each calibrated on the ranking prompts
        and counted on held-out prompts of each style: the share of (target, prompt) pairs
        reaching `ratio` under `kl_bound` (`saes.intervene.steer_bench`); `.plot(path)` draws it.
        The parameters are `api.operations.steering.SteerBenchParams` (`sae_ids`: the
        deprecated old name of `saes`)."""
        params = SteerBenchParams.of(targets=targets, saes=saes, sae_ids=sae_ids, ratio=ratio, kl_bound=kl_bound,
                                     n_prompts=n_prompts, candidates=candidates, prompt_prefix=prompt_prefix,
                                     confirm_prompts=confirm_prompts, styles=list(styles),
                                     prompts=user_prompts(prompts), combine=combine)
        return steering_service.steer_bench(self.ctx, self._views(params.saes), params)

    def steering_scores(self, saes: list[str] | None = None, *,
                        n_prompts: int = SteeringScoresParams.default("n_prompts"),
                        prompt_tokens: int = SteeringScoresParams.default("prompt_tokens"),
                        strength: float = SteeringScoresParams.default("strength"),
                        seed: int = SteeringScoresParams.default("seed"),
                        top_k: int = SteeringScoresParams.default("top_k"),
                        chunk: int = SteeringScoresParams.default("chunk"),
                        lens_z: float = SteeringScoresParams.default("lens_z"),
                        force: bool = SteeringScoresParams.default("force"), progress: bool = False,
                        dist: DistContext | None = None) -> list[SteeringReport]:
        """Writes: each SAE's steering table (default: every SAE; each needs its summaries): per
        feature, what adding its decoder row (`strength` x its mean active value) at the last
        token of `n_prompts` neutral prompts does to the next token; what `steering_features`
        reads. Resumable after a kill; a current table is kept unless `force`; under torchrun
        (`dist`) the ranks take the chunks in turn. The parameters are
        `api.operations.steering.SteeringScoresParams`."""
        params = SteeringScoresParams.of(saes=saes, n_prompts=n_prompts, prompt_tokens=prompt_tokens,
                                         strength=strength, seed=seed, top_k=top_k, chunk=chunk, lens_z=lens_z,
                                         force=force)
        return steering_service.steering_scores(self.ctx, self._views(params.saes), params, progress=progress,
                                                dist=dist)

    def model(self) -> ModelHandle:
        """The atlas's model handle (loaded on first call, then kept)."""
        return self.ctx.model()

    # maps and analyses --------------------------------------------------------------------
    def map(self, sae_id: str, basis: Basis = MapParams.default("basis")) -> Rows[MapPoint]:
        """The SAE's 2-D feature map in one basis ("decoder": UMAP of the decoder rows;
        "cooccurrence": UMAP of the activation co-occurrence graph): latent, x, y, knn_overlap,
        group columns such as cluster when present, and each feature's offline `label`. The
        parameters are `api.operations.pages.MapParams`."""
        params = MapParams.of(basis=basis)
        view = self.sae(sae_id)
        frame = view.map(params.basis).with_columns(pl.lit(view.sae_id).alias("sae_id"))
        return Rows(MapPoint, labels.with_labels(self.ctx, frame, {view.sae_id: view}).drop("sae_id", "explanations"))

    def map_scores(self, sae_id: str) -> MapScores:
        """Per built map basis: mean kNN overlap on its own neighbours, the chance level, and
        the share of the other basis' neighbours it keeps (`store.maps.map_scores`)."""
        return self.sae(sae_id).map_scores()

    def analyses(self) -> Rows[AnalysisRunFiles]:
        """Stored geometry results: kind, run, table file, figure files, and `status`: "ok",
        "damaged" (the `problem`: which file, what is wrong, the repair) or "unregistered" (a
        run its kind's runs.json does not list; the `problem` names `sae-atlas register`)."""
        return Rows.of(AnalysisRunFiles, analyses.analysis_runs(self.root))

    def analysis(self, kind: str, run: str) -> AnalysisResult:
        """One geometry result: its parameters/summary (json), table (with each latent's
        `label` where its rows name latents of this atlas's SAEs) and figure paths."""
        return analyses.with_run_labels(self.ctx, analyses.analysis(self.root, kind, run))

    def figure_path(self, kind: str, name: str) -> Path:
        """Path of a stored analysis figure (PNG), checked against its run."""
        return analyses.figure_path(self.root, kind, name)

    def run_circular(self, sae_id: str, *, method: ClusterMethod = CircularParams.default("method"),
                     k: int = CircularParams.default("k"), threshold: float = CircularParams.default("threshold"),
                     n_clusters: int = CircularParams.default("n_clusters"),
                     split: Split = CircularParams.default("split"),
                     max_tokens: int = CircularParams.default("max_tokens"),
                     min_tokens: int = CircularParams.default("min_tokens"), seed: int = CircularParams.default("seed"),
                     run: str | None = None, token_strings: bool = False) -> CircularDiscovery:
        """Writes: circular-feature discovery on SAE `sae_id` (its features clustered by decoder
        direction, each cluster scored for irreducibility over `max_tokens` cached tokens),
        stored as the analysis run `circular/<run>`. The parameters are
        `api.operations.analyses.CircularParams`."""
        params = CircularParams.of(sae_id=sae_id, method=method, k=k, threshold=threshold, n_clusters=n_clusters,
                                   split=split, max_tokens=max_tokens, min_tokens=min_tokens, seed=seed, run=run,
                                   token_strings=token_strings)
        return analyses.run_circular(self.sae(params.sae_id), params)

    def circle_concept(self, concept: str = CircleConceptParams.default("concept"), *, model: str | None = None,
                       layers: str | Sequence[int] = (3, 6, 9, 12),
                       n_components: int = CircleConceptParams.default("n_components"),
                       intervene_layer: int = CircleConceptParams.default("intervene_layer"),
                       shifts: str | Sequence[int] | None = None, run: str | None = None,
                       seed: int = CircleConceptParams.default("seed"), spectra: bool = False,
                       sae_id: str | None = None) -> CircleProbeRun:
        """Writes: a circle probe per layer (`layers`) of the atlas's model (or `model`) on a
        cyclic concept ("weekdays", "months" or a JSON file), with `intervene_layer` >= 0 an
        intervention along the fitted circle beside baselines, with `spectra` the Fourier
        spectra of residual dimensions (or of SAE `sae_id`'s features); stored as
        `analyses/circular/<run>`. The parameters are `api.operations.analyses.CircleConceptParams`."""
        params = CircleConceptParams.of(concept=concept, model=model, layers=layers, n_components=n_components,
                                        intervene_layer=intervene_layer, shifts=shifts, run=run, seed=seed,
                                        spectra=spectra, sae_id=sae_id)
        handle = self.ctx.model_of(params.model) if params.model else self.ctx.model()
        return self.ctx.run_locked(lambda: circle_probe.run_circle_probe(handle, params, self.root))

    def _model_of(self, spec: str | None) -> ModelHandle:
        """The model `spec` names (loaded once through the context), else the atlas's."""
        return self.ctx.model_of(spec) if spec else self.ctx.model()

    def analyze_hierarchy(self, *, model: str | None = None, tree: str = HierarchyParams.default("tree"),
                          metric: CausalMetric = HierarchyParams.default("metric"),
                          estimator: Estimator = HierarchyParams.default("estimator"),
                          min_tokens: int = HierarchyParams.default("min_tokens"), sae_id: str | None = None,
                          match: ConceptMatch = HierarchyParams.default("match"), seed: int = HierarchyParams.default("seed"),
                          run: str | None = None) -> AnalysisResult:
        """Writes: parent-child orthogonality of concept vectors (Park et al. 2024) in the
        unembedding of the atlas's model (or `model`), with controls; with `sae_id`, of that
        SAE's features matched to the concepts; stored as `analyses/hierarchy/<run>`. The
        parameters are `api.operations.analyses.HierarchyParams`."""
        params = HierarchyParams.of(model=model, tree=tree, metric=metric, estimator=estimator, min_tokens=min_tokens,
                                    sae_id=sae_id, match=match, seed=seed, run=run)
        handle = self._model_of(params.model)
        return self.ctx.run_locked(lambda: geometry_runs.hierarchy(handle, params, self.root))

    def analyze_probe(self, hooks: str | list[str], *, target: str = ProbeParams.default("target"),
                      sae_id: str | None = None, model: str | None = None,
                      max_tokens: int = ProbeParams.default("max_tokens"), seed: int = ProbeParams.default("seed"),
                      run: str | None = None) -> AnalysisResult:
        """Writes: linear probes per cached hook (`hooks`) of the token position (ridge) or of a
        curated concept (logistic; with `sae_id` also k-sparse probes on neurons vs latents),
        stored as `analyses/probe/<run>`. The parameters are `api.operations.analyses.ProbeParams`."""
        params = ProbeParams.of(hooks=hooks, target=target, sae_id=sae_id, model=model, max_tokens=max_tokens,
                                seed=seed, run=run)
        return geometry_runs.probe(self.ctx, params)

    def analyze_crystals(self, *, model: str | None = None, hook: str | None = None,
                         n_null: int = CrystalsParams.default("n_null"), seed: int = CrystalsParams.default("seed"),
                         run: str | None = None) -> AnalysisResult:
        """Writes: word-pair relation crystals of the atlas's model (or `model`) at its input
        embeddings (or the residual at `hook`): held-out LDA silhouette against a random-label
        null, stored as `analyses/crystals/<run>`. The parameters are
        `api.operations.analyses.CrystalsParams`."""
        params = CrystalsParams.of(model=model, hook=hook, n_null=n_null, seed=seed, run=run)
        handle = self._model_of(params.model)
        return self.ctx.run_locked(lambda: geometry_runs.crystals(handle, params, self.root))

    def analyze_lobes(self, sae_id: str, *, measure: Measure = LobesParams.default("measure"),
                      k: int = LobesParams.default("k"), n_clusters: int = LobesParams.default("n_clusters"),
                      seed: int = LobesParams.default("seed"), run: str | None = None) -> AnalysisResult:
        """Writes: co-occurrence lobes of SAE `sae_id` compared with its geometric clusters by
        AMI, stored as `analyses/lobes/<run>`. The parameters are `api.operations.analyses.LobesParams`."""
        params = LobesParams.of(sae_id=sae_id, measure=measure, k=k, n_clusters=n_clusters, seed=seed, run=run)
        return geometry_runs.lobes(self.ctx, params)

    def analyze_galaxy(self, saes: list[str] | None = None, *, seed: int = GalaxyParams.default("seed"),
                       run: str = GalaxyParams.default("run")) -> AnalysisResult:
        """Writes: decoder covariance power-law slope (ranks 10-150) and TwoNN dimension of each
        SAE (`saes`, default all), stored as `analyses/galaxy/<run>`. The parameters are
        `api.operations.analyses.GalaxyParams`."""
        params = GalaxyParams.of(saes=saes, seed=seed, run=run)
        return geometry_runs.galaxy(self.ctx, params)

    def build_maps(self, saes: list[str] | None = None, *, k_overlap: int = MapBuildParams.default("k_overlap"),
                   n_neighbors: int = MapBuildParams.default("n_neighbors"),
                   min_dist: float = MapBuildParams.default("min_dist"),
                   seed: int = MapBuildParams.default("seed")) -> list[MapBuild]:
        """Writes: UMAP maps of each SAE (`saes`, default all) into `saes/<id>/map.parquet`,
        scored by kNN overlap: of the unit decoder rows, and of the activation co-occurrence
        graph once the SAE is summarized. The parameters are `api.operations.analyses.MapBuildParams`."""
        params = MapBuildParams.of(saes=saes, k_overlap=k_overlap, n_neighbors=n_neighbors, min_dist=min_dist,
                                   seed=seed)
        return geometry_runs.build_maps(self.ctx, params)

    # comparisons ----------------------------------------------------------------------------
    def compare(self, other: str | Path | Atlas, *, sae: str | None = None, other_sae: str | None = None,
                n_tokens: int = CompareOptions.default("n_tokens"),
                batch_blocks: int = CompareOptions.default("batch_blocks"),
                sample_tokens: int = CompareOptions.default("sample_tokens"),
                max_items: int = CompareOptions.default("max_items"), n_perm: int = CompareOptions.default("n_perm"),
                n_rotations: int = CompareOptions.default("n_rotations"),
                min_fires: int = CompareOptions.default("min_fires"), seed: int = CompareOptions.default("seed"),
                decoder: bool | None = None, groups: str | None = None, run: str | None = None,
                corpus: CorpusSpec | None = None, device: str = "cpu") -> CompareResult:
        """Writes: compare SAE `sae` of this atlas with `other_sae` of `other` (an atlas, its
        path, or this one; each the atlas's only SAE when None) over `n_tokens` tokens of
        `corpus` on `device`: MCC and mutual nearest neighbours of activation correlations,
        decoder matching, SVCCA / RSA beside their nulls; stored as `analyses/compare/<run>`.
        The parameters are `api.operations.compare.CompareOptions`."""
        options = CompareOptions.of(n_tokens=n_tokens, batch_blocks=batch_blocks, sample_tokens=sample_tokens,
                                    max_items=max_items, n_perm=n_perm, n_rotations=n_rotations, min_fires=min_fires,
                                    seed=seed, decoder=decoder, groups=groups, run=run)
        other_ctx = other.ctx if isinstance(other, Atlas) else self.ctx.other(other)
        return compare_service.compare_atlases(compare_service.side_sae(self.ctx, sae),
                                               compare_service.side_sae(other_ctx, other_sae), options,
                                               corpus=corpus, device=device)

    def comparisons(self) -> list[CompareRunRow]:
        """The stored comparisons of this atlas with their headline scores and `status`: "ok",
        "damaged" (the `problem` names the file and the repair) or "unregistered" (on disk but
        not in analyses/compare/runs.json; the `problem` names `sae-atlas register`)."""
        return compare_service.compare_runs(self.root)

    def comparison(self, run: str) -> CompareResult:
        """One stored comparison (files verified); each matched pair carries both latents' labels."""
        return compare_service.compare_result(self.ctx, run)

    def compared_feature(self, run: str, side: Side, index: int, *,
                         examples: int = FeaturePageParams.default("examples"),
                         neighbours: int = FeaturePageParams.default("neighbours")) -> Feature:
        """The feature page of latent `index` of side "a" or "b" of comparison `run`, read
        (read-only) from the atlas that side belongs to; NotFoundError when B's atlas is gone.
        The parameters are `api.operations.pages.FeaturePageParams`."""
        params = FeaturePageParams.of(examples=examples, neighbours=neighbours)
        return compare_features.side_feature(self.ctx, run, side, index, examples=params.examples,
                                             neighbours=params.neighbours)

    def crosscoders(self) -> list[CrosscoderRow]:
        """The stored crosscoders (`sae-atlas train-crosscoder`): sides, size, latents per class."""
        return crosscoder_reads.crosscoders(self.ctx)

    def crosscoder_latents(self, crosscoder: str, *, latent_class: LatentClass | None = None,
                           sort: str = CrosscoderLatentsParams.default("sort"),
                           descending: bool = CrosscoderLatentsParams.default("descending"),
                           offset: int = CrosscoderLatentsParams.default("offset"),
                           limit: int = CrosscoderLatentsParams.default("limit")) -> CrosscoderLatents:
        """A crosscoder's latents of one class ("a_only", "shared", "b_only"; all when None),
        sorted by a column (relative_norm, norm_a, norm_b, latent or a Latent Scaling column),
        beside the relative-norm histogram of all of them. The parameters are
        `api.operations.pages.CrosscoderLatentsParams`."""
        params = CrosscoderLatentsParams.of(latent_class=latent_class, sort=sort, descending=descending,
                                            offset=offset, limit=limit)
        return crosscoder_reads.crosscoder_latents(self.ctx, crosscoder, **params.model_dump())

    def crosscoder_latent(self, crosscoder: str, latent: int, *,
                          k: int = CrosscoderLatentParams.default("k")) -> CrosscoderLatentCard:
        """One crosscoder latent: both decoder norms, relative norm, class, any Latent Scaling
        values, and per side the `k` features of this atlas's SAEs at that hook whose decoder
        rows are nearest to the side's decoder row (with their labels). The parameters are
        `api.operations.pages.CrosscoderLatentParams`."""
        return crosscoder_reads.crosscoder_latent(self.ctx, crosscoder, latent, k=CrosscoderLatentParams.of(k=k).k)

    def emergence(self, members: list[str | SaeView],
                  concepts: Sequence[Any] | None = tuple(EmergenceParams.default("concepts")), *,
                  metric: Metric = EmergenceParams.default("metric"),
                  threshold: float = EmergenceParams.default("threshold"),
                  test_frac: float = EmergenceParams.default("test_frac"), seed: int = EmergenceParams.default("seed"),
                  run: str | None = None, device: str = "cpu") -> EmergenceResult:
        """Writes: where each concept's features emerge over a series of SAEs (`members`: SAE
        ids or views of this atlas, or `ATLAS:SAE` of others (each opened once, beside this
        one), in series order): per member the held-out AUROC of the best single latent and
        the k=1 / full probe accuracies (concept prompts against control prompts), the first
        member reaching `threshold` on `metric`, gaps and re-appearances; stored with a heat
        map as `analyses/emergence/<run>` of the first member's atlas. `concepts` default to
        weekdays, months, numbers and colours. The parameters are
        `api.operations.concepts_across.EmergenceParams`."""
        params = EmergenceParams.of(concepts=list(concepts or EmergenceParams.default("concepts")), metric=metric,
                                    threshold=threshold, test_frac=test_frac, seed=seed, run=run)
        sides = [m if isinstance(m, SaeView) else self.sae(m) if m in self.sae_ids
                 else compare_service.open_side(m, near=self.ctx) for m in members]
        return emergence_service.run_emergence(sides, params, device=device)

    def compare_circle(self, circle: str, other: str | Path | Atlas | None = None, *, sae: str | None = None,
                       other_sae: str | None = None, model_b: str | None = None, hook_b: str | None = None,
                       n_components: int = CircleTransferParams.default("n_components"),
                       n_null: int = CircleTransferParams.default("n_null"),
                       n_random: int = CircleTransferParams.default("n_random"),
                       alpha: float = CircleTransferParams.default("alpha"),
                       seed: int = CircleTransferParams.default("seed"), run: str | None = None,
                       device: str = "cpu") -> CircleTransferResult:
        """Writes: does the circle of this atlas's stored run `circle` (`circular/<run>`, a
        concept run, or `concept_search/<run>`) exist in `other` (an atlas, its path or this
        one; SAE `other_sae`) or in `model_b` at `hook_b`? The circle probe and concept span
        fitted again in both, beside nulls, with the cyclic order and period; stored as
        `analyses/circle_transfer/<run>`. The parameters are
        `api.operations.concepts_across.CircleTransferParams`."""
        params = CircleTransferParams.of(circle=circle, model_b=model_b, hook_b=hook_b, n_components=n_components,
                                         n_null=n_null, n_random=n_random, alpha=alpha, seed=seed, run=run)
        side_b = None
        if other is not None:
            other_ctx = other.ctx if isinstance(other, Atlas) else self.ctx.other(other)
            side_b = compare_service.side_sae(other_ctx, other_sae)
        return circle_service.run_circle_transfer(compare_service.side_sae(self.ctx, sae), side_b, params,
                                                  device=device)

    def train_crosscoder(self, hook_a: str, hook_b: str, *, model_b: str | dict[str, Any] | None = None,
                         d_sae: int = CrosscoderParams.default("d_sae"), k: int = CrosscoderParams.default("k"),
                         tokens: int = CrosscoderParams.default("tokens"), pass_tokens: int | None = None,
                         batch_size: int = CrosscoderParams.default("batch_size"),
                         batch_blocks: int = CrosscoderParams.default("batch_blocks"),
                         seed: int = CrosscoderParams.default("seed"), cc_id: str | None = None,
                         scaling_tokens: int = CrosscoderParams.default("scaling_tokens"),
                         corpus: CorpusSpec | None = None, device: str = "cpu",
                         progress: bool = True, n_tokens: int | None = None) -> CrosscoderRun:
        """Writes: a crosscoder between `hook_a` of this atlas's model and `hook_b` of `model_b`
        (default the same model) in `crosscoders/<id>/`, its relative decoder norms (and with
        `scaling_tokens` > 0 its Latent Scaling) as `analyses/crosscoder/<id>`. The parameters
        are `api.operations.crosscoder.CrosscoderParams` (`n_tokens`: the deprecated old name of `tokens`)."""
        params = CrosscoderParams.of(hook_a=hook_a, hook_b=hook_b, model_b=model_b, d_sae=d_sae, k=k,
                                     tokens=tokens, n_tokens=n_tokens, pass_tokens=pass_tokens, batch_size=batch_size,
                                     batch_blocks=batch_blocks, seed=seed, cc_id=cc_id, scaling_tokens=scaling_tokens)
        return crosscoder_service.run_train_crosscoder(self.ctx, params, corpus=corpus, device=device,
                                                       progress=progress)

    def latent_scaling(self, cc_id: str, *, tokens: int = LatentScalingParams.default("tokens"),
                       batch_blocks: int = LatentScalingParams.default("batch_blocks"),
                       corpus: CorpusSpec | None = None, device: str = "cpu",
                       n_tokens: int | None = None) -> CrosscoderRun:
        """Writes: Latent Scaling (Minder et al. 2025) of the latents of
        crosscoder `cc_id` over `tokens` tokens of `corpus` (default: its training corpus), as
        the columns `beta_error_a/b`, `beta_recon_a/b`, `nu_error`, `nu_recon`,
        `scaling_active_tokens` of `analyses/crosscoder/<id>`. The parameters are
        `api.operations.crosscoder.LatentScalingParams` (`n_tokens`: the deprecated old name of `tokens`)."""
        params = LatentScalingParams.of(cc_id=cc_id, tokens=tokens, batch_blocks=batch_blocks, n_tokens=n_tokens)
        return crosscoder_service.run_latent_scaling(self.ctx, params, corpus=corpus, device=device)

    def depth_runs(self) -> list[DepthRunRow]:
        """The stored depth runs (`analyze depth`): what each streamed, its headline and `status`
        ("ok", "damaged" or "unregistered", the `problem` naming the file or the command)."""
        return depth_service.depth_runs(self.root)

    def depth_run(self, run: str) -> DepthRun:
        """One stored depth run as the Depth page reads it: the per-layer profile, the CKA
        matrix, trajectory distributions and extreme tokens, the joined SAE features whose
        tokens sit lowest and highest in local dimension, or a families run's per-family means
        and tests (files verified)."""
        return depth_service.depth_run(self.ctx, run)

    def depth_profile(self, layers: list[int] | None = None, *, tokens: int = DepthParams.default("tokens"),
                      batch_blocks: int = DepthParams.default("batch_blocks"),
                      max_points: int = DepthParams.default("max_points"), k: int = DepthParams.default("k"),
                      mle_k: int = DepthParams.default("mle_k"), n_boot: int = DepthParams.default("n_boot"),
                      fit_fraction: float = DepthParams.default("fit_fraction"),
                      space: TrajectorySpace = DepthParams.default("space"), seed: int = DepthParams.default("seed"),
                      saes: list[str] | None = None, checkpoint_every: int | None = None,
                      families: str | Path | None = None,
                      n_permutations: int = DepthParams.default("n_permutations"), model_b: str | None = None,
                      layers_b: list[int] | None = None, run: str | None = None, corpus: CorpusSpec | None = None,
                      progress: bool = False, n_tokens: int | None = None,
                      sae_ids: list[str] | None = None) -> DepthProfile | AnalysisResult:
        """Writes: the depth analysis of the atlas' model over `tokens` tokens of `corpus`
        (default: the built-in one) at `layers` (default: every layer), as
        `analyses/depth/<run>`; the stored result (per layer ID, local ID, trajectories,
        lenses; CKA and tokens tables beside it). With `families`, the metrics per prompt
        family and their tests; with `model_b`, CKA between A's and B's layers and the ID
        shift (both stored as a generic `AnalysisResult`). The parameters are
        `api.operations.depth.DepthParams` (`n_tokens`, `sae_ids`: deprecated old names)."""
        from sae_atlas.api.services.depth import run_depth_operation

        params = DepthParams.of(layers=layers, tokens=tokens, batch_blocks=batch_blocks, max_points=max_points, k=k,
                                mle_k=mle_k, n_boot=n_boot, fit_fraction=fit_fraction, space=space, seed=seed,
                                saes=saes, checkpoint_every=checkpoint_every, families=families,
                                n_permutations=n_permutations, model_b=model_b, layers_b=layers_b, run=run,
                                n_tokens=n_tokens, sae_ids=sae_ids)
        run_depth_operation(self.root, self.model(), params, corpus or CorpusSpec(), progress=progress)
        kind = AnalysisResult if params.families is not None or params.model_b is not None else DepthProfile
        return analyses.analysis_as(kind, self.root, "depth", params.run_name())
