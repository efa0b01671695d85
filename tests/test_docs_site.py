"""The docs site (mkdocs.yml, docs/) builds in strict mode: a broken link or anchor, or a page
left out of the nav, fails the suite. Offline: the build fetches nothing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

REPO = Path(__file__).resolve().parents[1]
INCLUDED = ["BENCHMARKS.md", "RELIABILITY.md"]  # pulled into the site by docs/benchmarks.md, reliability.md


def build(root: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of the site whose mkdocs.yml is in `root`, into `out`."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[test]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (pip install -e '.[test]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(root / "mkdocs.yml"), "--site-dir", str(out)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_site_builds_strict(tmp_path: Path) -> None:
    done = build(REPO, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").exists()
    benchmarks = (tmp_path / "site" / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "Cross-check against SAEBench" in benchmarks  # BENCHMARKS.md is in the site, not just linked


@pytest.fixture
def site_copy(tmp_path: Path) -> Path:
    """A copy of the site's sources to break."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "docs", root / "docs")
    for name in ["mkdocs.yml", *INCLUDED]:
        shutil.copy(REPO / name, root / name)
    return root


def test_a_broken_link_fails_the_build(site_copy: Path) -> None:
    page = site_copy / "docs" / "install.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [the missing page](no-such-page.md).\n",
                    encoding="utf-8")
    done = build(site_copy, site_copy / "site")
    assert done.returncode != 0 and "no-such-page.md" in done.stdout + done.stderr


def test_a_broken_anchor_fails_the_build(site_copy: Path) -> None:
    page = site_copy / "docs" / "install.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [the board](evaluation.md#no-such-section).\n",
                    encoding="utf-8")
    done = build(site_copy, site_copy / "site")
    assert done.returncode != 0 and "no-such-section" in done.stdout + done.stderr


def test_a_page_missing_from_the_nav_fails_the_build(site_copy: Path) -> None:
    (site_copy / "docs" / "orphan.md").write_text("# An orphan page\n", encoding="utf-8")
    done = build(site_copy, site_copy / "site")
    assert done.returncode != 0 and "orphan.md" in done.stdout + done.stderr


def cli_verbs() -> set[str]:
    """Every leaf verb of the command line, e.g. "search text", "analyze circular concept"."""
    from sae_atlas.api.cli import app

    def walk(command: typer.core.TyperGroup, prefix: list[str]) -> set[str]:
        found: set[str] = set()
        for name, sub in command.commands.items():
            if isinstance(sub, typer.core.TyperGroup):
                found |= walk(sub, [*prefix, name])
            else:
                found.add(" ".join([*prefix, name]))
        return found

    return walk(typer.main.get_command(app), [])


def documented_verbs() -> set[str]:
    """The verbs docs/cli.md's table names: a row's first span is a whole command
    (`sae-atlas search text`), the spans after it are its siblings (`flow`, `vector`)."""
    found: set[str] = set()
    for row in re.findall(r"^\| (`sae-atlas [^|]+)\|", (REPO / "docs" / "cli.md").read_text(encoding="utf-8"), re.M):
        first, *siblings = re.findall(r"`([^`]+)`", row)
        words = first.split()[1:]
        found.add(" ".join(words))
        found |= {" ".join([*words[:-1], *sibling.split()]) for sibling in siblings}
    return found


def test_the_cli_page_lists_every_verb() -> None:
    verbs, documented = cli_verbs(), documented_verbs()
    assert not verbs - documented, f"docs/cli.md lists no page for {sorted(verbs - documented)}"
    assert not documented - verbs, f"docs/cli.md lists verbs the CLI lacks: {sorted(documented - verbs)}"
