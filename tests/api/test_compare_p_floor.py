"""A comparison's p-value can only go below 0.05 with enough null draws (with n draws the
smallest is 1/(1+n)). Planted: an SAE against a permuted copy of itself (MCC 1). With the
default single rotation the MCC's p-value is 0.5 and the result says why and what to rerun;
with 20 rotations the same pair scores p < 0.05 and no note is left."""

from __future__ import annotations

from pathlib import Path

from sae_atlas.api.atlas import Atlas
from sae_atlas.api.services.compare import p_value_notes
from tests.api.test_compare import OPTIONS, atlas  # noqa: F401 (the atlas fixture)


def test_the_default_says_why_its_p_value_stops_at_a_half(atlas: Path) -> None:  # noqa: F811
    one = Atlas(atlas).compare(atlas, sae="orig", other_sae="perm", run="p-one", **OPTIONS)
    assert one.summary["mcc"] > one.summary["mcc_null"]["null_mean"] + 0.3 and one.summary["mcc_null"]["p_value"] == 0.5
    (note,) = [n for n in one.notes if n.startswith("MCC (activation)")]
    assert "1 null draw(s)" in note and "--rotations 20" in note
    assert one.to_dict()["notes"] == one.notes


def test_twenty_rotations_give_a_p_value_below_005(atlas: Path) -> None:  # noqa: F811
    many = Atlas(atlas).compare(atlas, sae="orig", other_sae="perm", run="p-many", n_rotations=20, **OPTIONS)
    assert many.summary["mcc_null"]["n_null"] == 20
    assert many.summary["mcc_null"]["p_value"] < 0.05 and many.summary["decoder_mcc_null"]["p_value"] < 0.05
    assert not any(n.startswith("MCC") for n in many.notes)


def test_nineteen_draws_are_not_enough() -> None:
    null = {"p_value": 0.05, "n_null": 19}
    assert p_value_notes({"mcc_null": null, "spaces": {"decoder_svcca_random_features": null}}) == [
        "MCC (activation): p = 0.05 is the smallest p-value 19 null draw(s) allow, 1/(1+n); rerun with --rotations 20 "
        "or more for p < 0.05 (each rotation streams B once more and runs one more matching of every latent pair)",
        "decoder svcca random features: p = 0.05 is the smallest p-value 19 null draw(s) allow, 1/(1+n); rerun with "
        "--n-perm 20 or more for p < 0.05"]
