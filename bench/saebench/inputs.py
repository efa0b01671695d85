"""The shared inputs of the SAEBench cross-check, written to `tests/fixtures/saebench/`.

Both sides read the same files: a tiny GPT-NeoX (Pythia-shaped) model, trained for a few
hundred steps on the topic texts below so that its next-token loss means something, saved
as a local Hugging Face folder (`model/`; its word-level tokenizer prepends BOS, so
SAEBench's own tokenizer call and our `to_tokens` give the same ids), a TopK SAE trained
with our trainer on that model's `blocks.0.hook_resid_post` and saved in SAELens format
(`sae/`),
the token blocks of the core eval (`core_tokens.json`, BOS first) and the labelled texts
of the sparse-probing eval (`probe_texts.jsonl`: text, label, and SAEBench's train / test
split). Everything is seeded, so a rebuild gives the same files.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from sae_atlas.saes.models import TINY_WORDS, load_model

FIXTURE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "saebench"
HOOK = "blocks.0.hook_resid_post"
MODEL_NAME = "tiny-neox"
BOS, EOS = "<s>", "</s>"
CORE_BLOCKS, CORE_CONTEXT = 32, 32  # core: one batch of 32 blocks of 32 tokens (BOS + 31)
TRAIN_PER_CLASS, TEST_PER_CLASS = 60, 30  # sparse probing: SAEBench's train / test texts per class
CLASS_WORDS = {  # four topics of the tiny vocabulary; each text mixes its topic with filler
    "animals": "cat dog bird fish horse cow".split(),
    "weekdays": "monday tuesday wednesday thursday friday saturday sunday".split(),
    "months": "january february march april may june july august september october".split(),
    "numbers": "one two three four five six seven eight nine ten eleven twelve".split(),
}
FILLER = ("the a an of to in on is was and or not it this that with for from as at by be are "
          "sat ran mat house tree car red blue green big small day week").split()
TOPIC_SHARE = 0.3  # share of a text's words drawn from its topic (model and SAE training, core)
PROBE_TOPIC_SHARE = 0.15  # the probe texts' share: weak enough that probes are not all perfect


def write_model(folder: Path, seed: int = 0) -> None:
    """A 2-layer GPT-NeoX (d_model 32, rotary on a quarter of each head) trained briefly on
    topic texts, and a word-level tokenizer that prepends BOS, as a local Hugging Face folder."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, BOS: 1, EOS: 2}
    for word in TINY_WORDS:
        vocab.setdefault(word, len(vocab))
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token=BOS, eos_token=EOS, unk_token="<unk>",
                                        pad_token=EOS)
    torch.manual_seed(seed)
    config = GPTNeoXConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=64, rotary_pct=0.25,
                           bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = GPTNeoXForCausalLM(config)
    fit_model(model, tokenizer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder)
    (folder / "generation_config.json").unlink(missing_ok=True)


def fit_model(model, tokenizer, seed: int = 4, steps: int = 300, batch: int = 16) -> None:
    """A few hundred AdamW steps of next-token prediction on topic texts (then eval mode)."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        texts = [topic_text(rng, rng.choice(list(CLASS_WORDS)), CORE_CONTEXT - 1) for _ in range(batch)]
        ids = torch.tensor(tokenizer(texts)["input_ids"])
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def topic_text(rng: random.Random, topic: str | None, n_words: int, share: float = TOPIC_SHARE) -> str:
    """`n_words` words: each from `topic`'s words with probability `share`, else filler
    (all filler words and all topics' words when `topic` is None)."""
    pool = FILLER + [w for words in CLASS_WORDS.values() for w in words] if topic is None else FILLER
    return " ".join(rng.choice(CLASS_WORDS[topic]) if topic and rng.random() < share else rng.choice(pool)
                    for _ in range(n_words))


def probe_rows(seed: int = 1) -> list[dict[str, str]]:
    """The labelled texts: per class TRAIN_PER_CLASS 'train' and TEST_PER_CLASS 'test' rows
    of 8-24 words (short enough that neither side truncates)."""
    rng = random.Random(seed)
    return [{"text": topic_text(rng, label, rng.randint(8, 24), PROBE_TOPIC_SHARE), "label": label, "split": split}
            for label in CLASS_WORDS
            for split, count in (("train", TRAIN_PER_CLASS), ("test", TEST_PER_CLASS))
            for _ in range(count)]


def core_tokens(tokenizer, seed: int = 2) -> list[list[int]]:
    """CORE_BLOCKS blocks of CORE_CONTEXT token ids, BOS first, each from one topic's text
    (the model's training distribution, so its loss is below the ablated model's)."""
    rng = random.Random(seed)
    blocks = []
    for _ in range(CORE_BLOCKS):
        ids = tokenizer(topic_text(rng, rng.choice(list(CLASS_WORDS)), CORE_CONTEXT - 1))["input_ids"]
        if len(ids) != CORE_CONTEXT or ids[0] != tokenizer.bos_token_id:
            raise AssertionError(f"expected BOS + {CORE_CONTEXT - 1} word tokens, got {len(ids)} ids")
        blocks.append(ids)
    return blocks


def train_rows(handle, seed: int = 3, n_texts: int = 400) -> torch.Tensor:
    """Non-BOS activations at HOOK of `n_texts` mixed-topic texts, the SAE's training data."""
    from sae_atlas.saes.forward import run_hooks

    rng = random.Random(seed)
    texts = [topic_text(rng, rng.choice([None, *CLASS_WORDS]), 40) for _ in range(n_texts)]
    tokens = handle.to_tokens(texts)
    return run_hooks(handle, tokens, [HOOK])[HOOK][:, 1:].reshape(-1, handle.d_model)


def write_sae(folder: Path, handle) -> None:
    """A TopK SAE (128 latents, k = 8) trained on `train_rows`, saved in SAELens format."""
    from sae_atlas.saes.sae.base import SAEConfig
    from sae_atlas.saes.train.config import TrainConfig
    from sae_atlas.saes.train.trainer import train_sae

    rows = train_rows(handle)
    generator = torch.Generator().manual_seed(0)
    batch = 256
    steps = 300

    def batches(skip: int):
        for _ in range(skip, steps):
            yield rows[torch.randint(len(rows), (batch,), generator=generator)]

    cfg = SAEConfig(architecture="topk", d_in=handle.d_model, d_sae=128, k=8, model_name=MODEL_NAME,
                    hook_name=HOOK, context_size=CORE_CONTEXT, prepend_bos=True)
    train_sae(cfg, batches, TrainConfig(total_tokens=batch * steps, batch_size=batch, progress=False,
                                        checkpoint_every_tokens=0), out_dir=folder)
    (folder / "training.json").unlink(missing_ok=True)


def build(fixture: Path = FIXTURE) -> None:
    """Write every shared input into `fixture` (the SAEBench outputs are written later)."""
    torch.manual_seed(0)
    write_model(fixture / "model")
    handle = load_model(str(fixture / "model"), cache=False)
    write_sae(fixture / "sae", handle)
    (fixture / "core_tokens.json").write_text(json.dumps(core_tokens(handle.tokenizer)) + "\n")
    with open(fixture / "probe_texts.jsonl", "w") as out:
        for row in probe_rows():
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    build()
