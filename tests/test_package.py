"""The distribution installs one namespace: a wheel built from the source holds `sae_atlas`
and nothing else at its top level, with every source package and its data files inside."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("api", "saes", "store", "geometry")


def test_the_wheel_installs_only_the_sae_atlas_namespace(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, source / name)
    for folder in ("sae_atlas", *FOLDERS):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"),
                    str(source)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("sae_atlas-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"sae_atlas"}, sorted(top)
    packages = {str(p.parent.relative_to(REPO)) for f in FOLDERS for p in (REPO / f).rglob("__init__.py")}
    assert {f"sae_atlas/{package}/__init__.py" for package in packages} <= set(names)
    assert "sae_atlas/__main__.py" in names and "sae_atlas/api/static/index.html" in names
    assert any(name.startswith("sae_atlas/saes/data/") for name in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "sae-atlas = sae_atlas.api.cli:app" in zipfile.ZipFile(wheel).read(entry_points).decode()
