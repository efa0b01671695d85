"""Text search leaves out BOS and the model's other special tokens (as summaries and evals
do), unless asked for, and labels every feature it lists. Planted: a BOS whose embedding
is scaled up 1000x fires far above every real token, and still never comes first."""

from __future__ import annotations

from typing import Any

import torch

from sae_atlas.api.atlas import Atlas
from sae_atlas.saes.models import ModelHandle, tiny_model


def _loud_bos_model() -> ModelHandle:
    handle = tiny_model(n_layers=2, d_model=32)
    with torch.no_grad():
        handle.bridge.original_model.get_input_embeddings().weight[handle.bos_token_id] *= 1000.0
    return handle


def test_a_loud_bos_is_left_out_unless_asked_for(small_atlas: dict[str, Any]) -> None:
    atlas = Atlas(small_atlas["root"], model=_loud_bos_model())
    sae = small_atlas["sae_ids"][1]
    text = "the cat sat on the mat </s> the dog"  # an EOS in the middle is special too
    everything = atlas.search_text(text, saes=[sae], k=3, include_special=True)
    frame = everything.frame.sort("act", descending=True)
    assert frame["token"][0] == "<s>" and frame["pos"][0] == 0  # the plant: BOS fires hardest of all
    assert frame["act"][0] > 5 * frame.filter(frame["token"] != "<s>")["act"].max()
    assert everything.special[0] and everything.special.count(True) == 2
    assert everything._repr_html_().count("rgba(255,140,0,1.00)") >= 2  # scaled by real tokens: not BOS alone at 1
    found = atlas.search_text(text, saes=[sae], k=3)
    assert "<s>" not in found.tokens and "</s>" not in found.tokens and not any(found.special)
    assert found.positions[0] == 1 and len(found.positions) == len(everything.positions) - 2
    top = found.frame.sort("act", descending=True)
    assert top["token"][0] not in ("<s>", "</s>") and top["pos"][0] != 0
    labels = top["label"].drop_nulls()
    assert labels.len() == top.height and all(isinstance(x, str) and x for x in labels)
