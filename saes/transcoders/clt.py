"""The engine layer of `clt`; its other layers: `sae_atlas.saes.importing.clt` (import).

Cross-layer transcoders (CLTs; Ameisen et al. 2025, "Circuit Tracing", § "Building an
interpretable replacement model"; the cross-layer features of Lindsey et al. 2024,
"Sparse crosscoders for cross-layer features and model diffing").

A CLT over the MLPs of layers 0..L-1 has, at every layer l, F features that read the MLP
input of layer l (`blocks.l.<input_site>`, e.g. `ln2.hook_normalized` or `hook_resid_mid`)
and write to the MLP output of layer l and of every later layer (`blocks.l'.<output_site>`):

    f_l      = act(x_l @ W_enc[l] + b_enc[l])                           [F]
    y_hat_l' = sum_{l <= l'} f_l @ W_dec[l][:, l' - l] + b_dec[l']       [d]

Shapes: `W_enc [L, d, F]` (SAELens' `[d_in, d_sae]` per layer), `b_enc [L, F]`, `W_dec[l]
[F, L - l, d]` (circuit-tracer's layout of the decoder of layer l), `b_dec [L, d]`.
`act` is JumpReLU (`z * (z > threshold)`, a threshold `[L, F]` trained as `log_threshold`
with the straight-through estimators of `saes.sae.jumprelu`) or TopK (the k largest of
`relu(z)` per layer and token). A feature's decoder norm is the norm of its whole
`W_dec[l][i]` `[L - l, d]`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

import torch
from torch import nn

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.sae.base import SAEOutput, config_from_dict
from sae_atlas.saes.sae.jumprelu import jumprelu_ste, step_ste
from sae_atlas.saes.sae.losses import StepInfo, TrainStep, step_metrics
from sae_atlas.saes.sae.topk import topk_code
from sae_atlas.store.dtypes import DTypeName, dtype_name

CLTArchitecture = Literal["jumprelu", "topk"]
CLT_ARCHITECTURES: tuple[CLTArchitecture, ...] = get_args(CLTArchitecture)


@dataclass
class CLTConfig:
    """Everything needed to rebuild a CLT; saved in its cfg.json and training.json."""

    architecture: CLTArchitecture
    n_layers: int
    d_model: int
    d_sae: int  # features per layer
    k: int | None = None  # topk: active features per layer and token
    l0_coefficient: float = 1.0  # jumprelu
    jumprelu_bandwidth: float = 0.05
    jumprelu_init_threshold: float = 0.1
    dtype: DTypeName = "float32"
    model_name: str = ""
    input_site: str = "ln2.hook_normalized"  # the hook inside block l that layer l's encoder reads
    output_site: str = "hook_mlp_out"  # the hook inside block l' that the decoders write
    context_size: int = 0
    dataset_path: str = ""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.architecture not in CLT_ARCHITECTURES:
            raise InvalidInputError(f"unknown CLT architecture {self.architecture!r}; valid: "
                                    f"{', '.join(CLT_ARCHITECTURES)}")
        if min(self.n_layers, self.d_model, self.d_sae) <= 0:
            raise InvalidInputError(f"n_layers, d_model and d_sae must be positive, got {self.n_layers}, "
                                    f"{self.d_model}, {self.d_sae}")
        if self.architecture == "topk" and (self.k is None or not 0 < self.k <= self.d_sae):
            raise InvalidInputError(f"a topk CLT needs 0 < k <= d_sae ({self.d_sae}), got k={self.k}")
        for name in ("input_site", "output_site"):
            site = getattr(self, name)
            if not site or site.startswith("blocks.") or "{" in site:
                raise InvalidInputError(f"{name} is a hook inside a block without the block prefix "
                                        f"(e.g. 'ln2.hook_normalized', 'hook_mlp_out'), got {site!r}")
        if self.input_site == self.output_site:
            raise InvalidInputError(f"a CLT reads one hook and writes another; both are {self.input_site!r}")
        self.dtype = dtype_name(self.dtype, kind="CLT dtype")

    @property
    def hooks_in(self) -> list[str]:
        """The hook each layer's encoder reads, `blocks.l.<input_site>`."""
        return [f"blocks.{layer}.{self.input_site}" for layer in range(self.n_layers)]

    @property
    def hooks_out(self) -> list[str]:
        """The hook each layer's output is written to, `blocks.l.<output_site>`."""
        return [f"blocks.{layer}.{self.output_site}" for layer in range(self.n_layers)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CLTConfig:
        """Build from a dict, rejecting unknown keys with the list of valid ones."""
        return config_from_dict(cls, data, "CLT config")


class CrossLayerTranscoder(nn.Module):
    """A CLT (see the module doc). Inputs and outputs are `[..., L, d]`: the L MLP inputs
    (or outputs) of one token."""

    def __init__(self, cfg: CLTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        L, d, F = cfg.n_layers, cfg.d_model, cfg.d_sae
        self.W_enc = nn.Parameter(torch.empty(L, d, F))
        self.b_enc = nn.Parameter(torch.zeros(L, F))
        self.W_dec = nn.ParameterList([nn.Parameter(torch.empty(F, L - layer, d)) for layer in range(L)])
        self.b_dec = nn.Parameter(torch.zeros(L, d))
        if cfg.architecture == "jumprelu":
            self.log_threshold = nn.Parameter(torch.full((L, F), math.log(cfg.jumprelu_init_threshold)))

    @property
    def threshold(self) -> torch.Tensor:
        """JumpReLU thresholds `[L, F]` (`exp(log_threshold)`)."""
        return self.log_threshold.exp()

    def _check(self, x: torch.Tensor, what: str = "inputs") -> None:
        L, d = self.cfg.n_layers, self.cfg.d_model
        if x.ndim < 2 or tuple(x.shape[-2:]) != (L, d):
            raise InvalidInputError(f"the CLT expects {what} [..., n_layers={L}, d_model={d}], got {tuple(x.shape)}")

    def encode_pre(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-activations `[..., L, F]` of inputs `[..., L, d]`: `x_l @ W_enc[l] + b_enc[l]`."""
        self._check(x)
        return torch.einsum("...ld,ldf->...lf", x, self.W_enc) + self.b_enc

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        """The code of pre-activations `[..., L, F]` (inference behaviour)."""
        if self.cfg.architecture == "jumprelu":
            return pre * (pre > self.threshold)
        assert self.cfg.k is not None
        return topk_code(pre, self.cfg.k)

    def activate_layer(self, pre: torch.Tensor, layer: int) -> torch.Tensor:
        """The code of one layer's pre-activations `[..., F]`."""
        if self.cfg.architecture == "jumprelu":
            return pre * (pre > self.threshold[layer])
        assert self.cfg.k is not None
        return topk_code(pre, self.cfg.k)

    def encode_pre_layer(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """One layer's pre-activations `[..., F]` of its input `[..., d]`."""
        return x @ self.W_enc[layer] + self.b_enc[layer]

    def encode_layer(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        """One layer's code `[..., F]` of its input `[..., d]`."""
        return self.activate_layer(self.encode_pre_layer(x, layer), layer)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations `[..., L, F]` of inputs `[..., L, d]`."""
        return self.activate(self.encode_pre(x))

    def decode_layer(self, codes: Mapping[int, torch.Tensor], layer: int) -> torch.Tensor:
        """The output `[..., d]` at one layer from per-layer codes `codes[l] [..., F]` (only
        layers `l <= layer` are read)."""
        out = self.b_dec[layer]
        for source in range(layer + 1):
            out = out + codes[source] @ self.W_dec[source][:, layer - source]
        return out

    def decode(self, f: torch.Tensor) -> torch.Tensor:
        """Outputs `[..., L, d]` of codes `[..., L, F]`: every layer's features written to
        their own and every later layer, plus `b_dec`."""
        out = self.b_dec.expand(*f.shape[:-2], -1, -1).clone()
        for source in range(self.cfg.n_layers):
            out[..., source:, :] += torch.einsum("...f,fkd->...kd", f[..., source, :], self.W_dec[source])
        return out

    def forward(self, x: torch.Tensor) -> SAEOutput:
        """Predicted MLP outputs `[..., L, d]`, code and pre-activations of inputs `[..., L, d]`."""
        pre = self.encode_pre(x)
        f = self.activate(pre)
        return SAEOutput(self.decode(f), f, pre)

    def decoder_norms(self) -> torch.Tensor:
        """`[L, F]`: the norm of each feature's whole decoder `W_dec[l][i]` (all layers it writes)."""
        return torch.stack([w.pow(2).sum((1, 2)).sqrt() for w in self.W_dec])

    def training_loss(self, x: torch.Tensor, info: StepInfo, target: torch.Tensor) -> TrainStep:
        """The loss of a batch `x [B, L, d]` predicting `target [B, L, d]`: the squared error
        summed over layers (metrics `mse`, `fvu` against the summed variance, `l0` = active
        features per token over all layers) plus `l0_coefficient * L0` (JumpReLU, straight-
        through threshold gradients) or the FVU alone (TopK)."""
        self._check(target, "targets")
        pre = self.encode_pre(x)
        B, L, F = pre.shape
        if self.cfg.architecture == "jumprelu":
            eps, log_t = self.cfg.jumprelu_bandwidth, self.log_threshold.reshape(-1)
            f = jumprelu_ste(pre.reshape(B, L * F), log_t, eps).reshape(B, L, F)
        else:
            f = self.activate(pre)
        y_hat = self.decode(f)
        metrics = step_metrics(target.reshape(B, -1), y_hat.reshape(B, -1), (f != 0).sum((-1, -2)), info)
        if self.cfg.architecture == "jumprelu":
            l0 = step_ste(pre.reshape(B, L * F), log_t, eps).sum(-1).mean()
            loss = metrics["mse"] + self.cfg.l0_coefficient * l0
        else:
            loss = metrics["fvu"]
        return TrainStep(loss, {k: v.detach() for k, v in metrics.items()}, (f != 0).sum(0).reshape(-1))


def build_clt(cfg: CLTConfig) -> CrossLayerTranscoder:
    """A CLT with uninitialised weights (zero biases; thresholds at their initial value)."""
    return CrossLayerTranscoder(cfg)


@torch.no_grad()
def fold_layer_scales(clt: CrossLayerTranscoder, scale_in_L: torch.Tensor,
                      scale_out_L: torch.Tensor) -> CrossLayerTranscoder:
    """A copy of `clt` trained on `s_l x_l` predicting `t_l y_l` that works on raw inputs
    and predicts raw outputs with the same code: `W_enc[l]` times `s_l`, the decoder block
    and bias writing layer l' divided by `t_l'`."""
    folded = copy.deepcopy(clt)
    s, t = scale_in_L.to(folded.W_enc), scale_out_L.to(folded.W_enc)
    folded.W_enc.mul_(s[:, None, None])
    for source, w in enumerate(folded.W_dec):
        w.div_(t[source:, None])
    folded.b_dec.div_(t[:, None])
    return folded
