"""Forward-hook builders: capture leaves the activation alone, replace keeps its dtype."""

import torch

from saes.hook_fns import capture_hook, capture_hooks, replace_hook


def test_capture_passes_the_activation_on_and_stores_it_detached():
    act = torch.randn(2, 3, 4, requires_grad=True)
    seen = []
    assert capture_hook(seen.append)(act, None) is act and seen[0] is act
    store = {}
    [(name, fn)] = capture_hooks(["blocks.0.hook_resid_post"], store)
    assert fn(act, None) is act
    assert name == "blocks.0.hook_resid_post" and not store[name].requires_grad
    assert torch.equal(store[name], act.detach())


def test_replace_returns_the_new_activation_in_the_old_dtype():
    act = torch.ones(2, 3, dtype=torch.bfloat16)
    out = replace_hook(lambda a: a.float() * 3)(act, None)
    assert out.dtype == torch.bfloat16 and torch.equal(out, torch.full((2, 3), 3.0, dtype=torch.bfloat16))
