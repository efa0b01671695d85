"""Importing circuit-tracer cross-layer transcoders: the folders circuit-tracer wrote
(tests/fixtures/make_clt_written.py) load to the codes and outputs circuit-tracer computed
and to a direct numpy evaluation of its formula; damaged folders are refused by name; an
exact CLT of a tiny ReLU model passes the misload guard and is registered, a CLT for another
model or writing the wrong hook is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.numpy import load_file as load_numpy
from safetensors.torch import load_file, save_file

from sae_atlas.errors import IntegrityError, InvalidInputError
from sae_atlas.saes.cache import cache_activations
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.importing.clt import import_clt, judge
from sae_atlas.saes.importing.pipeline import MisloadError, import_sae
from sae_atlas.saes.models import tiny_model
from sae_atlas.saes.transcoders.circuit_tracer_clt import load_circuit_tracer_clt
from sae_atlas.saes.transcoders.clt_store import load_atlas_clt
from sae_atlas.store.layout import AtlasLayout
from tests.saes.planted import one_thread  # noqa: F401

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "clt_written"


def numpy_clt(folder: Path, x_BLD: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """circuit-tracer's CLT evaluated from its files: f_l = act(x_l W_enc_l^T + b_enc_l),
    out_l' = sum_{l <= l'} f_l W_dec_l[:, l' - l] + b_dec_l'."""
    L = x_BLD.shape[1]
    enc = [load_numpy(str(folder / f"W_enc_{i}.safetensors")) for i in range(L)]
    dec = [load_numpy(str(folder / f"W_dec_{i}.safetensors"))[f"W_dec_{i}"] for i in range(L)]
    x = x_BLD.astype(np.float64)
    f = []
    for i in range(L):
        pre = x[:, i] @ enc[i][f"W_enc_{i}"].T.astype(np.float64) + enc[i][f"b_enc_{i}"]
        th = enc[i].get(f"threshold_{i}")
        f.append(pre * (pre > th) if th is not None else np.maximum(pre, 0))
    out = np.stack([sum(f[i] @ dec[i][:, j - i] for i in range(j + 1)) + enc[j][f"b_dec_{j}"] for j in range(L)], 1)
    return np.stack(f, 1), out


@pytest.mark.parametrize("name", ["jumprelu", "relu"])
def test_circuit_tracer_written_clts_match_circuit_tracer_and_its_formula(name):
    io = load_file(str(HERE / "io.safetensors"))
    clt = load_circuit_tracer_clt(HERE / name)
    assert (clt.cfg.n_layers, clt.cfg.d_model, clt.cfg.d_sae) == (3, 8, 12)
    assert clt.cfg.hooks_in[2] == "blocks.2.hook_resid_mid" and clt.cfg.hooks_out[0] == "blocks.0.hook_mlp_out"
    with torch.no_grad():
        out = clt(io["x"])
    f_np, out_np = numpy_clt(HERE / name, io["x"].numpy())
    assert (f_np != 0).any() and (f_np == 0).any()
    torch.testing.assert_close(out.feature_acts, io[f"{name}.f"], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.x_hat, io[f"{name}.out"], atol=1e-6, rtol=1e-6)
    assert np.allclose(out.feature_acts.double().numpy(), f_np, atol=1e-6, rtol=1e-6)
    assert np.allclose(out.x_hat.double().numpy(), out_np, atol=1e-6, rtol=1e-6)


def _damaged(tmp_path: Path, edit) -> Path:
    folder = tmp_path / "clt"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(HERE / "jumprelu", folder)
    edit(folder)
    return folder


def _rewrite(folder: Path, file: str, change) -> None:
    tensors = load_file(str(folder / file))
    change(tensors)
    save_file(tensors, folder / file)


def test_damaged_folders_are_refused_by_name(tmp_path):
    cases = [
        (lambda f: (f / "W_dec_1.safetensors").unlink(), IntegrityError, r"W_dec_1\.safetensors.*missing"),
        (lambda f: (f / "W_enc_1.safetensors").unlink(), IntegrityError, r"W_enc_1\.safetensors.*missing"),
        (lambda f: _rewrite(f, "W_dec_0.safetensors", lambda t: t.update(W_dec_0=t["W_dec_0"][:, :2].contiguous())),
         IntegrityError, "W_dec_0"),
        (lambda f: _rewrite(f, "W_enc_2.safetensors", lambda t: t.update(W_enc_2=t["W_enc_2"].T.contiguous())),
         IntegrityError, "W_enc_2"),
        (lambda f: _rewrite(f, "W_enc_0.safetensors", lambda t: t.update(W_skip_0=torch.zeros(8, 8))),
         InvalidInputError, r"unsupported tensors \['W_skip_0'\]"),
        (lambda f: _rewrite(f, "W_enc_1.safetensors", lambda t: t.update(threshold_1=-t["threshold_1"])),
         InvalidInputError, "negative JumpReLU thresholds"),
    ]
    gemma_scope_2 = {"model_kind": "cross_layer_transcoder", "transcoders": ["hf://google/x/layer_0.safetensors"]}
    cases.append((lambda f: (f / "config.yaml").write_text(yaml.safe_dump(gemma_scope_2)), InvalidInputError,
                  "Gemma Scope 2"))
    for edit, error, match in cases:
        with pytest.raises(error, match=match):
            load_circuit_tracer_clt(_damaged(tmp_path, edit))


def _exact_clt(folder: Path, handle, n_layers: int | None = None, output_hook: str = "hook_mlp_out") -> Path:
    """A circuit-tracer CLT whose diagonal decoders are the tiny ReLU model's own MLPs."""
    folder.mkdir(parents=True)
    L = n_layers or handle.n_layers
    for i in range(L):
        mlp = handle.bridge.blocks[min(i, handle.n_layers - 1)].mlp
        dec = torch.zeros(mlp.W_out.shape[0], L - i, handle.d_model)
        dec[:, 0] = mlp.W_out.detach()
        save_file({f"W_enc_{i}": mlp.W_in.detach().T.contiguous(), f"b_enc_{i}": mlp.b_in.detach().clone(),
                   f"b_dec_{i}": mlp.b_out.detach().clone()}, folder / f"W_enc_{i}.safetensors")
        save_file({f"W_dec_{i}": dec}, folder / f"W_dec_{i}.safetensors")
    (folder / "config.yaml").write_text(yaml.safe_dump({
        "model_kind": "cross_layer_transcoder", "model_name": "tiny", "feature_input_hook": "mlp.hook_in",
        "feature_output_hook": output_hook}))
    return folder


def test_import_through_the_guard(tmp_path):
    handle = tiny_model(arch="gpt2", n_layers=2, d_model=16, d_mlp=32, act_fn="relu", seed=3)
    root = tmp_path / "atlas"
    cache_activations(handle, root, ["blocks.1.hook_mlp_out"], corpus=CorpusSpec(context_size=16), n_tokens=16 * 20,
                      progress=False)
    result = import_clt(root, _exact_clt(tmp_path / "exact", handle), model_handle=handle, n_tokens=256)
    _exact_clt(tmp_path / "other-source", handle)
    assert not result.suspect and result.metrics["fvu"] < 1e-6 and result.metrics["l0"] > 0
    assert result.metrics["ce_loss_score"] == pytest.approx(1.0, abs=1e-4)  # every MLP replaced by the CLT
    record = AtlasLayout(root).read_meta()["clts"][result.clt_id]
    assert record["hooks_in"] == ["blocks.0.mlp.hook_in", "blocks.1.mlp.hook_in"] and record["n_layers"] == 2
    assert (AtlasLayout(root).clt_dir(result.clt_id) / "source.json").is_file()
    assert load_atlas_clt(root, result.clt_id).cfg.d_sae == 32
    with pytest.raises(InvalidInputError, match="already exists"):
        import_clt(root, tmp_path / "other-source", model_handle=handle, clt_id=result.clt_id)
    # killed after the folder was moved into place, before atlas.json recorded it: the same import finishes
    layout = AtlasLayout(root)
    layout.update_meta(clts={})
    again = import_clt(root, tmp_path / "exact", model_handle=handle, clt_id=result.clt_id)
    assert again.metrics == result.metrics and result.clt_id in layout.read_meta()["clts"]
    with pytest.raises(InvalidInputError, match="is a cross-layer transcoder"):
        import_sae(root, tmp_path / "exact", model_handle=handle)
    with pytest.raises(InvalidInputError, match="has 3 layers but model"):
        import_clt(root, _exact_clt(tmp_path / "deep", handle, n_layers=3), model_handle=handle)
    wrong = _exact_clt(tmp_path / "wrong", handle, output_hook="hook_attn_out")
    with pytest.raises(MisloadError, match="fvu"):
        import_clt(root, wrong, model_handle=handle, n_tokens=256)
    assert sorted(AtlasLayout(root).clt_ids()) == [result.clt_id]
    kept = import_clt(root, wrong, model_handle=handle, n_tokens=256, force=True, clt_id="kept")
    assert kept.suspect and AtlasLayout(root).read_meta()["clts"]["kept"]["suspect"]


def test_cli_import_detects_a_clt_folder(tmp_path):
    from typer.testing import CliRunner

    from sae_atlas.api.cli import app

    handle = tiny_model(arch="gpt2", n_layers=2, d_model=16, d_mlp=32, act_fn="relu", seed=3)
    root = tmp_path / "atlas"
    cache_activations(handle, root, ["blocks.1.hook_mlp_out"], corpus=CorpusSpec(context_size=16), n_tokens=16 * 20,
                      progress=False)
    folder = _exact_clt(tmp_path / "exact", handle)
    res = CliRunner().invoke(app, ["import", str(root), str(folder), "--id", "via-cli", "--json"])
    assert res.exit_code == 0, res.output
    body = json.loads(res.output)
    assert body["clt_id"] == "via-cli" and body["metrics"]["fvu"] < 1e-6 and not body["suspect"]
    res = CliRunner().invoke(app, ["import", str(root), str(folder), "--id", "via-cli"])
    assert res.exit_code != 0 and "already exists" in res.output


def test_guard_rules():
    jump, relu = load_circuit_tracer_clt(HERE / "jumprelu"), load_circuit_tracer_clt(HERE / "relu")
    metrics = {"fvu": 0.1, "fvu_per_layer": [0.1] * 3, "l0": 30.0, "l0_per_layer": [10.0] * 3, "dead_fraction": 0.0,
               "n_tokens": 10}
    assert [p.cause for p in judge(jump, metrics)] == ["threshold"]  # 10 of 12 features fire: thresholds lost
    assert judge(relu, metrics) == []  # a ReLU CLT is dense by design
    bad = {**metrics, "fvu": 1.5, "fvu_per_layer": [1.5] * 3, "l0_per_layer": [0.0] * 3, "dead_fraction": 1.0}
    assert [p.cause for p in judge(jump, bad)] == ["fvu", "dead"]
