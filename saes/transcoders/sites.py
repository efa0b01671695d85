"""Which hooks a transcoder that replaces an MLP may read and write: the one rule shared
by training (per-layer transcoders and CLTs) and by attribution graphs over them.

A transcoder of block L's MLP reads that MLP's input, taken before the MLP adds its output
to the residual stream (`blocks.L.hook_resid_mid`, or its normalised form
`blocks.L.ln2.hook_normalized`, which TransformerBridge also names `ln2.hook_out` and
`mlp.hook_in`), and writes the MLP's output (`blocks.L.hook_mlp_out`, or `mlp.hook_out`).
A hook after the MLP (`blocks.L.hook_resid_post`, any later block) already holds the
output it would predict, so a transcoder reading it replaces nothing.
"""

from __future__ import annotations

from sae_atlas.errors import InvalidInputError
from sae_atlas.store.hooks import BLOCK_HOOK, hook_layer

MLP_OUT = "hook_mlp_out"
MLP_INPUT_SITES = ("ln2.hook_normalized", "hook_resid_mid", "ln2.hook_out", "mlp.hook_in")
MLP_OUTPUT_SITES = (MLP_OUT, "mlp.hook_out")
_AFTER_MLP_SITES = ("hook_resid_post",)


def _layer_at(hook: str, sites: tuple[str, ...]) -> int | None:
    match = BLOCK_HOOK.match(hook or "")
    return int(match.group(1)) if match and match.group(2) in sites else None


def mlp_input_layer(hook: str) -> int | None:
    """The block whose MLP input `hook` is (`blocks.3.ln2.hook_normalized` -> 3), else None."""
    return _layer_at(hook, MLP_INPUT_SITES)


def mlp_output_layer(hook: str) -> int | None:
    """The block whose MLP output `hook` is (`blocks.3.hook_mlp_out` -> 3), else None."""
    return _layer_at(hook, MLP_OUTPUT_SITES)


def valid_inputs(layer: int | str) -> str:
    """The MLP inputs of a block, for messages: `blocks.L.ln2.hook_normalized or blocks.L.hook_resid_mid`."""
    return " or ".join(f"blocks.{layer}.{site}" for site in MLP_INPUT_SITES[:2])


def check_mlp_input(hook: str) -> int:
    """The block whose MLP `hook` feeds; InvalidInputError naming the valid inputs when
    `hook` is not an MLP's input (outside a block, the MLP output itself, a hook after the
    MLP, or any other hook of the block)."""
    layer = hook_layer(hook)
    if layer < 0:
        raise InvalidInputError(f"hook {hook!r} is not inside a block; a transcoder reads a block's MLP input "
                                f"({valid_inputs('L')})")
    if mlp_input_layer(hook) is not None:
        return layer
    if mlp_output_layer(hook) is not None:
        why = "is the MLP output itself"
    elif BLOCK_HOOK.match(hook).group(2) in _AFTER_MLP_SITES:  # type: ignore[union-attr]
        why = (f"lies after the MLP of block {layer} and already holds its output, so a transcoder reading it "
               "replaces nothing")
    else:
        why = f"is not the input of block {layer}'s MLP"
    raise InvalidInputError(f"{hook!r} {why}; a transcoder reads the MLP's input: {valid_inputs(layer)}")


def mlp_output_hook(hook: str) -> str:
    """The MLP output (`blocks.L.hook_mlp_out`) that a transcoder reading MLP input `hook`
    predicts; InvalidInputError (`check_mlp_input`) for a hook that is not an MLP's input."""
    return f"blocks.{check_mlp_input(hook)}.{MLP_OUT}"
