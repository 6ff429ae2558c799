"""Stitch hooks for Miles (github.com/radixark/miles).

Miles syncs weights through disk with
``--update-weight-transfer-mode disk-delta --update-weight-disk-dir DIR``:
each sync is a ``weight_vNNNNNN`` directory of XOR/zstd deltas in the format
Stitch reads, after which Miles calls ``--custom-update-weight-post-write-path``
on every trainer rank. Wire Stitch in with::

    # launcher (Miles' train.py): the --stitch-* flags, and the claim
    args = parse_args(add_custom_arguments=stitch.integrations.miles.add_arguments)
    stitch.integrations.miles.claim(args)

    --custom-update-weight-post-write-path stitch.integrations.miles.post_write_hook
    --custom-generate-function-path stitch.integrations.miles.generate

The signatures follow Miles' hook contracts (``hook(args, version_dir,
rollout_engines)``; ``async generate(input: GenerateFnInput) ->
GenerateFnOutput``); see docs/trainers.md.
"""

from __future__ import annotations

from typing import Any

from stitch.integrations._hooks import (
    add_arguments,
    claim,
    constrain_sample_request,
    gated_generate,
    post_write_hook,
    settings,
)

__all__ = ["add_arguments", "claim", "post_write_hook", "constrain_sample_request", "generate",
           "settings"]

_GENERATE_MODULE = "miles.rollout.generate_hub.single_turn"


async def generate(input: Any) -> Any:  # noqa: A002 - Miles' parameter name
    """``--custom-generate-function-path``: Miles' single-turn generate, with
    its request to the router gated by :func:`constrain_sample_request`."""
    return await gated_generate(_GENERATE_MODULE, input.args, input.sample, input)
