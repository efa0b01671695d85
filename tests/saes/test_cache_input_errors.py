"""The default hooks of a model of any depth are hooks it has, and a cache run that fails on
a user error leaves the atlas directory exactly as it found it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.cache import cache_activations
from sae_atlas.saes.corpus import CorpusSpec
from sae_atlas.saes.models import ModelHandle, tiny_model
from tests.saes.kill_points import tree_hashes

SMALL = {"d_model": 16, "n_heads": 2, "d_mlp": 32}
HOOKS = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
EMPTY = "empty or too short for one block"


@pytest.mark.parametrize("n_layers", range(1, 7))
def test_default_hooks_name_only_layers_the_model_has(n_layers: int) -> None:
    handle = tiny_model(n_layers=n_layers, **SMALL)
    for count in range(1, 9):
        hooks = handle.default_hooks(count)
        layers = [handle.hook_layer(hook) for hook in hooks]
        assert hooks and layers == sorted(set(layers)) and all(0 <= layer < n_layers for layer in layers)
        assert all(hook in handle.hook_names for hook in hooks)


@pytest.mark.parametrize(("n_layers", "count", "layers"), [
    (1, 3, [0]), (2, 3, [0, 1]), (3, 3, [1, 2]), (4, 3, [1, 2, 3]), (30, 3, [8, 15, 22]), (6, 1, [3]),
])
def test_default_hooks_spread(n_layers: int, count: int, layers: list[int]) -> None:
    handle = tiny_model(n_layers=n_layers, **SMALL)
    assert handle.default_hooks(count) == [f"blocks.{layer}.hook_resid_post" for layer in layers]


@pytest.fixture(scope="module")
def handle() -> ModelHandle:
    return tiny_model(n_layers=2, **SMALL)


def _corpus(tmp_path: Path, text: str) -> CorpusSpec:
    path = tmp_path / "corpus.txt"
    path.write_text(text)
    return CorpusSpec(source=str(path), context_size=16)


@pytest.mark.parametrize(("text", "message"), [
    ("", EMPTY),
    ("   \n\n  ", EMPTY),
    ("the cat sat on the mat . " * 6, "gave only 2 blocks"),  # too short, and less than a shard
], ids=["empty", "blank", "short"])
@pytest.mark.parametrize("existed", [False, True], ids=["new-path", "empty-dir"])
def test_failed_cache_into_a_new_atlas_leaves_nothing(text: str, message: str, existed: bool, handle: ModelHandle,
                                                      tmp_path: Path) -> None:
    root = tmp_path / "atlas"
    if existed:
        root.mkdir()
    with pytest.raises(InvalidInputError, match=message):
        cache_activations(handle, root, HOOKS, corpus=_corpus(tmp_path, text), n_tokens=16 * 64, progress=False)
    assert (list(root.iterdir()) == []) if existed else not root.exists()


def test_failed_cache_leaves_an_existing_atlas_untouched(handle: ModelHandle, tmp_path: Path) -> None:
    root = tmp_path / "atlas"
    shards = {"batch_blocks": 2, "shard_blocks": 2, "progress": False}
    cache_activations(handle, root, HOOKS[:1], corpus=CorpusSpec(context_size=16), n_tokens=16 * 4, **shards)
    before = tree_hashes(root)
    with pytest.raises(InvalidInputError, match=EMPTY):  # a new hook, an empty corpus
        cache_activations(handle, root, HOOKS, corpus=_corpus(tmp_path, ""), n_tokens=16 * 4, **shards)
    assert tree_hashes(root) == before
    with pytest.raises(InvalidInputError, match="already cached with"):  # another amount of the same hook
        cache_activations(handle, root, HOOKS[:1], corpus=_corpus(tmp_path, "x"), n_tokens=16 * 8, **shards)
    assert tree_hashes(root) == before
    with pytest.raises(InvalidInputError, match="different settings"):  # the new hook's folder came first
        cache_activations(handle, root, HOOKS[::-1], corpus=CorpusSpec(context_size=16), n_tokens=16 * 4,
                          batch_blocks=2, shard_blocks=4, progress=False)
    assert tree_hashes(root) == before


def test_a_too_short_corpus_keeps_the_shards_it_wrote(handle: ModelHandle, tmp_path: Path) -> None:
    """A run that wrote shards before the corpus ran out keeps them: a re-run asking for
    fewer tokens resumes from them."""
    corpus = _corpus(tmp_path, "the cat sat on the mat . " * 30)
    root = tmp_path / "atlas"
    with pytest.raises(InvalidInputError, match="gave only"):
        cache_activations(handle, root, HOOKS, corpus=corpus, n_tokens=16 * 64, batch_blocks=2, shard_blocks=2,
                          progress=False)
    assert sorted(p.name for p in (root / "activations" / HOOKS[0]).glob("shard-*"))
    summary = cache_activations(handle, root, HOOKS, corpus=corpus, n_tokens=16 * 4, batch_blocks=2,
                                shard_blocks=2, progress=False)
    assert summary.resumed_from_blocks > 0
