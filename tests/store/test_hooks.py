"""Hook-name helpers: the block of a hook and the hook an SAE cfg.json names."""

from sae_atlas.store.hooks import cfg_hook_name, hook_layer


def test_block_number_of_a_hook_name():
    assert hook_layer("blocks.11.hook_resid_post") == 11
    assert hook_layer("blocks.0.attn.hook_z") == 0
    assert hook_layer("hook_embed") == hook_layer("") == -1
    assert hook_layer("ln_final.blocks.3.x") == -1  # only a leading block counts


def test_cfg_hook_name_prefers_metadata():
    assert cfg_hook_name({"metadata": {"hook_name": "blocks.1.hook_resid_post"}, "hook_name": "x"}) == \
        "blocks.1.hook_resid_post"
    assert cfg_hook_name({"hook_name": "blocks.2.hook_resid_pre"}) == "blocks.2.hook_resid_pre"
    assert cfg_hook_name({"metadata": None}) == ""
