"""Depth metrics per prompt family on a tiny model: a family of repeated-word prompts moves
through the layers unlike a family of mixed-word prompts, two halves of one pool do not
differ, and a family file without families is a clear error."""

import json

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.depth.families import family_depth, read_families
from sae_atlas.saes.models import TINY_WORDS, tiny_model

WORDS = [w for w in TINY_WORDS if w.isalpha()]


def mixed(n, seed):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, 8)) for _ in range(n)]


@pytest.fixture(scope="module")
def handle():
    return tiny_model(arch="llama", n_layers=4, seed=3)


def test_planted_families_differ_and_a_split_pool_does_not(handle):
    repeated = [" ".join([w] * 8) for w in WORDS[:10]]
    out = family_depth(handle, {"repeated": repeated, "mixed": mixed(10, 0)}, [0, 1, 2, 3], k=10,
                       n_permutations=2000)
    assert out["prompts"].height == 20 and set(out["families"]["family"]) == {"repeated", "mixed"}
    assert {"convergence_index", "curvature", "path_length", "lid_0", "lid_3"} <= set(out["tests"]["metric"])
    assert out["tests"]["p_value"].min() < 0.01
    pool = mixed(20, 1)
    null = family_depth(handle, {"a": pool[:10], "b": pool[10:]}, [0, 1, 2, 3], k=10, n_permutations=2000)
    assert null["tests"]["p_value"].min() > 0.01


def test_family_file_errors(tmp_path):
    path = tmp_path / "families.json"
    for content, message in (({"prompts": ["a"]}, "has no families"), ({"families": {}}, "has no families"),
                             ({"families": {"a": ["x", "y"]}}, "at least 2 families"),
                             ({"families": {"a": ["x", "y"], "b": ["z"]}}, r"these are not: \['b'\]")):
        path.write_text(json.dumps(content))
        with pytest.raises(InvalidInputError, match=message):
            read_families(path)
    path.write_text(json.dumps({"families": {"a": ["the cat", "a dog"], "b": ["red car", "big tree"]}}))
    assert read_families(path) == {"a": ["the cat", "a dog"], "b": ["red car", "big tree"]}
