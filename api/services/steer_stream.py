"""The service layer of `steer_stream`; its other layers: `sae_atlas.api.results.steer_stream`
(typed-result).

A steered generation streamed token by token: the checks and splices of
`api.services.interventions.steer`, then `compare_steps` run one step at a time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

from sae_atlas.api.context import AtlasContext
from sae_atlas.api.operations.interventions import SteerParams
from sae_atlas.api.results.interventions import SteerView
from sae_atlas.api.results.steer_stream import SteerTokens, TokenPiece
from sae_atlas.api.sae_view import SaeView
from sae_atlas.api.services.interventions import SteerInputs, steer_inputs

REPLACEMENT = "\ufffd"  # what a tokenizer decodes a cut UTF-8 sequence to


class TextPieces:
    """The text each new token adds to a continuation: the decoded continuation minus what
    was already sent, held back while it ends in a cut UTF-8 sequence. The pieces join to
    the continuation's decoded text (but for a cut sequence it may end on)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = 0

    def add(self, token_id: int) -> TokenPiece:
        """The piece of a new token."""
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids)
        if text.endswith(REPLACEMENT):
            return TokenPiece(token_id=token_id, text="")
        piece, self.sent = text[self.sent:], len(text)
        return TokenPiece(token_id=token_id, text=piece)


class SteerStream:
    """A checked steer request whose generation runs as it is iterated: one `SteerTokens`
    per step, holding the model lock until the end; then `result` is the `SteerView` that
    `Atlas.steer` returns for the same request. Closing the iterator early stops the
    generation (and frees the model)."""

    def __init__(self, ctx: AtlasContext, inputs: SteerInputs) -> None:
        self.ctx = ctx
        self.inputs = inputs
        self._result: SteerView | None = None

    @property
    def result(self) -> SteerView:
        """The whole result, once the stream has been iterated to its end."""
        if self._result is None:
            raise RuntimeError("the steered generation has not run to its end yet")
        return self._result

    def __iter__(self) -> Iterator[SteerTokens]:
        tokenizer = self.inputs.handle.tokenizer
        baseline, edited = TextPieces(tokenizer), TextPieces(tokenizer)
        with self.ctx.model_lock, closing(self.inputs.steps()) as steps:
            while True:
                try:
                    step = next(steps)
                except StopIteration as stop:
                    self._result = self.inputs.view(stop.value)
                    return
                base_id, edit_id = step.tokens
                yield SteerTokens(step=step.index, baseline=None if base_id is None else baseline.add(base_id),
                                  edited=None if edit_id is None else edited.add(edit_id))


def steer_stream(ctx: AtlasContext, views: list[SaeView], params: SteerParams) -> SteerStream:
    """`steer`'s request checked now (errors raised here) and generated as it is iterated."""
    return SteerStream(ctx, steer_inputs(ctx, views, params))
