"""The package layout: the repository's top-level folders install under one namespace,
`sae_atlas` (`sae_atlas.saes` from `saes/`, and so on); everything else is in pyproject.toml."""

from setuptools import find_packages, setup

FOLDERS = ("api", "saes", "store", "geometry")

setup(
    packages=["sae_atlas", *(f"sae_atlas.{name}" for name in find_packages(include=[f"{f}*" for f in FOLDERS]))],
    package_dir={"sae_atlas": "sae_atlas", **{f"sae_atlas.{folder}": folder for folder in FOLDERS}},
)
