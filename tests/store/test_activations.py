"""The activation shard writer/reader: round trip, resume, corruption, batches."""

import json

import pytest
import torch

from sae_atlas.errors import IntegrityError, InvalidInputError, NotFoundError
from sae_atlas.store.activations import ActivationReader, ActivationWriter

HOOK = "blocks.0.hook_resid_post"


def write_cache(root, n_blocks=10, t=4, d=8, dtype="float32", shard_blocks=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    acts = torch.randn(n_blocks, t, d, generator=gen)
    toks = torch.randint(3, 50, (n_blocks, t), generator=gen)
    toks[:, 0] = 1
    writer = ActivationWriter(root, HOOK, d=d, dtype=dtype, context_size=t, bos_token_id=1,
                              shard_blocks=shard_blocks, model="m")
    writer.append(acts[:4], toks[:4], torch.arange(4))
    writer.append(acts[4:], toks[4:], torch.arange(4, n_blocks))
    writer.finish()
    return acts, toks


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_blocks_round_trip(tmp_path, dtype):
    acts, toks = write_cache(tmp_path, dtype=dtype)
    reader = ActivationReader(tmp_path, HOOK)
    assert reader.n_blocks == 10 and reader.n_tokens == 40 and reader.dtype == dtype
    blocks = list(reader.blocks())
    stored = torch.cat([b.acts for b in blocks])
    expected = acts.to(getattr(torch, dtype)).float()
    assert torch.equal(stored, expected)
    assert torch.equal(torch.cat([b.token_ids for b in blocks]), toks)
    assert torch.equal(torch.cat([b.block_index for b in blocks]), torch.arange(10))
    assert torch.cat([b.is_bos for b in blocks])[:, 0].all()
    assert not torch.cat([b.is_bos for b in blocks])[:, 1:].any()


def test_splits_are_disjoint_and_cover(tmp_path):
    write_cache(tmp_path, n_blocks=20)
    reader = ActivationReader(tmp_path, HOOK)
    train = torch.cat([b.block_index for b in reader.blocks("train")])
    held = torch.cat([b.block_index for b in reader.blocks("heldout")])
    assert torch.equal(torch.cat([train, held]), torch.arange(20))
    assert len(held) == 2


def test_rows_are_in_cache_order_without_bos_and_capped(tmp_path):
    acts, toks = write_cache(tmp_path, n_blocks=10, t=4)
    reader = ActivationReader(tmp_path, HOOK)
    rows = list(reader.rows("all"))
    assert len(rows) == 4  # one chunk per shard of 3 blocks
    assert torch.equal(torch.cat([r.acts for r in rows]), acts[:, 1:].reshape(-1, 8))
    assert torch.equal(torch.cat([r.token_ids for r in rows]), toks[:, 1:].reshape(-1))
    assert torch.equal(torch.cat([r.positions for r in rows]), torch.tensor([1, 2, 3] * 10))
    capped = list(reader.rows("all", max_tokens=11))
    assert [len(r.token_ids) for r in capped] == [9, 2]
    assert torch.equal(torch.cat([r.acts for r in capped]), acts[:, 1:].reshape(-1, 8)[:11])
    with_bos = torch.cat([r.token_ids for r in reader.rows("heldout", exclude_bos=False)])
    assert torch.equal(with_bos, toks[9])
    with pytest.raises(InvalidInputError, match="max_tokens must be positive"):
        next(reader.rows(max_tokens=0))


def test_batches_shuffled_seeded_and_exclude_bos(tmp_path):
    acts, toks = write_cache(tmp_path, n_blocks=30, shard_blocks=4)
    reader = ActivationReader(tmp_path, HOOK)
    a = list(reader.batches(7, seed=1, buffer_tokens=20, split="all"))
    b = list(reader.batches(7, seed=1, buffer_tokens=20, split="all"))
    c = list(reader.batches(7, seed=2, buffer_tokens=20, split="all"))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(torch.cat(a), torch.cat(c)[: len(torch.cat(a))])
    rows = torch.cat(a)
    non_bos = acts[:, 1:].reshape(-1, 8)
    assert len(rows) == (len(non_bos) // 7) * 7  # one pass, BOS excluded, last partial dropped
    # every emitted row is a distinct non-BOS row
    match = (rows[:, None, :] == non_bos[None]).all(-1)
    assert (match.sum(1) == 1).all() and (match.sum(0) <= 1).all()
    assert not (rows[:, None, :] == acts[:, 0][None]).all(-1).any()
    # consecutive rows are not in storage order (shuffled)
    order = match.float().argmax(1)
    assert (order.diff() == 1).float().mean() < 0.5


def test_batches_of_a_split_smaller_than_one_batch_are_none(tmp_path):
    write_cache(tmp_path, n_blocks=10, t=4)  # the held-out split is one block: 3 non-BOS rows
    reader = ActivationReader(tmp_path, HOOK)
    assert list(reader.batches(5, seed=0, buffer_tokens=5, split="heldout")) == []
    assert [len(b) for b in reader.batches(3, seed=0, buffer_tokens=3, split="heldout")] == [3]


def test_skip_batches_continues_the_same_stream(tmp_path):
    write_cache(tmp_path, n_blocks=30, shard_blocks=4)
    reader = ActivationReader(tmp_path, HOOK)
    stream = reader.batches(5, seed=3, buffer_tokens=16, repeat=True)
    full = [next(stream) for _ in range(40)]
    resumed = reader.batches(5, seed=3, buffer_tokens=16, repeat=True, skip_batches=25)
    assert all(torch.equal(full[25 + i], next(resumed)) for i in range(15))


def test_corrupt_and_truncated_shards_are_detected(tmp_path):
    write_cache(tmp_path)
    shard = tmp_path / "activations" / HOOK / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    reader = ActivationReader(tmp_path, HOOK)
    with pytest.raises(IntegrityError, match="shard-00001.*sha256.*sae-atlas cache"):
        list(reader.blocks())
    shard.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(IntegrityError, match="shard-00001.*truncated"):
        ActivationReader(tmp_path, HOOK)
    shard.unlink()
    with pytest.raises(IntegrityError, match="missing"):
        ActivationReader(tmp_path, HOOK)


def test_corrupt_manifest_and_unknown_hook(tmp_path):
    write_cache(tmp_path)
    with pytest.raises(NotFoundError, match="blocks.0.hook_resid_post"):
        ActivationReader(tmp_path, "blocks.5.hook_resid_post")
    (tmp_path / "activations" / HOOK / "manifest.json").write_text("{not json")
    with pytest.raises(IntegrityError, match="manifest.json.*not valid JSON"):
        ActivationReader(tmp_path, HOOK)


def test_writer_resumes_from_last_verified_shard(tmp_path):
    acts, toks = write_cache(tmp_path)
    cache_dir = tmp_path / "activations" / HOOK
    manifest = json.loads((cache_dir / "manifest.json").read_text())
    # simulate a crash: incomplete, last shard corrupt, plus a stray temp file
    manifest["complete"] = False
    (cache_dir / "manifest.json").write_text(json.dumps(manifest))
    (cache_dir / "shard-00002.safetensors").write_bytes(b"garbage")
    (cache_dir / ".shard-00004.safetensors.abc.tmp").write_bytes(b"partial")
    writer = ActivationWriter(tmp_path, HOOK, d=8, context_size=4, bos_token_id=1, shard_blocks=3, model="m")
    assert writer.n_blocks_done == 6
    assert not (cache_dir / ".shard-00004.safetensors.abc.tmp").exists()
    writer.append(acts[6:], toks[6:], torch.arange(6, 10))
    writer.finish()
    reader = ActivationReader(tmp_path, HOOK)
    assert torch.equal(torch.cat([b.acts for b in reader.blocks()]), acts)


def test_writer_rejects_changed_settings_and_bad_input(tmp_path):
    write_cache(tmp_path)
    with pytest.raises(InvalidInputError, match="different settings.*d: cached 8 vs requested 16"):
        ActivationWriter(tmp_path, HOOK, d=16, context_size=4, bos_token_id=1, shard_blocks=3, model="m")
    with pytest.raises(InvalidInputError, match="unknown activation dtype 'int8'.*bfloat16"):
        ActivationWriter(tmp_path / "b", HOOK, d=8, dtype="int8", context_size=4)
    writer = ActivationWriter(tmp_path / "c", HOOK, d=8, context_size=4)
    with pytest.raises(InvalidInputError, match=r"expected activations \[n, 4, 8\]"):
        writer.append(torch.zeros(2, 4, 7), torch.zeros(2, 4, dtype=torch.long), torch.arange(2))
    with pytest.raises(InvalidInputError, match="no blocks"):
        writer.finish()


def test_incomplete_cache_is_refused_by_default(tmp_path):
    writer = ActivationWriter(tmp_path, HOOK, d=8, context_size=4, shard_blocks=2)
    writer.append(torch.zeros(4, 4, 8), torch.zeros(4, 4, dtype=torch.long), torch.arange(4))
    with pytest.raises(IntegrityError, match="incomplete"):
        ActivationReader(tmp_path, HOOK)
    assert ActivationReader(tmp_path, HOOK, allow_incomplete=True).n_blocks == 4


def test_special_token_positions_are_excluded(tmp_path):
    toks = torch.tensor([[1, 5, 2, 6], [1, 7, 8, 2]])
    acts = torch.arange(32, dtype=torch.float32).reshape(2, 4, 4)
    writer = ActivationWriter(tmp_path, HOOK, d=4, context_size=4, bos_token_id=1,
                              special_token_ids=[2], shard_blocks=2)
    writer.append(acts, toks, torch.arange(2))
    writer.finish()
    reader = ActivationReader(tmp_path, HOOK)
    rows = torch.cat(list(reader.batches(1, split="all", buffer_tokens=8)))
    kept = acts.reshape(-1, 4)[torch.tensor([1, 3, 5, 6])]
    assert sorted(rows[:, 0].tolist()) == sorted(kept[:, 0].tolist())
    assert next(reader.blocks()).is_bos.tolist() == [[True, False, True, False], [True, False, False, True]]
