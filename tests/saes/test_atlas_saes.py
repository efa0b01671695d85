"""Loading an atlas SAE by id: one path, the project's errors, the recorded checksums."""

import json

import pytest
import torch

from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.saes.atlas_saes import atlas_sae_hook, hook_of, load_atlas_sae
from sae_atlas.saes.formats import save_saelens
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig
from sae_atlas.store.layout import AtlasLayout


def _saved(root, sae_id="s", hook="blocks.0.hook_resid_post"):
    cfg = SAEConfig(architecture="topk", d_in=8, d_sae=16, k=2, hook_name=hook)
    sae = build_sae(cfg)
    save_saelens(sae, AtlasLayout(root).sae_dir(sae_id))
    return sae


def test_loads_in_eval_mode_with_the_saved_weights_and_hook(tmp_path):
    saved = _saved(tmp_path)
    sae = load_atlas_sae(tmp_path, "s")
    assert not sae.training and sae.cfg.architecture == "topk"
    assert torch.equal(sae.W_dec, saved.W_dec)
    assert atlas_sae_hook(tmp_path, "s") == hook_of(sae, "s") == "blocks.0.hook_resid_post"


def test_unknown_id_lists_the_valid_ones(tmp_path):
    _saved(tmp_path)
    with pytest.raises(NotFoundError, match=r"unknown SAE id 'x'; valid: s"):
        load_atlas_sae(tmp_path, "x")
    with pytest.raises(NotFoundError, match="unknown SAE id 'x'"):
        atlas_sae_hook(tmp_path, "x")


def test_changed_weights_fail_the_recorded_sha256(tmp_path):
    _saved(tmp_path)
    weights = AtlasLayout(tmp_path).sae_dir("s") / "sae_weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="sha256 does not match"):
        load_atlas_sae(tmp_path, "s")


def test_missing_hook_is_a_clear_error(tmp_path):
    _saved(tmp_path, hook="")
    with pytest.raises(InvalidInputError, match="names no hook"):
        atlas_sae_hook(tmp_path, "s")
    with pytest.raises(InvalidInputError, match="records no hook name"):
        hook_of(load_atlas_sae(tmp_path, "s"), "s")
    cfg = AtlasLayout(tmp_path).sae_dir("s") / "cfg.json"
    assert "hook_name" in json.loads(cfg.read_text())["metadata"]
