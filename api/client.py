"""`AtlasClient(url, token=None)`: the Atlas calls over HTTP (httpx).

Methods mirror `api.Atlas`, with its parameter names (which SAEs: `saes`; the old `sae_id`
keyword still works, with a DeprecationWarning), and return the same JSON data the service
sends (dicts), with tabular results as polars frames. A 4xx/5xx answer raises
`AtlasHTTPError` carrying the status and the server's message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import httpx
import polars as pl

from sae_atlas.api.operations.operation import take_old_names
from sae_atlas.errors import AtlasError

if TYPE_CHECKING:
    from sae_atlas.store.maps import Basis


def _which(method: str, saes: list[str] | str | None, sae_id: str | None) -> list[str] | None:
    """The SAEs a lookup names: `saes` (one id is a list of one), or the deprecated `sae_id`."""
    given = take_old_names(f"AtlasClient.{method}", {"sae_id": "saes"}, {"saes": saes, "sae_id": sae_id},
                           {"saes": None}, stacklevel=4)["saes"]
    return [given] if isinstance(given, str) else given


def _present(params: dict[str, Any]) -> dict[str, Any]:
    """Query parameters without the ones not given (None)."""
    return {name: value for name, value in params.items() if value is not None}


class AtlasHTTPError(AtlasError):
    """An error answer from the service: `status` and the server's `detail` (status 0: the
    service could not be reached)."""

    def __init__(self, status: int, detail: str) -> None:
        self.http_status = status
        self.detail = detail
        super().__init__(f"HTTP {status}: {detail}")


class AtlasClient:
    """A client of one `sae-atlas serve` service."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> AtlasClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The answer to one request; AtlasHTTPError for an error answer or no answer."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:  # refused, unresolvable, timed out
            raise AtlasHTTPError(0, f"cannot reach {self._http.base_url} ({type(exc).__name__}: {exc})") from exc
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise AtlasHTTPError(response.status_code, str(detail))
        return response

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    @staticmethod
    def _sae(sae_id: str) -> str:
        return quote(sae_id, safe="")

    def health(self) -> dict[str, Any]:
        """Service status."""
        return self._call("GET", "/health")

    def saes(self) -> pl.DataFrame:
        """One row per SAE."""
        return pl.DataFrame(self._call("GET", "/saes"))

    def sae_info(self, sae_id: str) -> dict[str, Any]:
        """Facts about one SAE."""
        return self._call("GET", f"/saes/{self._sae(sae_id)}")

    def feature(self, sae_id: str, index: int, *, examples: int = 10, neighbours: int = 8) -> dict[str, Any]:
        """Everything about one feature (see `Atlas.feature`)."""
        return self._call("GET", f"/saes/{self._sae(sae_id)}/features/{int(index)}",
                          params={"examples": examples, "neighbours": neighbours})

    def examples(self, sae_id: str, index: int, kind: str | None = None) -> pl.DataFrame:
        """All stored example contexts of a feature."""
        params = {"kind": kind} if kind else {}
        return pl.DataFrame(self._call("GET", f"/saes/{self._sae(sae_id)}/features/{int(index)}/examples",
                                       params=params))

    def similar(self, sae_id: str, index: int, k: int = 10) -> pl.DataFrame:
        """Nearest decoder directions in the same SAE."""
        return pl.DataFrame(self._call("GET", f"/saes/{self._sae(sae_id)}/features/{int(index)}/similar",
                                       params={"k": k}))

    def flow(self, sae_id: str, index: int, k: int = 5) -> pl.DataFrame:
        """Best matches of the feature in the other SAEs."""
        return pl.DataFrame(self._call("GET", f"/saes/{self._sae(sae_id)}/features/{int(index)}/flow",
                                       params={"k": k}))

    def search_vector(self, vector: Sequence[float], *, saes: list[str] | None = None, k: int = 10,
                      in_circle: bool | None = None, period: float | None = None, lobe: int | None = None,
                      sae_id: str | None = None) -> pl.DataFrame:
        """Features nearest to a direction, in the SAEs `saes` (default all) of its width,
        optionally only those of matching geometry records."""
        body = {"vector": [float(v) for v in vector], "saes": _which("search_vector", saes, sae_id), "k": k,
                "in_circle": in_circle, "period": period, "lobe": lobe}
        return pl.DataFrame(self._call("POST", "/search/vector", json=body))

    def search_text(self, text: str, *, saes: list[str] | None = None, k: int = 5,
                    include_special: bool = False) -> dict[str, Any]:
        """Per token of `text`, the most active features of each SAE (BOS and the model's
        other special tokens left out unless `include_special`)."""
        return self._call("POST", "/search/text", json={"text": text, "saes": saes, "k": k,
                                                         "include_special": include_special})

    def search_token(self, token: str | int, *, saes: list[str] | None = None, k: int = 10,
                     sae_id: str | None = None) -> dict[str, Any]:
        """Features centred on / promoting a token (string or id), in the SAEs `saes` (default all)."""
        params = _present({"k": k, "saes": _which("search_token", saes, sae_id)})
        if isinstance(token, int):
            return self._call("GET", f"/search/token/{token}", params=params)
        return self._call("GET", "/search/token", params={**params, "token": token})

    def contrast(self, texts_a: list[str], texts_b: list[str], *, saes: list[str] | None = None,
                 **options: Any) -> dict[str, Any]:
        """Features separating two sets of texts (`Atlas.contrast`; options: k, pool,
        n_permutations, alpha, duplicate_threshold, seed)."""
        return self._call("POST", "/search/contrast", json={"texts_a": texts_a, "texts_b": texts_b,
                                                           "saes": saes, **options})

    def concept_search(self, concept: str | dict[str, Any], *, saes: list[str] | None = None,
                       **options: Any) -> dict[str, Any]:
        """Features carrying a concept, their span and its geometry (`Atlas.concept_search`;
        a built-in name or a spec with kind, values, templates)."""
        return self._call("POST", "/search/concept", json={"concept": concept, "saes": saes, **options})

    def geometry_features(self, saes: list[str] | str | None = None, *, in_circle: bool | None = None,
                          period: float | None = None, lobe: int | None = None,
                          kind: Literal["circle", "concept", "hierarchy", "lobe"] | None = None,
                          sae_id: str | None = None) -> pl.DataFrame:
        """Features of `saes` (default all; one id is a list of one) by the geometry records
        they belong to."""
        params = _present({"saes": _which("geometry_features", saes, sae_id), "in_circle": in_circle,
                           "period": period, "lobe": lobe, "kind": kind})
        return pl.DataFrame(self._call("GET", "/search/geometry", params=params))

    def search_labels(self, query: str, *, saes: list[str] | None = None, k: int = 10,
                      sae_id: str | None = None) -> pl.DataFrame:
        """Features of `saes` (default all) whose labels or explanations match `query`."""
        params = _present({"query": query, "k": k, "saes": _which("search_labels", saes, sae_id)})
        return pl.DataFrame(self._call("GET", "/search/labels", params=params))

    def map(self, sae_id: str, basis: Basis = "decoder") -> pl.DataFrame:
        """The SAE's 2-D feature map in one basis ("decoder" or "cooccurrence")."""
        body = self._call("GET", f"/saes/{self._sae(sae_id)}/map", params={"basis": basis})
        return pl.DataFrame({k: v for k, v in body.items() if k not in ("basis", "scores")})

    def map_scores(self, sae_id: str) -> dict[str, dict[str, float | None]]:
        """Per built map basis, how faithful its map is (kNN overlap, chance, other basis kept)."""
        return self._call("GET", f"/saes/{self._sae(sae_id)}/map")["scores"]

    def analyses(self) -> pl.DataFrame:
        """Stored geometry results."""
        return pl.DataFrame(self._call("GET", "/analyses"))

    def analysis(self, kind: str, run: str) -> dict[str, Any]:
        """One geometry result (meta, table rows, figure names)."""
        return self._call("GET", f"/analyses/{quote(kind, safe='')}/{quote(run, safe='')}")

    def figure(self, kind: str, name: str) -> bytes:
        """The PNG bytes of a stored figure."""
        return self._request("GET", f"/analyses/{quote(kind, safe='')}/figures/{quote(name, safe='')}").content
