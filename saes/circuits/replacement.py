"""The local replacement model of one prompt (Ameisen et al. 2025, "Circuit Tracing",
§ "local replacement model"; circuit-tracer's `ReplacementModel`).

`capture` runs the model once and keeps what the replacement freezes: every attention
pattern and every norm scale (LayerNorm or RMSNorm), each dictionary's input and output
at its hooks, its code, and its error `output - (decode(code) + skip)`. `frozen_forward`
then runs the model with those patterns and scales in place of the live ones and lets the
caller decide what each dictionary writes: with everything a dictionary writes held fixed
(apart from a transcoder's linear skip term), the map from token embeddings and the
written vectors to any later residual stream is affine, which makes direct effects exact.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.circuits.dictionaries import Dictionary, DictionarySet, decode_at
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.models import ModelHandle

_FROZEN = ("attn.hook_pattern", "hook_scale")
EMBED_HOOK, FINAL_HOOK = "hook_embed", "unembed.hook_in"

ReadFn = Callable[[Dictionary, torch.Tensor], None]
WriteFn = Callable[[Dictionary, torch.Tensor, torch.Tensor], torch.Tensor]
TensorFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Capture:
    """What one clean forward pass fixes (batch dimension dropped; patterns and scales keep
    theirs, of size 1). `start` is the first position whose features are nodes (1 when the
    prompt starts with BOS: its features and error are folded into constants, as circuit-tracer
    does)."""

    token_ids_T: torch.Tensor
    x_in: dict[str, torch.Tensor]  # dictionary id -> [T, d_in]
    out: dict[str, torch.Tensor]  # dictionary id -> [T, d_model], the clean output at the write hook
    codes: dict[str, torch.Tensor]  # dictionary id -> [T, F]
    errors: dict[str, torch.Tensor]  # dictionary id -> [T, d_model], zero before `start`
    frozen: dict[str, torch.Tensor]  # hook -> clean attention pattern / norm scale
    embed_TD: torch.Tensor
    final_TD: torch.Tensor  # the final norm's output (the unembedding's input)
    logits_TV: torch.Tensor
    start: int


def reconstruction(dset: DictionarySet, j: int, codes: dict[int, torch.Tensor], x_in: torch.Tensor) -> torch.Tensor:
    """What the features and the skip term write at dictionary `j`'s write hook, given every
    dictionary's codes (by index) and `j`'s input `x_in`: `decode_at(...) + skip_out(x_in)`."""
    sae = dset.items[j].sae
    return decode_at(dset, j, codes) + sae.skip_out(x_in.to(sae.W_dec.dtype)).to(x_in.dtype)


def encode(d: Dictionary, x_in: torch.Tensor) -> torch.Tensor:
    """The dictionary's code of `x_in`, in the input's dtype."""
    return sae_codes(d.sae, x_in).to(x_in.dtype)


def frozen_forward(
    handle: ModelHandle,
    dset: DictionarySet,
    cap: Capture,
    batch: int,
    write: WriteFn,
    *,
    read: ReadFn | None = None,
    embed: TensorFn | None = None,
    final: TensorFn | None = None,
) -> torch.Tensor:
    """Logits `[batch, T, V]` of `batch` copies of the prompt with attention patterns and norm
    scales frozen at their clean values. At each dictionary's write hook the activation
    becomes `write(d, act, x_in)` (`x_in`: the live input at its read hook, also passed to
    `read`); `embed` and `final` may replace or record the token embeddings and the final
    norm's output (returning fewer positions unembeds only those)."""
    tokens = cap.token_ids_T[None].expand(batch, -1).to(handle.device)
    live: dict[str, torch.Tensor] = {}

    def freeze(name: str) -> Callable:
        return lambda act, hook=None: cap.frozen[name].expand_as(act)

    def reader(d: Dictionary) -> Callable:
        def fn(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
            live[d.id] = act
            if read is not None:
                read(d, act)
            return act if d.write_hook != d.read_hook else write(d, act, act)

        return fn

    def writer(d: Dictionary) -> Callable:
        def fn(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
            return write(d, act, live.pop(d.id))

        return fn

    hooks: list[tuple[str, Any]] = [(n, freeze(n)) for n in cap.frozen]
    hooks += [(d.read_hook, reader(d)) for d in dset.items]
    hooks += [(d.write_hook, writer(d)) for d in dset.items if d.write_hook != d.read_hook]
    if embed is not None:
        hooks.append((EMBED_HOOK, lambda act, hook=None: embed(act)))
    if final is not None:
        hooks.append((FINAL_HOOK, lambda act, hook=None: final(act)))
    with warnings.catch_warnings():
        # freezing a norm scale edits it on purpose (TransformerLens warns about any such edit)
        warnings.filterwarnings("ignore", message="A forward hook edited hook_scale")
        return handle.bridge.run_with_hooks(tokens, fwd_hooks=hooks)


@torch.no_grad()
def capture(handle: ModelHandle, dset: DictionarySet, token_ids_T: torch.Tensor, *, skip_bos: bool = True) -> Capture:
    """One clean forward pass of `token_ids_T [T]` recording what the replacement model fixes."""
    names = [n for n in handle.hook_names if n.endswith(_FROZEN)]
    seen: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Callable:
        def fn(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
            seen[name] = act.detach().clone()
            return act

        return fn

    wanted = list(dict.fromkeys([*names, EMBED_HOOK, FINAL_HOOK, *(d.read_hook for d in dset.items),
                                 *(d.write_hook for d in dset.items)]))
    logits = handle.bridge.run_with_hooks(token_ids_T[None].to(handle.device), fwd_hooks=[(n, keep(n)) for n in wanted])
    missing = [n for n in wanted if n not in seen and not n.endswith(_FROZEN)]
    if missing:
        raise InvalidInputError(f"hooks {missing} did not fire on model {handle.name}; a graph cannot use them")
    start = int(skip_bos and handle.bos_token_id is not None and int(token_ids_T[0]) == handle.bos_token_id)
    x_in, out, codes, errors = {}, {}, {}, {}
    for d in dset.items:
        x_in[d.id], out[d.id] = seen[d.read_hook][0], seen[d.write_hook][0]
        code = encode(d, x_in[d.id])
        code[:start] = 0
        codes[d.id] = code
    by_index = {i: codes[d.id] for i, d in enumerate(dset.items)}
    for j, d in enumerate(dset.items):
        err = out[d.id] - reconstruction(dset, j, by_index, x_in[d.id])
        err[:start] = 0
        errors[d.id] = err
    frozen = {n: seen[n] for n in names if n in seen}
    return Capture(token_ids_T.cpu(), x_in, out, codes, errors, frozen, seen[EMBED_HOOK][0], seen[FINAL_HOOK][0],
                   logits[0].detach(), start)
