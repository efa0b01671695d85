"""A crosscoder of two layers trained from the model's stream (`train_from_model(crosscoders=...)`),
stepped by the same loop as the run's SAEs: its weights are byte-identical to `train_crosscoder`
(the trainer `train-crosscoder` runs) fed the same batches, it is saved as `train-crosscoder`
saves one, and the SAE trained beside it is byte-identical to the same SAE trained alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sae_atlas.errors import AtlasError
from sae_atlas.saes.compare.crosscoder import (
    crosscoder_dir,
    read_crosscoder_sides,
    train_crosscoder,
)
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.formats.saelens import load_saelens
from sae_atlas.saes.models import ModelHandle, tiny_model
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.stream_source import StreamSource
from sae_atlas.saes.train_from_model import StreamOptions, train_from_model
from sae_atlas.store.layout import AtlasLayout

A, B = "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"
STREAM = StreamOptions(CorpusSpec(context_size=16), batch_blocks=2, buffer_tokens=128, heldout_tokens=64)
TRAIN = TrainConfig(total_tokens=32 * 10, batch_size=32, seed=0, progress=False)


@pytest.fixture(scope="module")
def handle() -> ModelHandle:
    return tiny_model(n_layers=2, d_model=16, n_heads=2, d_mlp=32, seed=4)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_saelens(folder).state_dict()


def test_a_streamed_crosscoder_equals_train_crosscoder_on_the_same_batches(handle: ModelHandle,
                                                                           tmp_path: Path) -> None:
    root = tmp_path / "stream"
    records = train_from_model(handle, root, [A], d_sae=24, k=4, train_cfg=TRAIN, stream=STREAM,
                               crosscoders=[(A, B)])
    cc_id = f"{A}--{B}-24"
    assert set(records) == {A, cc_id} and records[cc_id]["kind"] == "crosscoder" and records[cc_id]["hook_b"] == B
    assert records[cc_id]["fvu"] is not None and records[cc_id]["tokens"] == 320
    assert set(AtlasLayout(root).read_meta()["saes"]) == {records[A]["sae_id"]}  # a crosscoder is not an atlas SAE
    folder = crosscoder_dir(root, cc_id)
    sides = read_crosscoder_sides(folder)
    assert (sides["d_a"], sides["d_b"], sides["sides"]["hook_a"], sides["sides"]["hook_b"]) == (16, 16, A, B)

    source = StreamSource(handle, STREAM.corpus, [A, B], batch_size=32, steps=TRAIN.total_steps, batch_blocks=2,
                          buffer_tokens=128, heldout_tokens=64, seed=0)
    joined = [torch.cat([b[A], b[B]], 1) for b in (source.next_batch() for _ in range(TRAIN.total_steps))]
    reference = tmp_path / "reference"
    _, scales = train_crosscoder(lambda skip: iter(joined[skip:]), 16, 16, d_sae=24, k=4, train_cfg=TRAIN,
                                 out_dir=reference)
    assert (sides["scale_a"], sides["scale_b"]) == (scales.scale_a, scales.scale_b)
    mine, theirs = _weights(folder), _weights(reference)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)

    alone = tmp_path / "alone"  # the SAE beside the crosscoder trained as if alone
    train_from_model(handle, alone, [A], d_sae=24, k=4, train_cfg=TRAIN, stream=STREAM)
    sae_id = records[A]["sae_id"]
    beside, by_itself = (_weights(AtlasLayout(r).sae_dir(sae_id)) for r in (root, alone))
    assert all(torch.equal(beside[k], by_itself[k]) for k in beside)
    assert not list((root / "saes").glob(".train-*"))  # the run's checkpoints are gone


def test_only_a_crosscoder_checkpoints_in_its_own_folder_and_resumes(handle: ModelHandle, tmp_path: Path) -> None:
    args = {"d_sae": 24, "k": 4, "train_cfg": TRAIN, "stream": STREAM, "crosscoders": [(A, B)]}
    assert train_from_model(handle, tmp_path / "a", [], stop_after_steps=4, **args) == {}
    folder = crosscoder_dir(tmp_path / "a", f"{A}--{B}-24")
    assert list((folder / "checkpoints").iterdir())
    train_from_model(handle, tmp_path / "a", [], **args)
    train_from_model(handle, tmp_path / "b", [], **args)
    resumed, whole = _weights(folder), _weights(crosscoder_dir(tmp_path / "b", f"{A}--{B}-24"))
    assert all(torch.equal(resumed[k], whole[k]) for k in resumed)
    assert not (folder / "checkpoints").exists() or not list((folder / "checkpoints").iterdir())


@pytest.mark.parametrize(("pair", "needle"), [((A, A), "two hooks"), ((A, "blocks.7.hook_resid_post"), "blocks.7")])
def test_a_bad_pair_is_refused_before_training(handle: ModelHandle, tmp_path: Path, pair: tuple[str, str],
                                               needle: str) -> None:
    with pytest.raises(AtlasError, match=needle):
        train_from_model(handle, tmp_path, [], d_sae=24, k=4, train_cfg=TRAIN, stream=STREAM, crosscoders=[pair])
    assert not (tmp_path / "crosscoders").exists()


def test_progress_shows_the_rate_the_forwards_share_and_each_dictionarys_metrics(
        handle: ModelHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = TrainConfig(total_tokens=32 * 10, batch_size=32, seed=0, progress=True, log_every_steps=5)
    train_from_model(handle, tmp_path, [A], d_sae=24, k=4, train_cfg=train, stream=STREAM, crosscoders=[(A, B)])
    out = capsys.readouterr()
    shown = out.out + out.err
    assert "tok/s" in shown and "forward " in shown
    for name in (f"{A}-topk-24", f"{A}--{B}-24"):  # every dictionary at each log step
        lines = [line for line in shown.splitlines() if f" {name}: " in line]
        assert len(lines) == 2 and all("FVU" in x and "L0" in x and "dead" in x for x in lines), shown[-2000:]
