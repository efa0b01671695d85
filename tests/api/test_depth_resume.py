"""kill -9 of `analyze depth` at named points (`tests.saes.kill_points`): in the stream after
some batches were checkpointed, half-way through a checkpoint's write, and in the estimators
after the whole stream was checkpointed. The re-run resumes from the checkpoint and leaves
exactly the files of an uninterrupted run (tables, figures, JSON), its checkpoints removed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sae_atlas.api.analyses.depth import STATE_DIR
from sae_atlas.api.atlas import Atlas
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.depth import capture as stream_module
from sae_atlas.store.layout import AtlasLayout
from tests.saes.compare_fixtures import one_thread  # noqa: F401
from tests.saes.kill_points import (
    KillPoint,
    fresh_copy,
    run_child_until_killed,
    timeless_tree,
    uninterrupted,
)

MODEL = {"kind": "tiny", "arch": "llama", "n_layers": 4, "seed": 3}


def depth_job(root: Path) -> object:
    return Atlas(root).depth_profile(tokens=32 * 12, corpus=CorpusSpec(context_size=32), batch_blocks=2,
                                     max_points=150, k=10, n_boot=20, checkpoint_every=1)


JOB = "tests.api.test_depth_resume.depth_job"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("depth-base") / "atlas"
    root.mkdir()
    AtlasLayout(root).update_meta(model=MODEL)
    return root


@pytest.fixture(scope="module")
def reference(base: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return uninterrupted(JOB, base, tmp_path_factory.mktemp("depth-ref") / "atlas")


@pytest.mark.parametrize("point, done", [
    # 6 batches, the first 2 fit the tuned lens: killed before scoring the 2nd held-out batch, 3 batches counted
    pytest.param(KillPoint("sae_atlas.saes.depth.capture.score_lenses", 2), 3, id="stream-batch-4"),
    pytest.param(KillPoint("torch.save", 3, "mid_write"), 2, id="mid-checkpoint-write"),  # the 3rd checkpoint cut
    pytest.param(KillPoint("sae_atlas.api.analyses.depth.local_dimension", 2), 6, id="estimators"),
])
def test_depth_killed_resumes_to_identical_files(base: Path, reference: dict, tmp_path: Path, point: KillPoint,
                                                 done: int, monkeypatch: pytest.MonkeyPatch) -> None:
    work = fresh_copy(base, tmp_path / "atlas")
    run_child_until_killed(JOB, work, point)
    states = list((work / STATE_DIR).glob("*/rank-0000.pt"))
    assert len(states) == 1 and torch.load(states[0], weights_only=False).done == done
    assert not (work / "analyses" / "depth").exists()  # nothing stored yet
    batches: list[int] = []
    real = stream_module.stream_activations

    def counted(*args, **kwargs):
        for batch in real(*args, **kwargs):
            batches.append(batch.first_block)
            yield batch

    monkeypatch.setattr(stream_module, "stream_activations", counted)
    depth_job(work)
    assert len(batches) == 6 - done  # resumed: only the batches not checkpointed run again
    assert not (work / STATE_DIR).exists()  # checkpoints removed once the run is stored
    assert timeless_tree(work) == reference
