"""Device and dtype plumbing: one resolver, clear errors for absent accelerators, CPU runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from sae_atlas.api.cli import app
from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.devices import (
    ENV_DEVICE,
    ENV_DTYPE,
    resolve_device,
    resolve_dtype,
    use_by_default,
)
from sae_atlas.saes.forward import run_hooks
from sae_atlas.saes.models import load_model

TINY = {"kind": "tiny", "n_layers": 2, "d_model": 16, "n_heads": 2, "d_mlp": 32}
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")


def test_cpu_and_auto_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_DEVICE, raising=False)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else
                                           "mps" if torch.backends.mps.is_available() else "cpu")
    monkeypatch.setenv(ENV_DEVICE, "cpu")
    assert resolve_device(None) == torch.device("cpu")


def test_unknown_names_are_clear_errors() -> None:
    with pytest.raises(InvalidInputError, match="unknown device 'tpu'; valid: auto, cpu, cuda, cuda:N, mps"):
        resolve_device("tpu")
    with pytest.raises(InvalidInputError, match="unknown model dtype 'int3'"):
        resolve_dtype("int3", torch.device("cpu"))
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda", 0)) == torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16


@no_cuda
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_gpu_is_a_clear_error(name: str) -> None:
    with pytest.raises(InvalidInputError, match="no CUDA GPU visible to torch.*use --device cpu or auto"):
        resolve_device(name)


@no_cuda
def test_cli_cuda_without_gpu_exits_with_the_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_DEVICE, raising=False)
    result = CliRunner().invoke(app, ["cache", "--atlas", str(tmp_path / "a"), "--model", '{"kind": "tiny"}',
                                      "--tokens", "256", "--device", "cuda"])
    assert result.exit_code == 2
    assert "no CUDA GPU" in result.output
    assert not (tmp_path / "a").exists()  # nothing written before the check


def test_model_on_cpu_in_bfloat16_runs_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_DEVICE, raising=False)
    handle = load_model(TINY, cache=False, device="cpu", dtype="bfloat16")
    assert handle.device == torch.device("cpu")
    assert {p.dtype for p in handle.bridge.parameters()} == {torch.bfloat16}
    reference = load_model(TINY, cache=False)
    tokens = reference.to_tokens("the cat sat on the mat")
    low = run_hooks(handle, tokens, ["blocks.1.hook_resid_post"])["blocks.1.hook_resid_post"]
    full = run_hooks(reference, tokens, ["blocks.1.hook_resid_post"])["blocks.1.hook_resid_post"]
    assert low.dtype == torch.bfloat16 and full.dtype == torch.float32
    # same model, lower precision: close but not bit-identical
    assert torch.allclose(low.float(), full, atol=0.1 * full.abs().max().item())


def test_use_by_default_sets_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_DEVICE, "auto")  # restored after the test
    monkeypatch.setenv(ENV_DTYPE, "float32")
    assert use_by_default("cpu", "bfloat16") == torch.device("cpu")
    assert (os.environ[ENV_DEVICE], os.environ[ENV_DTYPE]) == ("cpu", "bfloat16")
    assert load_model(TINY, cache=False).bridge.W_U.dtype == torch.bfloat16


@needs_cuda
def test_model_and_hooks_on_cuda() -> None:
    handle = load_model(TINY, cache=False, device="cuda")
    tokens = handle.to_tokens("the cat sat")
    acts = run_hooks(handle, tokens, ["blocks.1.hook_resid_post"])["blocks.1.hook_resid_post"]
    assert acts.device.type == "cuda"
