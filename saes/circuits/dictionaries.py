"""Which dictionaries form a graph's nodes, checked against the model.

Three kinds of graph:
- "transcoders": one per-layer transcoder (PLT, skip connection optional) for every MLP,
  reading the MLP's input (`blocks.L.hook_resid_mid` or its normalised form) and writing
  its output (`blocks.L.hook_mlp_out`), as in circuit-tracer;
- "clt": one cross-layer transcoder (`saes.transcoders.clt`) over every MLP, as in
  circuit-tracer's CLT graphs: one dictionary per layer (id `<clt_id>@<layer>`, its
  encoder and code), whose features write to their own MLP output and every later one;
  the error node of a layer is its MLP output minus everything the CLT writes there. A CLT
  over the first k layers only takes per-layer transcoders (or frozen MLPs) for the rest;
- "residual": SAEs on the residual stream (`hook_resid_pre/post`) at any set of layers,
  as in Marks et al. 2024 ("Sparse Feature Circuits"). Not `hook_resid_mid`: in
  TransformerLens' TransformerBridge that hook feeds the MLP only, the residual sum goes
  around it, so an SAE spliced there does not carry the stream.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.models import ModelHandle
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAE, SAEConfig
from sae_atlas.saes.transcoders.clt import CrossLayerTranscoder
from sae_atlas.saes.transcoders.sites import (
    MLP_OUT,
    mlp_input_layer,
    mlp_output_layer,
    valid_inputs,
)

GraphKind = Literal["transcoders", "clt", "residual"]
_RESID = re.compile(r"^blocks\.(\d+)\.hook_resid_(pre|post)$")
_RESID_ORDER = {"pre": 0, "post": 1}


class CLTLayer:
    """Layer `layer` of a CLT as a graph dictionary: its encoder and code; the decoders of
    its features (to this and every later layer) are `decoders`, and what a layer's MLP
    output receives from every layer's features is `decode_at`."""

    def __init__(self, clt: CrossLayerTranscoder, layer: int) -> None:
        self.clt, self.layer = clt, layer

    @property
    def W_enc(self) -> torch.Tensor:
        return self.clt.W_enc[self.layer]

    @property
    def W_dec(self) -> torch.Tensor:
        """The decoder block to its own layer `[F, d]`."""
        return self.clt.W_dec[self.layer][:, 0]

    def encode_pre(self, x: torch.Tensor) -> torch.Tensor:
        return self.clt.encode_pre_layer(x, self.layer)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.clt.encode_layer(x, self.layer)

    def skip_out(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(*x.shape[:-1], self.clt.cfg.d_model)


@dataclass(frozen=True)
class Dictionary:
    """One dictionary of the graph: its id, module, the hook it reads and the hook it writes
    (the same for an SAE) and the block it belongs to."""

    id: str
    sae: SAE | CLTLayer
    read_hook: str
    write_hook: str
    layer: int


def decoders(d: Dictionary) -> torch.Tensor:
    """`[F, K, d_model]`: each feature's decoder rows to the write hooks of the K
    dictionaries from `d` on (K = 1 but for a CLT layer, which writes every later layer)."""
    if isinstance(d.sae, CLTLayer):
        return d.sae.clt.W_dec[d.sae.layer]
    return d.sae.W_dec[:, None]


def decode_at(dset: DictionarySet, j: int, codes: dict[int, torch.Tensor]) -> torch.Tensor:
    """What the features write at dictionary `j`'s write hook (no skip term, no error): its
    `b_dec` plus `codes[i] @ W_dec` of every dictionary `i` writing there (a CLT: every
    layer `i <= j`), in the codes' dtype."""
    d = dset.items[j]
    if not isinstance(d.sae, CLTLayer):
        return d.sae.decode(codes[j].to(d.sae.W_dec.dtype)).to(codes[j].dtype)
    dtype = d.sae.W_dec.dtype
    return d.sae.clt.decode_layer({i: codes[i].to(dtype) for i in range(j + 1)}, j).to(codes[j].dtype)


@dataclass(frozen=True)
class DictionarySet:
    """The graph's dictionaries, in the order the residual stream meets them."""

    kind: GraphKind
    items: tuple[Dictionary, ...]

    @property
    def ids(self) -> list[str]:
        return [d.id for d in self.items]


def _transcoders(handle: ModelHandle, saes: dict[str, SAE], clt: tuple[Dictionary, ...] = ()) -> DictionarySet:
    """Per-layer transcoders for every MLP the CLT layers `clt` (if any, layers 0..k-1) leave."""
    by_layer: dict[int, Dictionary] = {d.layer: d for d in clt}
    for sid, sae in saes.items():
        read, write = sae.cfg.hook_name, sae.cfg.output_hook
        layer = mlp_input_layer(read)
        if layer is None or mlp_output_layer(write) != layer:
            raise InvalidInputError(
                f"transcoder {sid!r} reads {read!r} and writes {write!r}; a graph needs transcoders from an "
                f"MLP's input ({valid_inputs('L')}) to its output (blocks.L.{MLP_OUT}) of the same layer")
        if layer in by_layer:
            raise InvalidInputError(f"{by_layer[layer].id!r} and transcoder {sid!r} both replace the MLP of "
                                    f"layer {layer}; give one per layer")
        by_layer[layer] = Dictionary(sid, sae, read, write, layer)
    missing = [layer for layer in range(handle.n_layers) if layer not in by_layer]
    if missing:
        raise InvalidInputError(
            f"no transcoder for the MLPs of layers {missing}: a transcoder graph replaces every MLP "
            f"(layers 0..{handle.n_layers - 1}); have {sorted(by_layer)} (or freeze the others: their "
            "outputs become error nodes)")
    return DictionarySet("clt" if clt else "transcoders", tuple(by_layer[layer] for layer in sorted(by_layer)))


def _residual(saes: dict[str, SAE]) -> DictionarySet:
    by_hook: dict[str, Dictionary] = {}
    for sid, sae in saes.items():
        hook = sae.cfg.hook_name
        m = _RESID.match(hook)
        if not m:
            raise InvalidInputError(
                f"SAE {sid!r} is at {hook!r}, which a graph cannot use: give residual-stream SAEs "
                "(blocks.L.hook_resid_pre or blocks.L.hook_resid_post) or MLP transcoders")
        if hook in by_hook:
            raise InvalidInputError(f"SAEs {by_hook[hook].id!r} and {sid!r} are both at {hook!r}; give one per hook")
        by_hook[hook] = Dictionary(sid, sae, hook, hook, int(m.group(1)))

    def depth(d: Dictionary) -> tuple[int, int]:
        m = _RESID.match(d.read_hook)
        assert m is not None
        return d.layer, _RESID_ORDER[m.group(2)]

    return DictionarySet("residual", tuple(sorted(by_hook.values(), key=depth)))


def _writes(module: SAE | CrossLayerTranscoder) -> list[str]:
    return module.cfg.hooks_out if isinstance(module, CrossLayerTranscoder) else [module.cfg.output_hook]


def frozen_mlps(handle: ModelHandle, saes: dict[str, SAE | CrossLayerTranscoder]) -> dict[str, SAE]:
    """Transcoders that never fire for the MLPs no transcoder (or CLT) of `saes` replaces (ids
    `mlp{L}-frozen`): with them each such MLP's whole output is its error node, fixed like
    every error, so a graph over transcoders at a few layers stays exact."""
    covered = {layer for module in saes.values() for hook in _writes(module)
               if (layer := mlp_output_layer(hook)) is not None}
    out = {}
    for layer in range(handle.n_layers):
        if layer in covered:
            continue
        cfg = SAEConfig(architecture="standard", d_in=handle.d_model, d_sae=1, hook_name=f"blocks.{layer}.hook_resid_mid",
                        hook_name_out=f"blocks.{layer}.hook_mlp_out", apply_b_dec_to_input=False)
        sae = build_sae(cfg)
        with torch.no_grad():
            for p in sae.parameters():
                p.zero_()
            sae.b_enc.fill_(-1.0)  # a ReLU code that is always 0
        out[f"mlp{layer}-frozen"] = sae.to(next(iter(saes.values())).W_enc.dtype if saes else torch.float32)
    return out


def _clt_layers(handle: ModelHandle, clt_id: str, clt: CrossLayerTranscoder) -> tuple[Dictionary, ...]:
    cfg = clt.cfg
    if cfg.n_layers > handle.n_layers or cfg.d_model != handle.d_model:
        raise InvalidInputError(f"CLT {clt_id!r} spans {cfg.n_layers} layers of width {cfg.d_model}; model "
                                f"{handle.name} has {handle.n_layers} layers of width {handle.d_model}")
    items = []
    for layer, (read, write) in enumerate(zip(cfg.hooks_in, cfg.hooks_out, strict=True)):
        if mlp_input_layer(read) is None or mlp_output_layer(write) is None:
            raise InvalidInputError(f"CLT {clt_id!r} reads {read!r} and writes {write!r}; a graph needs a CLT from "
                                    f"the MLPs' inputs ({valid_inputs('L')}) to their outputs")
        handle.check_hook(read)
        handle.check_hook(write)
        items.append(Dictionary(f"{clt_id}@{layer}", CLTLayer(clt, layer), read, write, layer))
    return tuple(items)


def dictionary_set(handle: ModelHandle, saes: dict[str, SAE | CrossLayerTranscoder]) -> DictionarySet:
    """The graph's dictionaries from `saes` (id -> module): one CLT, or all transcoders (one
    per MLP), or all residual-stream SAEs; InvalidInputError naming what is missing or unusable."""
    if not saes:
        raise InvalidInputError("an attribution graph needs transcoders (one per MLP), a cross-layer transcoder or "
                                "residual-stream SAEs; none were given")
    clts = [sid for sid, m in saes.items() if isinstance(m, CrossLayerTranscoder)]
    if len(clts) > 1:
        raise InvalidInputError(f"a graph uses one cross-layer transcoder; got {clts}")
    if clts:  # its layers 0..k-1, then per-layer transcoders (or frozen MLPs) for the rest
        layers = _clt_layers(handle, clts[0], saes[clts[0]])  # type: ignore[arg-type]
        rest = {sid: m for sid, m in saes.items() if sid != clts[0]}
        plain = sorted(sid for sid, m in rest.items() if not (isinstance(m, SAE) and m.is_transcoder))
        if plain:
            raise InvalidInputError(f"a graph over a cross-layer transcoder takes per-layer transcoders for the "
                                    f"MLPs it leaves, not SAEs {plain}")
        return _transcoders(handle, rest, layers)  # type: ignore[arg-type]
    for sae in saes.values():
        handle.check_hook(sae.cfg.hook_name)
        handle.check_hook(sae.cfg.output_hook)
        if sae.cfg.d_in != handle.d_model or sae.cfg.output_dim != handle.d_model:
            raise InvalidInputError(f"dictionary at {sae.cfg.hook_name!r} has width {sae.cfg.d_in} -> "
                                    f"{sae.cfg.output_dim}; the model's residual width is {handle.d_model}")
    kinds = {sae.is_transcoder for sae in saes.values()}
    if len(kinds) > 1:
        tc = sorted(s for s, sae in saes.items() if sae.is_transcoder)
        raise InvalidInputError(f"a graph is over transcoders or over residual SAEs, not both; transcoders: {tc}, "
                                f"SAEs: {sorted(set(saes) - set(tc))}")
    return _transcoders(handle, saes) if kinds == {True} else _residual(saes)
