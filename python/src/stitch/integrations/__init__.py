"""Hooks for RL trainers that already write weight updates to disk.

``stitch.integrations.slime`` and ``stitch.integrations.miles`` hold the
functions those frameworks call by import path (publish an update and wake
the pool, claim the pool at launch, gate each rollout request);
``stitch.integrations.torch_comms`` is a :class:`stitch.TrainerComms` over
``torch.distributed`` for the multi-host upload protocol. Settings come from
the trainer's argument namespace (the ``--stitch-*`` flags that
:func:`add_arguments` adds). See docs/trainers.md.
"""

from stitch.integrations._hooks import (
    RequestGate,
    Settings,
    add_arguments,
    claim,
    constrain_payload,
    publish_update,
    reset,
    settings,
)

__all__ = [
    "RequestGate",
    "Settings",
    "add_arguments",
    "claim",
    "constrain_payload",
    "publish_update",
    "reset",
    "settings",
]
