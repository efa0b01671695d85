"""The parameters of the reads that show one thing: a feature page (of this atlas, or of a
side of a stored comparison), a feature's stored examples, an SAE's 2-D map, a crosscoder's
latents and one crosscoder latent. HTTP takes them as the GET routes' query parameters (what
names the thing stays in the path: the SAE id, the latent index, the comparison)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sae_atlas.api.bounds import MAX_EXAMPLES, MAX_INDEX, MAX_K, MAX_LIST
from sae_atlas.api.operations.fields import JsonInt, SafeId
from sae_atlas.api.operations.operation import Lookup
from sae_atlas.saes.compare.crosscoder import LatentClass
from sae_atlas.store.maps import Basis


class FeaturePageParams(Lookup):
    """How much of a feature page to send (`Atlas.feature`, `GET /saes/{sae_id}/features/{index}`,
    `sae-atlas feature`; `Atlas.compared_feature`, `GET /compare/{comparison}/{side}/features/{index}`)."""

    examples: JsonInt = Field(default=10, ge=1, le=MAX_EXAMPLES, description="top examples")
    neighbours: JsonInt = Field(default=8, ge=1, le=MAX_K, description="nearest decoder neighbours in the SAE")


class ExamplesParams(Lookup):
    """A feature's stored example contexts (`Atlas.examples`, `GET /saes/{sae_id}/features/{index}/examples`)."""

    kind: Literal["top", "band"] | None = Field(default=None, description="only top-k or only band examples "
                                                                          "(default: both)")


class MapParams(Lookup):
    """An SAE's 2-D feature map (`Atlas.map`, `GET /saes/{sae_id}/map`)."""

    basis: Basis = Field(default="decoder", description="decoder: UMAP of the decoder rows; cooccurrence: of the "
                                                        "activation co-occurrence graph")


class CrosscoderLatentsParams(Lookup):
    """A page of a crosscoder's latents (`Atlas.crosscoder_latents`, `GET /crosscoders/{crosscoder}/latents`)."""

    latent_class: LatentClass | None = Field(default=None, description="only a_only, shared or b_only latents")
    sort: SafeId = Field(default="relative_norm", description="a numeric column: relative_norm, norm_a, norm_b, "
                                                              "latent or a Latent Scaling one")
    descending: bool = Field(default=True, description="largest first")
    offset: JsonInt = Field(default=0, ge=0, le=MAX_INDEX, description="first row of the page")
    limit: JsonInt = Field(default=100, ge=1, le=MAX_LIST, description="rows of the page")


class CrosscoderLatentParams(Lookup):
    """One crosscoder latent's card (`Atlas.crosscoder_latent`, `GET /crosscoders/{crosscoder}/latents/{index}`)."""

    k: JsonInt = Field(default=5, ge=1, le=MAX_K, description="nearest atlas features per side")
