"""Importing into an atlas: provenance, registration, the misload guard and --force.

The atlas (tests/fixtures/import_atlas.py) holds a BatchTopK SAE trained on its hook; the
tests write that SAE in foreign layouts, correctly and with the classic mistakes, and
import it back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from sae_atlas.errors import InvalidInputError, UnknownHookError
from sae_atlas.saes.formats.saelens import load_saelens
from sae_atlas.saes.importing.pipeline import MisloadError, import_sae
from sae_atlas.store.activations import ActivationReader
from sae_atlas.store.atomic import sha256_file
from sae_atlas.store.layout import AtlasLayout
from tests.fixtures.import_atlas import (
    D_SAE,
    HOOKS,
    TARGET,
    K,
    build_import_atlas,
    saelens_jumprelu_cfg,
    weights,
    write_dictionary_learning,
    write_gemma_scope,
    write_saelens,
)


@pytest.fixture(scope="module")
def atlas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return build_import_atlas(tmp_path_factory.mktemp("import") / "atlas")


@pytest.fixture(scope="module")
def w(atlas: dict[str, Any]) -> dict[str, torch.Tensor]:
    return weights(atlas["sae"])


def _import(atlas: dict[str, Any], source: Path, **kwargs: Any) -> Any:
    return import_sae(atlas["root"], source, model_handle=atlas["handle"], **kwargs)


def _gemma_dir(tmp_path: Path, name: str = "average_l0_4") -> Path:
    return tmp_path / "gemma-scope-tiny-res" / "layer_1" / f"width_{D_SAE}" / name


def _assert_untouched(atlas: dict[str, Any], before: dict[str, Any]) -> None:
    layout = AtlasLayout(atlas["root"])
    assert layout.read_meta()["saes"].keys() == before.keys()
    assert not any(p.name not in before for p in (layout.root / "saes").iterdir())


def test_gemma_scope_import_records_provenance_eval_and_registration(atlas, w, tmp_path: Path) -> None:
    source = write_gemma_scope(_gemma_dir(tmp_path), w)
    result = _import(atlas, source, sae_id="gemma-import")
    layout = AtlasLayout(atlas["root"])
    folder = layout.sae_dir("gemma-import")
    assert result.hook == TARGET and result.architecture == "jumprelu" and not result.suspect
    assert result.metrics["fvu"] < 1 and "ce_loss_score" in result.metrics
    # the stored SAE computes what the trained BatchTopK computes
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(load_saelens(folder)(x).x_hat, atlas["sae"](x).x_hat, atol=1e-4, rtol=1e-4)
    provenance = json.loads((folder / "source.json").read_text())
    assert provenance["format"] == "gemma_scope" and provenance["kind"] == "local"
    assert provenance["original_files"] == {"params.npz": sha256_file(source / "params.npz")}
    assert provenance["suspect"] is False and provenance["original_hook"] == TARGET
    record = json.loads((folder / "eval.json").read_text())
    assert record["metrics"]["l0"] == pytest.approx(result.metrics["l0"]) and record["suspect"] is False
    registered = layout.read_meta()["saes"]["gemma-import"]
    assert registered["source"]["format"] == "gemma_scope" and registered["suspect"] is False
    with pytest.raises(InvalidInputError, match="already exists"):
        _import(atlas, source, sae_id="gemma-import")


def test_saes_report_true_architecture_and_source(atlas, w, tmp_path: Path) -> None:
    from sae_atlas import Atlas

    if "gemma-import" not in AtlasLayout(atlas["root"]).sae_ids():
        _import(atlas, write_gemma_scope(_gemma_dir(tmp_path), w), sae_id="gemma-import")
    frame = Atlas(atlas["root"]).saes()
    rows = {r["sae_id"]: r for r in frame.to_dicts()}
    assert rows[atlas["sae_id"]]["architecture"] == "batchtopk"  # cfg.json says jumprelu
    assert rows[atlas["sae_id"]]["source"] == "trained"
    assert rows["gemma-import"]["architecture"] == "jumprelu"
    assert rows["gemma-import"]["source"].endswith("average_l0_4")


@pytest.mark.parametrize("kind", ["gemma_scope", "batchtopk"])
def test_stripped_threshold_is_refused(atlas, w, tmp_path: Path, kind: str) -> None:
    before = AtlasLayout(atlas["root"]).read_meta()["saes"]
    if kind == "gemma_scope":
        source = write_gemma_scope(_gemma_dir(tmp_path, "stripped"), w, threshold=False)
    else:  # dictionary_learning writes -1 until the threshold is set
        source = write_dictionary_learning(tmp_path / "dl", w, threshold=-1.0)
    with pytest.raises(MisloadError, match=r"threshold: L0 .* of d_sae 64") as info:
        _import(atlas, source)
    assert [p.cause for p in info.value.problems][0] == "threshold"
    _assert_untouched(atlas, before)


def test_batchtopk_with_its_threshold_is_accepted(atlas, w, tmp_path: Path) -> None:
    result = _import(atlas, write_dictionary_learning(tmp_path / "dl-ok", w, threshold=float(w["threshold"][0])),
                     sae_id="dl-batchtopk", with_model=False)
    assert result.architecture == "batchtopk" and not result.suspect
    assert result.metrics["l0"] < 3 * K


def test_wrong_hook_is_refused(atlas, w, tmp_path: Path) -> None:
    source = write_saelens(tmp_path / "sl", w | {"threshold": w["threshold"]}, saelens_jumprelu_cfg(32, D_SAE, TARGET))
    with pytest.raises(MisloadError, match="hook mismatch"):
        _import(atlas, source, hook="model.layers.0")
    forced = _import(atlas, source, hook="model.layers.0", sae_id="wrong-hook", force=True, with_model=False)
    assert forced.hook == "blocks.0.hook_resid_post" and [p.cause for p in forced.problems][0] == "hook"
    with pytest.raises(UnknownHookError, match="valid hooks"):
        _import(atlas, source, hook="blocks.9.hook_resid_post")


def test_wrong_normalisation_is_refused_and_named(atlas, w, tmp_path: Path) -> None:
    s = 16.0  # the file describes an SAE on inputs scaled by s, the config says 'none'
    scaled = {**w, "W_enc": w["W_enc"] / s, "W_dec": w["W_dec"] * s, "b_dec": w["b_dec"] * s}
    source = write_saelens(tmp_path / "norm", scaled, saelens_jumprelu_cfg(32, D_SAE, TARGET))
    with pytest.raises(MisloadError, match=r"normalisation: .*scaled by 16"):
        _import(atlas, source, with_model=False)
    # declared as expected_average_only_in, the factor is estimated from the hook's held-out
    # activations (sqrt(d_in) / mean ||x||) and folded in: the SAE works again
    reader = ActivationReader(atlas["root"], TARGET)
    rows = torch.cat([b.acts[~b.is_bos].float() for b in reader.blocks(split="heldout")])[:8192]
    s_est = 32**0.5 / float(rows.norm(dim=-1).mean())
    declared = write_saelens(tmp_path / "norm-declared", {**w, "W_enc": w["W_enc"] / s_est, "W_dec": w["W_dec"] * s_est,
                                                         "b_dec": w["b_dec"] * s_est},
                             saelens_jumprelu_cfg(32, D_SAE, TARGET, normalize_activations="expected_average_only_in"))
    result = _import(atlas, declared, sae_id="norm-declared", with_model=False)
    assert result.source["conversions"]["norm_scaling_factor"]["value"] == pytest.approx(s_est, rel=1e-5)
    x = rows[:64]
    torch.testing.assert_close(load_saelens(AtlasLayout(atlas["root"]).sae_dir("norm-declared"))(x).x_hat,
                               atlas["sae"](x).x_hat, atol=1e-4, rtol=1e-4)


def test_transposed_square_dictionary_is_refused(atlas, w, tmp_path: Path) -> None:
    acts_NF = torch.cat([atlas["sae"].encode(r.acts) for r in ActivationReader(atlas["root"], TARGET).rows()])
    keep = (acts_NF > 0).sum(0).argsort(descending=True)[:32]  # the 32 most used latents: a square dictionary
    c = 4.0  # code scaled by c, decoder by 1/c: the same SAE, with W_enc far from W_dec.T
    square = {"W_enc": c * w["W_enc"][:, keep], "b_enc": c * w["b_enc"][keep], "W_dec": w["W_dec"][keep] / c,
              "b_dec": w["b_dec"], "threshold": c * w["threshold"][keep]}
    cfg = saelens_jumprelu_cfg(32, 32, TARGET)
    good = _import(atlas, write_saelens(tmp_path / "sq", square, cfg), sae_id="square", with_model=False)
    assert good.metrics["fvu"] < 1
    swapped = {**square, "W_enc": square["W_dec"].T.contiguous(), "W_dec": square["W_enc"].T.contiguous()}
    with pytest.raises(MisloadError, match="transposed"):
        _import(atlas, write_saelens(tmp_path / "sq-t", swapped, cfg), with_model=False)


def test_force_keeps_a_refused_sae_marked_suspect(atlas, w, tmp_path: Path) -> None:
    from sae_atlas import Atlas

    source = write_gemma_scope(_gemma_dir(tmp_path, "forced"), w, threshold=False)
    result = _import(atlas, source, sae_id="forced", force=True, with_model=False)
    assert result.suspect and result.problems[0].cause == "threshold"
    folder = AtlasLayout(atlas["root"]).sae_dir("forced")
    assert json.loads((folder / "source.json").read_text())["suspect"] is True
    assert json.loads((folder / "eval.json").read_text())["problems"][0]["cause"] == "threshold"
    assert Atlas(atlas["root"]).sae_info("forced")["suspect"] is True


def test_link_shares_unconverted_saelens_weights(atlas, w, tmp_path: Path) -> None:
    source = write_saelens(tmp_path / "link", {k: w[k] for k in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")},
                           saelens_jumprelu_cfg(32, D_SAE, TARGET))
    with pytest.raises(InvalidInputError, match="--link"):  # log_threshold round trip changes nothing here,
        _import(atlas, write_gemma_scope(_gemma_dir(tmp_path, "nolink"), w), link=True, with_model=False)
    result = _import(atlas, source, sae_id="linked", link=True, with_model=False)
    weights_file = AtlasLayout(atlas["root"]).sae_dir("linked") / "sae_weights.safetensors"
    assert weights_file.is_symlink() and weights_file.resolve() == (source / "sae_weights.safetensors").resolve()
    assert result.source["linked"] is True
    load_saelens(weights_file.parent)  # the recorded sha256 is the linked file's


def test_not_cached_hook_is_evaluated_on_a_streamed_sample(atlas, w, tmp_path: Path) -> None:
    cfg = saelens_jumprelu_cfg(32, D_SAE, "blocks.1.hook_resid_mid")
    source = write_saelens(tmp_path / "mid", w, cfg)
    result = _import(atlas, source, sae_id="mid", force=True, n_tokens=512, ce_blocks=2)
    assert result.hook == "blocks.1.hook_resid_mid" and HOOKS[1] != result.hook
    record = json.loads((AtlasLayout(atlas["root"]).sae_dir("mid") / "eval.json").read_text())
    assert record["parameters"]["split"] == "streamed" and 0 < record["metrics"]["n_tokens"] <= 512
    assert "ce_loss_score" in record["metrics"]


def test_import_killed_before_registration_is_finished_by_rerunning(atlas, w, tmp_path: Path) -> None:
    source = write_gemma_scope(_gemma_dir(tmp_path, "killed"), w)
    first = _import(atlas, source, sae_id="killed", with_model=False)
    layout = AtlasLayout(atlas["root"])
    meta = layout.read_meta()
    meta["saes"].pop("killed")  # as if killed between the move into saes/ and atlas.json
    layout.write_meta(meta)
    again = _import(atlas, source, sae_id="killed", with_model=False)
    assert again.metrics == first.metrics and "killed" in layout.read_meta()["saes"]
    assert not (layout.root / ".import-staging").exists()
    other = write_gemma_scope(_gemma_dir(tmp_path, "other"), w)
    with pytest.raises(InvalidInputError, match="already exists"):
        _import(atlas, other, sae_id="killed", with_model=False)
