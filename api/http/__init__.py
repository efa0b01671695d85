"""The HTTP service over an atlas (FastAPI + uvicorn)."""

from api.http.app import create_app, serve
from api.http.settings import ServerSettings

__all__ = ["ServerSettings", "create_app", "serve"]
