"""Planted sparse dictionaries for SAE tests: activations built from known unit atoms."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


def planted_atoms(d_in: int, n_atoms: int, seed: int = 0) -> torch.Tensor:
    """`[n_atoms, d_in]` random unit atoms."""
    gen = torch.Generator().manual_seed(seed)
    atoms = torch.randn(n_atoms, d_in, generator=gen)
    return atoms / atoms.norm(dim=-1, keepdim=True)


def planted_batches(
    atoms: torch.Tensor, batch_size: int, n_batches: int, *, active: int = 3, seed: int = 0,
    offset: float = 2.0, noise: float = 0.01,
) -> Iterator[torch.Tensor]:
    """Batches `x = offset_vector + sum of `active` atoms with magnitudes in [1, 2] + noise`."""
    gen = torch.Generator().manual_seed(seed + 1)
    n_atoms, d_in = atoms.shape
    mean = torch.full((d_in,), offset / d_in**0.5)
    for _ in range(n_batches):
        idx = torch.rand(batch_size, n_atoms, generator=gen).topk(active, dim=-1).indices
        mags = 1.0 + torch.rand(batch_size, active, generator=gen)
        codes = torch.zeros(batch_size, n_atoms).scatter_(1, idx, mags)
        yield mean + codes @ atoms + noise * torch.randn(batch_size, d_in, generator=gen)


def recovery(W_dec: torch.Tensor, atoms: torch.Tensor) -> float:
    """Mean over true atoms of the best cosine with any learned decoder row."""
    W = W_dec / W_dec.norm(dim=-1, keepdim=True)
    return float((atoms @ W.detach().T).max(dim=1).values.mean())


def write_planted_atlas(root, hooks: list[str], *, d_in: int = 32, n_atoms: int = 96,
                        n_blocks: int = 40, context: int = 32, seed: int = 0) -> None:
    """An atlas whose hooks hold planted activations (one dictionary per hook), no BOS."""
    from sae_atlas.store.activations import ActivationWriter

    for h, hook in enumerate(hooks):
        atoms = planted_atoms(d_in, n_atoms, seed=seed + h)
        acts = next(planted_batches(atoms, n_blocks * context, 1, seed=seed + h))
        writer = ActivationWriter(root, hook, d=d_in, model="planted", context_size=context,
                                  bos_token_id=None, prepend_bos=False, shard_blocks=8)
        writer.append(acts.reshape(n_blocks, context, d_in),
                      torch.zeros(n_blocks, context, dtype=torch.int64), torch.arange(n_blocks))
        writer.finish()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Run a test module's tiny-shape training single-threaded (import it to use it).

    On a loaded 2-core machine every multi-threaded op on small tensors waits a scheduler
    slice for the second thread, which makes these steps 10-50x slower.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
