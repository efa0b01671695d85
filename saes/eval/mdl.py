"""`mdl`: the description length of the SAE's codes, in bits per token, at its own error.

The "SAEs as lossy compression" view (Ayonrinde, Pearce & Sharkey 2024, "Interpretability
as Compression: Reconsidering SAE Explanations of Neural Activations with MDL-SAEs";
SAEBench's `mdl` eval computes the same quantity): a token's code is sent latent by
latent, and the cost is the entropy of what is sent. The coding scheme, exactly:

- Data: the first `n_tokens` held-out, non-BOS activation rows of the SAE's hook.
- Per latent `i`: whether it fires is one Bernoulli symbol with the empirical rate `p_i`
  (cost `H_b(p_i)` bits per token); when it fires, its value is sent as one of `B`
  equal-width bins spanning `[min_i, max_i]` of its non-zero values on the data, coded by
  the empirical bin frequencies (cost `H_i(B)` bits per firing).
- Description length `DL(B) = sum_i [H_b(p_i) + p_i * H_i(B)]` bits per token (entropy
  coding with the empirical distributions; the cost of sending the distributions
  themselves is not counted).
- Each sent value is decoded as its bin's midpoint; `fvu_quantized(B)` is the FVU of the
  decoder on those values. `B` is the smallest of `bin_counts` with
  `fvu_quantized(B) - fvu <= tolerance` (the codes at the SAE's own reconstruction error);
  when none is, the largest `B` is reported with `within_threshold` false.

Reported (category `mdl`): `description_length` (bits/token), `num_bins`,
`within_threshold`, `fvu`, `fvu_quantized`, `bits_firing` (the `H_b` part), `bits_values`
(the rest) and `l0`; the details list every `B` tried.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.eval.spec import EvalInputs, EvalOutcome, EvalSpec
from sae_atlas.saes.sae.base import SAE
from sae_atlas.store.activations import ActivationReader


@dataclass(frozen=True)
class MdlConfig:
    """Held-out tokens, the bin counts tried (ascending) and the FVU tolerance."""

    n_tokens: int = 16384
    bin_counts: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128, 256)
    tolerance: float = 0.01


@dataclass
class SparseCodes:
    """The non-zero code entries of `n` tokens (row-major) and the inputs they encode."""

    rows: torch.Tensor  # [nnz] int64
    cols: torch.Tensor  # [nnz] int64
    values: torch.Tensor  # [nnz] float64
    x_ND: torch.Tensor  # [n, d_in] float64
    d_sae: int

    @property
    def n(self) -> int:
        return self.x_ND.shape[0]


@torch.no_grad()
def sparse_codes(sae: SAE, rows_iter: Iterable[torch.Tensor], batch_size: int = 4096) -> SparseCodes:
    """Encode activation rows `[n, d_in]` with `sae` and keep only the non-zero entries."""
    rows, cols, values, xs, offset = [], [], [], [], 0
    for chunk in rows_iter:
        for x in chunk.split(batch_size):
            f = sae_codes(sae, x).double().cpu()
            r, c = f.nonzero(as_tuple=True)
            rows.append(r + offset)
            cols.append(c)
            values.append(f[r, c])
            xs.append(x.double().cpu())
            offset += x.shape[0]
    if offset == 0:
        raise InvalidInputError("no held-out tokens to measure the description length on")
    return SparseCodes(torch.cat(rows), torch.cat(cols), torch.cat(values), torch.cat(xs), sae.cfg.d_sae)


def binary_entropy(p: torch.Tensor) -> torch.Tensor:
    """`H_b(p)` in bits, 0 at p = 0 and p = 1."""
    q = p.clamp(1e-300, 1 - 1e-16)
    h = -(q * q.log2() + (1 - q) * (1 - q).log2())
    return torch.where((p <= 0) | (p >= 1), torch.zeros_like(p), h)


def fvu_of(codes: SparseCodes, values: torch.Tensor, W_dec_FD: torch.Tensor, b_dec_D: torch.Tensor) -> float:
    """FVU of decoding the entries `values` (at the codes' positions): SSE / (n * sum Var)."""
    f = torch.sparse_coo_tensor(torch.stack([codes.rows, codes.cols]), values, (codes.n, codes.d_sae),
                                check_invariants=False)
    x_hat = torch.sparse.mm(f, W_dec_FD) + b_dec_D
    variance = float(codes.x_ND.var(0, unbiased=False).sum())
    return float((codes.x_ND - x_hat).pow(2).sum()) / (codes.n * variance) if variance > 0 else float("nan")


def description_length(codes: SparseCodes, n_bins: int) -> tuple[float, float, torch.Tensor]:
    """`(bits_firing, bits_values, quantized values)` of the codes with `n_bins` bins per latent."""
    F = codes.d_sae
    fired = torch.bincount(codes.cols, minlength=F).double()
    lo = torch.full((F,), float("inf"), dtype=torch.float64).scatter_reduce(0, codes.cols, codes.values, "amin")
    hi = torch.full((F,), float("-inf"), dtype=torch.float64).scatter_reduce(0, codes.cols, codes.values, "amax")
    width = (hi - lo)[codes.cols]
    span = torch.where(width > 0, width, torch.ones_like(width))
    bucket = ((codes.values - lo[codes.cols]) / span * n_bins).floor().clamp(0, n_bins - 1).long()
    counts = torch.bincount(codes.cols * n_bins + bucket, minlength=F * n_bins).view(F, n_bins).double()
    probs = counts / fired.clamp_min(1)[:, None]
    value_bits = -(probs * torch.where(probs > 0, probs.log2(), torch.zeros_like(probs))).sum(1)
    p_fire = fired / codes.n
    quantized = lo[codes.cols] + (bucket.double() + 0.5) * torch.where(width > 0, width, torch.zeros_like(width)) / n_bins
    return float(binary_entropy(p_fire).sum()), float((p_fire * value_bits).sum()), quantized


def mdl_metrics(codes: SparseCodes, W_dec_FD: torch.Tensor, b_dec_D: torch.Tensor, config: MdlConfig) -> EvalOutcome:
    """The description length at the SAE's reconstruction error (see the module docstring)."""
    if not config.bin_counts or any(b < 1 for b in config.bin_counts):
        raise InvalidInputError(f"bin_counts must be positive integers, got {config.bin_counts}")
    W, b = W_dec_FD.double().cpu(), b_dec_D.double().cpu()
    fvu = fvu_of(codes, codes.values, W, b)
    tried = []
    for n_bins in sorted(config.bin_counts):
        bits_firing, bits_values, quantized = description_length(codes, n_bins)
        fvu_q = fvu_of(codes, quantized, W, b)
        tried.append({"num_bins": n_bins, "description_length": bits_firing + bits_values,
                      "bits_firing": bits_firing, "bits_values": bits_values, "fvu_quantized": fvu_q,
                      "within_threshold": fvu_q - fvu <= config.tolerance})
    chosen = next((row for row in tried if row["within_threshold"]), tried[-1])
    metrics = {**{key: chosen[key] for key in ("description_length", "num_bins", "within_threshold",
                                               "fvu_quantized", "bits_firing", "bits_values")},
               "fvu": fvu, "l0": codes.rows.numel() / codes.n}
    return EvalOutcome({"mdl": metrics}, tried)


def run_mdl(inputs: EvalInputs, config: MdlConfig) -> EvalOutcome:
    """Encode the held-out rows of the SAE's hook and measure the codes' description length."""
    reader = ActivationReader(inputs.atlas, inputs.hook)
    if reader.d != inputs.sae.cfg.d_in:
        raise InvalidInputError(f"SAE {inputs.sae_id!r} has d_in={inputs.sae.cfg.d_in} but its hook has d={reader.d}")
    rows = (r.acts for r in reader.rows("heldout", max_tokens=config.n_tokens))
    codes = sparse_codes(inputs.sae, rows)
    return mdl_metrics(codes, inputs.sae.W_dec.detach(), inputs.sae.b_dec.detach(), config)


MDL: EvalSpec[MdlConfig] = EvalSpec("mdl", "mdl", MdlConfig, run_mdl)
