"""`sae-atlas train --from-model`: SAEs trained from one streamed forward are saved and
registered exactly as cached training saves them (and summarize and index take them), and
bad input is refused before any training (no SAE folder, no checkpoint, no forward of the
stream)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from sae_atlas import Atlas
from sae_atlas.api.cli import app
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes import train_from_model as from_model
from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.distributed import DistContext
from sae_atlas.saes.models import load_model
from sae_atlas.saes.train import stream_source
from sae_atlas.saes.train.checkpoint import load_latest_checkpoint, save_checkpoint
from sae_atlas.saes.train.config import TrainConfig
from sae_atlas.saes.train.train_saes import run_dir
from sae_atlas.saes.train_from_model import StreamOptions, train_from_model
from sae_atlas.store.layout import AtlasLayout

MODEL = json.dumps({"kind": "tiny", "n_layers": 2, "d_model": 16, "n_heads": 2, "d_mlp": 32})
HOOKS = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
SIZES = ["--d-sae", "32", "--k", "4", "--tokens", "320", "--batch-size", "32", "--context", "16",
         "--batch-blocks", "2", "--buffer-tokens", "128"]


def _train(root: Path, *args: str) -> object:
    return CliRunner().invoke(app, ["train", str(root), "--from-model", "--model", MODEL, *SIZES,
                                    "--json", *args])


def _hooks(hooks: list[str]) -> list[str]:
    return [arg for hook in hooks for arg in ("--hook", hook)]


def _refused(result: object, root: Path, *needles: str) -> None:
    """Exit status 2 with one line naming the problem, and nothing trained."""
    assert result.exit_code == 2, (result.output, result.exception)
    assert all(needle in result.output for needle in needles), result.output
    assert not (root / "saes").exists() or not any((root / "saes").iterdir())


def test_streamed_saes_are_saved_and_registered_like_cached_ones(tmp_path: Path) -> None:
    root = tmp_path / "stream"
    result = _train(root, *_hooks(HOOKS), "--heldout-tokens", "64")
    assert result.exit_code == 0, (result.output, result.exception)
    records = json.loads(result.output)
    cached = tmp_path / "cached"  # the same SAE trained from a cache of the same tokens
    assert CliRunner().invoke(app, ["cache", str(cached), "--model", MODEL, "--hook", HOOKS[0],
                                    "--tokens", "640", "--context", "16", "--json"]).exit_code == 0
    done = CliRunner().invoke(app, ["train", str(cached), "--hook", HOOKS[0], *SIZES[:-4], "--json"])
    assert done.exit_code == 0, done.output
    reference = json.loads(done.output)[HOOKS[0]]
    meta = AtlasLayout(root).read_meta()
    assert set(meta["saes"]) == {records[h]["sae_id"] for h in HOOKS}
    assert set(records[HOOKS[0]]) == set(reference) and records[HOOKS[0]]["sae_id"] == reference["sae_id"]
    assert records[HOOKS[0]]["fvu"] < 1 and records[HOOKS[0]]["tokens"] == 320
    sae_dir = AtlasLayout(root).sae_dir(reference["sae_id"])
    cached_dir = AtlasLayout(cached).sae_dir(reference["sae_id"])
    assert sorted(p.name for p in sae_dir.iterdir()) == sorted(p.name for p in cached_dir.iterdir())
    assert set(json.loads((sae_dir / "training.json").read_text())) == set(
        json.loads((cached_dir / "training.json").read_text()))
    sae = load_atlas_sae(root, reference["sae_id"])
    assert sae.cfg.hook_name == HOOKS[0] and sae.cfg.d_sae == 32
    assert not list((root / "saes").glob(".train-*"))  # the run's checkpoints are gone
    for verb in (["summarize", "--from-model", "--tokens", "64", "--context", "16"], ["index"]):  # used like any SAE
        done = CliRunner().invoke(app, [verb[0], str(root), *verb[1:]])
        assert done.exit_code == 0, (verb, done.output)


def test_a_hook_the_model_lacks(tmp_path: Path) -> None:
    _refused(_train(tmp_path / "a", *_hooks(["blocks.5.hook_resid_post"])), tmp_path / "a",
             "blocks.5.hook_resid_post", "valid hooks")


def test_a_transcoder_input_that_does_not_fit(tmp_path: Path) -> None:
    _refused(_train(tmp_path / "a", "--transcode", *_hooks(["blocks.1.hook_resid_post"])), tmp_path / "a",
             "blocks.1.hook_resid_post", "lies after the MLP", "blocks.1.ln2.hook_normalized")


def test_a_buffer_larger_than_memory(tmp_path: Path) -> None:
    result = _train(tmp_path / "a", *_hooks(HOOKS), "--buffer-tokens", str(10**13))
    _refused(result, tmp_path / "a", "--buffer-tokens 10000000000000 needs", "GiB", "free")


def test_a_corpus_shorter_than_the_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = tmp_path / "short.txt"
    text.write_text(" ".join(["the cat sat on the mat ."] * 30))
    monkeypatch.setattr(stream_source, "stream_activations", lambda *a, **k: pytest.fail("a forward ran"))
    result = _train(tmp_path / "a", *_hooks(HOOKS), "--corpus", str(text))
    _refused(result, tmp_path / "a", "short.txt", "is too short", "320 training tokens were asked for")


def test_more_ranks_than_dictionaries_for_module_sharding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # rank 0 of two, as torchrun would start it; the refusal comes before any collective
    monkeypatch.setattr(from_model, "init_distributed", lambda: DistContext(0, 2, 0))
    monkeypatch.setattr("sae_atlas.saes.train.train_saes.barrier", lambda ctx: None)
    result = _train(tmp_path / "a", *_hooks(HOOKS[:1]), "--distribute-modules")
    _refused(result, tmp_path / "a", "--distribute-modules over 2 ranks needs at least 2 dictionaries")


def test_a_cached_runs_checkpoint_is_not_mixed_with_the_stream(tmp_path: Path) -> None:
    root = tmp_path / "a"  # a streamed run stopped after 4 steps, its checkpoint then made a cached run's
    options = StreamOptions(CorpusSpec(context_size=16), batch_blocks=2, buffer_tokens=128)
    train = TrainConfig(total_tokens=320, batch_size=32, progress=False, checkpoint_every_tokens=64)
    train_from_model(load_model(json.loads(MODEL)), root, HOOKS[:1], d_sae=32, k=4, train_cfg=train, stream=options,
                     stop_after_steps=4)
    folder = run_dir(AtlasLayout(root), [f"{HOOKS[0]}-topk-32"])
    state = load_latest_checkpoint(folder)
    assert state is not None and state["sources"][0]["source"] == "stream"
    state["sources"] = [{"batches": state["sources"][0]["batches"]}]  # what a cached source saves
    state["replay"]["state"] = [{"batches": 0}]  # (still replaying the first 8 batches, drawn from the start)
    save_checkpoint(folder, state["step"] + 1, state)
    result = _train(root, *_hooks(HOOKS[:1]), "--checkpoint-every", "64")
    assert result.exit_code == 2 and "does not mix cached and streamed sources" in result.output, result.output


def test_an_unknown_dict_dtype(tmp_path: Path) -> None:
    _refused(_train(tmp_path / "a", *_hooks(HOOKS), "--dict-dtype", "float8"), tmp_path / "a",
             "dict_dtype", "'float32', 'bfloat16' or 'float16'")


def test_bfloat16_dictionaries_train(tmp_path: Path) -> None:
    result = _train(tmp_path / "a", *_hooks(HOOKS[:1]), "--dict-dtype", "bfloat16")
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads(result.output)[HOOKS[0]]["fvu"] < 1
    assert torch.isfinite(load_atlas_sae(tmp_path / "a", f"{HOOKS[0]}-topk-32").W_dec).all()


def test_a_streamed_cross_layer_transcoder_is_saved_and_registered_like_a_cached_one(tmp_path: Path) -> None:
    ins = [f"blocks.{layer}.ln2.hook_normalized" for layer in range(2)]
    clt = ["--transcode", "--cross-layer", "--arch", "topk", *_hooks(ins)]
    root, cached = tmp_path / "stream", tmp_path / "cached"
    result = _train(root, *clt)
    assert result.exit_code == 0, (result.output, result.exception)
    record = json.loads(result.output)
    outs = [f"blocks.{layer}.hook_mlp_out" for layer in range(2)]
    assert CliRunner().invoke(app, ["cache", str(cached), "--model", MODEL, *_hooks(ins + outs),
                                    "--tokens", "640", "--context", "16", "--json"]).exit_code == 0
    done = CliRunner().invoke(app, ["train", str(cached), *clt, *SIZES[:-4], "--json"])
    assert done.exit_code == 0, done.output
    reference = json.loads(done.output)
    assert set(record) == set(reference) and record["clt_id"] == reference["clt_id"]
    assert record["fvu"] < 1 and AtlasLayout(root).read_meta()["clts"][record["clt_id"]]["fvu"] == record["fvu"]
    folders = [layout.clt_dir(record["clt_id"]) for layout in (AtlasLayout(root), AtlasLayout(cached))]
    assert sorted(p.name for p in folders[0].iterdir()) == sorted(p.name for p in folders[1].iterdir())


def test_a_crosscoder_of_two_layers_trains_in_the_same_forward_and_is_stored_like_train_crosscoders(
        tmp_path: Path) -> None:
    root = tmp_path / "a"
    result = _train(root, *_hooks(HOOKS[:1]), "--crosscoder", f"{HOOKS[0]},{HOOKS[1]}")
    assert result.exit_code == 0, (result.output, result.exception)
    records = json.loads(result.output)
    cc_id = f"{HOOKS[0]}--{HOOKS[1]}-32"
    assert set(records) == {HOOKS[0], cc_id} and records[cc_id]["kind"] == "crosscoder"
    atlas = Atlas(root)
    (row,) = atlas.crosscoders()  # read as the explorer reads a train-crosscoder run
    assert (row["crosscoder"], row["hook_a"], row["hook_b"], row["d_sae"]) == (cc_id, HOOKS[0], HOOKS[1], 32)
    run = atlas.analysis("crosscoder", cc_id)
    assert run.n_rows == 32 and {"relative_norm", "latent_class"} <= set(run.columns or [])


@pytest.mark.parametrize(("args", "needles"), [
    (["--crosscoder", f"{HOOKS[0]},{HOOKS[1]}"], ("--crosscoder trains from the model's stream", "--from-model")),
    (["--from-model", "--crosscoder", HOOKS[0]], ("--crosscoder takes two hooks", "HOOK_A,HOOK_B")),
    (["--from-model", "--crosscoder", f"{HOOKS[0]},{HOOKS[0]}"], ("a crosscoder pairs two hooks",)),
])
def test_a_bad_crosscoder_request_is_refused(tmp_path: Path, args: list[str], needles: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, ["train", str(tmp_path / "a"), "--model", MODEL, *SIZES, *args])
    _refused(result, tmp_path / "a", *needles)


def test_atlas_train_runs_the_facades_model_and_never_loads_another(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    handle = load_model(json.loads(MODEL))
    monkeypatch.setattr("sae_atlas.saes.models.load_model", lambda *a, **k: pytest.fail("a second model loaded"))
    monkeypatch.setattr("sae_atlas.api.context.load_model", lambda *a, **k: pytest.fail("a second model loaded"))
    atlas = Atlas.create(tmp_path / "a", model=handle)
    records = atlas.train(HOOKS[:1], d_sae=32, k=4, tokens=320, batch_size=32, from_model=True, batch_blocks=2,
                          buffer_tokens=128, corpus=CorpusSpec(context_size=16), progress=False)
    assert records[HOOKS[0]]["sae_id"] in atlas.sae_ids and atlas.meta["saes"]
    with pytest.raises(InvalidInputError, match="tokens"):
        atlas.train(HOOKS[:1], tokens=0, from_model=True)
