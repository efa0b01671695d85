"""Cross-layer transcoders: the formula, the atlas storage round trip and bad input."""

import numpy as np
import pytest
import torch

from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.saes.transcoders.clt import CLTConfig, build_clt, fold_layer_scales
from sae_atlas.saes.transcoders.clt_store import WEIGHTS_FILE, clt_dir, load_atlas_clt, save_clt
from sae_atlas.store.layout import AtlasLayout

L, D, F = 3, 5, 7


def random_clt(architecture="jumprelu", seed=0, k=2):
    cfg = CLTConfig(architecture=architecture, n_layers=L, d_model=D, d_sae=F, k=k if architecture == "topk" else None)
    clt = build_clt(cfg).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in clt.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
        if architecture == "jumprelu":
            clt.log_threshold.copy_(torch.rand(L, F, generator=gen, dtype=torch.float64).log())
    return clt


def numpy_outputs(clt, x):
    """The CLT's formula term by term: f_l = act(x_l W_enc[l] + b_enc[l]),
    y_l' = sum_{l <= l'} f_l W_dec[l][:, l' - l] + b_dec[l']."""
    W_enc, b_enc = clt.W_enc.detach().numpy(), clt.b_enc.detach().numpy()
    W_dec, b_dec = [w.detach().numpy() for w in clt.W_dec], clt.b_dec.detach().numpy()
    f = np.zeros((x.shape[0], L, F))
    for layer in range(L):
        pre = x[:, layer] @ W_enc[layer] + b_enc[layer]
        if clt.cfg.architecture == "jumprelu":
            f[:, layer] = pre * (pre > clt.threshold.detach().numpy()[layer])
        else:
            keep = np.argsort(-pre, axis=1)[:, : clt.cfg.k]
            mask = np.zeros_like(pre, dtype=bool)
            np.put_along_axis(mask, keep, True, axis=1)
            f[:, layer] = np.where(mask, np.maximum(pre, 0), 0)
    y = np.zeros((x.shape[0], L, D)) + b_dec
    for target in range(L):
        for source in range(target + 1):
            y[:, target] += f[:, source] @ W_dec[source][:, target - source]
    return f, y


@pytest.mark.parametrize("architecture", ["jumprelu", "topk"])
def test_outputs_follow_the_formula(architecture):
    clt = random_clt(architecture)
    x = torch.randn(11, L, D, dtype=torch.float64)
    f, y = numpy_outputs(clt, x.numpy())
    out = clt(x)
    assert np.allclose(out.feature_acts.detach().numpy(), f, atol=1e-10)
    assert np.allclose(out.x_hat.detach().numpy(), y, atol=1e-10)
    assert (f != 0).any() and (f == 0).any()
    by_layer = dict(enumerate(out.feature_acts.unbind(-2)))
    for layer in range(L):
        assert torch.allclose(clt.decode_layer(by_layer, layer), out.x_hat[:, layer], atol=1e-10)
        assert torch.allclose(clt.encode_layer(x[:, layer], layer), out.feature_acts[:, layer], atol=1e-10)


def test_folded_scales_give_the_raw_outputs():
    clt = random_clt()
    s, t = torch.tensor([2.0, 0.5, 3.0]), torch.tensor([0.25, 4.0, 1.5])
    x = torch.randn(6, L, D, dtype=torch.float64)
    folded = fold_layer_scales(clt, s, t)
    scaled = clt(x * s.double()[:, None])
    raw = folded(x)
    assert torch.allclose(raw.feature_acts, scaled.feature_acts, atol=1e-10)
    assert torch.allclose(raw.x_hat, scaled.x_hat / t.double()[:, None], atol=1e-10)


def test_atlas_round_trip_and_damage(tmp_path):
    clt = random_clt().float()
    folder = AtlasLayout(tmp_path).clt_dir("clt-a")
    save_clt(clt, folder)
    back = load_atlas_clt(tmp_path, "clt-a")
    x = torch.randn(4, L, D)
    assert torch.equal(back(x).x_hat, clt(x).x_hat) and back.cfg == clt.cfg
    assert AtlasLayout(tmp_path).clt_ids() == ["clt-a"]
    with pytest.raises(NotFoundError, match="valid: clt-a"):
        clt_dir(tmp_path, "nope")
    weights = folder / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(IntegrityError, match="sha256"):
        load_atlas_clt(tmp_path, "clt-a")


def test_bad_configs_and_inputs():
    with pytest.raises(InvalidInputError, match="unknown CLT architecture"):
        CLTConfig(architecture="standard", n_layers=2, d_model=4, d_sae=8)
    with pytest.raises(InvalidInputError, match="needs 0 < k"):
        CLTConfig(architecture="topk", n_layers=2, d_model=4, d_sae=8)
    with pytest.raises(InvalidInputError, match="without the block prefix"):
        CLTConfig(architecture="jumprelu", n_layers=2, d_model=4, d_sae=8, input_site="blocks.0.hook_resid_mid")
    with pytest.raises(InvalidInputError, match="unknown CLT config keys"):
        CLTConfig.from_dict({"architecture": "jumprelu", "n_layers": 2, "d_model": 4, "d_sae": 8, "width": 3})
    with pytest.raises(InvalidInputError, match=r"n_layers=3, d_model=5"):
        random_clt()(torch.zeros(2, 2, D, dtype=torch.float64))
