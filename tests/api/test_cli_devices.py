"""Every verb with a `--device` option refuses a GPU this machine lacks with one clear error
line and exit status 2 (no traceback), before it writes anything; `train` included, also
when its config file names the device."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import typer
from typer.testing import CliRunner

from sae_atlas.api.cli import app
from sae_atlas.saes.devices import ENV_DEVICE, resolve_device
from sae_atlas.saes.formats.saelens import save_saelens
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.layout import AtlasLayout
from tests.saes.kill_points import tree_hashes
from tests.saes.planted import write_planted_atlas

HOOK = "blocks.0.hook_resid_post"
MISSING_GPU = "cuda:99" if torch.cuda.is_available() else "cuda"
# the arguments that take each verb up to its device check, given an atlas with a cache and an SAE
VERB_ARGS: dict[tuple[str, ...], Any] = {
    ("cache",): lambda root: [str(root / "new"), "--model", '{"kind": "tiny"}', "--tokens", "256"],
    ("train",): lambda root: [str(root), "--tokens", "128", "--batch-size", "64"],
    ("eval",): lambda root: [str(root)],
    ("summarize",): lambda root: [str(root)],
    ("demo",): lambda root: [str(root / "demo")],
    ("serve",): lambda root: [str(root)],
    ("search", "text"): lambda root: [str(root), "the cat"],
    ("steering-scores",): lambda root: [str(root)],
    ("compare",): lambda root: [f"{root}:s0", f"{root}:s0"],
    ("train-crosscoder",): lambda root: [str(root), "--hook-a", HOOK, "--hook-b", HOOK],
    ("emergence",): lambda root: [f"{root}:s0", f"{root}:s0"],
    ("compare-circle",): lambda root: [f"{root}:s0", "--circle", "circular/none"],
    ("latent-scaling",): lambda root: [str(root), "--id", "cc"],
    ("analyze", "depth"): lambda root: [str(root), "--model", '{"kind": "tiny"}'],
}


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if hasattr(command, "list_commands"):
        ctx = typer.Context(command)
        for name in command.list_commands(ctx):
            yield from _commands(command.get_command(ctx, name), (*path, name))
    else:
        yield path, command


def test_every_verb_with_a_device_option_is_checked() -> None:
    with_device = {path for path, command in _commands(typer.main.get_command(app))
                   if any(param.name == "device" for param in command.params)}
    assert with_device == set(VERB_ARGS)


@pytest.fixture(scope="module")
def atlas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A planted cache of one hook and one random SAE on it."""
    root = tmp_path_factory.mktemp("devices") / "atlas"
    write_planted_atlas(root, [HOOK], d_in=16, n_atoms=32, n_blocks=20, context=32)
    save_saelens(build_sae(SAEConfig("topk", d_in=16, d_sae=32, k=4, hook_name=HOOK)), AtlasLayout(root).sae_dir("s0"))
    return root


def _assert_refused(args: list[str], root: Path) -> None:
    before = tree_hashes(root)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: device {MISSING_GPU!r}"), result.output
    assert tree_hashes(root) == before  # nothing written before the check


@pytest.mark.parametrize("verb", sorted(VERB_ARGS), ids=" ".join)
def test_a_missing_gpu_is_one_clear_error(verb: tuple[str, ...], atlas: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_DEVICE, raising=False)
    _assert_refused([*verb, *VERB_ARGS[verb](atlas), "--device", MISSING_GPU], atlas)


def test_train_config_file_device_is_checked_too(atlas: Path, tmp_path: Path) -> None:
    config = tmp_path / "train.json"
    config.write_text(json.dumps({"device": MISSING_GPU}))
    _assert_refused(["train", *VERB_ARGS[("train",)](atlas), "--config", str(config)], atlas)


def test_train_resolves_auto(atlas: Path, tmp_path: Path) -> None:
    """`--device auto` (a name torch does not know) trains on the device it resolves to."""
    root = tmp_path / "atlas"
    write_planted_atlas(root, [HOOK], d_in=16, n_atoms=32, n_blocks=20, context=32)
    result = CliRunner().invoke(app, ["train", str(root), "--tokens", "128", "--batch-size", "64",
                                      "--d-sae", "32", "--k", "4", "--json", "--device", "auto"])
    assert result.exit_code == 0, result.output
    record = json.loads((AtlasLayout(root).sae_dir(f"{HOOK}-topk-32") / "training.json").read_text())
    assert record["train_config"]["device"] == str(resolve_device("auto"))
