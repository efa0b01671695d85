"""SAEs spliced into the model at their hooks, with the error term kept.

At a spliced hook the activation `x` becomes `decode(f') + (x - decode(f))` where
`f = encode(x)` and `f'` is the code after the clamp / scale / ablate edits; steer,
project-out and rotate edits then act on that output. With no edit `f' = f`, so the
model's logits are reproduced (up to float rounding).

A transcoder is spliced across its two hooks: at the hook it reads, `f = encode(x)` is
edited to `f'` (the input passes on unchanged); at the hook it writes, the output `y`
becomes `y + decode(f') - decode(f)`, i.e. its prediction from `f'` plus its error
`y - (decode(f) + skip(x))` (the skip term cancels). Steer edits on its features add their
decoder directions at the hook it writes.

`Splice` holds the SAEs (by id) and the compiled edits; `run_spliced` runs one forward
pass and returns the logits and every spliced SAE's (edited) code. `EditSources` is what
the caller supplies to compile edit specs: the SAEs, feature means and circle planes.

Edits act at absolute token positions. A forward pass over a whole unpadded sequence sees
positions `0..T-1`; incremental decoding (`saes.intervene.decode`) feeds a few tokens at a
time, left-padded in a batch, and tells the hooks where those tokens stand through
`HookPositions`. `stack_splices` makes one splice for a batch whose rows run different edits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.hook_fns import in_residual
from sae_atlas.saes.intervene.edits import (
    CirclePlane,
    CompiledEdit,
    compile_edit,
    resolve_positions,
)
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.base import SAE


class EditSources(Protocol):
    """Where edit specs get their SAEs, hooks, feature means and circle planes."""

    def sae(self, sae_id: str) -> SAE: ...

    def hook(self, sae_id: str) -> str: ...

    def feature_mean(self, sae_id: str, feature: int) -> float | None: ...

    def plane(self, run: str, layer: int | None) -> CirclePlane: ...


@dataclass
class HookPositions:
    """Absolute positions `[B, T]` of the tokens the next forward pass feeds the model (-1
    marks left padding), read by a splice's hooks when they run; None means `0..T-1`."""

    current: torch.Tensor | None = None


@dataclass
class Splice:
    """SAEs to splice in (sae_id -> (hook, SAE)) and edits to apply."""

    saes: dict[str, tuple[str, SAE]] = field(default_factory=dict)
    edits: list[CompiledEdit] = field(default_factory=list)

    @property
    def hooks(self) -> list[str]:
        """Every hook the splice touches (SAEs, the hooks transcoders write, and edits), in
        first-use order."""
        written = [sae.cfg.hook_name_out for _, sae in self.saes.values() if sae.is_transcoder]
        return list(dict.fromkeys([h for h, _ in self.saes.values()] + written + [e.hook for e in self.edits]))

    def hook_fn(self, hook: str, record: dict[str, torch.Tensor] | None,
                positions: HookPositions | None = None, pending: dict[str, torch.Tensor] | None = None) -> Any:
        """The forward hook at `hook`: splice its SAEs, apply its edits (at `positions`),
        record codes. `pending` carries a transcoder's output change from the hook it reads
        to the hook it writes (one dict shared by the hooks of one forward pass)."""
        at_hook = [(sid, sae) for sid, (h, sae) in self.saes.items() if h == hook]
        writing = [sid for sid, (_, sae) in self.saes.items() if sae.is_transcoder and sae.cfg.hook_name_out == hook]
        out_edits = [e for e in self.edits if e.hook == hook and not e.on_code]
        pending = {} if pending is None else pending

        def fn(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
            pos = None if positions is None else positions.current
            x = act
            for sid in writing:
                x = (x + pending.pop(sid).to(x.device)).to(act.dtype)
            for sid, sae in at_hook:
                xs = x.to(sae.W_dec.dtype)
                f = sae_codes(sae, xs)
                before = sae.decode(f)
                for e in self.edits:
                    if e.on_code and e.spec.sae == sid:
                        f = e.apply_code(f, pos)
                if record is not None:
                    record[sid] = f.detach()
                if sae.is_transcoder:
                    pending[sid] = sae.decode(f) - before
                else:
                    err = xs - before
                    x = (sae.decode(f) + err).to(act.dtype)
            for e in out_edits:
                x = e.apply_output(x, pos)
            return x

        return fn

    def fwd_hooks(self, record: dict[str, torch.Tensor] | None = None,
                  positions: HookPositions | None = None) -> list[tuple[str, Any]]:
        pending: dict[str, torch.Tensor] = {}
        return [(h, self.hook_fn(h, record, positions, pending)) for h in self.hooks]


def stack_splices(splices: Sequence[Splice]) -> Splice:
    """One splice for a batch whose row `b` runs `splices[b]`. Every row splices the same
    SAEs (ids, hooks and modules); each row's edits act on that row only (their masks
    become `[B, N]`, False past a mask's own length)."""
    first = splices[0]
    if any(s.saes != first.saes for s in splices[1:]):
        raise InvalidInputError("the rows of a batch must splice the same SAEs at the same hooks")
    width = max((e.mask_T.shape[-1] for s in splices for e in s.edits), default=0)
    edits = []
    for row, splice in enumerate(splices):
        for edit in splice.edits:
            mask_BN = torch.zeros(len(splices), width, dtype=torch.bool)
            mask_BN[row, : edit.mask_T.shape[-1]] = edit.mask_T
            edits.append(replace(edit, mask_T=mask_BN))
    return Splice(dict(first.saes), edits)


def build_splice(
    sources: EditSources,
    sae_ids: Sequence[str],
    specs: Sequence[Any],
    tokens: list[str],
    *,
    n_prompt: int | None = None,
    n_total: int | None = None,
) -> Splice:
    """A `Splice` of the SAEs `sae_ids` plus every SAE an edit names, with each spec
    compiled against `tokens` (the prompt's token strings; `n_total` >= prompt length
    leaves room for generated tokens)."""
    n_prompt = len(tokens) if n_prompt is None else n_prompt
    n_total = n_prompt if n_total is None else n_total
    splice = Splice()
    for sid in [*sae_ids, *[s.sae for s in specs if getattr(s, "sae", None)]]:
        if sid not in splice.saes:
            splice.saes[sid] = (sources.hook(sid), sources.sae(sid))
    for spec in specs:
        mask = resolve_positions(spec.at, tokens, n_prompt, n_total)
        if spec.kind == "rotate":
            plane = sources.plane(spec.circle, spec.layer)
            splice.edits.append(compile_edit(spec, mask, hook=plane.hook, plane=plane))
            continue
        hook, sae = splice.saes[spec.sae]
        mean = sources.feature_mean(spec.sae, spec.feature) if spec.kind == "ablate" and spec.to == "mean" else None
        # a decoder direction acts where the dictionary writes (a transcoder's output hook)
        splice.edits.append(compile_edit(spec, mask, sae=sae, hook=sae.cfg.hook_name_out or hook, feature_mean=mean))
    return splice


@dataclass
class SpliceRun:
    """Logits `[T, V]` and each spliced SAE's code `[T, F]` (`[B, T, ...]` for a batch)."""

    logits_TV: torch.Tensor
    codes: dict[str, torch.Tensor]


@torch.inference_mode()
def run_spliced(handle: ModelHandle, token_ids_T: torch.Tensor, splice: Splice) -> SpliceRun:
    """One forward pass of one token sequence `[T]` (or a batch `[B, T]` whose rows share
    the edits' positions) with `splice` applied."""
    if token_ids_T.ndim not in (1, 2) or token_ids_T.shape[-1] == 0:
        raise InvalidInputError(f"need token ids [T] or [B, T], got shape {tuple(token_ids_T.shape)}")
    for h in splice.hooks:
        handle.check_hook(h)
    record: dict[str, torch.Tensor] = {}
    batch = token_ids_T if token_ids_T.ndim == 2 else token_ids_T[None]
    logits = handle.bridge.run_with_hooks(batch, fwd_hooks=in_residual(handle.bridge, splice.fwd_hooks(record))).float()
    codes = {sid: f.float() for sid, f in record.items()}
    if token_ids_T.ndim == 1:
        return SpliceRun(logits[0], {sid: f[0] for sid, f in codes.items()})
    return SpliceRun(logits, codes)
