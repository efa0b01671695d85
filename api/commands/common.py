"""Shared CLI helpers: printing results as rich tables or JSON, and error handling."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console

from sae_atlas.api.commands.table_layout import render_table
from sae_atlas.api.results.jsonable import to_jsonable
from sae_atlas.errors import AtlasError, InvalidInputError
from sae_atlas.store.layout import AtlasLayout

if TYPE_CHECKING:
    from sae_atlas.api.atlas import Atlas

console = Console()
F = TypeVar("F", bound=Callable[..., Any])


def model_of_atlas(model: str, atlas: Path | None, device: str | None = None) -> Any:
    """The model named on the command line, else the atlas' model, else the default (on
    `device`, None: the process default)."""
    from sae_atlas.saes.models import DEFAULT_MODEL, load_model

    if not model and atlas is not None and AtlasLayout(atlas).atlas_json.exists():
        model = AtlasLayout(atlas).read_meta().get("model") or ""
    return load_model(model or DEFAULT_MODEL, device=device)


ATLAS_HELP = "Atlas directory."


def atlas_argument(default: Path | None = None, help: str = ATLAS_HELP) -> Any:
    """The atlas as every verb takes it: its first argument. With a `default` (verbs with no
    other argument) it may be left out; pass the same default to `the_atlas`. Pair it with
    `OLD_ATLAS_OPTION`."""
    if default is None:
        return typer.Argument(None, metavar="ATLAS", help=help, show_default=False)
    return typer.Argument(None, metavar="[ATLAS]", help=f"{help} [default: {default}]", show_default=False)


OLD_ATLAS_OPTION: Any = typer.Option(None, "--atlas", hidden=True, help="Deprecated: give the atlas as the first argument.")
"""The old `--atlas` option, still accepted (with a warning) where the atlas is now the first argument."""


def the_atlas(argument: Path | None, old_option: Path | None, default: Path | None = None) -> Path:
    """The atlas a verb was given: its first argument, or the deprecated `--atlas` (a warning
    on stderr), else `default`; InvalidInputError when both name different atlases or no atlas
    is given and there is no default."""
    if old_option is not None:
        typer.secho("warning: --atlas is deprecated; give the atlas as the first argument", fg="yellow", err=True)
        if argument is not None and argument != old_option:
            raise InvalidInputError(f"two atlases given: {argument} (argument) and {old_option} (--atlas); give one")
        return old_option
    if argument is not None:
        return argument
    if default is None:
        raise InvalidInputError("no atlas given: name the atlas directory as the first argument")
    return default


def handle_errors(fn: F) -> F:
    """Print an AtlasError as one red line and exit with status 2 instead of a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AtlasError as exc:
            typer.secho(f"error: {exc}", fg="red", err=True)
            raise typer.Exit(2) from exc

    return wrapper  # type: ignore[return-value]


def open_atlas(root: Path) -> Atlas:
    """The `Atlas` facade over `root`, imported on first use so that the CLI starts
    (`--help`, argument errors) without loading torch."""
    from sae_atlas.api.atlas import Atlas

    return Atlas(root)


def chosen_saes(layout: AtlasLayout, sae_ids: list[str]) -> list[str]:
    """The SAEs a command was given (`--sae`, repeatable), or every SAE of the atlas; each
    checked (NotFoundError listing the valid ids), InvalidInputError when there are none."""
    ids = list(sae_ids) or layout.sae_ids()
    if not ids:
        raise InvalidInputError(f"{layout.root} has no SAEs yet; train one with `sae-atlas train --atlas {layout.root}`")
    for sae_id in ids:
        layout.require_sae(sae_id)
    return ids


def main_rank() -> bool:
    """Whether this process prints: the only one, or rank 0 under torchrun."""
    from sae_atlas.saes.distributed import init_distributed

    dist = init_distributed()
    return dist is None or dist.is_main


@contextlib.contextmanager
def output_to_stderr(enabled: bool = True) -> Iterator[None]:
    """While open (when `enabled`), what a command prints (tables, progress) goes to stderr,
    so that stdout carries only its JSON."""
    with contextlib.redirect_stdout(sys.stderr) if enabled else contextlib.nullcontext():
        yield


def print_json(obj: Any) -> None:
    """Print `obj` as JSON on stdout."""
    typer.echo(json.dumps(to_jsonable(obj), indent=2))


def print_table(title: str, columns: list[str], rows: Iterable[Iterable[Any]]) -> None:
    """Print rows as a table: in full on a wide terminal, compact (one line per row, nothing
    split) when piped or narrow (`api.commands.table_layout`)."""
    render_table(console, title, columns, rows)
