"""Path and query parameters shared by the routers, with the limits that show in `/openapi.json`."""

from __future__ import annotations

from fastapi import Path, Query

from api.atlas import MAX_K

MAX_INDEX = 2**31 - 1
MAX_LIST = 1000
SaeId = Path(description="SAE id, e.g. blocks.6.hook_resid_post-topk-4608", max_length=128)
Index = Path(ge=0, le=MAX_INDEX, description="latent index")
K = Query(10, ge=1, le=MAX_K, description=f"number of results (1..{MAX_K})")
Kind = Path(max_length=128, description="analysis kind, e.g. circular")
