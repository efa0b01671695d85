"""`sae-atlas demo`: the whole pipeline on the embedded default model and text.

Each step reuses what a previous run finished (cache, SAEs, evaluations, ...), so the
command can be re-run after an interruption or to add steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from api.commands.cache import print_cache_summary
from api.commands.common import console, handle_errors, print_table
from api.commands.summarize import print_reports
from saes.cache import cache_activations
from saes.corpus import CorpusSpec
from saes.evaluate import evaluate_atlas_sae
from saes.models import DEFAULT_MODEL, ModelHandle, load_model
from saes.summarize import summarize_sae
from saes.train.atlas import train_saes
from saes.train.config import TrainConfig
from store.layout import AtlasLayout

DEMO_TOKENS = 65536
DEMO_TRAIN_TOKENS = 500_000


def _train_and_evaluate(handle: ModelHandle, atlas: Path, hooks: list[str], train_tokens: int, seed: int) -> list[str]:
    results = train_saes(atlas, hooks, architecture="topk", expansion=8, k=32,
                         train_cfg=TrainConfig(total_tokens=train_tokens, seed=seed))
    layout = AtlasLayout(atlas)
    rows = []
    for summary in results.values():
        sae_id = summary["sae_id"]
        eval_path = layout.sae_dir(sae_id) / "eval.json"
        if eval_path.exists():
            record = json.loads(eval_path.read_text())
        else:
            record = evaluate_atlas_sae(atlas, sae_id, model_handle=handle)
        m = record["metrics"]
        rows.append((sae_id, m["explained_variance"], m["l0"], m["dead_fraction"],
                     m.get("ce_loss_recovered", float("nan"))))
    print_table("SAEs (held-out tokens, BOS excluded)",
                ["sae", "explained var", "L0", "dead", "CE recovered"], rows)
    return [r[0] for r in rows]


@handle_errors
def demo_command(
    atlas: Path = typer.Option(Path("atlas-demo"), help="Atlas directory."),
    model: str = typer.Option(DEFAULT_MODEL, help="Model spec (default: the embedded SmolLM2-135M)."),
    tokens: int = typer.Option(DEMO_TOKENS, min=1024, help="Tokens to cache per hook."),
    train_tokens: int = typer.Option(DEMO_TRAIN_TOKENS, min=4096, help="Training tokens per SAE."),
    layers: int = typer.Option(3, min=1, help="Layers spread over the depth."),
    seed: int = typer.Option(0, help="Seed for every random choice."),
) -> None:
    """Run every step on the default model and corpus, reusing steps that already finished."""
    console.rule("[bold]1. model")
    handle = load_model(model)
    hooks = handle.default_hooks(layers)
    console.print(f"{handle.name}: {handle.n_layers} layers, d_model {handle.d_model}; hooks {hooks}")
    console.rule("[bold]2. activation cache")
    summary = cache_activations(handle, atlas, hooks, corpus=CorpusSpec(seed=seed), n_tokens=tokens)
    print_cache_summary(summary)
    console.rule("[bold]3. one TopK SAE per layer, evaluated")
    sae_ids = _train_and_evaluate(handle, atlas, hooks, train_tokens, seed)
    console.rule("[bold]4. feature summaries (held-out tokens)")
    print_reports([
        summarize_sae(atlas, sae_id, W_U=handle.W_U.detach(), final_norm_weight=handle.final_norm_weight,
                      norm_kind=handle.final_norm_kind, tokenizer=handle.tokenizer, seed=seed)
        for sae_id in sae_ids
    ])


def register(app: typer.Typer) -> None:
    """Add the `demo` verb."""
    app.command("demo")(demo_command)
