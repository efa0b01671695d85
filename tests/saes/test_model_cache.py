"""The cache of de-quantised GGUF models (`saes.model_cache`) and the tiny tokenizer folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sae_atlas.saes import model_cache, models


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(model_cache.ENV_CACHE_DIR, str(root))
    monkeypatch.delenv(model_cache.ENV_MODEL_CACHE, raising=False)
    return root


class Builder:
    """Stands in for de-quantising a GGUF: a tiny Llama and its tokenizer; counts the builds."""

    def __init__(self, seed: int = 3) -> None:
        self.seed, self.calls = seed, 0

    def __call__(self) -> tuple[object, object]:
        self.calls += 1
        tokenizer = models._tiny_tokenizer(models.TINY_WORDS)
        return models._tiny_hf_model(models.TinyModelSpec(n_layers=2, seed=self.seed), len(tokenizer)), tokenizer


def _source(tmp_path: Path, content: bytes = b"GGUF stand-in") -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    return path


def _logits(model: object) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([[1, 3, 20, 40]])).logits


def test_second_load_comes_from_the_cache_and_equals_the_first(cache: Path, tmp_path: Path) -> None:
    source, build = _source(tmp_path), Builder()
    first, tok = model_cache.load_cached(source, build)
    second, tok2 = model_cache.load_cached(source, build)
    assert build.calls == 1
    assert torch.equal(_logits(first), _logits(second))
    assert tok2("monday tuesday").input_ids == tok("monday tuesday").input_ids
    digest = model_cache.sha256_file(source)
    entry = cache / "models" / digest
    assert (entry / model_cache.MANIFEST).is_file() and (entry / "model.safetensors").is_file()
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_source_is_hashed_once_per_version(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _source(tmp_path)
    hashed: list[Path] = []
    real = model_cache.sha256_file
    monkeypatch.setattr(model_cache, "sha256_file", lambda p, chunk=0: hashed.append(Path(p)) or real(p))
    cache.mkdir()
    digest = model_cache.source_sha256(source, cache)
    assert model_cache.source_sha256(source, cache) == digest and hashed == [source]
    source.write_bytes(b"another GGUF")  # a new version: new size and mtime
    assert model_cache.source_sha256(source, cache) != digest and hashed == [source, source]


def test_changed_source_gets_its_own_entry(cache: Path, tmp_path: Path) -> None:
    source, build = _source(tmp_path), Builder()
    model_cache.load_cached(source, build)
    source.write_bytes(b"a re-quantised file")
    other = Builder(seed=9)
    model, _ = model_cache.load_cached(source, other)
    assert other.calls == 1 and len(list((cache / "models").iterdir())) == 2
    assert torch.equal(_logits(model), _logits(Builder(seed=9)()[0]))


@pytest.mark.parametrize("damage", ["weights", "manifest", "missing"])
def test_damaged_entry_is_rebuilt_with_a_warning_never_used(cache: Path, tmp_path: Path, damage: str) -> None:
    source, build = _source(tmp_path), Builder()
    expected = _logits(model_cache.load_cached(source, build)[0])
    entry = cache / "models" / model_cache.sha256_file(source)
    weights = entry / "model.safetensors"
    if damage == "weights":  # same size, one byte flipped near the end (inside a tensor)
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "manifest":
        (entry / model_cache.MANIFEST).write_text("{not json")
    else:
        (entry / "config.json").unlink()
    with pytest.warns(UserWarning, match="is damaged"):
        model, _ = model_cache.load_cached(source, build)
    assert build.calls == 2
    assert torch.equal(_logits(model), expected)
    assert model_cache.load_cached(source, build) and build.calls == 2  # the rebuilt entry verifies


def test_cache_off_by_environment(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(model_cache.ENV_MODEL_CACHE, "0")
    source, build = _source(tmp_path), Builder()
    model_cache.load_cached(source, build)
    model_cache.load_cached(source, build)
    assert build.calls == 2 and not cache.exists()


def test_cache_folder_follows_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(model_cache.ENV_CACHE_DIR, raising=False)
    monkeypatch.delenv(model_cache.ENV_MODEL_CACHE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert model_cache.cache_dir() == tmp_path / "sae-atlas"


def test_tiny_models_leave_no_tokenizer_folders(tmp_path: Path) -> None:
    """One tokenizer folder per process, removed at exit (not one per load)."""
    probe = (
        "import glob, os, tempfile\n"
        "from sae_atlas.saes.models import tiny_model\n"
        "for seed in range(3):\n"
        "    tiny_model(n_layers=1, seed=seed)\n"
        "print(len(glob.glob(os.path.join(tempfile.gettempdir(), 'sae-atlas-tiny-tokenizer-*'))))\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300,
                         cwd=Path(__file__).resolve().parents[2], check=True)
    assert out.stdout.strip().splitlines()[-1] == "1"
    assert not list(tmp_path.glob("sae-atlas-tiny-tokenizer-*"))


@pytest.mark.slow
def test_embedded_model_loads_from_the_cache_with_the_same_outputs(cache: Path) -> None:
    cold = models.load_model("smollm2-135m", cache=False)  # de-quantises and fills the cache
    assert len(list((cache / "models").iterdir())) == 1
    warm = models.load_model("smollm2-135m", cache=False)
    tokens = cold.to_tokens("Monday, Tuesday, Wednesday, Thursday,")
    assert torch.equal(warm.to_tokens("Monday, Tuesday, Wednesday, Thursday,"), tokens)
    with torch.no_grad():
        assert torch.equal(warm.bridge(tokens), cold.bridge(tokens))
    assert warm.hook_names == cold.hook_names and warm.bos_token_id == cold.bos_token_id
