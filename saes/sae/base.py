"""The common SAE config and interface shared by every architecture, and the registry of
architectures by name.

Shapes follow SAELens: `W_enc [d_in, d_sae]`, `b_enc [d_sae]`, `W_dec [d_sae, d_in]`,
`b_dec [d_in]`. `pre = (x - b_dec) @ W_enc + b_enc` (b_dec applied to the input),
`x_hat = f @ W_dec + b_dec`.

A transcoder (Dunefsky et al. 2024, "Transcoders Find Interpretable LLM Feature Circuits")
is an SAE of any architecture that reads one hook (`cfg.hook_name`) and predicts another
(`cfg.hook_name_out`, e.g. an MLP's input and output): `W_dec [d_sae, d_out]`,
`b_dec [d_out]` (the output bias, never subtracted from the input) and, with `cfg.skip`,
a linear skip connection `W_skip [d_in, d_out]`; `forward` returns the predicted output
`decode(encode(x)) + x @ W_skip`.

An architecture is one `SAE` subclass: it implements `activate` and `training_loss` and
declares, as class attributes, what the rest of the package needs to know about it (its
name, whether it needs `k`, what SAELens loads its export as, what the misload guard
checks). `register_architecture(cls)` makes `SAEConfig(architecture=cls.architecture)`
valid and buildable (`saes.sae.architectures` registers the built-in ones).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple, TypeVar, get_args

import torch
from torch import nn

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.sae.losses import StepInfo, TrainStep
from sae_atlas.store.dtypes import DTypeName, dtype_name

C = TypeVar("C")
SAELensArchitecture = Literal["standard", "topk", "jumprelu"]


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
    """Everything needed to rebuild an SAE; serialised into training.json and cfg.json.

    The per-architecture fields are read only by the architectures named beside them.
    """

    architecture: str  # a registered architecture (`architecture_names()`)
    d_in: int
    d_sae: int
    k: int | None = None  # architectures with `needs_k`: topk / batchtopk / matryoshka
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
    hook_name: str = ""  # the hook the SAE reads
    # transcoders (SAELens' transcoder names): the hook it writes, its width, a skip term
    hook_name_out: str = ""  # empty: an SAE, reconstructing its own input
    d_out: int | None = None  # None: d_in
    skip: bool = False
    context_size: int = 0
    prepend_bos: bool = True
    dataset_path: str = ""
    seed: int = 0

    def __post_init__(self) -> None:
        architecture = architecture_class(self.architecture)
        self.dtype = dtype_name(self.dtype, kind="SAE dtype")
        if self.d_in <= 0 or self.d_sae <= 0:
            raise InvalidInputError(f"d_in and d_sae must be positive, got {self.d_in}, {self.d_sae}")
        if architecture.needs_k and (self.k is None or not 0 < self.k <= self.d_sae):
            raise InvalidInputError(
                f"{self.architecture} needs 0 < k <= d_sae ({self.d_sae}), got k={self.k}"
            )
        if self.d_out is not None and self.d_out <= 0:
            raise InvalidInputError(f"d_out must be positive, got {self.d_out}")
        if not self.is_transcoder and (self.skip or self.output_dim != self.d_in):
            raise InvalidInputError(
                "skip and a d_out other than d_in are for transcoders: give hook_name_out, the hook it writes"
            )
        if self.is_transcoder and self.apply_b_dec_to_input:
            raise InvalidInputError(
                "a transcoder's b_dec is its output bias and is not subtracted from its input: "
                "set apply_b_dec_to_input=False"
            )

    @property
    def is_transcoder(self) -> bool:
        """It writes another hook than it reads (`hook_name_out` is set)."""
        return bool(self.hook_name_out)

    @property
    def output_dim(self) -> int:
        """Width of what it writes: `d_out`, or `d_in` when None."""
        return self.d_in if self.d_out is None else self.d_out

    @property
    def output_hook(self) -> str:
        """The hook it writes: `hook_name_out`, or `hook_name` for an SAE."""
        return self.hook_name_out or self.hook_name

    def to_dict(self) -> dict[str, Any]:
        """Every field; the transcoder fields only when set, so an SAE's dict (and the
        training records compared against it) is the same as before they existed."""
        data = dataclasses.asdict(self)
        for name in _TRANSCODER_FIELDS:
            if data[name] == _TRANSCODER_DEFAULTS[name]:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SAEConfig:
        """Build from a dict, rejecting unknown keys with the list of valid ones."""
        return config_from_dict(cls, data, "SAE config")


_TRANSCODER_FIELDS = ("hook_name_out", "d_out", "skip")
_TRANSCODER_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SAEConfig) if f.name in _TRANSCODER_FIELDS}


class SAEOutput(NamedTuple):
    """Named outputs of `SAE.forward`."""

    x_hat: torch.Tensor  # [..., d_out]: the reconstruction, or a transcoder's predicted output
    feature_acts: torch.Tensor  # [..., d_sae], the sparse code
    pre_acts: torch.Tensor  # [..., d_sae], before the sparsifying non-linearity


class SAE(nn.Module):
    """Base class: parameters, decode, forward; subclasses define `activate` and
    `training_loss` and declare the class attributes below."""

    architecture: ClassVar[str]
    """The name `SAEConfig.architecture` (and cfg.json / training.json) give it."""
    needs_k: ClassVar[bool] = False
    """`SAEConfig.k` is required, with `0 < k <= d_sae`."""
    saelens_architecture: ClassVar[SAELensArchitecture]
    """What SAELens loads the export as (`saes.formats.saelens`): "standard" for a ReLU code,
    "topk" for a per-token top-`cfg.k` code (written with `k`), "jumprelu" for a code that
    keeps the pre-activations above `self.threshold` (written as SAELens' `threshold`)."""
    has_threshold: ClassVar[bool] = False
    """Inference keeps latents above a learned `threshold` `[d_sae]`; the misload guard
    flags such an SAE firing densely (a lost threshold)."""
    k_is_mean_l0: ClassVar[bool] = False
    """Inference fires about `cfg.k` latents per token on average; the misload guard
    checks the measured L0 against it."""

    def __init__(self, cfg: SAEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.W_enc = nn.Parameter(torch.empty(cfg.d_in, cfg.d_sae))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae))
        self.W_dec = nn.Parameter(torch.empty(cfg.d_sae, cfg.output_dim))
        self.b_dec = nn.Parameter(torch.zeros(cfg.output_dim))
        if cfg.skip:
            self.W_skip = nn.Parameter(torch.zeros(cfg.d_in, cfg.output_dim))

    @property
    def is_transcoder(self) -> bool:
        """It predicts another hook (`cfg.hook_name_out`) from the one it reads."""
        return self.cfg.is_transcoder

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

    def training_loss(self, x: torch.Tensor, info: StepInfo, target: torch.Tensor | None = None) -> TrainStep:
        """The loss to back-propagate on a batch `x [B, d_in]`, its metrics (`mse`, `fvu`,
        `l0`, ...) and per-latent firing counts (`saes.sae.losses`). `target [B, d_out]` is
        what the output should be: `x` itself when None (an SAE), the output hook's
        activations at the same tokens for a transcoder."""
        raise NotImplementedError

    @torch.no_grad()
    def divide_thresholds(self, divisor: float) -> None:
        """Divide the learned activation thresholds by `divisor` (folding an input scale
        into the weights, `saes.train.scaling`); an SAE without thresholds has none."""

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Sparse feature activations `[..., d_sae]` for inputs `[..., d_in]`."""
        return self.activate(self.encode_pre(x))

    def decode(self, feature_acts: torch.Tensor) -> torch.Tensor:
        """Reconstruction `f @ W_dec + b_dec` (a transcoder's output without its skip term)."""
        return feature_acts @ self.W_dec + self.b_dec

    def skip_out(self, x: torch.Tensor) -> torch.Tensor:
        """The skip connection's part of the output, `x @ W_skip` (zeros without one)."""
        if self.cfg.skip:
            return x @ self.W_skip
        return x.new_zeros(*x.shape[:-1], self.cfg.output_dim)

    def with_skip(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`out + skip_out(x)`, adding nothing without a skip connection."""
        return out + x @ self.W_skip if self.cfg.skip else out

    def forward(self, x: torch.Tensor) -> SAEOutput:
        """Code and output of `x [..., d_in]`: the reconstruction of `x`, or for a
        transcoder its prediction of the output hook, `decode(code) + skip_out(x)`."""
        pre = self.encode_pre(x)
        acts = self.activate(pre)
        return SAEOutput(self.with_skip(self.decode(acts), x), acts, pre)


_REGISTERED: dict[str, type[SAE]] = {}


def register_architecture(cls: type[SAE]) -> type[SAE]:
    """Make `cls` the architecture named `cls.architecture` (InvalidInputError if the name is
    taken or a declaration is missing); returns `cls`."""
    name = getattr(cls, "architecture", None)
    if not (isinstance(cls, type) and issubclass(cls, SAE) and isinstance(name, str) and name):
        raise InvalidInputError(f"{cls!r} is not an SAE subclass declaring its `architecture` name")
    if name in _REGISTERED:
        raise InvalidInputError(f"SAE architecture {name!r} is already registered ({_REGISTERED[name].__name__})")
    if getattr(cls, "saelens_architecture", None) not in get_args(SAELensArchitecture):
        raise InvalidInputError(
            f"{cls.__name__} must declare saelens_architecture as one of {', '.join(get_args(SAELensArchitecture))}"
        )
    _REGISTERED[name] = cls
    return cls


def unregister_architecture(name: str) -> None:
    """Remove the architecture `name` from the registry (InvalidInputError if unknown)."""
    architecture_class(name)
    del _REGISTERED[name]


def architecture_names() -> tuple[str, ...]:
    """The registered architectures, in registration order."""
    return tuple(_REGISTERED)


def architecture_class(name: str) -> type[SAE]:
    """The `SAE` subclass registered as `name`; InvalidInputError naming the valid ones."""
    if name not in _REGISTERED:
        raise InvalidInputError(f"unknown SAE architecture {name!r}; valid: {', '.join(_REGISTERED)}")
    return _REGISTERED[name]
