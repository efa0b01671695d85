"""Response bodies: orjson rendering of what handlers return is valid JSON and matches
the facade's `to_dict` payloads."""

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from sae_atlas.api.http.json_body import dumps, json_body
from sae_atlas.api.results.jsonable import to_jsonable


@dataclass
class Card:
    name: str
    values: np.ndarray
    stats: dict
    nested: list


def test_nan_and_infinities_become_null_and_numpy_tensors_serialize():
    card = Card("f", np.array([1.5, np.nan], dtype=np.float32), {1: np.float64(np.inf), "n": np.int64(3)},
                [(torch.tensor([2, 3]), math.nan)])
    decoded = json.loads(dumps(card))  # strict JSON: NaN would not parse in many clients
    assert decoded == {"name": "f", "values": [1.5, None], "stats": {"1": None, "n": 3}, "nested": [[[2, 3], None]]}
    plain = to_jsonable(Card("g", np.arange(2), {"a": 1}, [("x", 2)]))
    assert json.loads(dumps(Card("g", np.arange(2), {"a": 1}, [("x", 2)]))) == plain
    response = json_body({"ok": True}, status_code=201)
    assert response.status_code == 201 and response.body == b'{"ok":true}'
    assert response.media_type == "application/json"


def test_unserializable_values_are_a_clear_type_error():
    with pytest.raises(TypeError, match="not JSON serializable: object"):
        dumps({"x": object()})
