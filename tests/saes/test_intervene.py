"""Splice, edits, generation and attribution on tiny models with planted structure."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.intervene.attribution import Target, attribute
from sae_atlas.saes.intervene.edits import (
    AblateEdit,
    CirclePlane,
    ClampEdit,
    ProjectOutEdit,
    RotateEdit,
    ScaleEdit,
    SteerEdit,
    TokenMatch,
    compile_edit,
    resolve_positions,
)
from sae_atlas.saes.intervene.generate import compare, distribution_shift
from sae_atlas.saes.intervene.splice import Splice, run_spliced
from sae_atlas.saes.models import tiny_model
from sae_atlas.saes.sae.architectures import ARCHITECTURES, build_sae
from sae_atlas.saes.sae.base import SAEConfig

TEXT = "the cat sat on the mat and the dog ran"


@pytest.fixture(scope="module")
def handle():
    return tiny_model(n_layers=3, seed=1)


@pytest.fixture(scope="module")
def tokens(handle):
    return handle.to_tokens(TEXT)[0]


def _clean_logits(handle, tokens):
    with torch.inference_mode():
        return handle.bridge(tokens[None])[0].float()


def _capture(handle, tokens, hook):
    got = {}

    def keep(act, hook=None):
        got["x"] = act[0].detach().clone()
        return act

    with torch.inference_mode():
        handle.bridge.run_with_hooks(tokens[None], fwd_hooks=[(hook, keep)])
    return got["x"].float().clone()  # a normal tensor (outside inference mode)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_splice_without_edits_reproduces_logits(handle, tokens, arch):
    hook = "blocks.1.hook_resid_post"
    cfg = SAEConfig(architecture=arch, d_in=handle.d_model, d_sae=64, k=8, hook_name=hook, seed=3,
                    jumprelu_init_threshold=0.01)
    sae = build_sae(cfg).eval()
    with torch.no_grad():  # an encoder bias that makes features fire, so the SAE is in the path
        sae.b_enc.fill_(0.05)
    run = run_spliced(handle, tokens, Splice({"s": (hook, sae)}))
    clean = _clean_logits(handle, tokens)
    assert float((run.logits_TV - clean).abs().max()) <= 1e-4
    x = _capture(handle, tokens, hook)
    assert torch.allclose(run.codes["s"], sae.encode(x), atol=1e-5)
    firing = int(run.codes["s"][-1].argmax())
    assert run.codes["s"][-1, firing] > 0
    # the code really flows: zeroing a firing feature changes the logits
    edit = compile_edit(ScaleEdit(sae="s", feature=firing, factor=0.0), torch.ones(len(tokens), dtype=torch.bool),
                        sae=sae, hook=hook)
    edited = run_spliced(handle, tokens, Splice({"s": (hook, sae)}, [edit]))
    assert float((edited.logits_TV[-1] - clean[-1]).abs().max()) > 1e-4


# ---------------------------------------------------------------- planted feature

TARGET = 7  # the output token the planted feature promotes


@pytest.fixture(scope="module")
def planted(handle, tokens):
    """An SAE at the last residual stream whose feature 0 writes the direction that raises
    logit[TARGET] most (w * W_U[:, TARGET], normalised) and fires at `f0 = x.d + 2`;
    features 1..7 are random directions with small activations."""
    hook = f"blocks.{handle.n_layers - 1}.hook_resid_post"
    D = handle.d_model
    cfg = SAEConfig(architecture="standard", d_in=D, d_sae=8, hook_name=hook, apply_b_dec_to_input=False)
    sae = build_sae(cfg).eval()
    w = handle.final_norm_weight.float()
    d = w * handle.W_U[:, TARGET].detach().float()
    d = d / d.norm()
    g = torch.Generator().manual_seed(5)
    others = torch.randn(7, D, generator=g)
    others = others / others.norm(dim=1, keepdim=True)
    with torch.no_grad():
        sae.W_dec.copy_(torch.cat([d[None], others]))
        sae.W_enc.copy_(sae.W_dec.T)
        sae.b_enc.copy_(torch.tensor([2.0] + [0.05] * 7))
        sae.b_dec.zero_()
    return hook, sae, d


def _hand_logit(handle, x_D: torch.Tensor) -> float:
    """logit[TARGET] of a final residual vector: RMS norm (weight w) then W_U."""
    eps = float(getattr(handle.bridge.cfg, "eps", 1e-6))
    w = handle.final_norm_weight.float()
    normed = x_D / torch.sqrt((x_D ** 2).mean() + eps) * w
    return float(normed @ handle.W_U[:, TARGET].detach().float())


def test_planted_feature_steer_clamp_ablate_match_hand_computation(handle, tokens, planted):
    hook, sae, d = planted
    x = _capture(handle, tokens, hook)[-1]
    f0 = float(x @ d + 2.0)
    assert f0 > 0
    assert _hand_logit(handle, x) == pytest.approx(float(_clean_logits(handle, tokens)[-1, TARGET]), abs=1e-4)
    last = resolve_positions("last", [], len(tokens), len(tokens))
    cases = [
        (SteerEdit(sae="p", feature=0, alpha=3.0, at="last"), x + 3.0 * d),
        (ClampEdit(sae="p", feature=0, value=10.0, at="last"), x + (10.0 - f0) * d),
        (AblateEdit(sae="p", feature=0, at="last"), x - f0 * d),
        (ScaleEdit(sae="p", feature=0, factor=2.5, at="last"), x + 1.5 * f0 * d),
    ]
    base = _hand_logit(handle, x)
    for spec, x_new in cases:
        edit = compile_edit(spec, last, sae=sae, hook=hook)
        got = float(run_spliced(handle, tokens, Splice({"p": (hook, sae)}, [edit])).logits_TV[-1, TARGET])
        want = _hand_logit(handle, x_new)
        assert got == pytest.approx(want, abs=1e-4), spec.kind
        assert abs(want - base) > 0.05, spec.kind  # each edit really moves the token
    # steering raises the target and ablation lowers it
    assert _hand_logit(handle, x + 3.0 * d) > base > _hand_logit(handle, x - f0 * d)


def test_attribution_ranks_planted_feature_first_and_is_complete(handle, tokens, planted):
    hook, sae, d = planted
    result = attribute(handle, tokens, Splice({"p": (hook, sae)}), Target(kind="logit", token=TARGET), verify=4)
    top = result.features.row(0, named=True)
    assert (top["sae_id"], top["feature"]) == ("p", 0)
    assert result.complete
    part = result.parts[0]
    assert part["sum"] == pytest.approx(result.total, abs=1e-3)
    # by hand: the last position's attribution is f0 * (d . w * W_U[:, T]) / rms(x)
    x = _capture(handle, tokens, hook)[-1].detach()
    eps = float(getattr(handle.bridge.cfg, "eps", 1e-6))
    g_D = handle.final_norm_weight.float() * handle.W_U[:, TARGET].detach().float() / torch.sqrt((x ** 2).mean() + eps)
    with torch.no_grad():
        want = float(sae.encode(x) @ (sae.W_dec @ g_D))
    assert result.token_attr["p"][-1] == pytest.approx(want, rel=1e-3)
    ver = result.verification[0]
    assert ver["feature"] == 0 and np.sign(ver["ablation_effect"]) == np.sign(ver["attribution"]) > 0
    assert result.agreement["sign_agreement"] >= 0.75


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_attribution_completeness_across_layers(arch):
    h = tiny_model(arch=arch, n_layers=3, seed=2)
    toks = h.to_tokens(TEXT)[0]
    with torch.no_grad():  # model biases after a hook are counted too (GPT-2 has them)
        for name, p in h.bridge.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.05)
    saes = {}
    for i, a in enumerate(["standard", "topk", "jumprelu"]):
        cfg = SAEConfig(architecture=a, d_in=h.d_model, d_sae=48, k=6, hook_name=f"blocks.{i}.hook_resid_post",
                        seed=i, jumprelu_init_threshold=0.01)
        sae = build_sae(cfg).eval()
        with torch.no_grad():
            sae.b_dec.normal_(0, 0.1)  # a decoder bias to count
            sae.b_enc.fill_(0.05)
        saes[a] = (cfg.hook_name, sae)
    for target in (Target(kind="logit_diff", token=5, other=9), Target(kind="loss")):
        result = attribute(h, toks, Splice(saes), target, verify=3)
        assert result.complete, result.parts
        assert all(abs(p["sae_bias"]) > 0 for p in result.parts)
        assert (abs(result.parts[0]["model_bias"]) > 0) == (arch == "gpt2")
        assert len(result.verification) == 3


def test_attribution_rejects_bad_targets(handle, tokens, planted):
    hook, sae, _ = planted
    sp = Splice({"p": (hook, sae)})
    with pytest.raises(InvalidInputError, match="exactly one token"):
        attribute(handle, tokens, sp, Target(kind="logit", token="the cat"))
    with pytest.raises(InvalidInputError, match="needs 'other'"):
        Target(kind="logit_diff", token=5)
    with pytest.raises(InvalidInputError, match="logit target needs a token"):
        Target(kind="logit")
    with pytest.raises(InvalidInputError, match="non-empty string"):
        Target(token="")
    with pytest.raises(InvalidInputError, match="outside"):
        attribute(handle, tokens, sp, Target(kind="logit", token=5, position=99))


# ---------------------------------------------------------------- edits


def test_positions():
    toks = ["<s>", "the", "Ġcat", "Ġsat", "Ġcat"]
    assert resolve_positions("last", toks, 5, 7).tolist() == [0, 0, 0, 0, 1, 0, 0]
    assert resolve_positions("all", toks, 5, 7).all()
    assert resolve_positions([1, -1], toks, 5, 5).tolist() == [0, 1, 0, 0, 1]
    assert resolve_positions(TokenMatch(match=" cat"), [t.replace("Ġ", " ") for t in toks], 5, 5).tolist() == [
        0, 0, 1, 0, 1]
    with pytest.raises(InvalidInputError, match="no prompt token matches"):
        resolve_positions(TokenMatch(match="dog"), toks, 5, 5)
    with pytest.raises(InvalidInputError, match="outside the prompt"):
        resolve_positions([9], toks, 5, 5)


def test_project_out_removes_the_span(handle, tokens, planted):
    hook, sae, _ = planted
    edit = compile_edit(ProjectOutEdit(sae="p", features=[0, 1, 2]), torch.ones(len(tokens), dtype=torch.bool),
                        sae=sae, hook=hook)
    x = torch.randn(len(tokens), handle.d_model)
    out = edit.apply_output(x)
    assert float((out @ sae.W_dec[:3].detach().T).abs().max()) < 1e-4
    resid = x - out  # only the span was removed
    Q, _ = torch.linalg.qr(sae.W_dec[:3].detach().T)
    assert torch.allclose(resid, (x @ Q) @ Q.T, atol=1e-5)


def test_feature_index_out_of_range(planted):
    hook, sae, _ = planted
    with pytest.raises(InvalidInputError, match="out of range"):
        compile_edit(SteerEdit(sae="p", feature=8, alpha=1.0), torch.ones(3, dtype=torch.bool), sae=sae, hook=hook)


def _plane(D=6, period=7):
    rng = np.random.default_rng(0)
    U, _ = np.linalg.qr(rng.normal(size=(D, 2)))
    return CirclePlane("h", period, rng.normal(size=D), U, np.array([[2.0, 0.3], [-0.4, 1.5]]), np.array([0.2, -0.1]))


def test_rotate_moves_points_on_the_fitted_circle_by_k_steps():
    plane = _plane()
    angles = 2 * np.pi * np.arange(7) / 7
    coords = np.c_[np.cos(angles), np.sin(angles)] @ plane.A_22.T + plane.c0_2
    off = np.random.default_rng(1).normal(size=(7, 6))
    off -= (off @ plane.basis_D2) @ plane.basis_D2.T  # out-of-plane part, must be kept
    X = torch.tensor(plane.mean_D + coords @ plane.basis_D2.T + off, dtype=torch.float32)
    mask = torch.ones(7, dtype=torch.bool)
    for k in (1, 3, -2):
        out = compile_edit(RotateEdit(circle="r", steps=k), mask, hook="h", plane=plane).apply_output(X)
        want = plane.mean_D + coords[(np.arange(7) + k) % 7] @ plane.basis_D2.T + off
        assert np.allclose(out.numpy(), want, atol=1e-4)
    ablated = compile_edit(RotateEdit(circle="r", baseline="mean_ablation"), mask, hook="h", plane=plane).apply_output(X)
    assert np.allclose(ablated.numpy(), plane.mean_D + off, atol=1e-4)
    rand = compile_edit(RotateEdit(circle="r", baseline="random_plane", steps=2), mask, hook="h", plane=plane)
    moved = rand.apply_output(X)
    assert torch.allclose((moved - X).norm(dim=1) > 0, torch.ones(7, dtype=torch.bool))
    assert torch.allclose((moved - rand.mean_D).norm(dim=1), (X - rand.mean_D).norm(dim=1), atol=1e-4)  # a rotation


# ---------------------------------------------------------------- generation


def test_generation_is_seeded_and_reports_the_shift(handle, tokens, planted):
    hook, sae, _ = planted
    base = Splice({"p": (hook, sae)})
    all_pos = resolve_positions("all", [], len(tokens), len(tokens) + 6)
    steer = compile_edit(SteerEdit(sae="p", feature=0, alpha=40.0), all_pos, sae=sae, hook=hook)
    edited = Splice(base.saes, [steer])
    g1 = compare(handle, TEXT, tokens, base, edited, max_new_tokens=6, temperature=1.0, seed=3)
    g2 = compare(handle, TEXT, tokens, base, edited, max_new_tokens=6, temperature=1.0, seed=3)
    assert g1.baseline_ids == g2.baseline_ids and g1.edited_ids == g2.edited_ids
    greedy = compare(handle, TEXT, tokens, base, edited, max_new_tokens=6)
    assert greedy.edited_ids == [TARGET] * 6  # a strong push on the planted feature
    assert greedy.rising[0].token_id == TARGET and greedy.kl > 0
    assert greedy.rising[0].p_edited > greedy.rising[0].p_baseline
    assert greedy.falling[0].p_edited < greedy.falling[0].p_baseline
    same = distribution_shift(handle.tokenizer, torch.randn(50), torch.zeros(50) + 1.0)[2]
    assert same > 0
    assert distribution_shift(handle.tokenizer, torch.ones(50), torch.ones(50))[2] == pytest.approx(0.0, abs=1e-12)
    assert math.isfinite(greedy.kl)


def test_gradient_mode_uses_the_model_gradient(handle, tokens, planted):
    """Without linearisation the final RMS norm is scale invariant (x . grad = 0 through it),
    so the parts no longer add up to the logit and the check says so."""
    hook, sae, _ = planted
    sp = Splice({"p": (hook, sae)})
    lin = attribute(handle, tokens, sp, Target(kind="logit", token=TARGET), verify=0)
    grad = attribute(handle, tokens, sp, Target(kind="logit", token=TARGET), verify=0, mode="gradient")
    assert lin.complete and not grad.complete and grad.mode == "gradient"
    assert grad.parts[0]["sum"] == pytest.approx(0.0, abs=1e-3)
    assert grad.total == pytest.approx(lin.total, abs=1e-5)
