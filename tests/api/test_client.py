"""AtlasClient over the live service returns what the Atlas facade returns in-process."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import pytest

from sae_atlas import Atlas
from sae_atlas.api.client import AtlasClient, AtlasHTTPError
from sae_atlas.api.operations.registry import OPERATIONS, Surfaces
from sae_atlas.errors import InvalidInputError
from tests.api.conftest import TOKEN

MIRRORED = [op for op in OPERATIONS if op.http and hasattr(AtlasClient, op.python)]


def test_client_mirrors_atlas(server: Any, small_atlas: dict[str, Any]) -> None:
    atlas = Atlas(small_atlas["root"])
    a, b = small_atlas["sae_ids"]
    with AtlasClient(server.url) as client:
        assert client.health()["saes"] == 2
        assert client.saes()["sae_id"].to_list() == atlas.saes()["sae_id"].to_list()
        assert client.sae_info(a) == atlas.sae_info(a)
        assert client.feature(a, 4, examples=3)["stats"] == atlas.feature(a, 4, examples=3).to_dict()["stats"]
        assert client.examples(a, 4).height == len(atlas.examples(a, 4))
        assert client.similar(a, 4, k=5)["latent"].to_list() == atlas.similar(a, 4, k=5)["latent"].to_list()
        assert client.flow(a, 4, k=2)["latent"].to_list() == atlas.flow(a, 4, k=2)["latent"].to_list()
        vec = [0.1 * i for i in range(32)]
        assert client.search_vector(vec, k=4)["latent"].to_list() == atlas.search_vector(vec, k=4)["latent"].to_list()
        text = client.search_text("the dog ran", saes=[b], k=2)
        assert text == atlas.search_text("the dog ran", saes=[b], k=2).to_dict()
        assert client.search_text("the dog", saes=[b], include_special=True)["tokens"][0] == "<s>"
        assert client.search_token("dog", k=3) == atlas.search_token("dog", k=3).to_dict()
        dog = atlas.search_token("dog", k=3).token_id
        assert client.search_token(dog, k=3) == atlas.search_token(dog, k=3).to_dict()
        assert client.map(b).height == small_atlas["d_sae"]
        assert client.map(b, "cooccurrence").equals(atlas.map(b, "cooccurrence").frame, null_equal=True)
        assert client.map_scores(b) == atlas.map_scores(b)
        assert client.analyses()["run"].to_list() == ["demo-run"]
        assert client.analysis("planted", "demo-run")["n_rows"] == 2
        assert client.figure("planted", "demo-run.png").startswith(b"\x89PNG")
        with pytest.raises(AtlasHTTPError, match="unknown SAE id") as info:
            client.feature("nope", 0)
        assert info.value.http_status == 404
        with pytest.raises(AtlasHTTPError) as info:
            client.similar(a, 0, k=10_000)
        assert info.value.http_status == 422


@pytest.mark.parametrize("op", MIRRORED, ids=[op.python for op in MIRRORED])
def test_the_client_takes_the_operations_names_and_defaults(op: Surfaces) -> None:
    client = inspect.signature(getattr(AtlasClient, op.python)).parameters
    atlas = inspect.signature(getattr(Atlas, op.python)).parameters
    for name, parameter in client.items():
        if name == "self" or parameter.kind is parameter.VAR_KEYWORD:  # **options: the server names them
            continue
        assert name in atlas, f"AtlasClient.{op.python} takes {name!r}, which Atlas.{op.python} does not"
        if name in op.params.renamed:
            new = op.params.renamed[name]
            assert new in client and parameter.default is None, (
                f"AtlasClient.{op.python} takes the old name {name!r} but not {new!r}")
        elif parameter.default is not parameter.empty:
            assert parameter.default == atlas[name].default, f"AtlasClient.{op.python}({name}=...)"


def test_the_client_takes_the_old_sae_id_with_a_deprecation(server: Any, small_atlas: dict[str, Any]) -> None:
    atlas = Atlas(small_atlas["root"])
    b = small_atlas["sae_ids"][1]
    vec = [0.1 * i for i in range(32)]
    with AtlasClient(server.url) as client:
        with pytest.warns(DeprecationWarning, match="AtlasClient.search_vector: 'sae_id' is deprecated, use 'saes'"):
            old = client.search_vector(vec, sae_id=b, k=4)
        assert old.equals(client.search_vector(vec, saes=[b], k=4))
        assert set(old["sae_id"].to_list()) == {b}
        with pytest.warns(DeprecationWarning, match="'sae_id' is deprecated"):
            assert client.search_token("dog", sae_id=b, k=3) == atlas.search_token("dog", saes=[b], k=3).to_dict()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert client.geometry_features(b).height == len(atlas.geometry_features(b))
        with pytest.raises(InvalidInputError, match="'sae_id' is the old name of 'saes'"):
            client.search_labels("dog", saes=[b], sae_id=small_atlas["sae_ids"][0])


def test_client_token(token_server: Any, small_atlas: dict[str, Any]) -> None:
    with AtlasClient(token_server.url) as anonymous, pytest.raises(AtlasHTTPError, match="bearer") as info:
        anonymous.saes()
    assert info.value.http_status == 401
    with AtlasClient(token_server.url, token=TOKEN) as client:
        assert client.feature(small_atlas["sae_ids"][0], 1)["index"] == 1


def test_client_names_an_unreachable_service() -> None:
    from tests.api.conftest import free_port

    with AtlasClient(f"http://127.0.0.1:{free_port()}", timeout=2) as client, \
            pytest.raises(AtlasHTTPError, match="cannot reach") as info:
        client.saes()
    assert info.value.http_status == 0


@pytest.mark.parametrize("env,needle", [
    ({}, "SAE_ATLAS_ROOT is not set"),
    ({"SAE_ATLAS_ROOT": "/x", "SAE_ATLAS_THREADS": "two"}, "SAE_ATLAS_THREADS='two'"),
    ({"SAE_ATLAS_ROOT": "/x", "SAE_ATLAS_MAX_BODY_BYTES": "-5"}, "SAE_ATLAS_MAX_BODY_BYTES"),
])
def test_worker_settings_from_a_bad_environment(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                needle: str) -> None:
    from sae_atlas.api.http.settings import ServerSettings
    from sae_atlas.errors import InvalidInputError

    for name in ("SAE_ATLAS_ROOT", "SAE_ATLAS_THREADS", "SAE_ATLAS_MAX_BODY_BYTES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InvalidInputError, match=needle):
        ServerSettings.from_env()
