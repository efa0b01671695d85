"""`sae-atlas demo`: the whole pipeline on the embedded default model and text."""

from __future__ import annotations

from pathlib import Path

import typer

from api.commands.cache import print_cache_summary
from api.commands.common import console, handle_errors
from saes.cache import cache_activations
from saes.corpus import CorpusSpec
from saes.models import DEFAULT_MODEL, load_model


@handle_errors
def demo_command(
    atlas: Path = typer.Option(Path("atlas-demo"), help="Atlas directory."),
    model: str = typer.Option(DEFAULT_MODEL, help="Model spec (default: the embedded SmolLM2-135M)."),
    tokens: int = typer.Option(131072, min=1024, help="Tokens to cache per hook."),
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


def register(app: typer.Typer) -> None:
    """Add the `demo` verb."""
    app.command("demo")(demo_command)
