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

from typing import Any, Mapping, Optional, Tuple

from stitch.integrations._hooks import (
    add_arguments,
    claim,
    constrain_payload,
    gated,
    publish_update,
    settings,
)

__all__ = ["add_arguments", "claim", "post_write_hook", "constrain_sample_request", "generate",
           "settings"]

_GENERATE_MODULE = "slime.rollout.sglang_rollout"


def post_write_hook(args: Any, version_dir: str, rollout_engines: Any = None) -> None:
    """``--custom-update-weight-post-write-path``: publishes the version slime
    just wrote and wakes the Stitch pool. Gates itself: global rank 0
    publishes, or every rank with ``--stitch-multihost``. The engines slime
    manages itself (``rollout_engines``) are left to slime."""
    del rollout_engines
    publish_update(args, version_dir)


def constrain_sample_request(args: Any, sample: Any, payload: Mapping[str, Any],
                             headers: Optional[Mapping[str, str]] = None) -> Tuple[dict, dict]:
    """For a custom generate function: the payload constrained to
    ``latest - --stitch-lag`` (or the pinned version) and the headers with
    the sample's group as the session, ready for slime's ``post``."""
    return constrain_payload(args, payload, headers, sample=sample)


async def generate(args: Any, sample: Any, sampling_params: dict, evaluation: bool = False) -> Any:
    """``--custom-generate-function-path``: slime's default generate, with its
    request to the router gated by :func:`constrain_sample_request`."""
    import importlib  # noqa: PLC0415

    module = importlib.import_module(_GENERATE_MODULE)
    del evaluation  # slime's default generate takes none
    return await gated(module, module.generate, args, sample, args, sample, sampling_params)
