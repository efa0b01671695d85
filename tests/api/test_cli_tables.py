"""CLI tables at 80 columns when output is not a terminal: one line per row or record, no
value split across lines, long text cut with an ellipsis; in full on a wide terminal."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from sae_atlas.api.cli import app
from sae_atlas.api.commands.eval import COLUMNS as EVAL_COLUMNS
from sae_atlas.api.commands.table_layout import cell_text, render_table

WIDTH = 80
LABEL = "days of the week and other calendar words that keep going well past any narrow column"


def _render(headers: list[str], rows: list[list[Any]], *, terminal: bool = False, width: int = WIDTH) -> list[str]:
    out = io.StringIO()
    render_table(Console(file=out, width=width, force_terminal=terminal, color_system=None), "t", headers, rows)
    return out.getvalue().splitlines()


def _on_one_line(lines: list[str], *parts: str) -> bool:
    return any(all(part in line for part in parts) for line in lines)


def test_narrow_table_keeps_values_whole_and_cuts_text() -> None:
    rows = [[f"sae-{i}", 0.123456789 * (i + 1), 40961 + i, LABEL] for i in range(3)]
    lines = _render(["sae_id", "fvu", "d_sae", "label"], rows)
    assert max(len(line) for line in lines) <= WIDTH
    for row in rows:
        assert _on_one_line(lines, row[0], cell_text(row[1]), str(row[2]), "days of the week", "…")
    assert not _on_one_line(lines, "narrow column")  # cut, not wrapped onto a further line


def test_many_columns_become_records_with_whole_pairs() -> None:
    headers = ["sae_id", "hook", *(f"metric_{i}" for i in range(12)), "label"]
    rows = [[f"blocks.{i}.hook_resid_post-topk-4608", f"blocks.{i}.hook_resid_post",
             *(0.8374 + j / 1000 for j in range(12)), LABEL] for i in range(2)]
    lines = _render(headers, rows)
    assert max(len(line) for line in lines) <= WIDTH
    for row in rows:
        for header, value in zip(headers[1:-1], row[1:-1], strict=True):
            assert _on_one_line(lines, f"{header} {cell_text(value)}")


def test_wide_terminal_draws_the_full_table() -> None:
    lines = _render(["sae_id", "fvu", "label"], [["a", 0.5, LABEL]], terminal=True, width=140)
    assert any("│" in line for line in lines) and _on_one_line(lines, LABEL)


@pytest.fixture(scope="module")
def atlas(small_atlas: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the small atlas (`eval` writes results)."""
    root = tmp_path_factory.mktemp("tables") / "atlas"
    shutil.copytree(small_atlas["root"], root)
    return root


def _run(args: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], Any]:
    """The command's text at 80 columns (not a terminal) and its --json answer."""
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0, text.output
    answer = CliRunner().invoke(app, [*args, "--json"])
    assert answer.exit_code == 0, answer.output
    lines = text.stdout.splitlines()
    assert max(len(line) for line in lines) <= WIDTH, text.stdout
    return lines, json.loads(answer.stdout)


def test_search_saes_at_80_columns(atlas: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines, rows = _run(["search", "saes", str(atlas)], monkeypatch)
    for row in rows:
        assert _on_one_line(lines, row["sae_id"])
        for key, value in row.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                assert _on_one_line(lines, f"{key} {cell_text(value)}"), (key, value)


def test_eval_at_80_columns(atlas: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines, records = _run(["eval", str(atlas), "--no-model", "--tokens", "2048"], monkeypatch)
    for sae_id, record in records.items():
        assert _on_one_line(lines, sae_id)
        for key, label in EVAL_COLUMNS:
            value = record["metrics"].get(key)
            if value is not None:
                assert _on_one_line(lines, f"{label} {cell_text(value)}"), (key, value)


def test_search_text_at_80_columns(atlas: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines, result = _run(["search", "text", str(atlas), "the cat sat on the mat", "-k", "3"], monkeypatch)
    for per_token in result["features"].values():
        for pos, token, feats in zip(result["positions"], result["tokens"], per_token, strict=True):
            first = f"{feats[0]['latent']}:{feats[0]['act']:.3g}"
            assert _on_one_line(lines, f"{pos} ", token, first), (pos, token, first)


def test_feature_at_80_columns(atlas: Path, small_atlas: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    sae_id = small_atlas["sae_ids"][0]
    found = CliRunner().invoke(app, ["search", "text", str(atlas), "the cat sat", "--sae-id", sae_id, "--json"])
    live = json.loads(found.stdout)["features"][sae_id][0][0]["latent"]  # a feature that fires
    lines, card = _run(["feature", str(atlas), sae_id, str(live)], monkeypatch)
    assert card["examples"]
    for field in ("n_active", "density", "mean_act", "max_act"):
        assert _on_one_line(lines, field, cell_text(card["stats"][field])), field
    for example in card["examples"]:
        assert _on_one_line(lines, cell_text(example["act"]), example["tokens"][0])
    for near in card["neighbours"] or []:
        assert _on_one_line(lines, str(near["latent"]), cell_text(near["cosine"]))


def test_demo_json_keeps_stdout_for_the_json(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`demo --json`: the steps' tables go to stderr, stdout is the JSON of what was built."""
    import sae_atlas.api.services.demo as demo

    def steps(ctx: Any, params: Any, *, report: Any, **_: Any) -> dict[str, Any]:
        report(demo.Table("a step's table", ["sae", "fvu"], [["s0", 0.25]]))
        return {"atlas": str(ctx.root), "sae_ids": ["s0"]}

    monkeypatch.setattr(demo, "run_demo", steps)
    result = CliRunner().invoke(app, ["demo", str(tmp_path), "--json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"atlas": str(tmp_path), "sae_ids": ["s0"]}
    assert "a step's table" in result.stderr and "0.25" in result.stderr
