"""Fixtures of the store tests: one battery atlas (the small test atlas plus eval.json)
per session, copied by each test that damages it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.store.corruption import build_battery_atlas


@pytest.fixture(scope="session")
def battery_atlas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The undamaged battery atlas (read it, never write it)."""
    return build_battery_atlas(tmp_path_factory.mktemp("battery") / "atlas")


@pytest.fixture
def atlas_copy(battery_atlas: Path, tmp_path: Path) -> Path:
    """A private copy of the battery atlas, free to damage."""
    return Path(shutil.copytree(battery_atlas, tmp_path / "atlas"))
