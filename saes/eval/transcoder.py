"""Transcoders spliced into the model: every MLP that has a transcoder replaced by it.

A transcoder reads `cfg.hook_name` (the MLP's input) and writes `cfg.hook_name_out` (the
MLP's output). In one forward pass a capture hook keeps the input and the output hook is
replaced by the transcoder's prediction from it, so with several transcoders a later
layer's transcoder reads the stream the earlier replacements produced (the replacement
model of Dunefsky et al. 2024 and Ameisen et al. 2025, "Circuit Tracing"). The baseline
replaces the same outputs by zeros (SAEBench's ablation) or by their mean over cached
tokens. BOS (and separator) positions keep the model's own output in every patched run,
and the CE / KL averages leave them out, as `saes.eval.downstream` does for SAEs;
`ce_loss_score` = (CE_ablated - CE_transcoders) / (CE_ablated - CE_clean).

A cross-layer transcoder (`saes.transcoders.clt`) replaces every MLP at once the same way:
at each layer's input hook its features are encoded from the live (already patched) stream,
and each MLP output becomes what the features of that layer and every earlier one write there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal, get_args

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.eval.downstream import DownstreamStats
from sae_atlas.saes.hook_fns import HookFn, capture_hook, replace_hook
from sae_atlas.saes.sae.base import SAE
from sae_atlas.saes.transcoders.clt import CrossLayerTranscoder

Ablation = Literal["zero", "mean"]
ABLATIONS: tuple[Ablation, ...] = get_args(Ablation)


def check_transcoders(transcoders: Sequence[SAE]) -> None:
    """InvalidInputError unless these are transcoders writing distinct hooks."""
    if not transcoders:
        raise InvalidInputError("no transcoders given")
    plain = [sae.cfg.hook_name for sae in transcoders if not sae.is_transcoder]
    if plain:
        raise InvalidInputError(f"SAEs on {plain} reconstruct their own hook; only transcoders (cfg.hook_name_out "
                                "set) replace an MLP")
    outs = [sae.cfg.hook_name_out for sae in transcoders]
    if len(set(outs)) != len(outs):
        raise InvalidInputError(f"two transcoders write the same hook: {sorted(outs)}")


def _keep(keep_BT: torch.Tensor, act: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    return torch.where(keep_BT[..., None].to(act.device), act, new.to(act.dtype))


def transcoder_hooks(transcoders: Sequence[SAE], keep_BT: torch.Tensor) -> list[tuple[str, HookFn]]:
    """Forward hooks replacing each transcoder's output hook by its prediction from the
    input hook of the same forward pass (positions where `keep_BT` is True left as they are)."""
    check_transcoders(transcoders)
    hooks: list[tuple[str, HookFn]] = []
    for sae in transcoders:
        seen: dict[str, torch.Tensor] = {}

        def predict(act: torch.Tensor, sae: SAE = sae, seen: dict[str, torch.Tensor] = seen) -> torch.Tensor:
            if "x" not in seen:
                raise InvalidInputError(f"hook {sae.cfg.hook_name!r} did not run before {sae.cfg.hook_name_out!r}")
            out = sae(seen.pop("x").to(sae.W_enc.device, sae.W_enc.dtype)).x_hat.to(act.device)
            return _keep(keep_BT, act, out)

        hooks += [(sae.cfg.hook_name, capture_hook(lambda act, seen=seen: seen.__setitem__("x", act))),
                  (sae.cfg.hook_name_out, replace_hook(predict))]
    return hooks


def clt_hooks(clt: CrossLayerTranscoder, keep_BT: torch.Tensor) -> list[tuple[str, HookFn]]:
    """Forward hooks replacing every MLP output by the CLT's, its layer-l features encoded
    from the same pass's input hook of layer l (positions where `keep_BT` is True left as they are)."""
    codes: dict[int, torch.Tensor] = {}
    W = clt.W_enc

    def encode(act: torch.Tensor, layer: int) -> None:
        codes[layer] = clt.encode_layer(act.to(W.device, W.dtype), layer)

    def write(act: torch.Tensor, layer: int) -> torch.Tensor:
        if layer not in codes:
            raise InvalidInputError(f"hook {clt.cfg.hooks_in[layer]!r} did not run before {clt.cfg.hooks_out[layer]!r}")
        return _keep(keep_BT, act, clt.decode_layer(codes, layer).to(act.device))

    hooks: list[tuple[str, HookFn]] = []
    for layer, (hook_in, hook_out) in enumerate(zip(clt.cfg.hooks_in, clt.cfg.hooks_out, strict=True)):
        hooks += [(hook_in, capture_hook(lambda act, layer=layer: encode(act, layer))),
                  (hook_out, replace_hook(lambda act, layer=layer: write(act, layer)))]
    return hooks


def ablation_hooks(
    hooks_out: Sequence[str], keep_BT: torch.Tensor, ablation: Ablation = "zero",
    means: dict[str, torch.Tensor] | None = None,
) -> list[tuple[str, HookFn]]:
    """Forward hooks replacing each of `hooks_out` by zeros or by its mean `means[hook]` `[d]`."""
    if ablation not in ABLATIONS:
        raise InvalidInputError(f"ablation must be one of {', '.join(ABLATIONS)}, got {ablation!r}")
    if ablation == "mean" and (means is None or set(hooks_out) - set(means)):
        raise InvalidInputError(f"mean ablation needs the mean of every hook: {sorted(hooks_out)}")

    def fill(hook: str) -> HookFn:
        if ablation == "zero":
            return replace_hook(lambda act: _keep(keep_BT, act, torch.zeros_like(act)))
        return replace_hook(lambda act: _keep(keep_BT, act, means[hook].to(act.device).expand_as(act)))

    return [(hook, fill(hook)) for hook in hooks_out]


@torch.no_grad()
def replacement_metrics(
    transcoders: Sequence[SAE] | CrossLayerTranscoder,
    bridge: Any,
    blocks: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    ablation: Ablation = "zero",
    means: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """CE / KL with every transcoder's MLP replaced at once (or every MLP by one cross-layer
    transcoder), against the clean model and the same outputs ablated (`ablation`), over
    `(token_ids, is_bos)` blocks `[n, T]` (three forwards per batch). Keys as
    `saes.eval.downstream.downstream_metrics`'."""
    if isinstance(transcoders, CrossLayerTranscoder):
        clt = transcoders
        outs = clt.cfg.hooks_out

        def splice(keep_BT: torch.Tensor) -> list[tuple[str, HookFn]]:
            return clt_hooks(clt, keep_BT)
    else:
        check_transcoders(transcoders)
        outs = [sae.cfg.hook_name_out for sae in transcoders]

        def splice(keep_BT: torch.Tensor) -> list[tuple[str, HookFn]]:
            return transcoder_hooks(transcoders, keep_BT)
    stats = DownstreamStats()
    for token_ids, is_bos in blocks:
        logits = {
            "clean": bridge(token_ids),
            "sae": bridge.run_with_hooks(token_ids, fwd_hooks=splice(is_bos)),
            "zero": bridge.run_with_hooks(token_ids, fwd_hooks=ablation_hooks(outs, is_bos, ablation, means)),
        }
        stats.update(logits, token_ids, is_bos)
    return stats.result()
