"""The CLI layer of `demo`; its other layers: `sae_atlas.api.services.demo` (service).

`sae-atlas demo [ATLAS]`: the whole pipeline on the embedded default model and text; a
thin call of `Atlas.create(...).demo` (the steps: `api.services.demo`; the parameters:
`api.operations.build.DemoParams`), printing what each step shows as it goes."""

from __future__ import annotations

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
from sae_atlas.api.commands.summarize import print_reports

if TYPE_CHECKING:  # the demo imports what it runs when it runs, so that `sae-atlas --help` loads no torch
    from sae_atlas.api.services.demo import Shown

DEFAULT_ATLAS = Path("atlas-demo")


def show(shown: Shown) -> None:
    """Print one thing a demo step shows: a step's rule, a table, the cache summary, the
    summary reports or a line."""
    from sae_atlas.api.services.demo import Step, Table

    if isinstance(shown, Step):
        console.rule(f"[bold]{shown.title}")
    elif isinstance(shown, Table):
        print_table(shown.title, shown.columns, shown.rows)
    elif isinstance(shown, list):
        print_reports(shown)
    elif isinstance(shown, str):
        console.print(shown)
    else:
        print_cache_summary(shown)


@handle_errors
def demo_command(
    atlas: Path | None = atlas_argument(DEFAULT_ATLAS),
    old_atlas: Path | None = OLD_ATLAS_OPTION,
    model: str = typer.Option("", help="Model spec (default: the atlas's, else the embedded SmolLM2-135M)."),
    tokens: int = typer.Option(65536, help="Tokens to cache per hook."),
    train_tokens: int = typer.Option(500_000, help="Training tokens per SAE."),
    layers: int = typer.Option(3, help="Layers spread over the depth."),
    seed: int = typer.Option(0, help="Seed for every random choice."),
    device: str = device_option(),
    model_dtype: str = model_dtype_option(),
    json_out: bool = typer.Option(False, "--json", help="Print what was built as JSON (atlas, model, hooks, SAE "
                                  "ids, the serve command); the steps' progress and tables go to stderr."),
) -> None:
    """Run every step on the default model and corpus, reusing steps that already finished."""
    from sae_atlas.api.atlas import Atlas
    from sae_atlas.saes.devices import use_by_default

    where = use_by_default(device, model_dtype)
    handle = Atlas.create(the_atlas(atlas, old_atlas, DEFAULT_ATLAS), model=model or None)
    with output_to_stderr(json_out):
        built = handle.demo(tokens=tokens, train_tokens=train_tokens, layers=layers, seed=seed, device=str(where),
                            report=show)
    if json_out:
        print_json(built)


def register(app: typer.Typer) -> None:
    """Add the `demo` verb."""
    app.command("demo")(demo_command)
