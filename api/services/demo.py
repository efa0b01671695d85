"""The service layer of `demo`; its other layers: `sae_atlas.api.commands.demo` (CLI).

The demo: every step of the pipeline on one atlas context, its model loaded once.

Each step reuses what a previous run finished (cache, SAEs, evaluations, ...), so the demo
can be re-run after an interruption or to add steps. It ends with what every explorer page
opens on (the suite's `core` results for the Board, steering tables, a stored graph, a
comparison) and the command that serves the explorer (`serve_argv`). What it shows goes to a
`Report` (the CLI prints it; from Python it may be left out).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typing_extensions import TypedDict

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.build import CacheParams, DemoParams, IndexParams, SummarizeParams
from sae_atlas.api.operations.compare import CompareOptions
from sae_atlas.api.operations.evals import EvalParams
from sae_atlas.api.operations.graph import GraphParams
from sae_atlas.api.sae_view import open_sae
from sae_atlas.api.services import build
from sae_atlas.api.services import compare as compare_service
from sae_atlas.api.services import graph as graph_service
from sae_atlas.api.services.evals import run_evals
from sae_atlas.saes.cache import CacheSummary
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.intervene.steering_params import SteeringParams
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.summary.run import SummaryReport

DEMO_TEXT = "The meeting moved from Monday to Friday, and the report is due in March."
DEMO_STEERING = SteeringParams(n_prompts=1, prompt_tokens=8, chunk=64)
"""The steering screen: 1 prompt of 8 tokens (`sae-atlas steering-scores` defaults to 16 of 12;
the cost grows with features x prompts, about 105 s per 1000 features at 16 prompts)."""
DEMO_GRAPH_RUN = "weekdays"
DEMO_GRAPH = ("Two days from Monday is", " Wednesday")
"""The stored graph's prompt and target."""
DEMO_COMPARE = {"n_tokens": 4096, "sample_tokens": 1024, "n_perm": 20}


@dataclass(frozen=True)
class Table:
    """A table the demo shows."""

    title: str
    columns: list[str]
    rows: list[Sequence[Any]]


@dataclass(frozen=True)
class Step:
    """The start of a numbered step."""

    title: str


Shown = Step | Table | CacheSummary | list[SummaryReport] | str
Report = Callable[[Shown], None]
"""Where the demo's steps, tables, cache summary, summary reports and lines go."""


class DemoBuilt(TypedDict):
    """What the demo built: the atlas, its model, the cached hooks, the SAEs and the command
    that serves the explorer."""

    atlas: str
    model: str
    hooks: list[str]
    sae_ids: list[str]
    serve: list[str]


def serve_argv(atlas: Path) -> list[str]:
    """The command the demo's closing lines print: the explorer on 127.0.0.1 with the model
    allowed to run (steering, attribution, graphs), which loopback keeps to this machine."""
    return ["sae-atlas", "serve", str(atlas), "--allow-interventions"]


def _example_searches(ctx: AtlasContext, handle: ModelHandle, sae_ids: list[str], report: Report) -> None:
    """Features most active on a weekday token of a sentence, and their neighbours."""
    import torch

    from sae_atlas.saes.atlas_saes import load_atlas_sae
    from sae_atlas.saes.forward import run_hooks

    search = ctx.search()
    tokens = handle.to_tokens(DEMO_TEXT)
    pieces = handle.tokenizer.convert_ids_to_tokens(tokens[0].tolist())
    position = next(i for i, piece in enumerate(pieces) if "Friday" in piece)
    saes = {sae_id: load_atlas_sae(ctx.root, sae_id) for sae_id in sae_ids}
    acts = run_hooks(handle, tokens, sorted({sae.cfg.hook_name for sae in saes.values()}))
    rows = []
    for sae_id, sae in saes.items():
        with torch.no_grad():
            code = sae.encode(acts[sae.cfg.hook_name][0, position])
        values, latents = code.topk(3)
        for value, latent in zip(values.tolist(), latents.tolist(), strict=True):
            near = search.similar(sae_id, latent, k=3)
            flow = search.flow(sae_id, latent)
            rows.append((sae_id, latent, value, ", ".join(f"{m.latent} ({m.cosine:.2f})" for m in near),
                         ", ".join(f"L{m.layer}:{m.latent} ({m.cosine:.2f})" for m in flow)))
    report(Table(f"top features on ' Friday' in {DEMO_TEXT!r}",
                 ["sae", "latent", "activation", "nearest in SAE (cos)", "best match per layer"], rows))


def _hierarchy_and_maps(ctx: AtlasContext, handle: ModelHandle, sae_ids: list[str], seed: int, report: Report) -> None:
    """Hierarchy test on the curated tree (causal inner product) and a UMAP map per SAE."""
    from sae_atlas.api.analyses.hierarchy import run_hierarchy
    from sae_atlas.api.analyses.maps import run_map

    stored = ctx.layout.analysis_dir("hierarchy") / "curated-causal-lda.json"
    if stored.exists():
        summary = json.loads(stored.read_text())["summary"]
    else:
        summary = run_hierarchy(handle.W_U.detach(), handle.tokenizer, atlas=ctx.root, seed=seed).result.summary
    report(Table("hierarchy: mean |cos| over parent-child edges (0 = orthogonal)", ["cosine", "mean |cos|", "max |cos|"],
                 [(name, stats["mean_abs"], stats["max_abs"]) for name, stats in summary.items()
                  if name.startswith("cos_") and isinstance(stats, dict)]))
    rows = []
    for sae_id in sae_ids:
        map_meta = ctx.layout.sae_dir(sae_id) / "map.json"
        if map_meta.exists():
            fmap = json.loads(map_meta.read_text()).get("summary", {})
        else:
            fmap = run_map(ctx.root, sae_id, seed=seed)["summary"]
        rows.append((sae_id, fmap.get("knn_overlap_mean"),
                     fmap.get("cooccurrence", {}).get("knn_overlap_mean", "not built")))
    report(Table("UMAP maps (mean kNN overlap, 10 neighbours)", ["sae", "decoder rows", "co-occurrence"], rows))


def _circles(ctx: AtlasContext, handle: ModelHandle, report: Report) -> None:
    """Circle probes for weekdays and months at layers over the depth; the clearest layer."""
    from sae_atlas.api.analyses.circular import run_circle_analysis, write_concept_run
    from sae_atlas.saes.intervene.concepts import load_concept

    layers = list(range(2, handle.n_layers - 1, 3))
    rows = []
    for name in ("weekdays", "months"):
        stored = ctx.layout.analysis_dir("circular") / f"{name}-{handle.name}.json"
        if stored.exists():
            meta = json.loads(stored.read_text())
            best, summary = meta["best_layer"], meta["best"]
        else:
            analysis = run_circle_analysis(handle, load_concept(name), layers)
            write_concept_run(ctx.root, f"{name}-{handle.name}", analysis, model=handle.name)
            best, summary = analysis.best_layer, analysis.probes[analysis.best_layer].summary()
        rows.append((name, best, summary.get("r2_loo"), summary.get("cyclic_order"), summary.get("fitted_period")))
    report(Table("circular concepts (circle probe on the top 5 PCs)",
                 ["concept", "clearest layer", "R^2 (leave-one-out)", "cyclic order", "fitted period"], rows))


def _train(ctx: AtlasContext, handle: ModelHandle, hooks: list[str], train_tokens: int, seed: int) -> list[str]:
    """One TopK SAE per hook; their ids."""
    from sae_atlas.saes.train.config import TrainConfig
    from sae_atlas.saes.train.train_saes import train_saes

    results = train_saes(ctx.root, hooks, architecture="topk", expansion=8, k=32,
                         train_cfg=TrainConfig(total_tokens=train_tokens, seed=seed, device=str(handle.device)))
    ctx.reread_meta()
    return [summary["sae_id"] for summary in results.values()]


def core_evals(ctx: AtlasContext, sae_ids: list[str], device: str | None, report: Report) -> None:
    """The suite's `core` eval of every SAE: the one record of the demo's evaluation
    (`evals/core.json`, which the Board shows, and `eval.json`); finished results are kept."""
    run = run_evals(ctx, EvalParams.of(saes=sae_ids, suite=["core"]), device=device, progress=False)
    rows = []
    for sae_id in sae_ids:
        m = run.results[sae_id]["core"]["eval_result_metrics"]
        rows.append((sae_id, m["reconstruction_quality"]["explained_variance"], m["sparsity"]["l0"],
                     1.0 - m["misc_metrics"]["frac_alive"], m["model_performance_preservation"]["ce_loss_score"]))
    report(Table("SAEs: suite `core` on held-out tokens, BOS excluded (the explorer's Board)",
                 ["sae", "explained var", "L0", "dead", "CE recovered"], rows))


def steering_tables(ctx: AtlasContext, handle: ModelHandle, sae_ids: list[str], report: Report) -> None:
    """A cheap steering screen of every SAE (few, short prompts): what the Steer page ranks from."""
    from sae_atlas.saes.intervene.output_scores import compute_steering_scores

    reports = [compute_steering_scores(handle, ctx.root, sae_id, DEMO_STEERING, progress=False) for sae_id in sae_ids]
    report(Table(f"steering tables ({DEMO_STEERING.n_prompts} prompts of {DEMO_STEERING.prompt_tokens} tokens; "
                 "sae-atlas steering-scores measures more)", ["sae", "latents", "chunks computed", "chunks kept"],
                 [(r.sae_id, r.n_latents, r.chunks_computed, r.chunks_resumed) for r in reports]))


def stored_graph(ctx: AtlasContext, text: str, target: str, report: Report) -> None:
    """An attribution graph of `text` -> `target` over every SAE, stored for the Graph page."""
    from sae_atlas.api.services.graphs import KIND as GRAPH_KIND
    from sae_atlas.api.services.graphs import store_graph
    from sae_atlas.api.services.graphs import stored_graph as read_graph
    from sae_atlas.store.analysis_runs import list_runs

    if DEMO_GRAPH_RUN not in list_runs(ctx.root, GRAPH_KIND):
        views = [open_sae(ctx, sae_id) for sae_id in ctx.sae_ids()]
        store_graph(ctx.root, DEMO_GRAPH_RUN, graph_service.graph(ctx, views, GraphParams.of(text=text,
                                                                                             targets=[target])))
    graph = read_graph(ctx.root, DEMO_GRAPH_RUN)
    report(f"graph {DEMO_GRAPH_RUN!r} of {text!r} -> {target!r}: {graph['size']['kept_nodes']} nodes, "
           f"{graph['size']['kept_edges']} edges kept, replacement {graph['scores']['replacement']:.3f}")


def comparison(ctx: AtlasContext, sae_ids: list[str], device: str, report: Report) -> None:
    """The last two SAEs compared (activation correlations, matched pairs, nulls)."""
    from sae_atlas.store.analysis_runs import list_runs

    if len(sae_ids) < 2:
        return
    sae_a, sae_b = sae_ids[-2], sae_ids[-1]
    run = f"{sae_a}--{sae_b}"
    if run in list_runs(ctx.root, "compare"):
        result = compare_service.compare_result(ctx, run)
    else:
        result = compare_service.compare_atlases(open_sae(ctx, sae_a), open_sae(ctx, sae_b),
                                                 CompareOptions.of(run=run, **DEMO_COMPARE), device=device)
    report(Table(f"{sae_a} vs {sae_b} ({result.summary['n_tokens']} tokens)", ["score", "value", "null", "p"],
                 compare_service.summary_rows(result)))


def explorer_content(ctx: AtlasContext, sae_ids: list[str], report: Report, *, device: str | None = None,
                     graph: tuple[str, str] = DEMO_GRAPH) -> None:
    """What the explorer's model pages open on: steering tables (a cheap screen), a stored
    graph of `graph` (prompt, target) and a comparison of two SAEs; finished ones are kept."""
    handle = ctx.model(device)
    steering_tables(ctx, handle, sae_ids, report)
    stored_graph(ctx, *graph, report)
    comparison(ctx, sae_ids, str(handle.device), report)


def run_demo(ctx: AtlasContext, params: DemoParams, *, device: str | None, report: Report) -> DemoBuilt:
    """Every step of the demo on the context's model (on `device`), shown as it goes; what was built."""
    report(Step("1. model"))
    handle = ctx.model(device)
    hooks = handle.default_hooks(params.layers)
    report(f"{handle.name}: {handle.n_layers} layers, d_model {handle.d_model}; hooks {hooks}")
    report(Step("2. activation cache"))
    report(build.cache(ctx, CacheParams(hooks=hooks, tokens=params.tokens), corpus=CorpusSpec(seed=params.seed),
                       device=device, progress=True))
    report(Step("3. one TopK SAE per layer, evaluated"))
    sae_ids = _train(ctx, handle, hooks, params.train_tokens, params.seed)
    core_evals(ctx, sae_ids, device, report)
    report(Step("4. feature summaries (held-out tokens)"))
    report(build.summarize(ctx, [open_sae(ctx, sae_id) for sae_id in sae_ids], SummarizeParams(seed=params.seed),
                           corpus=None, device=device, progress=True))
    report(Step("5. FAISS indexes and example searches"))
    for info in build.index(ctx, IndexParams()):
        report(f"{info.get('sae_id', 'model-wide')}: {info['type']}, {info['n']} rows, "
               f"recall@10 {info['recall_at_10']:.3f}")
    _example_searches(ctx, handle, sae_ids, report)
    report(Step("6. circular features: weekdays and months"))
    _circles(ctx, handle, report)
    report(Step("7. hierarchy and feature maps"))
    _hierarchy_and_maps(ctx, handle, sae_ids, params.seed, report)
    report(Step("8. steering tables, a stored graph and a comparison (the explorer's pages)"))
    explorer_content(ctx, sae_ids, report, device=device)
    report(Step("9. explore"))
    report(f"Atlas ready in {ctx.root}. Explore it with\n  .venv/bin/{shlex.join(serve_argv(ctx.root))}\n"
           "and open http://127.0.0.1:8000/ (feature pages at #/saes/<sae_id>/features/<index>). "
           "--allow-interventions lets the explorer run the model (Steer, Attribute, Graph); "
           "the server listens on 127.0.0.1 only.")
    return {"atlas": str(ctx.root), "model": handle.name, "hooks": hooks, "sae_ids": sae_ids,
            "serve": serve_argv(ctx.root)}
