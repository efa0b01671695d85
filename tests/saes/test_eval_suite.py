"""The eval suite on a planted atlas: SAEBench layout, checksums, resume, failures, refusals,
the mdl / meta / ground_truth evals, the CLI and the board."""

import json

import numpy as np
import pytest
import torch
import typer
from safetensors.torch import save_file
from typer.testing import CliRunner

from sae_atlas.errors import IntegrityError, InvalidInputError
from sae_atlas.saes.eval import suite as suite_module
from sae_atlas.saes.eval.core import CoreConfig
from sae_atlas.saes.eval.ground_truth import ground_truth_config
from sae_atlas.saes.eval.mdl import MdlConfig
from sae_atlas.saes.eval.meta import MetaConfig
from sae_atlas.saes.eval.results import SAEBENCH_KEYS, read_result, result_paths
from sae_atlas.saes.eval.spec import EVAL_NAMES
from sae_atlas.saes.eval.suite import EVALS, parse_suite, run_suite
from sae_atlas.saes.formats import save_saelens
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.layout import AtlasLayout
from tests.saes.planted import one_thread, planted_atoms, write_planted_atlas  # noqa: F401

HOOK = "blocks.0.hook_resid_post"
D_IN, N_ATOMS = 32, 96


def no_model():
    raise InvalidInputError("these tests run no model")


def planted_sae(atoms: torch.Tensor, offset: float = 2.0) -> torch.nn.Module:
    """A TopK SAE whose decoder rows are the planted atoms (it reads them off exactly)."""
    sae = build_sae(SAEConfig("topk", d_in=D_IN, d_sae=N_ATOMS, k=3, hook_name=HOOK))
    with torch.no_grad():
        sae.W_dec.copy_(atoms)
        sae.W_enc.copy_(atoms.T)
        sae.b_enc.zero_()
        sae.b_dec.fill_(offset / D_IN**0.5)
    return sae


@pytest.fixture
def atlas(tmp_path):
    root = tmp_path / "atlas"
    write_planted_atlas(root, [HOOK], d_in=D_IN, n_atoms=N_ATOMS, n_blocks=24, context=32)
    atoms = planted_atoms(D_IN, N_ATOMS, seed=0)
    save_saelens(planted_sae(atoms), AtlasLayout(root).sae_dir("planted"))
    save_saelens(build_sae(SAEConfig("topk", d_in=D_IN, d_sae=N_ATOMS, k=3, hook_name=HOOK, seed=5)),
                 AtlasLayout(root).sae_dir("random"))
    (root / "atlas.json").write_text(json.dumps({"model": "planted"}))  # what `cache` writes first
    truth = tmp_path / "truth.safetensors"
    save_file({"W_dec": atoms.contiguous()}, str(truth))
    return root, truth


def configs(truth):
    return {"core": CoreConfig(n_tokens=256, with_model=False), "mdl": MdlConfig(n_tokens=256),
            "meta": MetaConfig(train_steps=30, train_batch_size=64), "ground_truth": ground_truth_config(truth)}


SUITE = ["core", "mdl", "meta", "ground_truth"]


def run(root, truth, names=SUITE, **kw):
    return run_suite(root, ["planted", "random"], names, configs(truth), device="cpu", model=no_model,
                     progress=False, **kw)


def test_results_follow_saebench_layout_with_checksummed_sidecars(atlas):
    root, truth = atlas
    done = run(root, truth)
    assert not done.failures, done.failures
    for sae_id in ("planted", "random"):
        for name in SUITE:
            path, sidecar = result_paths(root, sae_id, name)
            output = json.loads(path.read_text())
            assert list(output) == list(SAEBENCH_KEYS)
            assert output["eval_type_id"] == EVALS[name].eval_type_id
            assert isinstance(output["eval_id"], str) and isinstance(output["datetime_epoch_millis"], int)
            assert isinstance(output["eval_config"], dict) and isinstance(output["eval_result_details"], list)
            assert output["sae_bench_commit_hash"] is None and output["sae_lens_id"] is None
            assert output["sae_lens_release_id"] is None and output["sae_lens_version"] is None
            assert output["sae_cfg_dict"]["d_sae"] == N_ATOMS and "sae_atlas" not in output["sae_cfg_dict"]
            for category in output["eval_result_metrics"].values():
                assert all(not isinstance(v, (dict, list)) for v in category.values())
            meta = json.loads(sidecar.read_text())
            assert len(meta["sha256"]) == 64 and len(meta["weights_sha256"]) == 64
            assert read_result(root, sae_id, name) == output
    core = read_result(root, "planted", "core")["eval_result_metrics"]
    assert set(core) == {"model_behavior_preservation", "model_performance_preservation", "reconstruction_quality",
                         "shrinkage", "sparsity", "token_stats", "misc_metrics"}
    assert 0.5 < core["reconstruction_quality"]["explained_variance"] <= 1.0
    assert core["model_performance_preservation"]["ce_loss_score"] is None
    assert (AtlasLayout(root).sae_dir("planted") / "eval.json").exists()


def test_ground_truth_mcc_is_one_for_the_planted_dictionary_and_near_chance_for_a_random_one(atlas):
    root, truth = atlas
    run(root, truth, ["ground_truth"])
    planted = read_result(root, "planted", "ground_truth")["eval_result_metrics"]["ground_truth"]
    random = read_result(root, "random", "ground_truth")["eval_result_metrics"]["ground_truth"]
    assert planted["mcc"] == pytest.approx(1.0, abs=1e-5) and planted["frac_recovered"] == 1.0
    assert random["mcc"] < 0.5 and random["frac_recovered"] == 0.0
    assert random["mcc"] == pytest.approx(random["mcc_chance"], abs=0.1)


def test_mdl_description_length_at_the_saes_own_error(atlas):
    root, truth = atlas
    run(root, truth, ["mdl"])
    output = read_result(root, "planted", "mdl")
    mdl = output["eval_result_metrics"]["mdl"]
    assert mdl["within_threshold"] and mdl["fvu_quantized"] - mdl["fvu"] <= 0.01
    assert mdl["description_length"] == pytest.approx(mdl["bits_firing"] + mdl["bits_values"])
    assert mdl["l0"] == pytest.approx(3.0)
    # firing alone: 96 latents each firing on ~3/96 of tokens
    p = 3 / 96
    assert mdl["bits_firing"] == pytest.approx(96 * -(p * np.log2(p) + (1 - p) * np.log2(1 - p)), rel=0.15)
    bits = [row["description_length"] for row in output["eval_result_details"]]
    assert bits == sorted(bits) and len(bits) == len(MdlConfig().bin_counts)


def test_meta_sae_explains_a_decoder_built_from_few_parts_better_than_random_rows(atlas, tmp_path):
    root, truth = atlas
    parts = planted_atoms(D_IN, 6, seed=9)
    gen = torch.Generator().manual_seed(0)
    composed = torch.zeros(N_ATOMS, D_IN)
    for row in range(N_ATOMS):
        composed[row] = parts[torch.randperm(6, generator=gen)[:2]].sum(0)
    composed = composed / composed.norm(dim=-1, keepdim=True)
    save_saelens(planted_sae(composed), AtlasLayout(root).sae_dir("composed"))
    meta_cfg = {"meta": MetaConfig(width_ratio=0.1, k=2, train_steps=300, train_batch_size=64)}
    done = run_suite(root, ["composed", "random"], ["meta"], meta_cfg, device="cpu", model=no_model, progress=False)
    assert not done.failures, done.failures
    scores = {s: read_result(root, s, "meta")["eval_result_metrics"]["meta_structure"] for s in ("composed", "random")}
    assert scores["composed"]["decoder_fraction_variance_explained"] > 0.7
    assert (scores["composed"]["decoder_fraction_variance_explained"]
            > scores["random"]["decoder_fraction_variance_explained"] + 0.2)


def test_an_interrupted_suite_resumes_keeping_finished_results(atlas, monkeypatch):
    root, truth = atlas
    real = EVALS["mdl"]

    def killed(inputs, config):
        raise KeyboardInterrupt

    monkeypatch.setitem(EVALS, "mdl", real.__class__(real.name, real.eval_type_id, real.config_type, killed))
    with pytest.raises(KeyboardInterrupt):
        run(root, truth, ["core", "ground_truth", "mdl"])
    finished = {name: read_result(root, "planted", name)["eval_id"] for name in ("core", "ground_truth")}
    assert not result_paths(root, "planted", "mdl")[0].exists()
    monkeypatch.setitem(EVALS, "mdl", real)
    resumed = run(root, truth, ["core", "ground_truth", "mdl"])
    assert ("planted", "core") in resumed.kept and ("planted", "ground_truth") in resumed.kept
    assert ("planted", "mdl") not in resumed.kept and ("random", "core") not in resumed.kept
    assert {name: read_result(root, "planted", name)["eval_id"] for name in finished} == finished
    changed = {**configs(truth), "mdl": MdlConfig(n_tokens=128)}
    again = run_suite(root, ["planted"], ["mdl"], changed, device="cpu", model=no_model, progress=False)
    assert ("planted", "mdl") not in again.kept  # another config is another result


def test_a_result_killed_between_its_two_writes_is_not_finished(atlas):
    root, truth = atlas
    run(root, truth, ["ground_truth"])
    path, sidecar = result_paths(root, "planted", "ground_truth")
    first = json.loads(path.read_text())["eval_id"]
    sidecar.unlink()  # killed after the result, before its sidecar
    with pytest.raises(IntegrityError, match="ground_truth.json: has no sidecar ground_truth.sha256.json"):
        read_result(root, "planted", "ground_truth")
    redone = run(root, truth, ["ground_truth"])
    assert ("planted", "ground_truth") not in redone.kept
    assert read_result(root, "planted", "ground_truth")["eval_id"] != first


def test_a_failed_eval_never_overwrites_a_good_result(atlas, monkeypatch):
    root, truth = atlas
    run(root, truth, ["ground_truth"])
    path, sidecar = result_paths(root, "planted", "ground_truth")
    before = path.read_bytes(), sidecar.read_bytes()
    real = EVALS["ground_truth"]

    def broken(inputs, config):
        raise RuntimeError("boom")

    monkeypatch.setitem(EVALS, "ground_truth", real.__class__(real.name, real.eval_type_id, real.config_type, broken))
    done = run(root, truth, ["ground_truth", "mdl"], force=True)
    assert done.failures[("planted", "ground_truth")] == "RuntimeError: boom"
    assert (path.read_bytes(), sidecar.read_bytes()) == before
    assert "mdl" in done.results["planted"]  # the other evals still ran


def test_damaged_or_stale_results_are_refused_by_name_and_recomputed(atlas):
    root, truth = atlas
    run(root, truth, ["ground_truth"])
    path, _ = result_paths(root, "planted", "ground_truth")
    path.write_text(path.read_text().replace('"mcc"', '"MCC"'))
    with pytest.raises(IntegrityError, match="ground_truth.json.*sha256 does not match"):
        read_result(root, "planted", "ground_truth")
    redone = run(root, truth, ["ground_truth"])
    assert ("planted", "ground_truth") not in redone.kept
    save_saelens(build_sae(SAEConfig("topk", d_in=D_IN, d_sae=N_ATOMS, k=3, hook_name=HOOK, seed=8)),
                 AtlasLayout(root).sae_dir("planted"))  # re-trained: the result is stale
    with pytest.raises(IntegrityError, match="stale"):
        read_result(root, "planted", "ground_truth")


def test_refusals_name_the_problem_and_the_valid_choices(atlas):
    root, truth = atlas
    with pytest.raises(InvalidInputError, match="unknown eval 'nope'.*valid: core, sparse_probing, meta, mdl, "
                                                "ground_truth"):
        parse_suite("core,nope")
    assert parse_suite("mdl, core,mdl") == ["mdl", "core"]
    with pytest.raises(InvalidInputError, match="does not exist"):
        ground_truth_config(root / "missing.safetensors")
    bad = root / "bad.safetensors"
    save_file({"atoms": torch.zeros(2, D_IN)}, str(bad))
    done = run_suite(root, ["planted"], ["ground_truth"], {"ground_truth": ground_truth_config(bad)}, device="cpu",
                     model=no_model, progress=False)
    assert "no 'W_dec' tensor" in done.failures[("planted", "ground_truth")]
    assert set(suite_module.EVALS) == set(EVAL_NAMES)  # every registered eval is runnable


def test_cli_suite_runs_resumes_and_refuses(atlas):
    root, truth = atlas
    from sae_atlas.api.commands import eval as eval_command

    app = typer.Typer()
    eval_command.register(app)
    app.command("noop")(lambda: None)
    runner = CliRunner()
    args = ["eval", str(root), "--sae", "planted", "--no-model", "--tokens", "128"]
    result = runner.invoke(app, [*args, "--suite", "core,ground_truth", "--ground-truth", str(truth), "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert printed["planted"]["ground_truth"]["eval_result_metrics"]["ground_truth"]["mcc"] == pytest.approx(1.0)
    core_only = runner.invoke(app, [*args, "--json"])
    assert core_only.exit_code == 0 and "metrics" in json.loads(core_only.output)["planted"]
    table = runner.invoke(app, [*args, "--suite", "ground_truth", "--ground-truth", str(truth)])
    assert table.exit_code == 0 and "ground_truth" in table.output and "mcc" in table.output
    unknown = runner.invoke(app, [*args, "--suite", "core,nope"])
    assert unknown.exit_code == 2 and "valid: core, sparse_probing, meta, mdl, ground_truth" in unknown.output
    missing = runner.invoke(app, [*args, "--suite", "ground_truth"])
    assert missing.exit_code == 2 and "--ground-truth" in missing.output
    needs_model = runner.invoke(app, [*args, "--suite", "sparse_probing"])
    assert needs_model.exit_code == 2 and "drop --no-model" in needs_model.output
    no_such_set = runner.invoke(app, [*args[:-3], "--suite", "sparse_probing", "--probe-set", "ag_news"])
    assert no_such_set.exit_code == 2 and "unknown probe set 'ag_news'" in no_such_set.output
    assert "fancyzhx/ag_news" in no_such_set.output


def test_torchrun_ranks_take_the_jobs_in_turn():
    from sae_atlas.saes.distributed import DistContext
    from sae_atlas.saes.eval.suite import rank_jobs

    ids, names = ["a", "b"], ["core", "mdl", "meta"]
    shares = [rank_jobs(ids, names, DistContext(rank, 2, rank)) for rank in range(2)]
    assert shares[0] == [("a", "core"), ("a", "meta"), ("b", "mdl")]
    assert shares[1] == [("a", "mdl"), ("b", "core"), ("b", "meta")]
    assert rank_jobs(ids, names, None) == [(i, n) for i in ids for n in names]
