"""`sae-atlas --help` starts without the heavy libraries: the commands import them when they run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "transformer_lens", "transformers", "faiss", "polars")


def test_cli_import_and_help_load_no_heavy_library() -> None:
    """`import sae_atlas.api.cli` and `--help` (top level and every verb's) import none of HEAVY; a
    failure names who imported it."""
    probe = f"""
import importlib.abc, json, sys, traceback
class Watch(importlib.abc.MetaPathFinder):
    who = {{}}
    def find_spec(self, name, path=None, target=None):
        if name in {HEAVY!r} and name not in self.who:
            self.who[name] = [f"{{f.filename}}:{{f.lineno}}" for f in traceback.extract_stack()
                              if "importlib" not in f.filename and "<" not in f.filename][-6:]
        return None
sys.meta_path.insert(0, Watch())
import sae_atlas.api.cli as cli
from typer.main import get_command
from typer.testing import CliRunner
runner = CliRunner()
group = get_command(cli.app)
verbs = [[]] + [[name] for name in group.commands]
for args in verbs:
    assert runner.invoke(cli.app, [*args, "--help"]).exit_code == 0, args
print(json.dumps({{name: Watch.who.get(name) for name in {HEAVY!r} if name in sys.modules}}))
"""
    answer = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                            cwd=Path(__file__).resolve().parents[2], check=True)
    loaded = json.loads(answer.stdout.strip().splitlines()[-1])
    assert not loaded, json.dumps(loaded, indent=1)
