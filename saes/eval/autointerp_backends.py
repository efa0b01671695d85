"""Autointerp back-ends: who writes a latent's explanation and who judges it.

One protocol, two back-ends:
- `lexical` (offline, the default): a LEXICAL PROXY, not LLM autointerp. The explanation
  is the offline label (`saes.labels.auto_labels`) of the explainer's windows, each centred
  on its highest activation; the simulator predicts from the explanation's quoted terms
  (its words when nothing is quoted): a window is detected when a token matches a term, a
  fuzzing highlight is correct when most highlighted tokens match.
- `openai`: a language model behind any OpenAI-compatible chat-completions endpoint (vLLM,
  llama.cpp server, Ollama), reached with httpx; `check` refuses an endpoint that does not
  answer before any work. Its answers give predictions without probabilities (AUC None).
- `hf`: a causal language model run in-process with transformers (any spec `load_model`
  takes: `smollm2-135m`, a .gguf file, a local folder, a hub id). Same prompts; it explains
  by greedy generation and judges one sample per forward from its next-token probabilities
  of "1" and "0" after the answer's opening "[" (delphi's log-prob scoring), so every
  judgement has a probability and the AUC is defined.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Protocol

import httpx
import numpy as np
import polars as pl
import torch

from sae_atlas.errors import InvalidInputError
from sae_atlas.saes.eval.autointerp_scoring import Judgement, Sample, ScorerName, Window
from sae_atlas.saes.labels import auto_labels

LEXICAL_PROXY = "lexical proxy"
KEY_ENV = "SAE_ATLAS_AUTOINTERP_KEY"


class AutointerpBackend(Protocol):
    """Writes explanations and judges scorer samples against them."""

    @property
    def description(self) -> str:
        """What the results call this back-end."""
        ...

    def explain(self, windows: Sequence[Window]) -> str:
        """An explanation of the latent that fires on `windows`."""
        ...

    def judge(self, scorer: ScorerName, explanation: str, samples: Sequence[Sample]) -> list[Judgement]:
        """One judgement per sample."""
        ...


def _term(token: str) -> str:
    return token.strip().lower()


def explanation_terms(explanation: str) -> set[str]:
    """The terms the lexical simulator matches: the quoted strings, else the words."""
    quoted = re.findall(r'"([^"]*)"', explanation)
    return {_term(t) for t in quoted or re.findall(r"\w+", explanation)} - {""}


class LexicalBackend:
    """The offline lexical proxy (see the module docstring); deterministic."""

    description = LEXICAL_PROXY

    def explain(self, windows: Sequence[Window]) -> str:
        """The offline label of `windows` (each centred on its highest activation)."""
        centres = [int(np.argmax(w.acts)) for w in windows]
        examples = pl.DataFrame({"latent": [0] * len(windows), "kind": ["top"] * len(windows),
                                 "act": [max(w.acts) for w in windows], "centre": centres,
                                 "tokens": [list(w.tokens) for w in windows]},
                                schema={"latent": pl.Int64, "kind": pl.String, "act": pl.Float64,
                                        "centre": pl.Int64, "tokens": pl.List(pl.String)})
        features = pl.DataFrame({"latent": [0], "n_active": [len(windows)], "top_logit_tokens": [[]]},
                                schema={"latent": pl.Int64, "n_active": pl.Int64, "top_logit_tokens": pl.List(pl.String)})
        return str(auto_labels(features, examples)["text"][0])

    def judge(self, scorer: ScorerName, explanation: str, samples: Sequence[Sample]) -> list[Judgement]:
        """Detection: probability `1 - 2**-matches` over the window; fuzzing: the share of
        highlighted tokens that match. Positive from 0.5."""
        terms = explanation_terms(explanation)
        judgements = []
        for sample in samples:
            if scorer == "detection":
                probability = 1.0 - 0.5 ** sum(_term(t) in terms for t in sample.tokens)
            else:
                marked = [_term(sample.tokens[i]) in terms for i in sample.highlighted]
                probability = sum(marked) / len(marked) if marked else 0.0
            judgements.append(Judgement(probability >= 0.5, probability))
        return judgements


EXPLAIN_PROMPT = ("You explain one latent feature of a language model. Below are text excerpts where it is active; "
                  "the tokens where it fires are marked <<like this>>. Reply with one short phrase describing what "
                  "it responds to, nothing else.\n\n{examples}")
SCORE_PROMPTS: dict[ScorerName, str] = {
    "detection": ("A latent feature of a language model is explained as: {explanation}\n\nFor each numbered excerpt "
                  "below, does it contain text the feature fires on? Reply with only a JSON list of {n} numbers, "
                  "1 for yes and 0 for no.\n\n{examples}"),
    "fuzzing": ("A latent feature of a language model is explained as: {explanation}\n\nIn each numbered excerpt "
                "below some tokens are marked <<like this>>. Are the marked tokens the ones the feature fires on? "
                "Reply with only a JSON list of {n} numbers, 1 for yes and 0 for no.\n\n{examples}"),
}


def marked_text(tokens: Sequence[str], marked: Sequence[int]) -> str:
    """The window's text with the `marked` tokens wrapped in << >>."""
    chosen = set(marked)
    return "".join(f"<<{t}>>" if i in chosen else t for i, t in enumerate(tokens))


def _numbered(texts: Sequence[str]) -> str:
    return "\n".join(f"{i + 1}. {text}" for i, text in enumerate(texts))


def explanation_of(answer: str) -> str:
    """The explanation in a model's answer to EXPLAIN_PROMPT."""
    return answer.strip().removeprefix("Explanation:").strip()


def read_verdicts(answer: str, n: int) -> list[bool | None]:
    """The 0/1 list of a scoring answer; all None when there is no list of `n` numbers."""
    for found in re.findall(r"\[[^\[\]]*\]", answer):
        try:
            values = json.loads(found)
        except json.JSONDecodeError:
            continue
        if isinstance(values, list) and len(values) == n and all(v in (0, 1) for v in values):
            return [bool(v) for v in values]
    return [None] * n


class OpenAIBackend:
    """A language model behind an OpenAI-compatible `/chat/completions` endpoint."""

    def __init__(self, url: str, model: str, *, key: str = "", timeout_s: float = 60.0, batch_size: int = 5) -> None:
        if not url or not model:
            raise InvalidInputError("the openai autointerp back-end needs --autointerp-url and --autointerp-model")
        self.url, self.model, self.batch_size = url.rstrip("/"), model, batch_size
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        self.description = f"LLM {model} at {self.url}"

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        with httpx.Client(headers=self.headers, timeout=self.timeout) as client:
            return client.request(method, f"{self.url}{path}", json=body).raise_for_status()

    def check(self) -> None:
        """Refuse an endpoint that does not answer `GET /models` (InvalidInputError naming it)."""
        try:
            self._request("GET", "/models")
        except httpx.HTTPError as exc:
            raise InvalidInputError(f"autointerp endpoint {self.url} does not answer ({type(exc).__name__}: {exc}); "
                                    "start the server or fix --autointerp-url") from exc

    def complete(self, prompt: str) -> str:
        """The model's reply to one user message (temperature 0)."""
        try:
            response = self._request("POST", "/chat/completions", {
                "model": self.model, "temperature": 0, "messages": [{"role": "user", "content": prompt}]})
            return str(response.json()["choices"][0]["message"]["content"])
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise InvalidInputError(f"autointerp endpoint {self.url} failed ({type(exc).__name__}: {exc})") from exc

    def explain(self, windows: Sequence[Window]) -> str:
        """The model's one-phrase explanation of the marked windows."""
        text = _numbered([marked_text(w.tokens, w.firing) for w in windows])
        return explanation_of(self.complete(EXPLAIN_PROMPT.format(examples=text)))

    def judge(self, scorer: ScorerName, explanation: str, samples: Sequence[Sample]) -> list[Judgement]:
        """The model's 0/1 verdicts, `batch_size` samples per request."""
        judgements: list[Judgement] = []
        for start in range(0, len(samples), self.batch_size):
            batch = samples[start:start + self.batch_size]
            text = _numbered([marked_text(s.tokens, s.highlighted) for s in batch])
            answer = self.complete(SCORE_PROMPTS[scorer].format(explanation=explanation, n=len(batch), examples=text))
            judgements.extend(Judgement(verdict) for verdict in read_verdicts(answer, len(batch)))
        return judgements


class HuggingFaceBackend:
    """A causal language model run in-process with transformers (see the module docstring)."""

    def __init__(self, spec: str | dict[str, Any], *, device: str = "cpu", max_new_tokens: int = 32) -> None:
        from sae_atlas.saes.models import load_causal_lm

        try:
            name, self.model, self.tokenizer = load_causal_lm(spec)
        except (OSError, ValueError) as exc:
            raise InvalidInputError(f"cannot load the autointerp model {spec!r} ({type(exc).__name__}: {exc}); "
                                    "pass --autointerp-model a model spec sae-atlas loads") from exc
        self.model.to(device)
        self.device, self.max_new_tokens = device, max_new_tokens
        self.description = f"LLM {name} in-process"
        self.answer_ids = [self._single_token(text) for text in ("0", "1")]

    def _single_token(self, text: str) -> int:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise InvalidInputError(f"the autointerp model's tokenizer splits {text!r} into {len(ids)} tokens; "
                                    "the hf back-end reads its verdicts from single-token '0' and '1'")
        return int(ids[0])

    def _prompt_ids(self, prompt: str, opening: str = "") -> torch.Tensor:
        """Token ids `[1, S]` of the user message (in the chat template when the tokenizer has
        one), followed by the start of the answer."""
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                      add_generation_prompt=True)
            ids = self.tokenizer.encode(text + opening, add_special_tokens=False)
        else:
            ids = self.tokenizer.encode(prompt + "\n" + opening)
        return torch.tensor([ids], device=self.device)

    @torch.inference_mode()
    def complete(self, prompt: str) -> str:
        """The model's greedy answer to one user message (up to `max_new_tokens`)."""
        ids = self._prompt_ids(prompt)
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.max_new_tokens,
                                  do_sample=False, pad_token_id=self.tokenizer.eos_token_id)
        return str(self.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))

    def explain(self, windows: Sequence[Window]) -> str:
        """The model's explanation of the marked windows (its answer's first line)."""
        text = _numbered([marked_text(w.tokens, w.firing) for w in windows])
        lines = explanation_of(self.complete(EXPLAIN_PROMPT.format(examples=text))).splitlines()
        return lines[0].strip() if lines else ""

    @torch.inference_mode()
    def judge(self, scorer: ScorerName, explanation: str, samples: Sequence[Sample]) -> list[Judgement]:
        """One forward per sample: P("1") / (P("0") + P("1")) as the answer's first number."""
        judgements = []
        for sample in samples:
            prompt = SCORE_PROMPTS[scorer].format(explanation=explanation, n=1,
                                                  examples=_numbered([marked_text(sample.tokens, sample.highlighted)]))
            logits = self.model(self._prompt_ids(prompt, "[")).logits[0, -1, self.answer_ids].float()
            probability = float(torch.softmax(logits, dim=0)[1])
            judgements.append(Judgement(probability >= 0.5, probability))
        return judgements
