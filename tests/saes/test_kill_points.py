"""kill -9 at named points of caching, training, streamed summaries and imports; the re-run
leaves exactly the files (sha256 for sha256) an uninterrupted run leaves.

Each killed run is a forked child that SIGKILLs itself at a monkeypatched call
(`tests.saes.kill_points`). Fields that legitimately differ between two runs are named
where they are dropped: a run's wall time (`training.json` final_metrics.wall_seconds, the
import's eval.json `seconds`) and the import's time stamp (source.json `imported_at`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sae_atlas.saes.cache import cache_activations
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.importing.pipeline import import_sae
from sae_atlas.saes.models import ModelHandle, tiny_model
from sae_atlas.saes.summary.stream import summarize_from_model
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.train_saes import train_saes
from sae_atlas.store.layout import AtlasLayout
from tests.saes import stream_fixture
from tests.saes.kill_points import KillPoint, run_until_killed, tree_hashes
from tests.saes.planted import one_thread, write_planted_atlas  # noqa: F401

# caching: 10 blocks in shards of 4, 4, 2 for each of two hooks
CACHE_HOOKS = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
CACHE_CORPUS = CorpusSpec(context_size=16)
CACHE_ARGS: dict[str, Any] = {"corpus": CACHE_CORPUS, "n_tokens": 16 * 10, "batch_blocks": 2, "shard_blocks": 4,
                              "progress": False}
# training: 12 steps on a planted cache, a checkpoint at almost every step (the default: a
# tenth of the run), a history row every step or every 10 (the default)
TRAIN_HOOK = "blocks.0.hook_resid_post"
TRAIN_RECORD = "saes/blocks.0.hook_resid_post-topk-64/training.json"
# streamed summaries: 7 batches, a checkpoint every 2
SUMMARY_ARGS: dict[str, Any] = {"corpus": stream_fixture.CORPUS, "n_tokens": stream_fixture.N_TOKENS,
                                "batch_blocks": stream_fixture.BATCH_BLOCKS, "checkpoint_every": 2,
                                "progress": False}
IMPORTED = "imported"


@pytest.fixture(scope="module")
def handle() -> ModelHandle:
    return tiny_model(n_layers=2, d_model=16, n_heads=2, d_mlp=32, seed=4)


@pytest.fixture(scope="module")
def cache_reference(handle: ModelHandle, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cache") / "atlas"
    cache_activations(handle, root, CACHE_HOOKS, **CACHE_ARGS)
    return tree_hashes(root)


@pytest.mark.parametrize("point", [
    KillPoint("sae_atlas.store.activations.save_deterministic", 3, "mid_write"),  # half of a temporary shard on disk
    KillPoint("sae_atlas.store.activations.ActivationWriter._write_manifest", 4),  # shard in place, manifest not updated
    KillPoint("pathlib.Path.write_bytes", 4, "mid_write", path_arg=0),  # half of a temporary manifest
], ids=["mid-shard-write", "shard-before-manifest", "mid-manifest-write"])
def test_cache_killed_resumes_to_identical_files(point: KillPoint, handle: ModelHandle, tmp_path: Path,
                                                 cache_reference: dict[str, str]) -> None:
    root = tmp_path / "atlas"
    run_until_killed(lambda: cache_activations(handle, root, CACHE_HOOKS, **CACHE_ARGS), point)
    summary = cache_activations(handle, root, CACHE_HOOKS, **CACHE_ARGS)
    assert summary.resumed_from_blocks > 0
    assert tree_hashes(root) == cache_reference


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("planted") / "atlas"
    write_planted_atlas(root, [TRAIN_HOOK], d_in=16, n_atoms=48, n_blocks=40, context=32)
    return root


def _train(root: Path, log_every_steps: int) -> None:
    train_saes(root, architecture="topk", d_sae=64, k=4, train_cfg=TrainConfig(
        total_tokens=64 * 12, batch_size=64, log_every_steps=log_every_steps, progress=False))


@pytest.fixture(scope="module")
def trained(planted: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Path]:
    """The planted atlas after an uninterrupted run, by `log_every_steps`."""
    runs: dict[int, Path] = {}

    def run(log_every_steps: int) -> Path:
        if log_every_steps not in runs:
            runs[log_every_steps] = tmp_path_factory.mktemp("trained") / "atlas"
            shutil.copytree(planted, runs[log_every_steps])
            _train(runs[log_every_steps], log_every_steps)
        return runs[log_every_steps]

    return run


def _training_record(root: Path) -> dict[str, Any]:
    """training.json without the run's wall time."""
    record = json.loads((root / TRAIN_RECORD).read_text())
    record["final_metrics"].pop("wall_seconds")
    return record


@pytest.mark.parametrize(("point", "log_every_steps"), [
    (KillPoint("sae_atlas.saes.train.trainer.project_decoder_grad", 7), 1),  # step 7: after the backward, before Adam
    (KillPoint("torch.save", 3, "mid_write"), 1),  # half of the third temporary checkpoint on disk
    (KillPoint("sae_atlas.saes.train.trainer._write_record", 1), 1),  # SAE saved, training.json not yet written
    (KillPoint("sae_atlas.saes.train.trainer.remove_checkpoints", 1), 1),  # training.json written, checkpoints left
    (KillPoint("sae_atlas.saes.train.trainer.project_decoder_grad", 7), 10),  # steps 1-6 not yet in the history
], ids=["after-backward", "mid-checkpoint-write", "before-training-json", "before-checkpoint-cleanup",
        "after-backward-mid-log-window"])
def test_training_killed_resumes_to_identical_files(point: KillPoint, log_every_steps: int, planted: Path,
                                                    trained: Callable[[int], Path], tmp_path: Path) -> None:
    root = tmp_path / "atlas"
    shutil.copytree(planted, root)
    run_until_killed(lambda: _train(root, log_every_steps), point)
    _train(root, log_every_steps)
    reference = trained(log_every_steps)
    assert tree_hashes(root, skip=(TRAIN_RECORD,)) == tree_hashes(reference, skip=(TRAIN_RECORD,))
    assert _training_record(root) == _training_record(reference)


@pytest.fixture(scope="module")
def summary_atlas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("summary") / "atlas"
    stream_fixture.make_atlas(root, with_cache=False)
    return root


@pytest.fixture(scope="module")
def summary_reference(summary_atlas: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("summarized") / "atlas"
    shutil.copytree(summary_atlas, root)
    summarize_from_model(stream_fixture.tiny(), root, **SUMMARY_ARGS)
    return tree_hashes(root)


@pytest.mark.parametrize("point", [
    KillPoint("sae_atlas.saes.streaming.run_hooks", 4),  # the 4th forward, after the checkpoint of batches 1-2
    KillPoint("torch.save", 2, "mid_write"),  # half of the second temporary accumulator state on disk
    KillPoint("sae_atlas.saes.summary.stream._save_state", 2),  # spool chunk written, accumulator state not
], ids=["mid-stream", "mid-state-write", "spool-before-state"])
def test_streamed_summary_killed_resumes_to_identical_tables(point: KillPoint, summary_atlas: Path, tmp_path: Path,
                                                            summary_reference: dict[str, str]) -> None:
    root = tmp_path / "atlas"
    shutil.copytree(summary_atlas, root)
    run_until_killed(lambda: summarize_from_model(stream_fixture.tiny(), root, **SUMMARY_ARGS), point)
    summarize_from_model(stream_fixture.tiny(), root, **SUMMARY_ARGS)
    assert tree_hashes(root) == summary_reference


@pytest.fixture(scope="module")
def saelens_folder(trained: Callable[[int], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained SAE's cfg.json and weights alone: a SAELens-layout folder."""
    folder = tmp_path_factory.mktemp("source") / "sae"
    folder.mkdir()
    for name in ("cfg.json", "sae_weights.safetensors"):
        shutil.copy(trained(1) / Path(TRAIN_RECORD).parent / name, folder / name)
    return folder


def _import(root: Path, folder: Path) -> object:
    return import_sae(root, folder, sae_id=IMPORTED, with_model=False, n_tokens=512)


@pytest.fixture(scope="module")
def import_reference(trained: Callable[[int], Path], saelens_folder: Path,
                     tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imported") / "atlas"
    shutil.copytree(trained(1), root)
    _import(root, saelens_folder)
    return root


def _timeless(root: Path) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
    """The atlas' files, with the imported SAE's source.json and eval.json compared without
    their time stamp and wall time."""
    folder = AtlasLayout(root).sae_dir(IMPORTED)
    source, record = json.loads((folder / "source.json").read_text()), json.loads((folder / "eval.json").read_text())
    source.pop("imported_at")
    record.pop("seconds")
    timed = tuple(f"saes/{IMPORTED}/{name}" for name in ("source.json", "eval.json"))
    return tree_hashes(root, skip=timed), source, record


@pytest.mark.parametrize("point", [
    KillPoint("sae_atlas.saes.importing.pipeline.write_eval", 1, "after"),  # staged, not moved into saes/
    KillPoint("sae_atlas.saes.importing.pipeline._register", 1),  # moved into saes/, not registered in atlas.json
], ids=["staged", "moved-not-registered"])
def test_import_killed_reruns_to_identical_registration(point: KillPoint, trained: Callable[[int], Path],
                                                        saelens_folder: Path, import_reference: Path,
                                                        tmp_path: Path) -> None:
    root = tmp_path / "atlas"
    shutil.copytree(trained(1), root)
    run_until_killed(lambda: _import(root, saelens_folder), point)
    result = _import(root, saelens_folder)
    assert not result.suspect, result.problems
    assert _timeless(root) == _timeless(import_reference)
    assert AtlasLayout(root).read_meta()["saes"][IMPORTED] == AtlasLayout(import_reference).read_meta()["saes"][IMPORTED]
