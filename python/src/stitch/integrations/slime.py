"""Stitch hooks for slime (github.com/THUDM/slime).

slime writes each weight sync as a ``weight_vNNNNNN`` directory when it
syncs through disk (``--update-weight-transport disk``, with
``--update-weight-mode delta`` for XOR/zstd deltas in the format Stitch
reads) and calls ``--custom-update-weight-post-write-path`` on every trainer
rank once the files are written. Wire Stitch in with::

    # launcher (slime's train.py): the --stitch-* flags, and the claim
    args = parse_args(add_custom_arguments=stitch.integrations.slime.add_arguments)
    stitch.integrations.slime.claim(args)

    --custom-update-weight-post-write-path stitch.integrations.slime.post_write_hook
    --custom-generate-function-path stitch.integrations.slime.generate

The signatures follow slime's documented hook contracts (``hook(args,
version_dir, rollout_engines)``; ``async generate(args, sample,
sampling_params)``); see docs/trainers.md.
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

_GENERATE_MODULE = "slime.rollout.sglang_rollout"


async def generate(args: Any, sample: Any, sampling_params: dict, evaluation: bool = False) -> Any:
    """``--custom-generate-function-path``: slime's default generate, with its
    request to the router gated by :func:`constrain_sample_request`."""
    del evaluation  # slime's default generate takes none
    return await gated_generate(_GENERATE_MODULE, args, sample, args, sample, sampling_params)
