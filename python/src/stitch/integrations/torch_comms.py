"""A :class:`stitch.TrainerComms` over ``torch.distributed``.

Every rank of the trainer's process group builds one and passes it to
:class:`stitch.Publisher`; the multi-host publish then runs its all-gathers
through ``all_gather_object`` on that group. Imports torch only when built.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional

from stitch.publisher import TrainerComms


class TorchDistributedComms(TrainerComms):
    """``rank``/``world_size`` of ``group`` (default: the world), the host
    leader is the rank whose local rank is 0 (``local_rank``, else the
    ``LOCAL_RANK`` environment variable torchrun sets). ``dist`` is the
    ``torch.distributed`` module (tests pass a stand-in)."""

    def __init__(self, group: Any = None, local_rank: Optional[int] = None, dist: Any = None) -> None:
        super().__init__()
        if dist is None:
            import torch.distributed as dist  # noqa: PLC0415 - torch is optional
        if not dist.is_initialized():
            raise RuntimeError("stitch: torch.distributed is not initialized; call "
                               "init_process_group before building TorchDistributedComms")
        self._dist = dist
        self._group = group
        self._rank = dist.get_rank(group)
        self._world = dist.get_world_size(group)
        if local_rank is None:
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self._local_rank = int(local_rank)

    def rank(self) -> int:
        return self._rank

    def world_size(self) -> int:
        return self._world

    def is_host_leader(self) -> bool:
        return self._local_rank == 0

    def all_gather_object(self, value: Any) -> List[Any]:
        out: List[Any] = [None] * self._world
        self._dist.all_gather_object(out, value, group=self._group)
        return out
