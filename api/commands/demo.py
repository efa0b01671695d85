"""`sae-atlas demo`: the whole pipeline on the embedded default model and text.

Each step reuses what a previous run finished (cache, SAEs, evaluations, ...), so the
command can be re-run after an interruption or to add steps. It ends with what every
explorer page opens on (the suite's `core` results for the Board, steering tables, a stored
graph, a comparison) and prints the command that serves the explorer (`serve_argv`).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sae_atlas.api.commands.cache import print_cache_summary
from sae_atlas.api.commands.common import (
    OLD_ATLAS_OPTION,
    atlas_argument,
    console,
    handle_errors,
    output_to_stderr,
    print_json,
    print_table,
    the_atlas,
)
from sae_atlas.api.commands.device_options import device_option, model_dtype_option
from sae_atlas.api.commands.eval import EvalsFailed
from sae_atlas.api.commands.summarize import print_reports
from sae_atlas.saes.intervene.steering_params import SteeringParams
from sae_atlas.saes.models import DEFAULT_MODEL
from sae_atlas.store.layout import AtlasLayout

if TYPE_CHECKING:  # the steps import what they run, so that `sae-atlas --help` loads no torch
    from sae_atlas.saes.models import ModelHandle

DEFAULT_ATLAS = Path("atlas-demo")
DEMO_TOKENS = 65536
DEMO_TRAIN_TOKENS = 500_000
DEMO_TEXT = "The meeting moved from Monday to Friday, and the report is due in March."
DEMO_STEERING = SteeringParams(n_prompts=1, prompt_tokens=8, chunk=64)
"""The steering screen: 1 prompt of 8 tokens (`sae-atlas steering-scores` defaults to 16 of 12;
the cost grows with features x prompts, about 105 s per 1000 features at 16 prompts)."""
DEMO_GRAPH_RUN = "weekdays"
DEMO_GRAPH_TEXT = "Two days from Monday is"
DEMO_GRAPH_TARGET = " Wednesday"
DEMO_COMPARE = {"n_tokens": 4096, "sample_tokens": 1024, "n_perm": 20}


def _example_searches(handle: ModelHandle, atlas: Path, sae_ids: list[str]) -> None:
    """Features most active on a weekday token of a sentence, and their neighbours."""
    import torch

    from sae_atlas.saes.atlas_saes import load_atlas_sae
    from sae_atlas.saes.encoding.codes import sae_codes
    from sae_atlas.saes.forward import run_hooks
    from sae_atlas.store.search import FeatureSearch

    search = FeatureSearch(atlas)
    tokens = handle.to_tokens(DEMO_TEXT)
    pieces = handle.tokenizer.convert_ids_to_tokens(tokens[0].tolist())
    position = next(i for i, piece in enumerate(pieces) if "Friday" in piece)
    saes = {sae_id: load_atlas_sae(atlas, sae_id) for sae_id in sae_ids}
    acts = run_hooks(handle, tokens, sorted({sae.cfg.hook_name for sae in saes.values()}))
    rows = []
    for sae_id, sae in saes.items():
        with torch.no_grad():
            code = sae_codes(sae, acts[sae.cfg.hook_name][0, position])
        values, latents = code.topk(3)
        for value, latent in zip(values.tolist(), latents.tolist(), strict=True):
            near = search.similar(sae_id, latent, k=3)
            flow = search.flow(sae_id, latent)
            rows.append((sae_id, latent, value, ", ".join(f"{m.latent} ({m.cosine:.2f})" for m in near),
                         ", ".join(f"L{m.layer}:{m.latent} ({m.cosine:.2f})" for m in flow)))
    print_table(f"top features on ' Friday' in {DEMO_TEXT!r}",
                ["sae", "latent", "activation", "nearest in SAE (cos)", "best match per layer"], rows)


def _hierarchy_and_maps(handle: ModelHandle, atlas: Path, sae_ids: list[str], seed: int) -> None:
    """Hierarchy test on the curated tree (causal inner product) and a UMAP map per SAE."""
    from sae_atlas.api.analyses.hierarchy import run_hierarchy
    from sae_atlas.api.analyses.maps import run_map

    layout = AtlasLayout(atlas)
    stored = layout.analysis_dir("hierarchy") / "curated-causal-lda.json"
    if stored.exists():
        summary = json.loads(stored.read_text())["summary"]
    else:
        summary = run_hierarchy(handle.W_U.detach(), handle.tokenizer, atlas=atlas, seed=seed).result.summary
    print_table("hierarchy: mean |cos| over parent-child edges (0 = orthogonal)", ["cosine", "mean |cos|", "max |cos|"],
                [(name, stats["mean_abs"], stats["max_abs"]) for name, stats in summary.items()
                 if name.startswith("cos_") and isinstance(stats, dict)])
    rows = []
    for sae_id in sae_ids:
        map_meta = layout.sae_dir(sae_id) / "map.json"
        if map_meta.exists():
            fmap = json.loads(map_meta.read_text()).get("summary", {})
        else:
            fmap = run_map(atlas, sae_id, seed=seed)["summary"]
        rows.append((sae_id, fmap.get("knn_overlap_mean"), fmap.get("cooccurrence", {}).get("knn_overlap_mean", "not built")))
    print_table("UMAP maps (mean kNN overlap, 10 neighbours)", ["sae", "decoder rows", "co-occurrence"], rows)


def _circles(handle: ModelHandle, atlas: Path) -> None:
    """Circle probes for weekdays and months at layers over the depth; the clearest layer."""
    from sae_atlas.api.analyses.circular import run_circle_analysis, write_concept_run
    from sae_atlas.saes.intervene.concepts import load_concept

    layers = list(range(2, handle.n_layers - 1, 3))
    rows = []
    for name in ("weekdays", "months"):
        stored = AtlasLayout(atlas).analysis_dir("circular") / f"{name}-{handle.name}.json"
        if stored.exists():
            meta = json.loads(stored.read_text())
            best, summary = meta["best_layer"], meta["best"]
        else:
            analysis = run_circle_analysis(handle, load_concept(name), layers)
            write_concept_run(atlas, f"{name}-{handle.name}", analysis, model=handle.name)
            best, summary = analysis.best_layer, analysis.probes[analysis.best_layer].summary()
        rows.append((name, best, summary.get("r2_loo"), summary.get("cyclic_order"), summary.get("fitted_period")))
    print_table("circular concepts (circle probe on the top 5 PCs)",
                ["concept", "clearest layer", "R^2 (leave-one-out)", "cyclic order", "fitted period"], rows)


def _train(handle: ModelHandle, atlas: Path, hooks: list[str], train_tokens: int, seed: int) -> list[str]:
    """One TopK SAE per hook; their ids."""
    from sae_atlas.saes.train.atlas import train_saes
    from sae_atlas.saes.train.config import TrainConfig

    results = train_saes(atlas, hooks, architecture="topk", expansion=8, k=32,
                         train_cfg=TrainConfig(total_tokens=train_tokens, seed=seed, device=str(handle.device)))
    return [summary["sae_id"] for summary in results.values()]


def core_evals(handle: ModelHandle, atlas: Path, sae_ids: list[str]) -> None:
    """The suite's `core` eval of every SAE: the one record of the demo's evaluation
    (`evals/core.json`, which the Board shows, and `eval.json`); finished results are kept."""
    from sae_atlas.saes.eval.suite import run_suite

    run = run_suite(atlas, sae_ids, ["core"], {}, device=str(handle.device), model=lambda: handle, progress=False)
    if run.failures:
        raise EvalsFailed("; ".join(f"{sae_id} {name}: {why}" for (sae_id, name), why in run.failures.items()))
    rows = []
    for sae_id in sae_ids:
        m = run.results[sae_id]["core"]["eval_result_metrics"]
        rows.append((sae_id, m["reconstruction_quality"]["explained_variance"], m["sparsity"]["l0"],
                     1.0 - m["misc_metrics"]["frac_alive"], m["model_performance_preservation"]["ce_loss_score"]))
    print_table("SAEs: suite `core` on held-out tokens, BOS excluded (the explorer's Board)",
                ["sae", "explained var", "L0", "dead", "CE recovered"], rows)


def _steering_tables(handle: ModelHandle, atlas: Path, sae_ids: list[str]) -> None:
    """A cheap steering screen of every SAE (few, short prompts): what the Steer page ranks from."""
    from sae_atlas.saes.intervene.output_scores import compute_steering_scores

    reports = [compute_steering_scores(handle, atlas, sae_id, DEMO_STEERING, progress=False) for sae_id in sae_ids]
    print_table(f"steering tables ({DEMO_STEERING.n_prompts} prompts of {DEMO_STEERING.prompt_tokens} tokens; "
                "sae-atlas steering-scores measures more)", ["sae", "latents", "chunks computed", "chunks kept"],
                [(r.sae_id, r.n_latents, r.chunks_computed, r.chunks_resumed) for r in reports])


def _stored_graph(atlas: Path, text: str, target: str) -> None:
    """An attribution graph of `text` -> `target`, stored for the Graph page."""
    from sae_atlas.api.atlas import Atlas
    from sae_atlas.api.services.graphs import KIND as GRAPH_KIND
    from sae_atlas.api.services.graphs import store_graph, stored_graph
    from sae_atlas.geometry.results import list_runs

    if DEMO_GRAPH_RUN not in list_runs(atlas, GRAPH_KIND):
        store_graph(atlas, DEMO_GRAPH_RUN, Atlas(atlas).graph(text, target))
    graph = stored_graph(atlas, DEMO_GRAPH_RUN)
    console.print(f"graph {DEMO_GRAPH_RUN!r} of {text!r} -> {target!r}: "
                  f"{graph['size']['kept_nodes']} nodes, {graph['size']['kept_edges']} edges kept, "
                  f"replacement {graph['scores']['replacement']:.3f}")


def _comparison(atlas: Path, sae_ids: list[str]) -> None:
    """The last two SAEs compared (activation correlations, matched pairs, nulls)."""
    from sae_atlas.api.atlas import Atlas
    from sae_atlas.api.services.compare import summary_rows
    from sae_atlas.geometry.results import list_runs

    if len(sae_ids) < 2:
        return
    sae_a, sae_b = sae_ids[-2], sae_ids[-1]
    run = f"{sae_a}--{sae_b}"
    if run in list_runs(atlas, "compare"):
        result = Atlas(atlas).comparison(run)
    else:
        result = Atlas(atlas).compare(atlas, sae=sae_a, other_sae=sae_b, run=run, **DEMO_COMPARE)
    print_table(f"{sae_a} vs {sae_b} ({result.summary['n_tokens']} tokens)", ["score", "value", "null", "p"],
                summary_rows(result))


def explorer_content(handle: ModelHandle, atlas: Path, sae_ids: list[str],
                     graph: tuple[str, str] = (DEMO_GRAPH_TEXT, DEMO_GRAPH_TARGET)) -> None:
    """What the explorer's model pages open on: steering tables (a cheap screen), a stored
    graph of `graph` (prompt, target) and a comparison of two SAEs; finished ones are kept."""
    _steering_tables(handle, atlas, sae_ids)
    _stored_graph(atlas, *graph)
    _comparison(atlas, sae_ids)


def serve_argv(atlas: Path) -> list[str]:
    """The command the demo's closing lines print: the explorer on 127.0.0.1 with the model
    allowed to run (steering, attribution, graphs), which loopback keeps to this machine."""
    return ["sae-atlas", "serve", str(atlas), "--allow-interventions"]


@handle_errors
def demo_command(
    atlas: Path | None = atlas_argument(DEFAULT_ATLAS),
    old_atlas: Path | None = OLD_ATLAS_OPTION,
    model: str = typer.Option(DEFAULT_MODEL, help="Model spec (default: the embedded SmolLM2-135M)."),
    tokens: int = typer.Option(DEMO_TOKENS, min=1024, help="Tokens to cache per hook."),
    train_tokens: int = typer.Option(DEMO_TRAIN_TOKENS, min=4096, help="Training tokens per SAE."),
    layers: int = typer.Option(3, min=1, help="Layers spread over the depth."),
    seed: int = typer.Option(0, help="Seed for every random choice."),
    device: str = device_option(),
    model_dtype: str = model_dtype_option(),
    json_out: bool = typer.Option(False, "--json", help="Print what was built as JSON (atlas, model, hooks, SAE "
                                  "ids, the serve command); the steps' progress and tables go to stderr."),
) -> None:
    """Run every step on the default model and corpus, reusing steps that already finished."""
    from sae_atlas.saes.devices import use_by_default

    use_by_default(device, model_dtype)
    atlas = the_atlas(atlas, old_atlas, DEFAULT_ATLAS)
    with output_to_stderr(json_out):
        built = _run_steps(atlas, model, tokens=tokens, train_tokens=train_tokens, layers=layers, seed=seed)
    if json_out:
        print_json(built)


def _run_steps(atlas: Path, model: str, *, tokens: int, train_tokens: int, layers: int, seed: int) -> dict[str, object]:
    """Every step of the demo, printed as it goes; what was built."""
    from sae_atlas.saes.cache import cache_activations
    from sae_atlas.saes.corpus import CorpusSpec
    from sae_atlas.saes.models import load_model
    from sae_atlas.store.index import build_atlas_indexes

    console.rule("[bold]1. model")
    handle = load_model(model)
    hooks = handle.default_hooks(layers)
    console.print(f"{handle.name}: {handle.n_layers} layers, d_model {handle.d_model}; hooks {hooks}")
    console.rule("[bold]2. activation cache")
    summary = cache_activations(handle, atlas, hooks, corpus=CorpusSpec(seed=seed), n_tokens=tokens)
    print_cache_summary(summary)
    console.rule("[bold]3. one TopK SAE per layer, evaluated")
    sae_ids = _train(handle, atlas, hooks, train_tokens, seed)
    core_evals(handle, atlas, sae_ids)
    console.rule("[bold]4. feature summaries (held-out tokens)")
    from sae_atlas.api.atlas import Atlas

    print_reports(Atlas(atlas, model=handle).summarize(sae_ids, seed=seed))
    console.rule("[bold]5. FAISS indexes and example searches")
    for info in build_atlas_indexes(atlas):
        console.print(f"{info.get('sae_id', 'model-wide')}: {info['type']}, {info['n']} rows, "
                      f"recall@10 {info['recall_at_10']:.3f}")
    _example_searches(handle, atlas, sae_ids)
    console.rule("[bold]6. circular features: weekdays and months")
    _circles(handle, atlas)
    console.rule("[bold]7. hierarchy and feature maps")
    _hierarchy_and_maps(handle, atlas, sae_ids, seed)
    console.rule("[bold]8. steering tables, a stored graph and a comparison (the explorer's pages)")
    explorer_content(handle, atlas, sae_ids)
    console.rule("[bold]9. explore")
    console.print(f"Atlas ready in {atlas}. Explore it with\n  .venv/bin/{shlex.join(serve_argv(atlas))}\n"
                  "and open http://127.0.0.1:8000/ (feature pages at #/saes/<sae_id>/features/<index>). "
                  "--allow-interventions lets the explorer run the model (Steer, Attribute, Graph); "
                  "the server listens on 127.0.0.1 only.")
    return {"atlas": str(atlas), "model": handle.name, "hooks": hooks, "sae_ids": sae_ids, "serve": serve_argv(atlas)}


def register(app: typer.Typer) -> None:
    """Add the `demo` verb."""
    app.command("demo")(demo_command)
