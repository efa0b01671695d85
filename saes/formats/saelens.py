"""The SAELens on-disk layout: `cfg.json` + `sae_weights.safetensors` (+ `sparsity.safetensors`).

We write the SAELens 6 layout (top-level `d_in`, `d_sae`, `dtype`, `architecture`, ...,
provenance under `metadata`) so SAELens' `SAE.load_from_disk` reads our SAEs, and we
read folders written by SAELens, including pre-6 configs (provenance at the top level,
`hook_point`, `activation_fn_str="topk"` with `activation_fn_kwargs.k`, no
`architecture`). Each architecture declares the SAELens architecture it is exported as
(`SAE.saelens_architecture`: BatchTopK and Matryoshka SAEs as `jumprelu` with their
inference threshold); our own `SAEConfig`, the sha256 of every file we wrote and the
versions that wrote them live under the `sae_atlas` key, so our loader rebuilds the
original architecture exactly. State SAELens has no slot for (JumpReLU's trained
`log_threshold`) goes to `sae_atlas_extra.safetensors`, which SAELens ignores. SAELens
folders of its own three architectures (`standard`, `topk`, `jumprelu`) load as ours of
the same names.
Transcoders are written as SAELens' transcoder classes (`transcoder`, `skip_transcoder`,
`jumprelu_transcoder`: top-level `d_out`, `metadata.hook_name_out`, `W_skip` stored
`[d_out, d_in]` as SAELens holds it); those three load as our `standard` (with or without
skip) and `jumprelu` transcoders. A transcoder SAELens has no class for (TopK, or JumpReLU
with a skip connection) is written as `<architecture>_transcoder` for our loader only.
`metadata.sae_lens_version` is written as "6.0.0" (the layout version, needed by SAELens
to read nested metadata); `sae_lens_training_version` is null because SAELens did not
train the SAE.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any, get_args

import torch

from sae_atlas.errors import IntegrityError, InvalidInputError
from sae_atlas.saes.formats.assembly import (
    DTYPES,
    assemble_sae,
    check_d_in,
    dtype_name,
    fold_decoder_norms,
    fold_norm_scaling,
    make_config,
    read_config,
    read_safetensors,
    reject_unknown,
    state_shapes,
    take,
)
from sae_atlas.saes.sae.base import SAE, SAEConfig, SAELensArchitecture
from sae_atlas.store.atomic import atomic_path, atomic_write_json, sha256_file
from sae_atlas.store.integrity import cached_sha256
from sae_atlas.store.layout import created_with
from sae_atlas.store.safetensors_io import save_deterministic

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
SPARSITY_FILE = "sparsity.safetensors"
EXTRA_FILE = "sae_atlas_extra.safetensors"
OUR_KEY = "sae_atlas"
FORMAT_VERSION = 1
SAELENS_LAYOUT_VERSION = "6.0.0"
_CORE = ("W_enc", "b_enc", "W_dec", "b_dec")
_OURS_REPAIR = "retrain the SAE, or re-export it with saes.formats.saelens.save_saelens"
_FOREIGN_REPAIR = "re-download or re-export the SAE folder"


def _package_version() -> str | None:
    try:
        return importlib.metadata.version("sae-atlas")
    except importlib.metadata.PackageNotFoundError:
        return None


# SAELens' transcoder classes by (exported architecture, skip connection)
_SAELENS_TRANSCODERS = {("standard", False): "transcoder", ("standard", True): "skip_transcoder",
                        ("jumprelu", False): "jumprelu_transcoder"}
_FROM_SAELENS_TRANSCODER = {name: key for key, name in _SAELENS_TRANSCODERS.items()}


def exported_tensors(sae: SAE) -> dict[str, torch.Tensor]:
    """The SAELens tensors of `sae`: the four weights, plus `threshold` for a jumprelu export
    and `W_skip` (transposed to SAELens' `[d_out, d_in]`) for a skip transcoder."""
    tensors = {name: getattr(sae, name).detach() for name in _CORE}
    if sae.saelens_architecture == "jumprelu":
        tensors["threshold"] = sae.threshold.detach()
    if sae.cfg.skip:
        tensors["W_skip"] = sae.W_skip.detach().T.contiguous()
    return tensors


def saelens_architecture_name(sae: SAE) -> str:
    """The `architecture` written to cfg.json: SAELens' class for an SAE or transcoder."""
    if not sae.is_transcoder:
        return sae.saelens_architecture
    key = (sae.saelens_architecture, sae.cfg.skip)
    return _SAELENS_TRANSCODERS.get(key, f"{sae.cfg.architecture}_transcoder")


def _write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    with atomic_path(path) as tmp:
        save_deterministic(tensors, tmp, {"format": "pt"})
    return sha256_file(path)


def _saelens_cfg(sae: SAE, dtype: str) -> dict[str, Any]:
    cfg = sae.cfg
    architecture = sae.saelens_architecture
    out: dict[str, Any] = {
        "architecture": saelens_architecture_name(sae),
        "d_in": cfg.d_in,
        "d_sae": cfg.d_sae,
        "dtype": dtype,
        "device": "cpu",
        "apply_b_dec_to_input": cfg.apply_b_dec_to_input,
        "normalize_activations": "none",
        "reshape_activations": "none",
    }
    if architecture == "topk":
        out.update(k=cfg.k, rescale_acts_by_decoder_norm=False)
    if sae.is_transcoder:
        out["d_out"] = cfg.output_dim
    out["metadata"] = {
        "model_name": cfg.model_name or None,
        "hook_name": cfg.hook_name or None,
        "hook_head_index": None,
        **({"hook_name_out": cfg.hook_name_out, "hook_head_index_out": None} if sae.is_transcoder else {}),
        "context_size": cfg.context_size or None,
        "prepend_bos": cfg.prepend_bos,
        "dataset_path": cfg.dataset_path or None,
        "exclude_special_tokens": True,
        "sae_lens_version": SAELENS_LAYOUT_VERSION,
        "sae_lens_training_version": None,
    }
    return out


def save_saelens(sae: SAE, folder: Path, *, sparsity: torch.Tensor | None = None) -> None:
    """Write `sae` to `folder` in the SAELens layout (every file atomic, `cfg.json` last).

    `sparsity` is the per-latent firing density `[d_sae]` in [0, 1]; it is stored as
    SAELens' `sparsity = log10(density + 1e-10)`. Optional files a previous save left
    behind are removed, so the folder always describes exactly this SAE.
    """
    folder = Path(folder)
    cfg = sae.cfg
    dtype = str(sae.W_enc.dtype).removeprefix("torch.")
    exported = exported_tensors(sae)
    extra = {k: v.detach() for k, v in sae.state_dict().items() if k not in exported}
    optional: dict[str, dict[str, torch.Tensor] | None] = {EXTRA_FILE: extra or None, SPARSITY_FILE: None}
    if sparsity is not None:
        density = sparsity.detach().to("cpu", torch.float32)
        if tuple(density.shape) != (cfg.d_sae,) or density.min() < 0 or density.max() > 1:
            raise InvalidInputError(
                f"sparsity must be the per-latent firing density [d_sae={cfg.d_sae}] in [0, 1], "
                f"got shape {tuple(density.shape)}"
            )
        optional[SPARSITY_FILE] = {"sparsity": torch.log10(density + 1e-10)}
    sha = {WEIGHTS_FILE: _write_tensors(folder / WEIGHTS_FILE, exported)}
    for name, tensors in optional.items():
        if tensors is not None:
            sha[name] = _write_tensors(folder / name, tensors)
        elif (folder / name).exists():
            (folder / name).unlink()
    body = _saelens_cfg(sae, dtype)
    body[OUR_KEY] = {
        "format_version": FORMAT_VERSION,
        "sae_atlas_version": _package_version(),
        "sae_config": {**cfg.to_dict(), "dtype": dtype},
        "sha256": sha,
        "created_with": created_with(),
    }
    atomic_write_json(folder / CFG_FILE, body)


def _verify(folder: Path, sha: dict[str, str], name: str) -> None:
    path = folder / name
    if not path.is_file():
        raise IntegrityError(path, "file is missing", _OURS_REPAIR)
    if cached_sha256(path) != sha[name]:
        raise IntegrityError(path, f"sha256 does not match the one recorded in {CFG_FILE} "
                             "(the file is corrupt or was changed)", _OURS_REPAIR)


def _ours(raw: dict[str, Any], cfg_path: Path) -> tuple[SAEConfig, dict[str, str]]:
    ours = raw[OUR_KEY]
    try:
        cfg = SAEConfig.from_dict(ours["sae_config"])
        sha = {str(k): str(v) for k, v in ours["sha256"].items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise IntegrityError(cfg_path, f"malformed {OUR_KEY!r} section ({exc!r})", _OURS_REPAIR) from exc
    if WEIGHTS_FILE not in sha:
        raise IntegrityError(cfg_path, f"no sha256 recorded for {WEIGHTS_FILE}", _OURS_REPAIR)
    return cfg, sha


def _load_ours(folder: Path, raw: dict[str, Any]) -> tuple[SAEConfig, dict[str, torch.Tensor], Path]:
    cfg_path = folder / CFG_FILE
    cfg, sha = _ours(raw, cfg_path)
    _verify(folder, sha, WEIGHTS_FILE)
    weights_path = folder / WEIGHTS_FILE
    tensors = read_safetensors(weights_path, _OURS_REPAIR)
    if "W_skip" in tensors:  # stored as SAELens holds it, [d_out, d_in]
        tensors["W_skip"] = tensors["W_skip"].T
    extra: dict[str, torch.Tensor] = {}
    if EXTRA_FILE in sha:
        _verify(folder, sha, EXTRA_FILE)
        extra = read_safetensors(folder / EXTRA_FILE, _OURS_REPAIR)
    # every state entry the weights file has no slot for was saved in the extra file
    state = {name: take(tensors, [name], shape, weights_path, _OURS_REPAIR)
             for name, shape in state_shapes(cfg).items() if name not in extra}
    return cfg, {**state, **extra}, weights_path


def _meta_field(raw: dict[str, Any], *names: str, default: Any = None) -> Any:
    """A provenance field from `metadata` (SAELens 6), `meta`, or the top level (older)."""
    for section in (raw.get("metadata"), raw.get("meta"), raw):
        if isinstance(section, dict):
            for name in names:
                if section.get(name) is not None:
                    return section[name]
    return default


def _foreign_architecture(raw: dict[str, Any], cfg_path: Path) -> tuple[SAELensArchitecture, int | None]:
    """The SAELens architecture a SAELens cfg.json declares (pre-6 configs name a top-k SAE
    by its activation function; a transcoder class its SAE one) and its `k`."""
    activation = raw.get("activation_fn_str") or raw.get("activation_fn") or "relu"
    architecture = raw.get("architecture") or "standard"
    if architecture in _FROM_SAELENS_TRANSCODER:
        architecture = _FROM_SAELENS_TRANSCODER[architecture][0]
    if architecture == "standard" and activation == "topk":
        architecture = "topk"
    supported = get_args(SAELensArchitecture)
    if architecture not in supported:
        raise InvalidInputError(
            f"{cfg_path}: SAELens architecture {architecture!r} is not supported; "
            f"supported: {', '.join(supported)}"
        )
    if architecture == "standard" and activation != "relu":
        raise InvalidInputError(f"{cfg_path}: activation function {activation!r} is not supported")
    k = raw.get("k") or (raw.get("activation_fn_kwargs") or {}).get("k")
    if architecture == "topk" and k is None:
        raise IntegrityError(cfg_path, "a topk SAE without 'k'", _FOREIGN_REPAIR)
    return architecture, None if k is None else int(k)


def normalization(raw: dict[str, Any]) -> str:
    """The `normalize_activations` a SAELens config declares ('none' when absent; pre-6
    booleans read the way SAELens reads them: true is 'expected_average_only_in')."""
    value = raw.get("normalize_activations", "none")
    if value is True:
        return "expected_average_only_in"
    return "none" if value in (None, False, "none") else str(value)


def _check_supported(raw: dict[str, Any], cfg_path: Path, norm_scaling_factor: float | None) -> None:
    normalize = normalization(raw)
    if normalize == "expected_average_only_in" and norm_scaling_factor is None:
        raise InvalidInputError(
            f"{cfg_path}: normalize_activations='expected_average_only_in' scales inputs by a "
            "norm_scaling_factor (sqrt(d_in) / mean ||x|| of the training data) that the folder "
            "does not store; give it (a registry's norm_scaling_factor) or import into an atlas, "
            "which estimates it from the hook's activations"
        )
    if normalize not in ("none", "expected_average_only_in"):
        raise InvalidInputError(
            f"{cfg_path}: normalize_activations={normalize!r} rescales every token at run time, "
            "which cannot be folded into the weights; supported: 'none', 'expected_average_only_in'"
        )
    if raw.get("reshape_activations", "none") not in (None, "none"):
        raise InvalidInputError(
            f"{cfg_path}: reshape_activations={raw['reshape_activations']!r} is not supported "
            "(only SAEs on flat hooks, 'none')"
        )
    if _meta_field(raw, "hook_head_index", "hook_point_head_index") is not None:
        raise InvalidInputError(f"{cfg_path}: per-head SAEs (hook_head_index set) are not supported")


def _load_foreign(
    folder: Path, raw: dict[str, Any], norm_scaling_factor: float | None
) -> tuple[SAEConfig, dict[str, torch.Tensor], Path]:
    cfg_path = folder / CFG_FILE
    _check_supported(raw, cfg_path, norm_scaling_factor)
    architecture, k = _foreign_architecture(raw, cfg_path)
    transcoder = _FROM_SAELENS_TRANSCODER.get(raw.get("architecture", ""))
    try:
        d_in, d_sae = int(raw["d_in"]), int(raw["d_sae"])
        d_out = int(raw["d_out"]) if transcoder else d_in
    except (KeyError, TypeError, ValueError) as exc:
        raise IntegrityError(cfg_path, f"needs integer 'd_in' and 'd_sae' (and 'd_out' for a transcoder) "
                             f"({exc!r})", _FOREIGN_REPAIR) from exc
    hook_out = str(_meta_field(raw, "hook_name_out", default="")) if transcoder else ""
    if transcoder and not hook_out:
        raise IntegrityError(cfg_path, "a transcoder without 'hook_name_out' (the hook it writes)", _FOREIGN_REPAIR)
    cfg = make_config(
        cfg_path,
        architecture=architecture,  # SAELens' own architectures are ours of the same names
        d_in=d_in,
        d_sae=d_sae,
        k=k,
        apply_b_dec_to_input=bool(raw.get("apply_b_dec_to_input", not transcoder)),
        dtype=dtype_name(raw.get("dtype", "float32"), cfg_path),
        model_name=str(_meta_field(raw, "model_name", default="")),
        hook_name=str(_meta_field(raw, "hook_name", "hook_point", default="")),
        hook_name_out=hook_out,
        d_out=d_out if transcoder else None,
        skip=bool(transcoder and transcoder[1]),
        context_size=int(_meta_field(raw, "context_size", default=0)),
        prepend_bos=bool(_meta_field(raw, "prepend_bos", default=True)),
        dataset_path=str(_meta_field(raw, "dataset_path", default="")),
    )
    weights_path = folder / WEIGHTS_FILE
    tensors = read_safetensors(weights_path, _FOREIGN_REPAIR)
    known = {*_CORE, "scaling_factor", "finetuning_scaling_factor"}
    if architecture == "jumprelu":
        known |= {"threshold", "log_threshold"}
    if cfg.skip:
        known.add("W_skip")
    reject_unknown(tensors, known, weights_path)
    shapes = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_out), "b_dec": (d_out,)}
    state = {n: take(tensors, [n], shapes[n], weights_path, _FOREIGN_REPAIR).float() for n in _CORE}
    if cfg.skip:
        state["W_skip"] = take(tensors, ["W_skip"], (d_out, d_in), weights_path, _FOREIGN_REPAIR).float().T
    scale_names = [n for n in ("scaling_factor", "finetuning_scaling_factor") if n in tensors]
    if scale_names:  # old SAELens: decode(f * scale) -> fold the scale into W_dec rows
        scale = take(tensors, scale_names, (d_sae,), weights_path, _FOREIGN_REPAIR).float()
        state["W_dec"] = state["W_dec"] * scale[:, None]
    if architecture == "jumprelu":
        if "log_threshold" in tensors:
            state["log_threshold"] = take(tensors, ["log_threshold"], (d_sae,), weights_path, _FOREIGN_REPAIR)
        else:
            threshold = take(tensors, ["threshold"], (d_sae,), weights_path, _FOREIGN_REPAIR).float()
            state["log_threshold"] = threshold.clamp_min(0).log()  # a threshold <= 0 acts as 0 after relu
    if architecture == "topk" and raw.get("rescale_acts_by_decoder_norm"):
        state = fold_decoder_norms(state, ["W_enc", "b_enc"])
    if normalization(raw) == "expected_average_only_in":
        state = fold_norm_scaling(state, float(norm_scaling_factor))
    return cfg, state, weights_path


def load_saelens(
    folder: str | Path,
    *,
    expected_d_in: int | None = None,
    device: str | torch.device = "cpu",
    native: bool = True,
    norm_scaling_factor: float | None = None,
) -> SAE:
    """Load an SAE folder in the SAELens layout (ours or SAELens'), in eval mode.

    A folder we wrote is checked against its recorded sha256s and rebuilt as its original
    architecture; `native=False` ignores our section and reads it the way SAELens would
    (BatchTopK / Matryoshka then load as the exported JumpReLU). `expected_d_in` is the
    target hook's d_model (InvalidInputError on mismatch). A SAELens SAE with
    `normalize_activations="expected_average_only_in"` needs `norm_scaling_factor`, which is
    folded into its weights. Missing, truncated or inconsistent files raise IntegrityError
    naming the file.
    """
    folder = Path(folder)
    raw = read_config(folder / CFG_FILE, _FOREIGN_REPAIR)
    if native and OUR_KEY in raw:
        cfg, state, weights_path = _load_ours(folder, raw)
        repair = _OURS_REPAIR
    else:
        cfg, state, weights_path = _load_foreign(folder, raw, norm_scaling_factor)
        repair = _FOREIGN_REPAIR
    if cfg.dtype not in DTYPES:
        raise InvalidInputError(f"{folder / CFG_FILE}: unsupported dtype {cfg.dtype!r}")
    sae = assemble_sae(cfg, state, weights_path, repair, device)
    return check_d_in(sae, expected_d_in, folder / CFG_FILE)


def relink_weights(folder: str | Path, target: str | Path) -> None:
    """Make `folder`'s weights file a symbolic link to `target` (a file holding the same
    tensors) and record the linked file's sha256 in `cfg.json`, so reads stay verified."""
    folder, target = Path(folder), Path(target).resolve()
    raw = read_config(folder / CFG_FILE, _OURS_REPAIR)
    _ours(raw, folder / CFG_FILE)
    link = folder / WEIGHTS_FILE
    tmp = folder / f".{WEIGHTS_FILE}.link"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    tmp.replace(link)
    raw[OUR_KEY]["sha256"][WEIGHTS_FILE] = sha256_file(target)
    atomic_write_json(folder / CFG_FILE, raw)


def true_architecture(raw: dict[str, Any]) -> str | None:
    """The architecture of the SAE a `cfg.json` describes: ours from the `sae_atlas` section
    (the SAELens field is what it is exported as, e.g. `jumprelu` for BatchTopK), else SAELens'."""
    ours = raw.get(OUR_KEY)
    if isinstance(ours, dict) and isinstance(ours.get("sae_config"), dict):
        return ours["sae_config"].get("architecture") or raw.get("architecture")
    return raw.get("architecture")
