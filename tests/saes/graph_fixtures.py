"""Tiny float64 models and dictionaries for the attribution-graph tests: a GPT-2-style model
with ReLU MLPs, its exact transcoders (each MLP's own weights) and exact cross-layer
transcoder, random transcoders with a skip term, random CLTs, residual-stream SAEs; and the
measured effect of removing each source node."""

from __future__ import annotations

import torch

from sae_atlas.saes.circuits.graph import Graph
from sae_atlas.saes.circuits.perturb import node_values
from sae_atlas.saes.models import ModelHandle, load_model
from sae_atlas.saes.sae.architectures import build_sae
from sae_atlas.saes.sae.base import SAE, SAEConfig
from sae_atlas.saes.transcoders.clt import CLTConfig, CrossLayerTranscoder, build_clt
from sae_atlas.saes.transcoders.clt_train import init_clt

PROMPT = "the cat sat on the mat and the dog ran"


def tiny_f64(arch: str = "gpt2", n_layers: int = 2, seed: int = 0) -> ModelHandle:
    """A tiny model (ReLU MLPs for gpt2) in float64."""
    handle = load_model({"kind": "tiny", "arch": arch, "n_layers": n_layers, "seed": seed,
                         **({"act_fn": "relu"} if arch == "gpt2" else {})}, cache=False)
    handle.bridge.to(torch.float64)
    return handle


def _mlp_weights(handle: ModelHandle, layer: int) -> dict[str, torch.Tensor]:
    params = dict(handle.bridge.blocks[layer].mlp.named_parameters())
    pick = lambda part, kind: next(v for k, v in params.items() if f"{part}." in k and k.endswith(kind))  # noqa: E731
    return {"W_in": pick("c_fc", "weight"), "b_in": pick("c_fc", "bias"),
            "W_out": pick("c_proj", "weight"), "b_out": pick("c_proj", "bias")}


def exact_transcoders(handle: ModelHandle) -> dict[str, SAE]:
    """For a ReLU GPT-2 MLP: standard transcoders with the MLP's own weights, reading the
    MLP's normalised input and writing its output (zero error by construction)."""
    out = {}
    for layer in range(handle.n_layers):
        w = _mlp_weights(handle, layer)
        d_mlp = w["W_in"].shape[1]
        cfg = SAEConfig(architecture="standard", d_in=handle.d_model, d_sae=d_mlp,
                        hook_name=f"blocks.{layer}.ln2.hook_normalized", hook_name_out=f"blocks.{layer}.hook_mlp_out",
                        apply_b_dec_to_input=False)
        sae = build_sae(cfg).double()
        with torch.no_grad():
            sae.W_enc.copy_(w["W_in"])
            sae.b_enc.copy_(w["b_in"])
            sae.W_dec.copy_(w["W_out"])
            sae.b_dec.copy_(w["b_out"])
        out[f"tc{layer}"] = sae
    return out


def random_transcoders(handle: ModelHandle, *, d_sae: int = 48, k: int = 6, skip: bool = True,
                       read: str = "hook_resid_mid") -> dict[str, SAE]:
    """TopK transcoders with random weights (non-zero errors), optionally with a skip term."""
    out = {}
    for layer in range(handle.n_layers):
        cfg = SAEConfig(architecture="topk", d_in=handle.d_model, d_sae=d_sae, k=k, seed=layer,
                        hook_name=f"blocks.{layer}.{read}", hook_name_out=f"blocks.{layer}.hook_mlp_out",
                        apply_b_dec_to_input=False, skip=skip)
        sae = build_sae(cfg).double()
        gen = torch.Generator().manual_seed(100 + layer)
        with torch.no_grad():
            sae.b_enc.copy_(0.1 * torch.randn(d_sae, generator=gen, dtype=torch.float64))
            sae.b_dec.copy_(0.1 * torch.randn(handle.d_model, generator=gen, dtype=torch.float64))
            if skip:
                sae.W_skip.copy_(0.1 * torch.randn(handle.d_model, handle.d_model, generator=gen, dtype=torch.float64))
        out[f"tc{layer}"] = sae
    return out


def residual_saes(handle: ModelHandle, hooks: list[str], *, d_sae: int = 64, k: int = 8) -> dict[str, SAE]:
    """TopK SAEs with random weights on residual-stream hooks."""
    out = {}
    for i, hook in enumerate(hooks):
        cfg = SAEConfig(architecture="topk", d_in=handle.d_model, d_sae=d_sae, k=k, seed=10 + i,
                        hook_name=hook)
        out[f"sae{i}"] = build_sae(cfg).double()
    return out


def exact_clt(handle: ModelHandle) -> CrossLayerTranscoder:
    """For a ReLU GPT-2: a CLT whose layer-l encoder and diagonal decoder are MLP l's own
    weights, off-diagonal decoders zero, thresholds 0 (zero error by construction)."""
    d_mlp = _mlp_weights(handle, 0)["W_in"].shape[1]
    clt = build_clt(CLTConfig(architecture="jumprelu", n_layers=handle.n_layers, d_model=handle.d_model,
                              d_sae=d_mlp)).double()
    with torch.no_grad():
        for p in clt.parameters():
            p.zero_()
        clt.log_threshold.fill_(-float("inf"))
        for layer in range(handle.n_layers):
            w = _mlp_weights(handle, layer)
            clt.W_enc[layer].copy_(w["W_in"])
            clt.b_enc[layer].copy_(w["b_in"])
            clt.W_dec[layer][:, 0].copy_(w["W_out"])
            clt.b_dec[layer].copy_(w["b_out"])
    return clt


def random_clt(handle: ModelHandle, *, architecture: str = "topk", d_sae: int = 48, k: int = 6,
               read: str = "hook_resid_mid", seed: int = 0) -> CrossLayerTranscoder:
    """A CLT with random weights (every decoder block non-zero, so features write later layers)."""
    cfg = CLTConfig(architecture=architecture, n_layers=handle.n_layers, d_model=handle.d_model, d_sae=d_sae,
                    k=k if architecture == "topk" else None, input_site=read)
    clt = build_clt(cfg)
    gen = torch.Generator().manual_seed(seed)
    init_clt(clt, gen)
    with torch.no_grad():
        clt.b_enc.copy_(0.1 * torch.randn(clt.b_enc.shape, generator=gen))
        clt.b_dec.copy_(0.1 * torch.randn(clt.b_dec.shape, generator=gen))
        if architecture == "jumprelu":
            clt.log_threshold.copy_((0.05 * torch.rand(clt.log_threshold.shape, generator=gen)).log())
    return clt.double()


def target_rows(g: Graph) -> torch.Tensor:
    """The graph's rows with inputs: its features and logit nodes."""
    return torch.cat([torch.arange(g.n_features), torch.arange(g.logit_slice.start, g.n_nodes)])


def removal_effects(handle: ModelHandle, g: Graph) -> tuple[torch.Tensor, torch.Tensor]:
    """`([rows, sources], clean values)`: each row's clean value minus its value with one
    source removed (attention and norms frozen), measured."""
    src = torch.arange(g.logit_slice.start)
    scale = torch.ones(len(src) + 1, g.n_nodes, dtype=torch.float64)
    scale[torch.arange(len(src)), src] = 0
    vals = node_values(handle, g, scale)
    rows = target_rows(g)
    return (vals[-1][None, rows] - vals[:-1][:, rows]).T, vals[-1]
