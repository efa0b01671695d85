"""KV-cached steered generation on the real SmolLM2-135M (slow: loads the model): every
step's logits match a full forward pass of the whole sequence."""

from __future__ import annotations

import pytest
import torch

from sae_atlas.saes.intervene.decode import cached_decoding
from sae_atlas.saes.intervene.edits import SteerEdit, compile_edit, resolve_positions
from sae_atlas.saes.intervene.splice import Splice, run_spliced
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAEConfig

pytestmark = pytest.mark.slow

HOOK = "blocks.15.hook_resid_post"
N_NEW = 8


def test_cached_steered_generation_matches_full_forward():
    from sae_atlas.saes.models import load_model

    handle = load_model("smollm2-135m")
    prompt = handle.to_tokens("Monday, Tuesday, Wednesday, Thursday,")[0]
    cfg = SAEConfig(architecture="topk", d_in=handle.d_model, d_sae=1024, k=32, hook_name=HOOK, seed=0)
    sae = build_sae(cfg).eval()
    mask = resolve_positions("all", [], len(prompt), len(prompt) + N_NEW)
    steer = compile_edit(SteerEdit(sae="s", feature=0, alpha=8.0), mask, sae=sae, hook=HOOK)
    splice = Splice({"s": (HOOK, sae)}, [steer])
    with cached_decoding(handle, [prompt], splice) as decoder:
        steps = [decoder.prefill()[0]]
        for _ in range(N_NEW - 1):
            steps.append(decoder.step(steps[-1].argmax()[None])[0])
    new = torch.stack(steps).argmax(-1)
    seq = torch.cat([prompt, new])
    n = len(prompt)
    diffs = [float((steps[s] - run_spliced(handle, seq[: n + s], splice).logits_TV[-1]).abs().max())
             for s in range(N_NEW)]
    print(f"steered continuation {handle.tokenizer.decode(new.tolist())!r}; max |cached - full| {max(diffs):.2e}")
    assert max(diffs) <= 1e-4
    plain = run_spliced(handle, prompt, Splice(splice.saes)).logits_TV[-1]
    assert float((steps[0] - plain).abs().max()) > 1e-2  # the steer really acts
