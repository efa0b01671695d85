"""The common SAE config and interface shared by every architecture.

Shapes follow SAELens: `W_enc [d_in, d_sae]`, `b_enc [d_sae]`, `W_dec [d_sae, d_in]`,
`b_dec [d_in]`. `pre = (x - b_dec) @ W_enc + b_enc` (b_dec applied to the input),
`x_hat = f @ W_dec + b_dec`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import torch
from torch import nn

from store.dtypes import DTypeName, dtype_name
from store.errors import InvalidInputError

if TYPE_CHECKING:
    from saes.sae.registry import Architecture

C = TypeVar("C")


def config_from_dict(cls: type[C], data: dict[str, Any], what: str) -> C:
    """`cls(**data)` for a config dataclass, rejecting unknown keys with the valid ones
    (InvalidInputError naming `what`, e.g. "SAE config")."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise InvalidInputError(f"unknown {what} keys {unknown}; valid: {', '.join(sorted(names))}")
    return cls(**data)


@dataclass
class SAEConfig:
    """Everything needed to rebuild an SAE; serialised into training.json and cfg.json."""

    architecture: Architecture
    d_in: int
    d_sae: int
    k: int | None = None  # topk / batchtopk / matryoshka
    l1_coefficient: float = 5.0  # standard
    l1_warmup_steps: int = 1000  # standard
    l0_coefficient: float = 1.0  # jumprelu
    jumprelu_bandwidth: float = 0.05  # jumprelu straight-through estimator
    jumprelu_init_threshold: float = 0.1  # inputs are scaled to E||x||^2 = d_in
    matryoshka_prefixes: list[int] = field(default_factory=list)  # empty -> d_sae/16../1
    apply_b_dec_to_input: bool = True
    dtype: DTypeName = "float32"
    # provenance (SAELens `metadata`)
    model_name: str = ""
    hook_name: str = ""
    context_size: int = 0
    prepend_bos: bool = True
    dataset_path: str = ""
    seed: int = 0

    def __post_init__(self) -> None:
        from saes.sae.registry import ARCHITECTURES  # the registry imports this module

        if self.architecture not in ARCHITECTURES:
            raise InvalidInputError(
                f"unknown SAE architecture {self.architecture!r}; valid: {', '.join(ARCHITECTURES)}"
            )
        self.dtype = dtype_name(self.dtype, kind="SAE dtype")
        if self.d_in <= 0 or self.d_sae <= 0:
            raise InvalidInputError(f"d_in and d_sae must be positive, got {self.d_in}, {self.d_sae}")
        if self.architecture in ("topk", "batchtopk", "matryoshka"):
            if self.k is None or not 0 < self.k <= self.d_sae:
                raise InvalidInputError(
                    f"{self.architecture} needs 0 < k <= d_sae ({self.d_sae}), got k={self.k}"
                )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SAEConfig:
        """Build from a dict, rejecting unknown keys with the list of valid ones."""
        return config_from_dict(cls, data, "SAE config")


class SAEOutput(NamedTuple):
    """Named outputs of `SAE.forward`."""

    x_hat: torch.Tensor  # [..., d_in]
    feature_acts: torch.Tensor  # [..., d_sae], the sparse code
    pre_acts: torch.Tensor  # [..., d_sae], before the sparsifying non-linearity


class SAE(nn.Module):
    """Base class: parameters, decode, forward; subclasses define `encode_pre` / `activate`."""

    def __init__(self, cfg: SAEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.W_enc = nn.Parameter(torch.empty(cfg.d_in, cfg.d_sae))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae))
        self.W_dec = nn.Parameter(torch.empty(cfg.d_sae, cfg.d_in))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_in))

    def _check_input(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.cfg.d_in:
            raise InvalidInputError(
                f"SAE expects inputs with last dimension d_in={self.cfg.d_in}, got shape {tuple(x.shape)}"
            )

    def encode_pre(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-activations `(x - b_dec) @ W_enc + b_enc`."""
        self._check_input(x)
        if self.cfg.apply_b_dec_to_input:
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        """The architecture's sparsifying non-linearity (inference behaviour)."""
        raise NotImplementedError

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Sparse feature activations `[..., d_sae]` for inputs `[..., d_in]`."""
        return self.activate(self.encode_pre(x))

    def decode(self, feature_acts: torch.Tensor) -> torch.Tensor:
        """Reconstruction `f @ W_dec + b_dec`."""
        return feature_acts @ self.W_dec + self.b_dec

    def forward(self, x: torch.Tensor) -> SAEOutput:
        pre = self.encode_pre(x)
        acts = self.activate(pre)
        return SAEOutput(self.decode(acts), acts, pre)
