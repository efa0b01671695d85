"""Feature x depth join on planted codes: a feature firing on low-LID tokens shows a
negative LID shift with a large |z|; one firing at random does not."""

import numpy as np
import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.geometry.feature_depth import feature_depth_table


def test_planted_feature_fires_where_dimension_is_low():
    rng = np.random.default_rng(0)
    lid = rng.normal(10, 2, 2000)
    conv = rng.uniform(0, 1, 2000)
    codes = np.zeros((2000, 3))
    codes[np.argsort(lid)[:100], 0] = 1.0  # fires on the 100 lowest-LID tokens
    codes[rng.choice(2000, 100, replace=False), 1] = 2.0  # fires at random
    codes[:3, 2] = 1.0  # too rare to report
    table = feature_depth_table(codes, {"lid": lid, "convergence_index": conv})
    assert table["feature"].to_list() == [0, 1] and table["n_fires"].to_list() == [100, 100]
    low, chance = table.row(0, named=True), table.row(1, named=True)
    assert low["lid_shift"] < -3 and low["lid_z"] < -10
    assert abs(chance["lid_z"]) < 3 and abs(low["convergence_index_z"]) < 3
    with pytest.raises(InvalidInputError, match="one value per token"):
        feature_depth_table(codes, {"lid": lid[:10]})
