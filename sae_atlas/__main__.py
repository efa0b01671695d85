"""`python -m sae_atlas` runs the `sae-atlas` command line (what torchrun launches)."""

from sae_atlas.api.cli import app

app()
