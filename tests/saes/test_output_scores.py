"""Output scores (`saes.intervene.output_scores`): the last-token trick equals a full spliced
forward with a steer edit at the last position; a planted feature that promotes a token
outranks one that only detects it; the stored table is checksummed, tied to the weights and
resumes after kill -9 from its last finished chunk; the CLI verb writes it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch
from typer.testing import CliRunner

import sae_atlas.saes.intervene.output_scores as output_scores
from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.saes.atlas_saes import load_atlas_sae
from sae_atlas.saes.intervene.edits import SteerEdit, compile_edit, resolve_positions
from sae_atlas.saes.intervene.output_scores import (
    SteeringParams,
    compute_steering_scores,
    last_token_steering,
    lens_peaks,
    lens_token_matrix,
    neutral_prompts,
    screened_latents,
    steering_chunk,
)
from sae_atlas.saes.intervene.splice import Splice, run_spliced
from sae_atlas.saes.models import tiny_model
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.steering import (
    CHUNKS_DIR,
    STEERING_FILE,
    STEERING_META,
    STEERING_SCHEMA,
    read_steering,
)
from sae_atlas.store.tables import FeatureTables
from tests.api.small_atlas import build_small_atlas
from tests.saes.kill_points import KillPoint

ATOL = 1e-4


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_last_token_trick_matches_a_full_spliced_forward(arch: str) -> None:
    handle = tiny_model(arch=arch, n_layers=3, seed=1)
    hook = "blocks.1.hook_resid_post"
    sae = build_sae(SAEConfig(architecture="topk", d_in=handle.d_model, d_sae=16, k=4, hook_name=hook, seed=3)).eval()
    prompts = neutral_prompts(handle, 3, 8, seed=0)
    features, alphas = [0, 5, 9, 15], [3.0, -2.0, 5.0, 0.0]
    with last_token_steering(handle, prompts, hook) as steered:
        fast_FPV = steered(torch.tensor(alphas)[:, None] * sae.W_dec.detach()[features])
    mask = resolve_positions("last", [], prompts.shape[1], prompts.shape[1])
    for i, (feature, alpha) in enumerate(zip(features, alphas, strict=True)):
        edit = compile_edit(SteerEdit(sae="s", feature=feature, alpha=alpha, at="last"), mask, sae=sae, hook=hook)
        for p in range(len(prompts)):
            full = run_spliced(handle, prompts[p], Splice({"s": (hook, sae)}, [edit])).logits_TV[-1]
            torch.testing.assert_close(fast_FPV[i, p], full, atol=ATOL, rtol=0)


def test_neutral_prompts_are_seeded_and_of_fixed_length() -> None:
    handle = tiny_model(n_layers=1)
    a, b = neutral_prompts(handle, 4, 6, seed=2), neutral_prompts(handle, 4, 6, seed=2)
    assert a.shape == (4, 6) and torch.equal(a, b) and bool((a[:, 0] == handle.bos_token_id).all())
    with pytest.raises(InvalidInputError, match="at least 2 tokens"):
        neutral_prompts(handle, 4, 1, seed=0)


def test_a_promoting_feature_outranks_one_that_only_detects_the_token() -> None:
    handle = tiny_model(arch="llama", n_layers=2, seed=4)
    hook = "blocks.1.hook_resid_post"  # the last block: the decoder row reaches the unembedding directly
    token = int(handle.tokenizer.convert_tokens_to_ids("cat"))
    W_U_D = handle.W_U.detach()[:, token].float()
    other_D = torch.randn(handle.d_model, generator=torch.Generator().manual_seed(0))
    other_D -= (other_D @ W_U_D) / (W_U_D @ W_U_D) * W_U_D  # orthogonal to the token's unembedding
    text = handle.to_tokens("the cat sat on the mat and a cat ran to the dog")[0]
    acts = {}
    handle.bridge.run_with_hooks(text[None], fwd_hooks=[(hook, lambda a, hook=None: acts.setdefault("x", a))])
    x_TD = acts["x"][0].detach().float()
    is_cat = text == token
    detect_D = x_TD[is_cat].mean(0) - x_TD.mean(0)  # fires on the token
    sae = build_sae(SAEConfig(architecture="standard", d_in=handle.d_model, d_sae=2, hook_name=hook)).eval()
    with torch.no_grad():
        sae.W_dec.copy_(torch.stack([W_U_D / W_U_D.norm(), other_D / other_D.norm()]))
        sae.W_enc.copy_(torch.stack([W_U_D, detect_D], 1))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    code_T = sae.encode(x_TD)[:, 1]
    assert code_T[is_cat].mean() > 2 * code_T[~is_cat].mean()  # the detector detects the token
    prompts = neutral_prompts(handle, 6, 8, seed=0)
    with last_token_steering(handle, prompts, hook) as steered:
        clean = steered(torch.zeros(1, handle.d_model))[0]
        rows = steering_chunk(steered, clean, sae.W_dec.detach(), np.arange(2, dtype=np.int32),
                              np.full(2, 8 * float(x_TD.norm(dim=-1).mean()), np.float32),
                              lens_token_matrix([[token], [token]], "planted"), top_k=5)
    promoter, detector = rows.row(0, named=True), rows.row(1, named=True)
    assert promoter["promoted_ids"][0] == token and promoter["lens_best_rank"] == 0
    assert detector["lens_best_rank"] > 10 and promoter["lens_top_prob"] > 1.5 * detector["lens_top_prob"]
    assert promoter["output_score"] > 3 * detector["output_score"], (promoter, detector)
    assert promoter["kl"] > 0 and detector["kl"] > 0


def test_the_lens_screen_keeps_a_promoting_latent_and_drops_random_and_dead_ones() -> None:
    handle = tiny_model(arch="llama", n_layers=2, seed=4)
    token = int(handle.tokenizer.convert_tokens_to_ids("cat"))
    u_D = handle.W_U.detach().float()[:, token]
    W_FD = torch.randn(40, handle.d_model, generator=torch.Generator().manual_seed(0))
    W_FD[0] = u_D / handle.final_norm_weight.detach().float()  # through the final norm: the token's unembedding
    W_FD[1] = W_FD[0]  # the same direction, but dead
    alpha_F = np.ones(40, np.float32)
    alpha_F[1] = 0.0
    z_F = lens_peaks(handle, W_FD)
    assert z_F[0] > z_F[2:].max() + 1  # the planted promoter peaks far above random rows
    assert screened_latents(handle, W_FD, alpha_F, 4.5).tolist() == [0]
    assert screened_latents(handle, W_FD, alpha_F, 0.0).tolist() == list(range(40))  # no screen: every latent
    with pytest.raises(InvalidInputError, match="lens_z"):
        screened_latents(handle, W_FD, alpha_F, -1.0)


@pytest.fixture(scope="module")
def atlas_root(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return build_small_atlas(tmp_path_factory.mktemp("steering") / "atlas")


PARAMS = SteeringParams(n_prompts=4, prompt_tokens=8, chunk=16, top_k=4)


REPO = Path(__file__).resolve().parents[2]
KILLED_RUN = """
import json, sys
from sae_atlas.saes.intervene.output_scores import SteeringParams, compute_steering_scores
from sae_atlas.saes.models import tiny_model
from tests.saes.kill_points import KillPoint
KillPoint(**json.loads(sys.argv[1])).install()
compute_steering_scores(tiny_model(n_layers=2, d_model=32), sys.argv[3], sys.argv[4],
                        SteeringParams(**json.loads(sys.argv[2])), progress=False)
"""  # a fresh interpreter: polars' thread pool does not survive a fork


@pytest.mark.parametrize(("point", "finished"), [
    (KillPoint("sae_atlas.saes.intervene.output_scores.steering_chunk", 3), 2),  # before the third chunk
    (KillPoint("polars.DataFrame.write_parquet", 2, "mid_write"), 1),  # half of the second chunk's temporary file
])
def test_a_killed_run_resumes_from_its_last_finished_chunk(atlas_root: dict[str, Any], point: KillPoint,
                                                           finished: int, tmp_path: Path) -> None:
    root = tmp_path / "atlas"
    shutil.copytree(atlas_root["root"], root)
    sae_id = atlas_root["sae_ids"][1]
    handle = tiny_model(n_layers=2, d_model=32)
    killed = subprocess.run([sys.executable, "-c", KILLED_RUN, json.dumps(asdict(point)), json.dumps(asdict(PARAMS)),
                             str(root), sae_id], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    folder = root / "saes" / sae_id
    assert sorted(p.name for p in (folder / CHUNKS_DIR).glob("chunk-*")) == [
        f"chunk-{i:06d}.parquet" for i in range(finished)]
    with pytest.raises(NotFoundError, match="steering-scores"):
        read_steering(root, sae_id)
    report = compute_steering_scores(handle, root, sae_id, PARAMS, progress=False)
    assert (report.chunks_computed, report.chunks_resumed, report.n_latents) == (4 - finished, finished,
                                                                                 atlas_root["d_sae"])
    assert not (folder / CHUNKS_DIR).exists()
    resumed, meta = read_steering(root, sae_id)
    again = compute_steering_scores(handle, root, sae_id, PARAMS, progress=False, force=True)
    assert again.chunks_computed == 4 and not again.current
    fresh, _ = read_steering(root, sae_id)
    assert dict(resumed.schema) == STEERING_SCHEMA and resumed["latent"].to_list() == list(range(atlas_root["d_sae"]))
    for column in ("output_score", "kl", "alpha"):
        np.testing.assert_allclose(resumed[column].to_numpy(), fresh[column].to_numpy(), rtol=1e-5, atol=1e-7)
    assert meta["params"]["n_prompts"] == 4 and meta["params"]["strength"] == PARAMS.strength
    assert meta["weights_sha256"] and meta["rows"] == atlas_root["d_sae"]
    assert ((resumed["output_score"] >= 0) & (resumed["output_score"] <= 1)).all()


def test_chunks_of_other_parameters_are_discarded(atlas_root: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    root, sae_id = atlas_root["root"], atlas_root["sae_ids"][0]
    handle = tiny_model(n_layers=2, d_model=32)
    original, calls = steering_chunk, []

    def dies_on_the_second_chunk(*args: Any, **kwargs: Any) -> pl.DataFrame:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(output_scores, "steering_chunk", dies_on_the_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        compute_steering_scores(handle, root, sae_id, PARAMS, progress=False)
    monkeypatch.setattr(output_scores, "steering_chunk", original)
    other = SteeringParams(**{**PARAMS.__dict__, "strength": 3.0})
    assert compute_steering_scores(handle, root, sae_id, other, progress=False).chunks_resumed == 0


def test_a_damaged_table_or_one_of_other_weights_is_named(atlas_root: dict[str, Any], tmp_path: Path) -> None:
    root = tmp_path / "atlas"
    shutil.copytree(atlas_root["root"], root)
    sae_id = atlas_root["sae_ids"][0]
    compute_steering_scores(tiny_model(n_layers=2, d_model=32), root, sae_id, PARAMS, progress=False)
    folder = root / "saes" / sae_id
    meta = (folder / STEERING_META).read_text()
    (folder / STEERING_META).write_text(meta.replace('"weights_sha256": "', '"weights_sha256": "0'))
    with pytest.raises(IntegrityError, match="other weights"):
        read_steering(root, sae_id)
    (folder / STEERING_META).write_text(meta)
    with open(folder / STEERING_FILE, "ab") as handle:
        handle.write(b"junk")
    with pytest.raises(IntegrityError, match="sha256"):
        read_steering(root, sae_id)
    (folder / STEERING_META).unlink()
    with pytest.raises(IntegrityError, match="interrupted write"):
        read_steering(root, sae_id)


def test_cli_writes_the_table(atlas_root: dict[str, Any], tmp_path: Path) -> None:
    from sae_atlas.api.cli import app

    root = tmp_path / "atlas"
    shutil.copytree(atlas_root["root"], root)
    sae_id = atlas_root["sae_ids"][0]
    result = CliRunner().invoke(app, ["steering-scores", str(root), "--sae", sae_id, "--prompts", "3",
                                      "--prompt-tokens", "6", "--chunk", "32", "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    frame, meta = read_steering(root, sae_id)
    assert frame.height == atlas_root["d_sae"] and meta["params"]["n_prompts"] == 3
    assert meta["params"]["hook"] == atlas_root["hooks"][0]


def test_a_screened_table_holds_only_the_latents_that_pass(atlas_root: dict[str, Any], tmp_path: Path) -> None:
    root = tmp_path / "atlas"
    shutil.copytree(atlas_root["root"], root)
    sae_id = atlas_root["sae_ids"][0]
    handle = tiny_model(n_layers=2, d_model=32)
    W_FD = load_atlas_sae(root, sae_id).W_dec.detach()
    z = float(np.median(lens_peaks(handle, W_FD)))
    report = compute_steering_scores(handle, root, sae_id, SteeringParams(**{**asdict(PARAMS), "lens_z": z}),
                                     progress=False)
    frame, meta = read_steering(root, sae_id)
    alpha_F = np.nan_to_num(FeatureTables(root, sae_id).features["mean_active_act"].to_numpy())
    assert frame["latent"].to_list() == screened_latents(handle, W_FD, alpha_F, z).tolist()
    assert 0 < report.measured == frame.height < atlas_root["d_sae"] and meta["params"]["lens_z"] == z
    with pytest.raises(InvalidInputError, match="passes the logit-lens screen"):
        compute_steering_scores(handle, root, sae_id, SteeringParams(**{**asdict(PARAMS), "lens_z": 1e3}),
                                progress=False)


def test_a_current_table_is_kept_unless_forced(atlas_root: dict[str, Any], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-running on a finished table of the same parameters and weights computes nothing and
    says so; other parameters or --force recompute it."""
    from sae_atlas.api.cli import app

    root = tmp_path / "atlas"
    shutil.copytree(atlas_root["root"], root)
    sae_id = atlas_root["sae_ids"][0]
    args = ["steering-scores", str(root), "--sae", sae_id, "--prompts", "3", "--prompt-tokens", "6",
            "--chunk", "32", "--device", "cpu"]
    assert CliRunner().invoke(app, args).exit_code == 0
    table = root / "saes" / sae_id / STEERING_FILE
    written = (table.read_bytes(), (table.parent / STEERING_META).read_bytes())
    original = output_scores.steering_chunk

    def computed(*a: Any, **k: Any) -> pl.DataFrame:
        raise AssertionError("a chunk of a current table was computed again")

    monkeypatch.setattr(output_scores, "steering_chunk", computed)
    again = CliRunner().invoke(app, [*args, "--json"])
    assert again.exit_code == 0, again.output
    [report] = json.loads(again.output)
    assert report["current"] and (report["chunks_computed"], report["chunks_resumed"]) == (0, 0)
    shown = CliRunner().invoke(app, args)
    assert shown.exit_code == 0 and "steering table is current (same parameters and weights), kept; --force" in shown.output
    assert (table.read_bytes(), (table.parent / STEERING_META).read_bytes()) == written
    monkeypatch.setattr(output_scores, "steering_chunk", original)
    n_chunks = -(-atlas_root["d_sae"] // 32)
    forced = CliRunner().invoke(app, [*args, "--force", "--json"])
    assert forced.exit_code == 0, forced.output
    assert json.loads(forced.output)[0]["chunks_computed"] == n_chunks and not json.loads(forced.output)[0]["current"]
    other = CliRunner().invoke(app, [*args, "--strength", "3", "--json"])  # other parameters
    assert other.exit_code == 0, other.output
    assert json.loads(other.output)[0]["chunks_computed"] == n_chunks
    assert read_steering(root, sae_id)[1]["params"]["strength"] == 3


def test_two_torchrun_ranks_write_the_table_of_one_process(atlas_root: dict[str, Any], tmp_path: Path) -> None:
    solo, ranks = tmp_path / "solo", tmp_path / "ranks"
    for root in (solo, ranks):
        shutil.copytree(atlas_root["root"], root)
    sae_id = atlas_root["sae_ids"][0]
    args = ["--sae", sae_id, "--prompts", "4", "--prompt-tokens", "8", "--chunk", "16", "--top-k", "4",
            "--device", "cpu", "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "sae_atlas", "steering-scores", str(solo), *args], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "-m", "sae_atlas", "steering-scores", str(ranks), *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    [report] = json.loads(two.stdout)  # printed once, by rank 0
    n_chunks = -(-atlas_root["d_sae"] // 16)
    assert report["chunks_computed"] == n_chunks and report["chunks_resumed"] == 0
    a, _ = read_steering(solo, sae_id)
    b, meta = read_steering(ranks, sae_id)
    assert b["latent"].to_list() == list(range(atlas_root["d_sae"])) and meta["rows"] == atlas_root["d_sae"]
    for column in ("output_score", "kl", "alpha", "lens_top_prob"):
        np.testing.assert_allclose(b[column].to_numpy(), a[column].to_numpy(), rtol=1e-5, atol=1e-7)
    assert b["promoted_ids"].to_list() == a["promoted_ids"].to_list()
