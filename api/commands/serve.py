"""`sae-atlas serve ATLAS`: the HTTP service and web explorer over an atlas."""

from __future__ import annotations

from pathlib import Path

import typer

from sae_atlas.api.commands.common import handle_errors
from sae_atlas.api.commands.device_options import device_option, model_dtype_option
from sae_atlas.api.http.settings import DEFAULT_MAX_BODY, ENV_TOKEN


@handle_errors
def serve_command(
    atlas: Path = typer.Argument(..., help="Atlas directory."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default)."),
    port: int = typer.Option(8000, min=1, max=65535, help="TCP port."),
    workers: int = typer.Option(1, min=1, max=64, help="Worker processes (each loads the indexes once)."),
    token: str = typer.Option(None, envvar=ENV_TOKEN, help="Require 'Authorization: Bearer TOKEN'."),
    allow_analyses: bool = typer.Option(False, "--allow-analyses", help="Allow POST endpoints that run analyses."),
    allow_interventions: bool = typer.Option(False, "--allow-interventions",
                                             help="Allow POST /run, /steer, /attribute (they run the model)."),
    max_body_bytes: int = typer.Option(DEFAULT_MAX_BODY, min=1024, help="Largest request body accepted."),
    threads: int = typer.Option(None, min=1, max=256,
                                help="Compute threads per worker (default: the cores divided among the workers)."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
    device: str = device_option("cpu"),
    model_dtype: str = model_dtype_option(),
) -> None:
    """Serve the atlas over HTTP: JSON API (OpenAPI at /openapi.json) and the explorer at /."""
    from sae_atlas.api.http import ServerSettings, serve
    from sae_atlas.saes.devices import use_by_default

    use_by_default(device, model_dtype)  # the workers inherit it through the environment
    settings = ServerSettings(root=atlas, token=token or None, allow_analyses=allow_analyses,
                              max_body_bytes=max_body_bytes, threads=threads, allow_interventions=allow_interventions)
    serve(settings, host=host, port=port, workers=workers, log_level=log_level)


def register(app: typer.Typer) -> None:
    """Add the `serve` verb."""
    app.command("serve")(serve_command)
