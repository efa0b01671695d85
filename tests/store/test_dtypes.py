"""The one dtype-name parser shared by the activation cache, SAE configs and format readers."""

import pytest
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.store.dtypes import dtype_name, parse_dtype


def test_names_torch_prefixes_and_dtypes_map_to_one_canonical_name():
    assert dtype_name("bfloat16") == dtype_name("torch.bfloat16") == dtype_name(torch.bfloat16) == "bfloat16"
    assert parse_dtype("float16") is torch.float16


def test_unknown_dtype_names_the_file_and_the_valid_names():
    with pytest.raises(InvalidInputError, match=r"^cfg.json: unknown dtype 'int8'; valid: float32, float16, bfloat16$"):
        dtype_name("int8", "cfg.json")
    with pytest.raises(InvalidInputError, match=r"^unknown activation dtype torch.int64"):
        parse_dtype(torch.int64, kind="activation dtype")
