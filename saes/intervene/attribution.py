"""Attribution of a target to the features of spliced SAEs: activation x gradient.

One forward and one backward pass. The model is linearised around the prompt (attention
patterns, norm scales and MLP gates frozen at their values; non-gated MLPs keep their
activation's ratio `act(z) / z`), which changes no value but makes the target an affine
function of the residual stream at every spliced hook. At a hook with SAE output
`x = f W_dec + b_dec + err`, the target then splits exactly into

    sum_i f_i (W_dec[i] . g)  +  err . g  +  b_dec . g  +  (model biases after the hook)
                             +  (the target's offset: 0 for logits, the entropy for the loss)

with `g` the gradient at the hook. Each SAE's parts are checked against the target
(`completeness`, within `atol + rtol |target|`). The gradient reaches earlier hooks
through the model itself (the splice adds `decode(f) - decode(f).detach()`), so each
SAE's attributions are computed in the same pass.

Features are ranked without the BOS position (SAEs are trained without it; its nodes
still count towards completeness). With `mode="gradient"` nothing is frozen: the attributions are the model's own first-order
estimates (on SmolLM2 they track the ablation effects much better, see the README) but
the parts no longer sum to the target, which the completeness check then reports.

The top features' attributions are then compared with their true ablation effect
(target with the feature set to zero at every position, error term kept): Pearson and
Spearman correlation and the share of matching signs.
"""

from __future__ import annotations

import re
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import polars as pl
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.encoding.codes import sae_codes
from sae_atlas.saes.encoding.tokens import decoded_tokens
from sae_atlas.saes.hook_fns import in_residual
from sae_atlas.saes.intervene.edits import AblateEdit, compile_edit
from sae_atlas.saes.intervene.splice import Splice, run_spliced
from sae_atlas.saes.models import ModelHandle

ATOL, RTOL = 1e-3, 1e-3
AttributionMode = Literal["linearized", "gradient"]
_LAYER = re.compile(r"\.(?:h|layers|blocks)\.(\d+)\.")
_UPSTREAM = ("embed", "wte", "wpe")


TokenRef = str | int
"""A token: a string that should be exactly one token, or an id."""


@dataclass(frozen=True)
class Target:
    """What to attribute: a token's logit, a logit difference `token - other`, or the
    mean next-token loss over the prompt. Logit targets read the prediction at `position`
    (`api.operations.interventions.AttributionTarget` validates a JSON target into one)."""

    kind: Literal["logit", "logit_diff", "loss"] = "logit"
    token: TokenRef | None = None
    other: TokenRef | None = None
    position: int = -1

    def __post_init__(self) -> None:
        if self.kind not in ("logit", "logit_diff", "loss"):
            raise InvalidInputError(f"unknown target kind {self.kind!r}; valid: logit, logit_diff, loss")
        if self.kind != "loss" and self.token is None:
            raise InvalidInputError(f"a {self.kind} target needs a token")
        if self.kind == "logit_diff" and self.other is None:
            raise InvalidInputError("a logit_diff target needs 'other', the token to subtract")
        if any(t == "" for t in (self.token, self.other)):
            raise InvalidInputError("a target token must be a non-empty string or a token id")


def token_id(tokenizer: Any, token: str | int) -> int:
    """A token id from an id or a string that is exactly one token."""
    if isinstance(token, int):
        if not 0 <= token < len(tokenizer):
            raise InvalidInputError(f"token id {token} is outside the vocabulary (0..{len(tokenizer) - 1})")
        return token
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise InvalidInputError(f"target {token!r} is {len(ids)} tokens {ids}; give exactly one token")
    return int(ids[0])


def target_fn(tokenizer: Any, target: Target, token_ids_T: torch.Tensor) -> Any:
    """A function `logits [T, V] -> (linear part, offset)` for `target` on this sequence:
    the target's value is their sum, and the linear part's gradient is the target's. For
    logits the offset is 0; for the loss `-l_y + lse(l) = -l_y + sum_v p_v l_v + H(p)`
    with `p` frozen, so the offset is the mean entropy `H` of the predictions."""
    n = len(token_ids_T)
    if target.kind == "loss":
        if n < 2:
            raise InvalidInputError("the loss target needs at least two tokens")
        nxt = token_ids_T[1:]

        def loss(lg: torch.Tensor) -> tuple[torch.Tensor, float]:
            lg = lg[:-1].float()
            logp = torch.log_softmax(lg, -1)
            p = logp.exp().detach()
            linear = (-lg.gather(1, nxt[:, None])[:, 0] + (p * lg).sum(1)).mean()
            return linear, float(-(p * logp.detach()).sum(1).mean())

        return loss
    if not -n <= target.position < n:
        raise InvalidInputError(f"target position {target.position} is outside the {n} tokens")
    pos, a = target.position, token_id(tokenizer, target.token)
    if target.kind == "logit":
        return lambda lg: (lg[pos, a], 0.0)
    b = token_id(tokenizer, target.other)
    return lambda lg: (lg[pos, a] - lg[pos, b], 0.0)


def linearizing_hooks(handle: ModelHandle) -> list[tuple[str, Any]]:
    """Forward hooks that freeze attention patterns, norm scales and MLP gates (values
    unchanged, gradients through them cut; see the module docstring)."""
    names = set(handle.hook_names)

    def detach(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
        return act.detach()

    hooks = [(n, detach) for n in sorted(names) if n.endswith(("attn.hook_pattern", "hook_scale", "mlp.gate.hook_out"))]
    for layer in range(handle.n_layers):
        pre, post = f"blocks.{layer}.mlp.hook_pre", f"blocks.{layer}.mlp.hook_post"
        if f"blocks.{layer}.mlp.gate.hook_out" in names or not {pre, post} <= names:
            continue
        seen: dict[str, torch.Tensor] = {}

        def keep(act: torch.Tensor, hook: Any = None, seen: dict = seen) -> torch.Tensor:
            seen["z"] = act
            return act

        def ratio(act: torch.Tensor, hook: Any = None, seen: dict = seen) -> torch.Tensor:
            z = seen.pop("z")
            r = torch.where(z.abs() > 1e-6, act / torch.where(z.abs() > 1e-6, z, 1.0), 0.5).detach()
            return act.detach() + (z - z.detach()) * r

        hooks += [(pre, keep), (post, ratio)]
    return hooks


def _param_layer(name: str) -> float:
    m = _LAYER.search(name)
    if m:
        return int(m.group(1))
    return -1 if any(u in name for u in _UPSTREAM) else float("inf")


@contextmanager
def _only_biases_need_grad(model: Any) -> Any:
    saved = {p: p.requires_grad for p in model.parameters()}
    biases = {n: p for n, p in model.named_parameters() if n.endswith("bias") or n.split(".")[-1].startswith("b_")}
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        for p in biases.values():
            p.grad = None
            p.requires_grad_(True)
        yield biases
    finally:
        for p, flag in saved.items():
            p.requires_grad_(flag)
            p.grad = None


@dataclass
class Attribution:
    """Attribution of one target on one prompt (see the module docstring)."""

    tokens: list[str]
    target: dict[str, Any]
    total: float
    features: pl.DataFrame  # sae_id, feature, attribution (summed over positions), max_act, top_position
    token_attr: dict[str, list[float]]  # sae_id -> per-position sum of feature attributions
    token_error: dict[str, list[float]]  # sae_id -> per-position error-node attribution
    parts: list[dict[str, Any]]  # per SAE: features, error, sae_bias, model_bias, sum, total, ok
    verification: list[dict[str, Any]]  # top features: attribution vs ablation effect
    agreement: dict[str, float]
    tolerance: dict[str, float]
    mode: str = "linearized"

    @property
    def complete(self) -> bool:
        return all(p["ok"] for p in self.parts)


def _agreement(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    if len(a) < 2:
        signs = float(np.mean(np.sign(a) == np.sign(b))) if len(a) else float("nan")
        return {"pearson": float("nan"), "spearman": float("nan"), "sign_agreement": signs}

    def corr(x: np.ndarray, y: np.ndarray) -> float:
        return float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else float("nan")

    rank = lambda v: np.argsort(np.argsort(v)).astype(float)  # noqa: E731
    return {"pearson": corr(a, b), "spearman": corr(rank(a), rank(b)),
            "sign_agreement": float(np.mean(np.sign(a) == np.sign(b)))}


def attribute(
    handle: ModelHandle,
    token_ids_T: torch.Tensor,
    splice: Splice,
    target: Target,
    *,
    top: int = 20,
    verify: int = 5,
    mode: AttributionMode = "linearized",
) -> Attribution:
    """Attribute `target` to the features of the SAEs in `splice` (its edits are ignored:
    attribution explains the clean model); verify the `verify` largest by ablation. `mode`
    "linearized" freezes the nonlinearities (parts sum to the target); "gradient" uses the
    model's own gradient (no completeness, often closer to the ablation effects)."""
    if not splice.saes:
        raise InvalidInputError("attribution needs at least one spliced SAE")
    for h, _ in splice.saes.values():
        handle.check_hook(h)
    fn = target_fn(handle.tokenizer, target, token_ids_T)
    leaves: dict[str, dict[str, torch.Tensor]] = {}

    def splice_hook(name: str) -> Any:
        def f_hook(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
            out = act
            for sid, (h, sae) in splice.saes.items():
                if h != name:
                    continue
                x = act.to(sae.W_dec.dtype)
                f = sae_codes(sae, x).detach().requires_grad_(True)
                rec = sae.decode(f)
                leaves[sid] = {"f": f, "err": (x - rec).detach()}
                out = out + (rec - rec.detach()).to(act.dtype)
            if out is act:
                return act
            out.register_hook(lambda g: leaves.setdefault("grad:" + name, {}).update(g=g.detach()))
            return out

        return f_hook

    hooks = (linearizing_hooks(handle) if mode == "linearized" else []) + [(h, splice_hook(h)) for h in dict.fromkeys(h for h, _ in splice.saes.values())]
    with torch.enable_grad(), _only_biases_need_grad(handle.bridge) as biases, warnings.catch_warnings():
        # freezing a norm scale is meant to edit it (TransformerLens warns about any such edit)
        warnings.filterwarnings("ignore", message="A forward hook edited hook_scale")
        logits = handle.bridge.run_with_hooks(token_ids_T[None], fwd_hooks=in_residual(handle.bridge, hooks))[0]
        value, offset = fn(logits)
        value.backward()
        bias_terms = [(_param_layer(n), float((p.detach() * p.grad).sum()))
                      for n, p in biases.items() if p.grad is not None]
    total = float(value.detach()) + offset
    # SAEs are trained without the BOS position (its activations are outliers): its nodes
    # count towards completeness but are not ranked, verified or edited
    start = int(handle.bos_token_id is not None and int(token_ids_T[0]) == handle.bos_token_id)
    tol = ATOL + RTOL * abs(total)
    parts, rows, token_attr, token_error = [], [], {}, {}
    for sid, (hook, sae) in splice.saes.items():
        f, err = leaves[sid]["f"], leaves[sid]["err"][0]
        g = leaves["grad:" + hook]["g"][0].to(f.dtype)
        attr_TF = (f.detach() * f.grad)[0]
        layer = handle.hook_layer(hook) + (-0.5 if hook.endswith("hook_resid_pre") else 0.5)
        model_bias = sum(v for ly, v in bias_terms if ly > layer)
        row = {"sae_id": sid, "hook": hook, "features": float(attr_TF.sum()), "error": float((err * g).sum()),
               "sae_bias": float((sae.b_dec.detach() * g).sum()), "model_bias": float(model_bias),
               "target_offset": offset}
        row["sum"] = row["features"] + row["error"] + row["sae_bias"] + row["model_bias"] + offset
        row.update(total=total, abs_diff=abs(row["sum"] - total), ok=abs(row["sum"] - total) <= tol)
        parts.append(row)
        token_attr[sid] = attr_TF.sum(1).tolist()
        token_error[sid] = (err * g).sum(1).tolist()
        ranked, codes = attr_TF[start:], f.detach()[0, start:]
        per_feat = ranked.sum(0)
        order = per_feat.abs().argsort(descending=True)[:top]
        for i in order.tolist():
            if codes[:, i].abs().max() == 0:
                continue
            rows.append({"sae_id": sid, "feature": i, "attribution": float(per_feat[i]),
                         "max_act": float(codes[:, i].max()), "top_position": start + int(ranked[:, i].abs().argmax())})
    features = pl.DataFrame(rows, schema={"sae_id": pl.String, "feature": pl.Int64, "attribution": pl.Float64,
                                          "max_act": pl.Float64, "top_position": pl.Int64})
    features = features.sort(pl.col("attribution").abs(), descending=True).head(top)
    verification = _verify(handle, token_ids_T, splice, fn, total, features.head(verify), start)
    agreement = _agreement(np.array([v["attribution"] for v in verification]),
                           np.array([v["ablation_effect"] for v in verification]))
    tokens = decoded_tokens(handle.tokenizer, token_ids_T.tolist())
    return Attribution(tokens, asdict(target), total, features, token_attr, token_error, parts,
                       verification, agreement, {"atol": ATOL, "rtol": RTOL}, mode)


def _verify(
    handle: ModelHandle, token_ids_T: torch.Tensor, splice: Splice, fn: Any, total: float, top: pl.DataFrame, start: int
) -> list[dict[str, Any]]:
    """Each top feature's attribution next to `target(clean) - target(feature ablated)`
    (ablated at every position from `start`)."""
    out = []
    everywhere = torch.arange(len(token_ids_T)) >= start
    bare = Splice(dict(splice.saes))
    for row in top.iter_rows(named=True):
        hook, sae = splice.saes[row["sae_id"]]
        edit = compile_edit(AblateEdit(sae=row["sae_id"], feature=row["feature"]), everywhere, sae=sae, hook=hook)
        run = run_spliced(handle, token_ids_T, Splice(bare.saes, [edit]))
        out.append({**row, "ablation_effect": total - sum(map(float, fn(run.logits_TV)))})
    return out
