"""One capturing forward pass: it stops after the deepest hooked layer."""

import pytest

from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.models import tiny_model


@pytest.fixture(scope="module")
def handle():
    return tiny_model(n_layers=3, d_model=32, seed=7)


def test_forward_stops_after_deepest_hooked_layer(handle):
    fired = []
    last = handle.bridge.hook_dict["blocks.2.hook_resid_post"]
    last.add_hook(lambda t, hook: fired.append(hook.name))
    try:
        run_hooks(handle, handle.to_tokens("the cat"), ["blocks.0.hook_resid_post"])
        assert fired == []
        run_hooks(handle, handle.to_tokens("the cat"), ["blocks.2.hook_resid_post"])
        assert fired
    finally:
        handle.bridge.reset_hooks()
