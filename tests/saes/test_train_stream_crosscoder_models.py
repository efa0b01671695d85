"""A crosscoder of two MODELS trained from the stream (`train_from_model(crosscoders=...,
model_b=...)`): model B runs on the same token blocks and its rows join model A's before the
mixing buffer. Its weights are byte-identical to `train_crosscoder` fed the same batches,
model B does not perturb the SAEs model A's forward feeds, a model B identical to A pairs
exactly A's own rows (planted), two module-sharded torchrun ranks give the weights of one
process, a kill -9 resumes exactly, and bad input is refused before any training."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from sae_atlas.errors import AtlasError
from sae_atlas.saes import train_from_model as from_model
from sae_atlas.saes.compare.crosscoder import (
    crosscoder_dir,
    read_crosscoder_sides,
    train_crosscoder,
)
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.distributed import DistContext, init_distributed
from sae_atlas.saes.formats.saelens import load_saelens
from sae_atlas.saes.models import TINY_WORDS, ModelHandle, _tiny_tokenizer, load_model, tiny_model
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.stream_source import StreamSource, model_b_hook
from sae_atlas.saes.train_from_model import StreamOptions, train_from_model
from sae_atlas.store.layout import AtlasLayout
from tests.saes.kill_points import KillPoint, run_until_killed, timeless_tree
from tests.saes.planted import one_thread  # noqa: F401

A, B = "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"
SPEC_A = {"kind": "tiny", "n_layers": 2, "d_model": 16, "n_heads": 2, "d_mlp": 32, "seed": 4}
SPEC_B = {**SPEC_A, "d_model": 24, "seed": 5}  # another width, other weights, the same tokenizer
STREAM = StreamOptions(CorpusSpec(context_size=16), batch_blocks=2, buffer_tokens=128, heldout_tokens=64)
TRAIN = TrainConfig(total_tokens=32 * 10, batch_size=32, seed=0, progress=False)
CC_ID = f"{A}--{B}-24"


@pytest.fixture(scope="module")
def handle() -> ModelHandle:
    return load_model(SPEC_A, cache=False)


@pytest.fixture(scope="module")
def model_b() -> ModelHandle:
    return load_model(SPEC_B, cache=False)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_saelens(folder).state_dict()


def _same(x: dict[str, torch.Tensor], y: dict[str, torch.Tensor]) -> bool:
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_a_two_model_crosscoder_equals_train_crosscoder_and_leaves_model_as_saes_alone(
        handle: ModelHandle, model_b: ModelHandle, tmp_path: Path) -> None:
    root = tmp_path / "stream"
    records = train_from_model(handle, root, [A], d_sae=24, k=4, train_cfg=TRAIN, stream=STREAM,
                               crosscoders=[(A, B)], model_b=model_b)
    assert set(records) == {A, CC_ID} and records[CC_ID]["kind"] == "crosscoder" and records[CC_ID]["hook_b"] == B
    folder = crosscoder_dir(root, CC_ID)
    stored = read_crosscoder_sides(folder)  # as `train-crosscoder --model-b` records it
    assert (stored["d_a"], stored["d_b"]) == (16, 24)
    assert stored["sides"] == {"model_a": handle.name, "hook_a": A, "model_b": model_b.name, "hook_b": B,
                               "spec_b": SPEC_B}

    source = StreamSource(handle, STREAM.corpus, [A, model_b_hook(B)], batch_size=32, steps=TRAIN.total_steps,
                          batch_blocks=2, buffer_tokens=128, heldout_tokens=64, seed=0, model_b=model_b)
    joined = [torch.cat([b[A], b[model_b_hook(B)]], 1) for b in (source.next_batch() for _ in range(TRAIN.total_steps))]
    reference = tmp_path / "reference"
    _, scales = train_crosscoder(lambda skip: iter(joined[skip:]), 16, 24, d_sae=24, k=4, train_cfg=TRAIN,
                                 out_dir=reference)
    assert (stored["scale_a"], stored["scale_b"]) == (scales.scale_a, scales.scale_b)
    assert _same(_weights(folder), _weights(reference))

    alone = tmp_path / "alone"  # model B's forward does not perturb model A's stream
    train_from_model(handle, alone, [A], d_sae=24, k=4, train_cfg=TRAIN, stream=STREAM)
    sae_id = records[A]["sae_id"]
    assert _same(*(_weights(AtlasLayout(r).sae_dir(sae_id)) for r in (root, alone)))


def test_a_model_b_identical_to_a_pairs_exactly_as_rows_of_a(handle: ModelHandle, tmp_path: Path) -> None:
    twin = load_model(SPEC_A, cache=False)  # A's weights, loaded again: another handle, the same function
    assert twin is not handle
    source = StreamSource(handle, STREAM.corpus, [A, B, model_b_hook(B)], batch_size=32, steps=TRAIN.total_steps,
                          batch_blocks=2, buffer_tokens=128, heldout_tokens=64, seed=0, model_b=twin)
    for _ in range(TRAIN.total_steps):  # the same token at every row index, through shuffles and carried tails
        batch = source.next_batch()
        assert torch.equal(batch[B], batch[model_b_hook(B)])
    # so the two-model crosscoder of (A, B of the twin) is the two-layer crosscoder (A, B) of A
    train_from_model(handle, tmp_path / "models", [], d_sae=24, k=4, train_cfg=TRAIN, stream=STREAM,
                     crosscoders=[(A, B)], model_b=twin)
    train_from_model(handle, tmp_path / "layers", [], d_sae=24, k=4, train_cfg=TRAIN, stream=STREAM,
                     crosscoders=[(A, B)])
    assert _same(*(_weights(crosscoder_dir(tmp_path / r, CC_ID)) for r in ("models", "layers")))


REPO = Path(__file__).resolve().parents[2]


def _sharded(root: str | Path, lanes: int | None) -> None:
    """The SAE at A and the two-model crosscoder, module-sharded (under torchrun: one each per
    rank, lanes=None: one lane per rank)."""
    train_from_model(load_model(SPEC_A, device="cpu", dtype="float32"), root, [A], d_sae=24, k=4, train_cfg=TRAIN,
                     stream=dataclasses.replace(STREAM, lanes=lanes), crosscoders=[(A, B)],
                     model_b=load_model(SPEC_B, device="cpu", dtype="float32"), distribute="modules")


def test_two_module_sharded_ranks_equal_one_process_streaming_both_lanes(tmp_path: Path) -> None:
    solo, dist = tmp_path / "solo", tmp_path / "dist"
    _sharded(solo, lanes=2)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "tests.saes.test_train_stream_crosscoder_models", str(dist)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for folder in (crosscoder_dir(dist, CC_ID), AtlasLayout(dist).sae_dir(f"{A}-topk-24")):
        assert _same(_weights(folder), _weights(solo / folder.relative_to(dist)))
    assert read_crosscoder_sides(crosscoder_dir(dist, CC_ID)) == read_crosscoder_sides(crosscoder_dir(solo, CC_ID))


KILL_TRAIN = TrainConfig(total_tokens=32 * 12, batch_size=32, scale_batches=2, checkpoint_every_tokens=32 * 5,
                         log_every_steps=3, progress=False)
TIMED = {f"saes/{A}-topk-24/training.json": ["final_metrics.wall_seconds"],
         f"crosscoders/{CC_ID}/training.json": ["final_metrics.wall_seconds"]}


def _killable(handle: ModelHandle, model_b: ModelHandle, root: Path) -> dict[str, Any]:
    return train_from_model(handle, root, [A], d_sae=24, k=4, train_cfg=KILL_TRAIN, stream=STREAM,
                            crosscoders=[(A, B)], model_b=model_b)


@pytest.mark.parametrize("point", [
    KillPoint("sae_atlas.saes.train.stream_source.run_hooks", 14),  # B's 2nd forward of window 3 (after step 10)
    KillPoint("sae_atlas.saes.train.trainer.project_decoder_grad", 15),  # step 8: after a backward, before Adam
], ids=["mid-forward-of-b", "mid-step"])
def test_killed_two_model_training_resumes_to_identical_files(point: KillPoint, handle: ModelHandle,
                                                              model_b: ModelHandle, tmp_path: Path) -> None:
    _killable(handle, model_b, tmp_path / "whole")
    root = tmp_path / "atlas"
    run_until_killed(lambda: _killable(handle, model_b, root), point)
    assert list((root / "saes").glob(".train-*/checkpoints/step-*.pt"))  # it died after a checkpoint
    _killable(handle, model_b, root)
    assert timeless_tree(root, TIMED) == timeless_tree(tmp_path / "whole", TIMED)


def _other_tokenizer(model: ModelHandle) -> ModelHandle:
    return dataclasses.replace(model, tokenizer=_tiny_tokenizer(TINY_WORDS[:-3]))


@pytest.mark.parametrize(("case", "needles"), [
    ("hook", ("model B", "blocks.5.hook_resid_post")),
    ("no-crosscoder", ("--model-b", "--crosscoder")),
    ("tokenizer", ("another tokenizer", "train-crosscoder --model-b")),
    ("torchrun", ("--model-b under torchrun", "--distribute-modules")),
])
def test_bad_model_b_input_is_refused_before_training(case: str, needles: tuple[str, ...], handle: ModelHandle,
                                                       model_b: ModelHandle, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    args: dict[str, Any] = {"crosscoders": [(A, B)], "model_b": model_b}
    if case == "hook":
        args["crosscoders"] = [(A, "blocks.5.hook_resid_post")]
    elif case == "no-crosscoder":
        args["crosscoders"] = []
    elif case == "tokenizer":
        args["model_b"] = _other_tokenizer(model_b)
    else:  # rank 0 of two data-parallel, as torchrun starts it: refused before any collective
        monkeypatch.setattr(from_model, "init_distributed", lambda: DistContext(0, 2, 0))
    with pytest.raises(AtlasError) as refused:
        train_from_model(handle, tmp_path, [A], d_sae=24, k=4, train_cfg=TRAIN, stream=STREAM, **args)
    assert all(needle in str(refused.value) for needle in needles), str(refused.value)
    assert not (tmp_path / "crosscoders").exists() and not (tmp_path / "saes").exists()


def test_a_crosscoder_saved_between_other_sides_is_not_taken_for_this_one(handle: ModelHandle,
                                                                            tmp_path: Path) -> None:
    twin = tiny_model(**{k: v for k, v in SPEC_A.items() if k != "kind"})  # the same widths, so the same config
    train_from_model(handle, tmp_path, [], d_sae=24, k=4, train_cfg=TRAIN, stream=STREAM, crosscoders=[(A, B)])
    with pytest.raises(AtlasError, match="already exists between other sides"):
        train_from_model(handle, tmp_path, [], d_sae=24, k=4, train_cfg=TRAIN, stream=STREAM, crosscoders=[(A, B)],
                         model_b=twin)


if __name__ == "__main__":  # the torchrun worker of the module-sharded test
    assert (ctx := init_distributed()) is not None and ctx.world_size == 2
    _sharded(sys.argv[1], lanes=None)
