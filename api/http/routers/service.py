"""The service itself: liveness (`/health`) and the explorer (`/`, `/static/*`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse

from api.http.deps import AtlasDep, SettingsDep

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"
router = APIRouter()


@router.get("/health", tags=["service"], summary="Liveness and what is served")
def health(atlas: AtlasDep, settings: SettingsDep) -> dict[str, Any]:
    return {"status": "ok", "atlas": atlas.root.name, "saes": len(atlas.sae_ids), "worker_pid": os.getpid(),
            "auth": bool(settings.token), "analyses_allowed": settings.allow_analyses}


@router.get("/", include_in_schema=False)
def explorer() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")
