"""`python -m api` runs the `sae-atlas` command line."""

from api.cli import app

app()
