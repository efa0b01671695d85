"""Map the hook names other tools record to the TransformerLens 4 names the atlas uses.

Accepted spellings, each turned into a `blocks.L.hook_*` name:

- TransformerLens / SAELens names (`blocks.6.hook_resid_post`, `hook_embed`, ...), kept
  when the model has them; HookedTransformer's `blocks.L.hook_resid_pre` for L > 0 is
  also the previous block's `hook_resid_post`;
- Hugging Face module paths (`model.layers.6`, `layers.6`, `transformer.h.6`,
  `gpt_neox.layers.6`, with `.mlp` / `.self_attn` / `.attn` for the sublayer outputs):
  a decoder layer's output is the block's `hook_resid_post`;
- `hidden_states.N` (the N-th entry of a model's `output_hidden_states`): 0 is the
  embedding output (`blocks.0.hook_resid_pre`), N is block N-1's `hook_resid_post`. The
  last entry has the final norm applied in most HF models and has no TransformerLens hook.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sae_atlas.errors import UnknownHookError
from sae_atlas.store.hooks import BLOCK_HOOK

_HF_MODULE = re.compile(
    r"^(?:[\w.]*\.)?(?:layers|h|blocks)\.(\d+)"
    r"(?:\.(mlp|self_attn|attn|attention))?$"
)
_HIDDEN = re.compile(r"^hidden_states\.(\d+)$")
_RESID_SUBMODULE = re.compile(r"^resid_post_layer_(\d+)$")
_SUBLAYER_HOOK = {None: "hook_resid_post", "mlp": "hook_mlp_out", "self_attn": "hook_attn_out",
                  "attn": "hook_attn_out", "attention": "hook_attn_out"}


def hook_from_module(name: str | None) -> str:
    """TransformerLens hook for a Hugging Face module path ('model.layers.6' ->
    'blocks.6.hook_resid_post', 'layers.6.mlp' -> 'blocks.6.hook_mlp_out', sparsify's
    'resid_post_layer_6' likewise), else ''."""
    match = _RESID_SUBMODULE.match(name or "")
    if match:
        return f"blocks.{match.group(1)}.hook_resid_post"
    match = _HF_MODULE.match(name or "")
    return f"blocks.{match.group(1)}.{_SUBLAYER_HOOK[match.group(2)]}" if match else ""


def module_input_hook(name: str | None) -> str:
    """TransformerLens hook for the input of a Hugging Face module (what a transcoder on
    it reads): 'layers.6' -> 'blocks.6.hook_resid_pre', 'layers.6.mlp' -> 'blocks.6.mlp.hook_in';
    '' for other modules."""
    match = _HF_MODULE.match(name or "")
    if not match or match.group(2) not in (None, "mlp"):
        return ""
    return f"blocks.{match.group(1)}.{'mlp.hook_in' if match.group(2) else 'hook_resid_pre'}"


def _candidates(name: str) -> list[str]:
    """TransformerLens spellings `name` may stand for, most literal first."""
    name = name.strip()
    out = [name]
    match = BLOCK_HOOK.match(name)
    if match and match.group(2) == "hook_resid_pre" and int(match.group(1)) > 0:
        out.append(f"blocks.{int(match.group(1)) - 1}.hook_resid_post")
    if hook_from_module(name):
        out.append(hook_from_module(name))
    match = _HIDDEN.match(name)
    if match:
        index = int(match.group(1))
        out.append("blocks.0.hook_resid_pre" if index == 0 else f"blocks.{index - 1}.hook_resid_post")
    if name in ("hook_embed", "embed_tokens", "model.embed_tokens", "transformer.wte"):
        out += ["blocks.0.hook_resid_pre", "hook_embed"]
    return out


def to_atlas_hook(name: str, valid: Sequence[str], *, model_name: str = "the model") -> str:
    """The TransformerLens 4 hook in `valid` that `name` (a TransformerLens, SAELens,
    HookedTransformer or Hugging Face module / hidden-state name) denotes; UnknownHookError
    listing the valid hooks when no mapping fits."""
    for candidate in _candidates(name):
        if candidate in valid:
            return candidate
    from sae_atlas.saes.models import summarize_hook_names

    tried = ", ".join(dict.fromkeys(_candidates(name)))
    raise UnknownHookError(
        f"hook {name!r} has no counterpart in {model_name} (tried {tried}); valid hooks: "
        f"{summarize_hook_names(list(valid))}; pass the TransformerLens name with --hook"
    )
