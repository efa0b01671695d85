"""Forward-hook builders: capture leaves the activation alone, replace keeps its dtype."""

import torch

from sae_atlas.saes.hook_fns import capture_hook, capture_hooks, replace_hook


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


def test_an_edit_of_resid_mid_reaches_the_residual_stream_as_at_attn_out():
    """TransformerBridge fires hook_resid_mid as the MLP norm's input; `in_residual` adds
    the change to the block output too, so the edit equals one made at hook_attn_out
    (resid_mid = resid_pre + attn_out), and without the carry it would not."""
    from sae_atlas.saes.hook_fns import in_residual, residual_carry
    from sae_atlas.saes.models import tiny_model

    handle = tiny_model(n_layers=3, seed=1)
    bridge = handle.bridge
    assert residual_carry(bridge.hook_dict, "blocks.1.hook_resid_mid") == "blocks.1.hook_resid_post"
    assert residual_carry(bridge.hook_dict, "blocks.1.hook_resid_post") is None
    assert residual_carry(bridge.hook_dict, "blocks.1.ln2.hook_in") is None  # named as the norm input: MLP only
    tokens = handle.to_tokens("the cat sat on the mat")
    v = torch.randn(handle.d_model, generator=torch.Generator().manual_seed(0))

    def shift(act, hook=None):
        return act + v

    with torch.inference_mode():
        at_attn_out = bridge.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_attn_out", shift)])
        carried = bridge.run_with_hooks(tokens, fwd_hooks=in_residual(bridge, [("blocks.1.hook_resid_mid", shift)]))
        mlp_only = bridge.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_mid", shift)])
    assert torch.allclose(carried, at_attn_out, atol=1e-4)
    assert float((mlp_only - at_attn_out).abs().max()) > 1e-2


def test_a_spliced_sae_at_resid_mid_steers_the_residual_stream():
    from sae_atlas.saes.intervene.edits import SteerEdit, compile_edit, resolve_positions
    from sae_atlas.saes.intervene.splice import Splice, run_spliced
    from sae_atlas.saes.models import tiny_model
    from sae_atlas.saes.sae.architectures import build_sae
    from sae_atlas.saes.sae.base import SAEConfig

    handle = tiny_model(n_layers=3, seed=1)
    tokens = handle.to_tokens("the cat sat on the mat")[0]
    hook = "blocks.1.hook_resid_mid"
    sae = build_sae(SAEConfig("topk", d_in=handle.d_model, d_sae=16, k=4, hook_name=hook, seed=2)).eval()
    with torch.inference_mode():
        clean = handle.bridge(tokens[None])[0]
    plain = run_spliced(handle, tokens, Splice({"s": (hook, sae)}))
    assert torch.allclose(plain.logits_TV, clean.float(), atol=1e-4)  # error term kept: nothing changes
    every = resolve_positions("all", [], len(tokens), len(tokens))
    edit = compile_edit(SteerEdit(sae="s", feature=3, alpha=4.0, at="all"), every, sae=sae, hook=hook)
    steered = run_spliced(handle, tokens, Splice({"s": (hook, sae)}, [edit])).logits_TV
    direction = 4.0 * sae.W_dec[3].detach()

    def add(act, hook=None):
        return act + direction

    with torch.inference_mode():
        want = handle.bridge.run_with_hooks(tokens[None], fwd_hooks=[("blocks.1.hook_attn_out", add)])[0]
    assert torch.allclose(steered, want.float(), atol=1e-4)
